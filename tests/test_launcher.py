"""``chattts-serve`` (``make serve``): renders, serves until a signal, stops cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from conftest import free_port

from chattts_serving import contract
from chattts_serving.runtime import Artifacts

pytestmark = pytest.mark.server


def test_serve_runs_until_sigterm_and_stops_cleanly(small_artifacts: Artifacts, tmp_path: Path) -> None:
    ports = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chattts_serving.deploy.server", "--artifacts", str(small_artifacts.root),
         "--repo", str(tmp_path / "repo"), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
         "--metrics-port", str(ports[2]), "--log", str(tmp_path / "server.log")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line, line
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        try:
            assert client.is_server_ready()
            assert all(client.is_model_ready(m) for m in contract.ALL_MODELS)
        finally:
            client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", ports[1])) != 0:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the gRPC port is still open after the server stopped")


def test_unknown_profile_is_one_clear_error(small_artifacts: Artifacts) -> None:
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.deploy.server", "--profile", "nope",
                           "--artifacts", str(small_artifacts.root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no profile 'nope'" in proc.stderr and "Traceback" not in proc.stderr
