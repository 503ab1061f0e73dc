"""Faults and recovery: a model process (Python-backend stub) dies under a real tritonserver.

What Triton 2.51 does when the GPT engine's stub is SIGKILLed (upstream issue
triton-inference-server/server#8604): ``/v2/health/ready`` and the model's ready state stay
200/READY, and every later request to the model fails with "Stub process ... is not
healthy". The tests pin that behaviour, then show what this project adds on top: the deep
probe (``python -m chattts_serving.deploy.probe``) reports it, the entry model's circuit breaker
fails fast, and ``chattts-serve --restart-on-failure`` restarts the server by itself. A stopped
server ends its live streams as unavailable and exits cleanly; the preStop drain waits for them.

The supervisor's decision logic without a server: tests/unit/test_faults.py.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.client import ClientError, SynthesisRequest, synthesize_stream
from chattts_serving.deploy.probe import probe
from chattts_serving.deploy.server import SHM_GLOB, TritonServer, _region_in_use
from chattts_serving.deploy.supervisor import Supervisor
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import PROFILES_DIR, HealthProfile, load_profile
from tests.support.probe_cli import probe_cli
from tests.support.servers import free_port, serve_profile
from tests.support.streams import Stream

BREAKER_FAILURES = 3
NOT_HEALTHY = "not healthy"  # Triton 2.51's error for a request to a model whose stub died
BREAKER_OPEN = "server unavailable: engine is failing"  # GuardedBreaker + CircuitBreaker.before()


def _urls(srv: TritonServer) -> tuple[str, str]:
    return f"127.0.0.1:{srv.http_port}", f"127.0.0.1:{srv.grpc_port}"


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return int(r.status)


def _engine_stub_pid(repo: Path) -> int | None:
    out = subprocess.run(["pgrep", "-f", f"{repo}/{contract.MODEL_ENGINE}/1/model.py"], capture_output=True,
                         text=True).stdout.split()
    return int(out[0]) if out else None


def _shm_regions(repo: Path) -> set[str]:
    """The shared-memory files (/dev/shm) the stubs of the server over ``repo`` hold: each
    stub's command line names its region."""
    regions: set[str] = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            text = cmdline.read_bytes().decode(errors="replace")
            if str(repo) in text:
                regions.update(re.findall(r"triton_python_backend_shm_region_[\w-]+", text))
    return {f"/dev/shm/{r}" for r in regions}


