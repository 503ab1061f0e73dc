"""Shared fixtures: generated small-config artifacts and a real tritonserver serving them.

Artifacts are exported once into ``build/test/`` and reused across runs while their inputs
hash the same (the exporter's own up-to-date check). The server fixture renders the model
repository with the ``cpu`` profile and starts the bundled tritonserver on free ports.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib

from chattts_serving.deploy.logscan import LogScanner
from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.export.build import export_artifacts
from chattts_serving.export.weights import generate_checkpoint, read_sizes
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import PROFILES_DIR, Profile, load_profile

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "test"
SMALL_SEED = 0


CRASH_MARKERS = ("Fatal Python error", "Segmentation fault", "is not healthy", "terminate called")
"""Server-log lines that say a stub process crashed (faulthandler's report, Triton's verdict)."""


def _servers_in(value: Any) -> list[TritonServer]:
    """The TritonServers a fixture value holds: itself, a ``Server``'s, or a dict's values."""
    if isinstance(value, TritonServer):
        return [value]
    if isinstance(getattr(value, "server", None), TritonServer):
        return [value.server]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, TritonServer)]
    return []


def server_log_report(server: TritonServer, tail_lines: int = 40, crash_lines: int = 80) -> str:
    """What a failing test's report shows of ``server``'s log: the first crash report (from
    the first line with a :data:`CRASH_MARKERS` entry, ``crash_lines`` long) and the last
    ``tail_lines`` lines. Empty when the server has no log file."""
    if server.log_path is None or not Path(server.log_path).is_file():
        return ""
    lines = Path(server.log_path).read_text(errors="replace").splitlines()
    first = next((i for i, line in enumerate(lines) if any(m in line for m in CRASH_MARKERS)), None)
    parts = []
    if first is not None:
        parts.append("--- first crash report ---\n" + "\n".join(lines[first:first + crash_lines]))
    parts.append(f"--- last {tail_lines} lines ---\n" + "\n".join(lines[-tail_lines:]))
    return f"{server.log_path}\n" + "\n".join(parts)


_SCANNERS: dict[int, LogScanner] = {}


def _new_fatal_lines(server: TritonServer) -> list[str]:
    """Crash signs (:mod:`chattts_serving.deploy.logscan`) written to ``server``'s log since the
    last look; none for a server whose test breaks it on purpose (``expect_fatal``)."""
    if server.log_path is None or getattr(server, "expect_fatal", False):
        return []
    scanner = _SCANNERS.setdefault(id(server), LogScanner(Path(server.log_path)))
    return scanner.new_fatal_lines()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test that used a real server fails when that server's log shows a crash or a
    corrupted heap while it ran (or, for a fixture's server, at its stop): such a server may
    live on and pass the test's checks. A failing test that used a real server gets that
    server's log (crash report and tail) as a report section: CI keeps only pytest's output,
    and a stub that died says why only there."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("call", "teardown") and not report.failed:
        signs = [(srv, line) for value in getattr(item, "funcargs", {}).values()
                 for srv in _servers_in(value) for line in _new_fatal_lines(srv)]
        if signs:
            report.outcome = "failed"
            report.longrepr = "the server log shows a crash:\n" + "\n".join(
                f"{srv.log_path}: {line}" for srv, line in signs[:20])
    if not report.failed:
        return
    seen: set[int] = set()
    for value in getattr(item, "funcargs", {}).values():
        for server in _servers_in(value):
            if id(server) not in seen and (text := server_log_report(server)):
                seen.add(id(server))
                report.sections.append(("tritonserver log", text))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_profile(artifacts: Artifacts, work: Path, **changes: dict[str, Any]) -> TritonServer:
    """A started tritonserver over ``artifacts`` with the ``cpu`` profile changed by table
    (``entry={"max_concurrent_streams": 1}``), its repository and log under ``work``, on free
    ports. The caller stops it."""
    data = tomllib.loads((PROFILES_DIR / "cpu.toml").read_text())
    for table, values in changes.items():
        data[table].update(values)
    render_repository(Profile.model_validate(data), artifacts.root, work / "repo")
    srv = TritonServer(work / "repo", http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                       log_path=work / "tritonserver.log", build_dir=work / "build")
    return srv.start()


@pytest.fixture(scope="session", autouse=True)
def _private_voice_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Gateways the tests start keep saved voices in a SQLite file of this session (the
    default store is a file in the user's home, which a developer's own voices would share)."""
    import os

    old = os.environ.get("CHATTTS_VOICE_STORE")
    os.environ["CHATTTS_VOICE_STORE"] = f"sqlite:///{tmp_path_factory.mktemp('voice-store') / 'voices.sqlite3'}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CHATTTS_VOICE_STORE", None)
        else:
            os.environ["CHATTTS_VOICE_STORE"] = old


