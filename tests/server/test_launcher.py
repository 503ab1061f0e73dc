"""``chattts-serve`` (``make serve``): renders, serves until a signal, stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from chattts_serving import contract
from chattts_serving.deploy import admin
from chattts_serving.runtime import Artifacts
from tests.support.servers import free_port


def test_serve_runs_until_sigterm_and_stops_cleanly(small_artifacts: Artifacts, tmp_path: Path) -> None:
    """Also: with no admin token configured, one is generated, printed once on stderr, and the
    admin APIs answer only with it."""
    ports = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != admin.TOKEN_ENV}
    env[admin.TOKEN_FILE_ENV] = str(tmp_path / "admin-token")
    stderr = tmp_path / "serve.stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chattts_serving.deploy.serve", "--artifacts", str(small_artifacts.root),
             "--repo", str(tmp_path / "repo"), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
             "--metrics-port", str(ports[2]), "--log", str(tmp_path / "server.log")],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line, (line, stderr.read_text())
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        try:
            assert client.is_server_ready()
            assert all(client.is_model_ready(m) for m in contract.ALL_MODELS)
            announced = [ln for ln in stderr.read_text().splitlines() if "admin token generated" in ln]
            assert len(announced) == 1, stderr.read_text()
            token = announced[0].rsplit(" ", 1)[-1]
            assert admin.token_from_env({admin.TOKEN_FILE_ENV: env[admin.TOKEN_FILE_ENV]}) == token
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_model_repository_index()
            index = client.get_model_repository_index(headers=admin.http_headers(token))
            assert {m["name"] for m in index} == set(contract.ALL_MODELS)
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
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.deploy.serve", "--profile", "nope",
                           "--artifacts", str(small_artifacts.root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no profile 'nope'" in proc.stderr and "Traceback" not in proc.stderr