def _engine_gauge(srv: TritonServer, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _kill_engine(srv: TritonServer) -> None:
    pid = _engine_stub_pid(srv.repo)
    assert pid is not None, "no GPT engine stub process"
    os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------ real server

@pytest.fixture(scope="module")
def crashable(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server for the tests below, in file order: fresh, then (the death test) its GPT
    engine's stub killed mid-stream, then restarted with its idle engine's stub killed.
    Streams give up after 3 s without progress (a queued one hears from the engine every
    1 s); the breaker opens after 3 failures and stays
    open for the rest of the module; 2 streams at most (the busy test fills them). The engine
    answers every 64 tokens instead of 4, so that the mid-stream kill seldom lands while the
    stub holds the shared-memory lock of a response it is sending (see the death test). A stuck
    engine does not stop this server (health.stop_on_stall off: tests/server/test_stalls.py covers
    that), so that the tests after the frozen-engine one find it serving."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("crashable"),
                 entry={"stall_timeout_s": 3.0, "breaker_failures": BREAKER_FAILURES, "breaker_cooldown_s": 3600.0,
                        "max_concurrent_streams": 2}, stream={"emit_tokens": 64},
                 engine={"waiting_heartbeat_s": 1.0}, health={"stop_on_stall": False})
    srv.expect_fatal = True  # its engine is killed on purpose: Triton may abort with it
    state: dict[str, Any] = {"server": srv, "killed": False, "failed_requests": 0}
    try:
        yield state
    finally:
        if srv.proc is not None and srv.proc.poll() is not None:  # diagnose a crash of the server itself
            print(f"tritonserver exited on its own with {srv.proc.returncode}{srv._tail(60)}")
        # A dead model never unloads: a SIGINT'ed server would wait out its whole exit timeout.
        srv.stop(timeout_s=3.0 if state["killed"] else 30.0)


def _killed(state: dict[str, Any]) -> TritonServer:
    """The module's server with its engine stub dead (killed here if no test did yet)."""
    srv: TritonServer = state["server"]
    if not state["killed"]:
        _kill_engine(srv)
        state["killed"] = True
    return srv


def test_probe_cli_reports_a_fresh_server_healthy(crashable: dict[str, Any]) -> None:
    http, grpc = _urls(crashable["server"])
    code, out = probe_cli("--http-url", http, "--grpc-url", grpc, "--timeout-s", "60",
                          admin_token=crashable["server"].admin_token)
    assert code == 0, out
    assert out["healthy"] is True and out["reason"] == "ok"
    assert set(out["checks"]) == {"live", "ready", "models", "synthesis"}
    assert all(c["ok"] for c in out["checks"].values())
    assert out["checks"]["models"]["models"] == len(contract.ALL_MODELS)
    assert out["checks"]["synthesis"]["samples"] > 0 and out["checks"]["synthesis"]["busy"] is False


def test_probe_counts_server_busy_as_healthy(crashable: dict[str, Any]) -> None:
    srv: TritonServer = crashable["server"]
    http, grpc = _urls(srv)
    hogs = [Stream(grpc, "占满所有名额。", i, 2000).start() for i in range(2)]
    try:
        for h in hogs:
            assert h.first_chunk.wait(60) and h.error is None, h.error
        result = probe(http, grpc, 60, admin_token=srv.admin_token)
    finally:
        for h in hogs:
            h.close()
    assert result.healthy, result.reason
    assert result.checks["synthesis"]["busy"] is True
    assert "server busy" in result.checks["synthesis"]["message"]
    # the cancelled hogs free their slots a moment after the client closed them
    assert _wait_for(lambda: not probe(http, grpc, 60, admin_token=srv.admin_token).checks["synthesis"].get("busy"),
                     60)


def test_a_frozen_engine_ends_the_stream_by_the_stall_watchdog_and_the_server_serves_on(
        crashable: dict[str, Any]) -> None:
    """SIGSTOP the GPT engine's stub mid-stream (a hung engine; unlike a kill, tritonserver
    itself is never at risk): the BLS iterator gets nothing more, and the entry model's stall
    watchdog ends the stream with its own error after stall_timeout_s (3 s here), while
    tritonserver stays up (with health.stop_on_stall off). Once the stub runs again the server
    serves the next request."""
    srv: TritonServer = crashable["server"]
    _, grpc = _urls(srv)
    pid = _engine_stub_pid(srv.repo)
    assert pid is not None
    s = Stream(grpc, "卡住测试。", 2, 2000).start()
    assert s.first_chunk.wait(60) and s.error is None, s.error
    os.kill(pid, signal.SIGSTOP)
    try:
        assert s.done.wait(60), "the stream hung while the engine was frozen"
        assert srv.proc is not None and srv.proc.poll() is None, "tritonserver died"
        assert s.error is not None and "stopped responding" in s.error, s.error
    finally:
        os.kill(pid, signal.SIGCONT)
        s.close()
    # the frozen sequence runs on to its end (nobody reads it any more); then the server serves again
    assert _wait_for(lambda: _engine_gauge(srv, "tts_engine_active_sequences") == 0, 120)
    again = synthesize_stream(grpc, SynthesisRequest(text="恢复了。", max_new_tokens=8, min_new_tokens=8), timeout_s=60)
    assert again.audio.size == contract.samples_for_tokens(8)


def test_engine_death_ready_stays_200_but_the_probe_and_the_supervisor_see_it(crashable: dict[str, Any]) -> None:
    """Kill the GPT engine's stub mid-stream: the stream ends with an explicit error, no hang
    (the stall watchdog's when tritonserver survives, a dropped connection when it aborts; the
    watchdog itself is pinned by the frozen-engine test above). Then, on a restarted server
    whose idle engine's stub is killed: Triton 2.51 still says ready; the probe and the
    supervisor's process check report the failure, naming it."""
    srv: TritonServer = crashable["server"]
    http, grpc = _urls(srv)
    sup = Supervisor(srv, HealthProfile(interval_s=1.0, failures=2, probe_every=0, probe_timeout_s=30.0))
    sup.baseline()
    assert sup.expected[contract.MODEL_ENGINE] == 1
    assert sup.check(with_probe=False).ok

    s = Stream(grpc, "故障测试。", 1, 2000).start()
    assert s.first_chunk.wait(60) and s.error is None, s.error
    _killed(crashable)
    assert s.done.wait(60), "the stream hung after the engine died"
    s.close()
    assert srv.proc is not None
    if srv.proc.poll() is None:
        assert s.error is not None and "stopped responding" in s.error, s.error
    else:
        print(f"\ntritonserver aborted with the stub (exit {srv.proc.returncode}); stream error: {s.error}")
        assert s.error is not None and "UNAVAILABLE" in s.error, s.error
    # Triton 2.51 itself aborts (boost::interprocess::lock_exception) when the stub died
    # holding a lock in its shared memory (the message queue's or the allocator's: a kill in
    # the middle of sending a response), and it does so at the kill or at the next request
    # that touches the model, whichever comes first: the clients then see the connection
    # drop, and the supervisor (or the Kubernetes liveness probe) restarts the whole server.
    # Which of the two a mid-stream kill gives is chance, so the rest of this test (and the
    # breaker test after it) runs on a fresh server whose engine is killed while idle, when
    # its stub holds no lock.
    srv.stop(timeout_s=3.0)
    srv.start()
    sup = Supervisor(srv, HealthProfile(interval_s=1.0, failures=2, probe_every=0, probe_timeout_s=30.0))
    sup.baseline()
    assert sup.check(with_probe=False).ok
    _kill_engine(srv)

    # Triton 2.51: the server and the dead model still report ready (upstream #8604).
    assert _status(f"http://{http}/v2/health/live") == 200
    assert _status(f"http://{http}/v2/health/ready") == 200
    assert _status(f"http://{http}/v2/models/{contract.MODEL_ENGINE}/ready") == 200

    # The supervisor's cheap check: the stub is gone.
    cheap = sup.check(with_probe=False)
    assert not cheap.ok and contract.MODEL_ENGINE in cheap.reason, cheap

    # The deep probe: states all READY, the synthesis fails with Triton's own message.
    result = probe(http, grpc, 60, admin_token=srv.admin_token)
    crashable["failed_requests"] += 1
    assert not result.healthy
    assert result.checks["ready"]["ok"] and result.checks["models"]["ok"]
    assert not result.checks["synthesis"]["ok"]
    assert result.reason.startswith("synthesis:") and NOT_HEALTHY in result.reason, result.reason
    assert contract.MODEL_ENGINE in result.reason, result.reason

    code, out = probe_cli("--http-url", http, "--grpc-url", grpc, "--timeout-s", "60", admin_token=srv.admin_token)
    crashable["failed_requests"] += 1
    assert code == 1 and out["healthy"] is False and NOT_HEALTHY in out["reason"], out


def test_circuit_breaker_fails_fast_after_breaker_failures(crashable: dict[str, Any]) -> None:
    """With the engine dead, each request reaches it and fails ("not healthy") until the entry
    model's engine breaker has seen ``breaker_failures`` failures; from then on requests fail
    at once with the breaker's own message, without reaching the engine."""
    srv = _killed(crashable)
    _, grpc = _urls(srv)
    before = crashable["failed_requests"]
    assert before <= BREAKER_FAILURES
    errors = []
    for i in range(BREAKER_FAILURES - before + 2):
        with pytest.raises(ClientError) as exc:
            synthesize_stream(grpc, SynthesisRequest(text="熔断测试。", seed=i, max_new_tokens=2, min_new_tokens=2),
                              timeout_s=60)
        errors.append(exc.value.message)
    reached = BREAKER_FAILURES - before
    assert all(NOT_HEALTHY in e for e in errors[:reached]), errors
    assert all(e.startswith(BREAKER_OPEN) for e in errors[reached:]), errors
    # and the probe reports the open breaker as a failure (not as "server busy")
    result = probe(*_urls(srv), timeout_s=60, admin_token=srv.admin_token)
    assert not result.healthy and BREAKER_OPEN in result.reason, result.reason


# ------------------------------------------------------------------------ supervised restart

def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"event"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _wait_for(pred: Any, timeout_s: float, proc: subprocess.Popen[str] | None = None) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return bool(pred())
        time.sleep(0.2)
    return False


def test_stopping_a_server_ends_live_streams_as_unavailable_and_exits_cleanly(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """SIGINT (a rolling update) with two streams in flight. Triton 2.51 does not count a
    decoupled BLS model's streams as in-flight requests and unloads every model at once, so
    each stream's next stage answers "Server not ready": each stream ends with UNAVAILABLE
    (retry on another server), not INTERNAL. No model process crashes on its way out (before
    the entry models joined their threads in finalize, their stubs died with "Fatal Python
    error: Segmentation fault" at every stop of a server that had served requests), and the
    server exits before its exit timeout."""
    srv = serve_profile(small_artifacts, tmp_path)
    streams: list[Stream] = []
    try:
        streams = [Stream(f"127.0.0.1:{srv.grpc_port}", "停止时还在播放的流。", i, 2000, request_id=f"live-{i}").start()
                   for i in range(2)]
        for s in streams:
            assert s.first_chunk.wait(60) and s.error is None, s.error
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        for s in streams:
            assert s.done.wait(60)
            assert s.error is not None and s.error.startswith("[unavailable]"), s.error
            s.close()  # an open gRPC stream keeps the model it called loaded (Triton 2.51)
        stopper.join(60)
        assert not stopper.is_alive()
    finally:
        for s in streams:
            s.close()
        srv.stop()
    log = srv.log_path.read_text(errors="replace")
    assert "Fatal Python error" not in log and "Exit timeout expired" not in log


def test_the_drain_returns_once_the_requests_in_flight_have_finished(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """The preStop drain (deploy/drain.py) waits for a live stream to finish with its audio,
    reports a stream that outlasts its timeout (exit code 1 from the command line), and counts
    an unreachable server as drained."""
    from chattts_serving.deploy.drain import drain
    from chattts_serving.deploy.drain import main as drain_main

    srv = serve_profile(small_artifacts, tmp_path)
    metrics = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    grpc = f"127.0.0.1:{srv.grpc_port}"
    try:
        short = Stream(grpc, "排空前的最后一句话。", 1, 200, request_id="drain-short").start()
        assert short.first_chunk.wait(60) and short.error is None, short.error
        result = drain(metrics, timeout_s=120, interval_s=0.1)
        assert result.drained and result.active == 0, result
        assert short.done.is_set() and short.error is None and short.audio.size > 0, short.error
        short.close()

        long = Stream(grpc, "排空时还很长的流。", 2, 2000, request_id="drain-long").start()
        try:
            assert long.first_chunk.wait(60) and long.error is None, long.error
            assert drain_main(["--metrics-url", metrics, "--timeout-s", "0.3", "--interval-s", "0.1"]) == 1
            assert not long.done.is_set()
        finally:
            long.close()
    finally:
        srv.stop()
    gone = drain(metrics, timeout_s=5)
    assert gone.drained and gone.active == -1 and "unreachable" in gone.reason
    with pytest.raises(SystemExit) as usage:
        drain_main(["--interval-s", "0"])
    assert usage.value.code == 2


def test_supervised_server_restarts_itself_after_the_engine_dies(small_artifacts: Artifacts, tmp_path: Path) -> None:
    text = (PROFILES_DIR / "cpu.toml").read_text()
    for old, new in (("interval_s = 5.0", "interval_s = 0.5"), ("failures = 3 ", "failures = 2 "),
                     ("probe_every = 6", "probe_every = 4"), ("probe_timeout_s = 20.0", "probe_timeout_s = 60.0")):
        assert old in text
        text = text.replace(old, new)
    profile = tmp_path / "fast-health.toml"
    profile.write_text(text)
    assert load_profile(profile).health.interval_s == 0.5
    ports = free_port(), free_port(), free_port()
    events = tmp_path / "serve.stderr"
    with events.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chattts_serving.deploy.serve", "--profile", str(profile), "--artifacts",
             str(small_artifacts.root), "--repo", str(tmp_path / "repo"), "--http-port", str(ports[0]),
             "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--log", str(tmp_path / "triton.log"),
             "--restart-on-failure"],
            stdout=subprocess.PIPE, stderr=err, text=True)
    grpc = f"127.0.0.1:{ports[1]}"
    request = SynthesisRequest(text="自动恢复。", max_new_tokens=4, min_new_tokens=4)
    shm_at_start = set(glob.glob(SHM_GLOB))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line, (line, events.read_text())
        assert _wait_for(lambda: any(e["event"] == "supervisor_started" for e in _events(events)), 60, proc)
        assert synthesize_stream(grpc, request, timeout_s=60).audio.size > 0
        pid = _engine_stub_pid((tmp_path / "repo").resolve())
        assert pid is not None
        first_regions = _shm_regions((tmp_path / "repo").resolve())
        assert first_regions and all(os.path.exists(f) for f in first_regions)
        os.kill(pid, signal.SIGKILL)
        assert _wait_for(lambda: any(e["event"] == "server_restarted" for e in _events(events)), 300, proc), \
            events.read_text()[-3000:]
        assert proc.poll() is None
        # no manual step: the same ports serve again, with a new engine process
        again = synthesize_stream(grpc, request, timeout_s=60)
        assert again.audio.size > 0
        new_pid = _engine_stub_pid((tmp_path / "repo").resolve())
        assert new_pid is not None and new_pid != pid
        leaked = [f for f in first_regions if os.path.exists(f)]
        assert not leaked, f"the first server's shared memory was left behind: {leaked}"
        # tritonserver itself SIGKILLed: its stubs die after it, and their regions go with the restart too
        second_regions = _shm_regions((tmp_path / "repo").resolve())
        server_pid = subprocess.run(["pgrep", "-f", "--", f"--model-repository={(tmp_path / 'repo').resolve()}"],
                                    capture_output=True, text=True).stdout.split()
        assert second_regions and len(server_pid) == 1, server_pid
        os.kill(int(server_pid[0]), signal.SIGKILL)
        assert _wait_for(lambda: [e["event"] for e in _events(events)].count("server_restarted") == 2, 300, proc), \
            events.read_text()[-3000:]
        assert synthesize_stream(grpc, request, timeout_s=60).audio.size > 0
        leaked = [f for f in second_regions if os.path.exists(f)]
        assert not leaked, f"the killed server's shared memory was left behind: {leaked}"
        orphans = [f for f in set(glob.glob(SHM_GLOB)) - shm_at_start if not _region_in_use(f)]
        assert not orphans, f"shared memory no process holds: {orphans}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = _events(events)
    names = [e["event"] for e in log]
    assert names[0] == "supervisor_started" and log[0]["stubs"][contract.MODEL_ENGINE] == 1
    failed = names.index("health_check_failed")
    restarting, restarted = names.index("server_restarting"), names.index("server_restarted")
    assert failed < restarting < restarted
    assert contract.MODEL_ENGINE in log[restarting]["reason"] and contract.MODEL_ENGINE in log[failed]["reason"]
    assert log[restarted]["restarts"] == 1 and "server_restart_failed" not in names
    # the server log keeps both runs (a restart appends)
    assert (tmp_path / "triton.log").read_text(errors="replace").count("Started GRPCInferenceService") == 3
