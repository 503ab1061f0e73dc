"""The server under test: the profile's repository rendered, the bundled tritonserver started
on free ports and warmed up, and its log scanned for crash signs when it stops."""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .config import Config


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(profile: Any, cfg: Config, log_name: str, sentences: list[str],
            progress: Callable[[str], None]) -> Iterator[Any]:
    """Render ``profile`` over the artifacts, start the bundled tritonserver on free ports
    (its log at ``<out>/<log_name>``), yield a warmed-up
    :class:`~bench.serverload.ServerSession` (its ``started_s`` and
    ``triton_version`` set), and stop the server at the end."""
    from chattts_serving.deploy.render import render_repository
    from chattts_serving.deploy.server import TritonServer

    from .serverload import ServerSession, TreeMonitor, warm_up

    with tempfile.TemporaryDirectory(prefix="chattts-bench-") as tmp:
        repo = Path(tmp) / "model_repository"
        render_repository(profile, cfg.artifacts, repo)
        ports = free_port(), free_port(), free_port()
        progress(f"server: starting tritonserver for {profile.name} (HTTP {ports[0]}, gRPC {ports[1]}, "
                 f"metrics {ports[2]})")
        t = time.perf_counter()
        srv = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                           log_path=cfg.out / log_name, build_dir=Path(tmp) / "build")
        try:  # not `with`: an interrupt inside start() must stop the half-started server too
            srv.start()
            started_s = time.perf_counter() - t
            assert srv.proc is not None
            monitor = TreeMonitor(srv.proc.pid).start()
            try:
                session = ServerSession(f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}/metrics", monitor,
                                        sentences, str(cfg.voice_seed), profile, progress=progress)
                session.started_s = started_s
                session.triton_version = _triton_version(ports[0])
                warm_up(session, max(cfg.levels), cfg.tokens)
                yield session
            finally:
                monitor.stop()
        finally:
            srv.stop()
            _scan_server_log(cfg.out / log_name, progress)


SERVER_CRASH_SIGNS: list[str] = []
"""Crash signs (:mod:`chattts_serving.deploy.logscan`) found in the logs of this run's servers:
any fails the benchmark, whatever its figures."""


def _scan_server_log(log: Path, progress: Callable[[str], None]) -> None:
    from chattts_serving.deploy.logscan import fatal_lines

    signs = fatal_lines(log.read_text(errors="replace")) if log.is_file() else []
    for line in signs:
        progress(f"server log {log.name} shows a crash: {line}")
    SERVER_CRASH_SIGNS.extend(f"{log.name}: {line}" for line in signs)


def _triton_version(http_port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2", timeout=5) as r:
            return str(json.loads(r.read()).get("version"))
    except (OSError, ValueError):
        return None
