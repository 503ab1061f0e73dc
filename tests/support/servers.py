"""Real servers for the tests: one function that renders a profile with overrides and starts
tritonserver on free ports (:func:`serve_profile`), the :class:`Server` a fixture hands out, and
the helpers that talk to one (metrics, stub processes, a gateway in a thread, polling)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import PROFILES_DIR, Profile

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root."""
BUILD = ROOT / "build" / "test"
"""Where the tests keep what they build (generated weights, exported artifacts)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REQUEST_DETERMINED_CHUNKS = {"stream": {"slow_stream_growth": 0.0}}
"""Profile changes every test server starts with (a test's own changes come after): chunks
sized by the request alone. With ``slow_stream_growth`` a stream that a loaded test machine
happens to measure slower than real time moves its seams, and the tests that compare two
streams' chunks and audio exactly would depend on timing; tests/unit/test_chunking.py tests
slow growth itself, the benchmark measures it (``vocoded_tokens_per_token``)."""


def profile_server(artifacts: Artifacts, work: Path, profile: str = "cpu",
                   prepare: Callable[[Path], None] | None = None, **changes: dict[str, Any]) -> TritonServer:
    """A tritonserver, not started, over ``artifacts`` with the profile ``profile``
    (``profiles/<name>.toml``) changed by :data:`REQUEST_DETERMINED_CHUNKS`, then by table
    (``entry={"max_concurrent_streams": 1}``), its
    repository (``work/repo``), build folder and log under ``work``, on free ports;
    ``prepare(work)`` runs after the repository is rendered (a test's own model beside the
    others)."""
    data = tomllib.loads((PROFILES_DIR / f"{profile}.toml").read_text())
    for table, values in [*REQUEST_DETERMINED_CHUNKS.items(), *changes.items()]:
        data[table].update(values)
    render_repository(Profile.model_validate(data), artifacts.root, work / "repo")
    if prepare is not None:
        prepare(work)
    return TritonServer(work / "repo", http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                        log_path=work / "tritonserver.log", build_dir=work / "build")


def serve_profile(artifacts: Artifacts, work: Path, profile: str = "cpu",
                  prepare: Callable[[Path], None] | None = None, **changes: dict[str, Any]) -> TritonServer:
    """:func:`profile_server`, started. The caller stops it. Every test that starts a server
    through Python starts it here."""
    return profile_server(artifacts, work, profile, prepare, **changes).start()


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

    @classmethod
    def of(cls, srv: TritonServer, artifacts: Artifacts) -> Server:
        """The :class:`Server` of a started ``srv``."""
        assert srv.log_path is not None
        return cls(srv.http_port, srv.grpc_port, srv.metrics_port, server=srv, artifacts=artifacts,
                   log_path=Path(srv.log_path))



def stream_24_tokens(artifacts: Artifacts, work: Path, profile: str) -> tuple[Any, str]:
    """Serve ``profile`` over ``artifacts`` (in ``work``), stream one fixed 24-token request over
    gRPC, stop the server, and check the stream came whole (2+ chunks, exactly 24 tokens of
    finite audio); returns (the client's SynthesisResult, the server's log text)."""
    from chattts_serving import contract
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    srv = serve_profile(artifacts, work, profile=profile)
    try:
        res = synthesize_stream(f"127.0.0.1:{srv.grpc_port}", SynthesisRequest(
            text="你好，欢迎使用流式语音合成服务。", seed=1, max_new_tokens=24, min_new_tokens=24))
    finally:
        srv.stop()
    assert res.chunks >= 2
    assert res.audio.size == contract.samples_for_tokens(24) and np.isfinite(res.audio).all()
    return res, (work / "tritonserver.log").read_text(errors="replace")

def metric(port: int, name: str, require: bool = False, **labels: str) -> float:
    """Sum of the series of ``name`` on a tritonserver's metrics ``port`` whose labels include
    ``labels``; with ``require``, a scrape without such a series fails instead of reading 0."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:{{(.*)}})? (\S+)", line)
        if m and labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")).items():
            total += float(m.group(2))
            found = True
    assert found or not require, f"no {name} series {labels or ''} in the scrape"
    return total


def log_events(log_path: Path | str) -> list[dict[str, Any]]:
    """Every structured event of a server log (lines that are JSON objects with an event)."""
    events = []
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        if '"event":' not in line:
            continue
        record = json.loads(line)  # a line that mentions an event must be exactly one JSON object
        assert isinstance(record, dict), line
        events.append(record)
    return events


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
