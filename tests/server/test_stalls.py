"""No request hangs, whatever breaks (real tritonserver, admission gate on).

Each test breaks part of the path a stream takes inside the server and checks what a client
and an operator see: every open stream ends with an explicit error instead of waiting for
ever, and the server stops claiming readiness, so that its supervisor (or the orchestrator)
starts a fresh one.

* The server process itself: a test backend corrupts the heap the way a use-after-free in
  Triton 2.51's Python backend does (tests/faults/crasher.cc). Triton's own fatal-signal
  handler then blocks inside malloc and leaves a server that answers "ready" and serves
  nothing (issue 28's state); the admission gate's handler ends the process at once.
* The entry model (the Python stub that owns the streams): frozen with SIGSTOP, nothing in it
  can end its streams; the gate's pings find it stuck and end them.
* The GPT engine's stub: frozen, the entry model's stall watchdog ends the streams; the entry
  model then stops the server (``health.stop_on_stall``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from chattts_serving import contract
from chattts_serving.client import SynthesisRequest, synthesize_stream
from chattts_serving.deploy.gate import GATE_DIR
from chattts_serving.deploy.server import TritonServer
from chattts_serving.deploy.supervisor import Supervisor
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import HealthProfile
from tests.support.servers import serve_profile, wait_until
from tests.support.streams import Stream

STALL_S = 2.0
"""The servers' entry.stall_timeout_s."""
CRASHER = Path(__file__).resolve().parents[1] / "faults" / "crasher.cc"
CRASHER_CONFIG = """name: "crasher"
backend: "crasher"
max_batch_size: 0
input { name: "x" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "y" data_type: TYPE_INT32 dims: [ 1 ] }
instance_group { count: 1 kind: KIND_CPU }
"""


def _add_crasher(work: Path) -> None:
    """The test backend's model beside the others (its library built with the host's g++)."""
    (work / "repo" / "crasher" / "1").mkdir(parents=True)
    (work / "repo" / "crasher" / "config.pbtxt").write_text(CRASHER_CONFIG)
    lib = work / "build" / "backends" / "crasher" / "libtriton_crasher.so"
    lib.parent.mkdir(parents=True)
    # -O0 -fno-builtin: the compiler must not drop the writes to freed memory it relies on.
    subprocess.run([shutil.which("g++") or "c++", "-std=c++17", "-O0", "-fno-builtin", "-shared", "-fPIC",
                    f"-I{GATE_DIR}", str(CRASHER), "-o", str(lib)], check=True)


def _server(artifacts: Artifacts, work: Path, crasher: bool = False) -> TritonServer:
    """A server on the cpu profile with a short stall timeout (the gate pings every 0.5 s),
    two stream slots, and with ``crasher`` the test backend's model beside the others."""
    return serve_profile(artifacts, work, prepare=_add_crasher if crasher else None,
                         entry={"stall_timeout_s": STALL_S, "max_concurrent_streams": 2},
                         engine={"waiting_heartbeat_s": STALL_S / 4})


def _ready(srv: TritonServer) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _stub_pid(srv: TritonServer, model: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"{srv.repo}/{model}/1/model.py"], capture_output=True, text=True).stdout
    assert out.split(), f"no stub process of {model}"
    return int(out.split()[0])


def _open_streams(srv: TritonServer, n: int = 2) -> list[Stream]:
    streams = [Stream(f"127.0.0.1:{srv.grpc_port}", "卡住的服务也要给出明确的错误。", i, 2000).start()
               for i in range(n)]
    for s in streams:
        assert s.first_chunk.wait(120) and s.error is None, s.error
    return streams


def _log(srv: TritonServer) -> str:
    assert srv.log_path is not None
    return Path(srv.log_path).read_text(errors="replace")


@pytest.fixture
def server(small_artifacts: Artifacts, tmp_path: Path) -> Iterator[TritonServer]:
    srv = _server(small_artifacts, tmp_path)
    srv.expect_fatal = True  # a frozen stub crashes when the server stops around it
    try:
        yield srv
    finally:
        srv.stop(timeout_s=15.0)