@pytest.fixture(scope="session")
def small_weights() -> Path:
    """A generated small-config checkpoint in ChatTTS' published layout."""
    root = BUILD / "weights-small"
    sizes = read_sizes(root / "asset") if (root / "asset").is_dir() else None
    if sizes is None or sizes.name != "small":
        generate_checkpoint(root, "small", SMALL_SEED)
    return root


@pytest.fixture(scope="session")
def small_artifacts(small_weights: Path) -> Artifacts:
    """The small checkpoint exported to ONNX (reused when up to date)."""
    out, _ = export_artifacts(small_weights, BUILD / "artifacts-small",
                              source={"kind": "synthetic", "size": "small", "seed": SMALL_SEED})
    return Artifacts.load(out)


@pytest.fixture(scope="session")
def small_int8_artifacts(small_artifacts: Artifacts, small_weights: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """A copy of the small artifacts plus their int8 GPT graph (``chattts-export --precision int8``)."""
    import shutil

    from chattts_serving.export.variants import ensure_precision

    root = tmp_path_factory.mktemp("int8") / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    assert ensure_precision(root, small_weights, "int8")
    return Artifacts.load(root)


@pytest.fixture(scope="session")
def small_chat(small_weights: Path):  # type: ignore[no-untyped-def]
    """The small checkpoint loaded through ChatTTS itself (the reference)."""
    from chattts_serving.export.weights import load_chat

    return load_chat(small_weights)


@dataclass(frozen=True)
class Server:
    """A running test server: its ports and the server object."""

    http_port: int
    grpc_port: int
    metrics_port: int
    server: TritonServer
    artifacts: Artifacts
    log_path: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def admin_token(self) -> str:
        """The header value the server's admin APIs need (generated for it unless configured)."""
        return self.server.admin_token


@pytest.fixture(scope="session")
def triton_server(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real tritonserver on the rendered ``cpu`` repository over the small artifacts."""
    work = tmp_path_factory.mktemp("triton")
    repo = work / "model_repository"
    render_repository(load_profile("cpu"), small_artifacts.root, repo)
    ports = free_port(), free_port(), free_port()
    log_path = work / "tritonserver.log"
    srv = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], log_path=log_path,
                       build_dir=work / "build")
    srv.start()
    try:
        yield Server(*ports, server=srv, artifacts=small_artifacts, log_path=log_path)
    finally:
        srv.stop()


def metric(port: int, name: str, **labels: str) -> float:
    """Sum of the series of ``name`` on a tritonserver's metrics ``port`` whose labels include ``labels``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:{{(.*)}})? (\S+)", line)
        if m and labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")).items():
            total += float(m.group(2))
    return total


# Two syntheses of the same request may differ by float noise (the stream's chunk windows
# follow the client's pace, and ORT's results depend on the batch a window shared), which
# flips a PCM16 rounding now and then: CI saw one sample one LSB apart. "The same audio" is
# within this many LSB (1.2e-4 of full scale, the float tests' 1e-4); different prompts differ
# by thousands.
SAME_PCM16_LSB = 4


def pcm16_gap(a: bytes, b: bytes) -> float:
    """The largest difference in LSB between two little-endian int16 PCM byte strings; inf
    when their lengths differ."""
    x, y = np.frombuffer(a, "<i2").astype(np.int32), np.frombuffer(b, "<i2").astype(np.int32)
    return float(np.abs(x - y).max(initial=0)) if x.shape == y.shape else float("inf")


def stub_processes(server: Server) -> dict[str, Any]:
    """The Python backend stubs of a running test server, as ``psutil.Process`` keyed by the
    model each serves (its command line holds ``<repo>/<model>/1/model.py``)."""
    import psutil

    proc = server.server.proc
    assert proc is not None
    out = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        args = child.cmdline()
        if child.name() == "triton_python_backend_stub" and len(args) > 1:
            out[Path(args[1]).parent.parent.name] = child
    return out


def wait_until(pred: Any, timeout_s: float = 60.0) -> bool:
    """Poll ``pred`` until it is true (True) or ``timeout_s`` passed (its last value)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


@contextmanager
def running_gateway(settings: Any) -> Iterator[str]:
    """The OpenAI gateway app for ``settings`` (a ``GatewaySettings``) served by uvicorn in a
    thread; yields its base URL and stops it afterwards."""
    import uvicorn

    from chattts_serving.gateway import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