@pytest.mark.parametrize(("model", "error", "event"), [
    (contract.MODEL_STREAM_ENTRY, f"{contract.MODEL_STREAM_ENTRY} stopped responding", "target_unresponsive"),
    (contract.MODEL_ENGINE, "the GPT engine stopped responding", "server_stopping"),
], ids=["entry", "engine"])
def test_a_frozen_model_has_its_streams_ended_and_the_server_stops(server: TritonServer, model: str, error: str,
                                                                    event: str) -> None:
    """SIGSTOP a model's stub under two live streams. The entry model (chattts_entry): its own
    stall watchdog is frozen with it, so only the gate can answer; its pings find the model
    stuck. The GPT engine: the entry model's stall watchdog sees it. Either way every stream
    ends with UNAVAILABLE naming what is stuck within the stall timeout (and a ping interval),
    and the server stops (readiness false) so that it is restarted: it must not go on claiming
    readiness while it cannot synthesise."""
    streams = _open_streams(server)
    pid = _stub_pid(server, model)
    os.kill(pid, signal.SIGSTOP)
    try:
        for s in streams:
            assert s.done.wait(10 * STALL_S), f"a stream hung behind a frozen {model}"
            assert s.error is not None and error in s.error, s.error
        assert wait_until(lambda: not _ready(server), 30), "the server still claims readiness"
        assert f'"event":"{event}"' in _log(server)
    finally:
        os.kill(pid, signal.SIGCONT)
        for s in streams:
            s.close()


def _crash(srv: TritonServer) -> None:
    """Ask the crasher model to corrupt the heap (its request never gets an answer)."""
    def call() -> None:
        body = b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1]}]}'
        req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}/v2/models/crasher/infer", data=body,
                                     headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=60).read()
    threading.Thread(target=call, daemon=True).start()


def test_a_heap_corruption_in_the_server_ends_the_process_and_every_stream(small_artifacts: Artifacts,
                                                                            tmp_path: Path) -> None:
    """glibc aborts inside malloc with the allocator's lock held: with Triton's own handler the
    process would live on for good, "ready", with its streams hanging. The gate's handler
    writes the signal and a stack and lets the process die: the streams end with an error at
    once (the connection is gone), nothing answers "ready", and the log says what happened."""
    srv = _server(small_artifacts, tmp_path, crasher=True)
    try:
        streams = _open_streams(srv)
        _crash(srv)
        assert srv.proc is not None
        assert wait_until(lambda: srv.proc is not None and srv.proc.poll() is not None, 60), (
            "tritonserver lives on after aborting; its log ends:\n" + _log(srv)[-6000:])
        assert srv.proc.returncode == -signal.SIGABRT, srv.proc.returncode
        for s in streams:
            assert s.done.wait(30), "a stream hung after the server died"
            assert s.error is not None, "a stream ended without an error on a dead server"
        assert not _ready(srv)
        log = _log(srv)
        assert "malloc(): unsorted double linked list corrupted" in log
        assert "Signal (6) received: chattts gate's fatal-signal handler" in log
        for s in streams:
            s.close()
    finally:
        srv.stop(timeout_s=5.0)


def test_the_supervisor_restarts_a_server_that_died_at_once(small_artifacts: Artifacts, tmp_path: Path) -> None:
    """The same crash under ``chattts-serve --restart-on-failure``: the supervisor sees the
    process gone at its next check and starts a new one (no count of failed checks to wait
    for), which serves, its gauges at 0."""
    srv = _server(small_artifacts, tmp_path, crasher=True)
    stop = threading.Event()
    sup = Supervisor(srv, HealthProfile(interval_s=0.5, failures=5, probe_every=0, probe_timeout_s=30.0))
    errors: list[BaseException] = []

    def supervise() -> None:
        try:
            sup.run(stop)
        except BaseException as exc:  # reported below
            errors.append(exc)
    watcher = threading.Thread(target=supervise, daemon=True)
    watcher.start()
    try:
        _crash(srv)
        assert wait_until(lambda: sup.restarts == 1 and _ready(srv), 180), (sup.restarts, errors)
        again = synthesize_stream(f"127.0.0.1:{srv.grpc_port}", SynthesisRequest(
            text="重新开始了。", max_new_tokens=8, min_new_tokens=8), timeout_s=120)
        assert again.audio.size == contract.samples_for_tokens(8)
        assert wait_until(lambda: _active(srv) == 0, 30)
    finally:
        stop.set()
        watcher.join(30)
        srv.stop(timeout_s=15.0)
    assert not errors, errors


def _active(srv: TritonServer) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    lines = [line for line in text.splitlines() if line.startswith(contract.ACTIVE_METRIC + "{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)
