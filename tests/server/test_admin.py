"""Triton's admin APIs need the admin token header; inference, health and metadata stay open.

Against the session's real tritonserver (started through ``TritonServer``, which always
restricts :data:`chattts_serving.deploy.admin.RESTRICTED_APIS`) over HTTP and gRPC, with the
probe and the supervisor; and ``chattts-tritonserver``, the image's command, run on an empty
repository, generating and sharing a token.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from chattts_serving import contract
from chattts_serving.client import SynthesisRequest, synthesize_offline, synthesize_sse, synthesize_stream
from chattts_serving.deploy import admin
from chattts_serving.deploy.probe import probe
from chattts_serving.deploy.server import bundled_triton
from chattts_serving.deploy.supervisor import Supervisor
from chattts_serving.serving.profile import HealthProfile
from tests.support.admin_calls import ADMIN_GRPC, ADMIN_HTTP
from tests.support.servers import Server, free_port

REFUSED_HTTP = f"This API is restricted, expecting header '{admin.ADMIN_HEADER}'"
REFUSED_GRPC = f"This protocol is restricted, expecting header '{admin.GRPC_ADMIN_HEADER}'"


def _http(server: Server, method: str, path: str, body: object = None,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return int(r.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"null")


@pytest.fixture
def grpc_client(triton_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        yield client
    finally:
        client.close()


def test_http_admin_calls_are_refused_without_the_token_and_work_with_it(triton_server: Server) -> None:
    good = admin.http_headers(triton_server.admin_token)
    wrong = admin.http_headers("x" * 32)
    for group, method, path, body in ADMIN_HTTP:
        for headers in (None, wrong):
            status, answer = _http(triton_server, method, path, body, headers)
            assert (status, answer) == (403, {"error": REFUSED_HTTP}), (group, headers, status, answer)
        status, answer = _http(triton_server, method, path, body, good)
        assert status == 200, (group, status, answer)
    # header names are case-insensitive over HTTP
    upper = {admin.ADMIN_HEADER.upper(): triton_server.admin_token}
    assert _http(triton_server, "GET", "/v2/logging", None, upper)[0] == 200


def test_log_verbosity_changes_only_with_the_token(triton_server: Server) -> None:
    good = admin.http_headers(triton_server.admin_token)
    try:
        status, answer = _http(triton_server, "POST", "/v2/logging", {"log_verbose_level": 1})
        assert (status, answer) == (403, {"error": REFUSED_HTTP})
        assert _http(triton_server, "GET", "/v2/logging", None, good)[1]["log_verbose_level"] == 0  # not applied
        status, answer = _http(triton_server, "POST", "/v2/logging", {"log_verbose_level": 1}, good)
        assert status == 200 and answer["log_verbose_level"] == 1
        assert _http(triton_server, "GET", "/v2/logging", None, good)[1]["log_verbose_level"] == 1
    finally:
        _http(triton_server, "POST", "/v2/logging", {"log_verbose_level": 0}, good)


def test_grpc_admin_calls_are_refused_without_the_token_and_work_with_it(
        triton_server: Server, grpc_client: grpcclient.InferenceServerClient) -> None:
    # the HTTP header's name is not enough over gRPC: Triton wants it behind its prefix
    for group, call in ADMIN_GRPC.items():
        for headers in (None, admin.grpc_headers("x" * 32), admin.http_headers(triton_server.admin_token)):
            with pytest.raises(InferenceServerException) as exc:
                call(grpc_client, headers)
            assert exc.value.status() == "StatusCode.UNAVAILABLE", (group, headers)
            assert REFUSED_GRPC in exc.value.message(), (group, exc.value.message())
        assert call(grpc_client, admin.grpc_headers(triton_server.admin_token)) is not None, group
    answer = grpc_client.update_log_settings({"log_verbose_level": 0},
                                             headers=admin.grpc_headers(triton_server.admin_token))
    assert answer.settings["log_verbose_level"].uint32_param == 0


def test_inference_health_metadata_and_model_config_stay_open(
        triton_server: Server, grpc_client: grpcclient.InferenceServerClient) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{contract.MODEL_STREAM}",
                 f"/v2/models/{contract.MODEL_STREAM}/ready", f"/v2/models/{contract.MODEL_STREAM}/config"):
        status, answer = _http(triton_server, "GET", path)
        assert status == 200, (path, answer)
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    assert grpc_client.get_server_metadata().version
    assert grpc_client.get_model_metadata(contract.MODEL_STREAM).name == contract.MODEL_STREAM
    assert grpc_client.get_model_config(contract.MODEL_OFFLINE).config.name == contract.MODEL_OFFLINE
    http = httpclient.InferenceServerClient(triton_server.http_url)
    try:
        assert http.is_server_ready() and http.get_model_metadata(contract.MODEL_OFFLINE)["name"]
    finally:
        http.close()
    request = SynthesisRequest(text="开放的推理。", max_new_tokens=4, min_new_tokens=4)
    for synthesize, url in ((synthesize_stream, triton_server.grpc_url), (synthesize_sse, triton_server.http_url),
                            (synthesize_offline, triton_server.http_url)):
        assert synthesize(url, request, timeout_s=60).audio.size > 0, synthesize.__name__


def test_the_probe_and_the_supervisor_send_the_token(triton_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(admin.TOKEN_ENV, raising=False)
    monkeypatch.setenv(admin.TOKEN_FILE_ENV, "/nonexistent/admin-token")
    urls = triton_server.http_url, triton_server.grpc_url
    blind = probe(*urls, timeout_s=60, synthesis=False)
    assert not blind.healthy and blind.reason == f"models: repository index answered 403 (no admin token: set " \
                                                  f"{admin.TOKEN_ENV})", blind.reason
    wrong = probe(*urls, timeout_s=60, synthesis=False, admin_token="y" * 32)
    assert not wrong.healthy and "the admin token is wrong" in wrong.reason
    assert probe(*urls, timeout_s=60, synthesis=False, admin_token=triton_server.admin_token).healthy
    monkeypatch.setenv(admin.TOKEN_ENV, triton_server.admin_token)  # the CLI's and the containers' way
    assert probe(*urls, timeout_s=60, synthesis=False).healthy
    monkeypatch.delenv(admin.TOKEN_ENV)
    # the supervisor's deep probe uses the token of the server it supervises
    check = Supervisor(triton_server.server, HealthProfile(interval_s=1.0, failures=1, probe_every=1,
                                                          probe_timeout_s=60.0)).check(with_probe=True)
    assert check.ok and check.probed, check.reason


def _wait_ready(port: int, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail("chattts-tritonserver did not become ready")


def test_chattts_tritonserver_generates_prints_and_shares_a_token(tmp_path: Path) -> None:
    """The image's command with no token configured: one is generated, printed once on stderr
    and written to the token file (0600), where the probe in the container reads it."""
    empty = tmp_path / "repo"
    empty.mkdir()
    token_file = tmp_path / "admin-token"
    env = {k: v for k, v in os.environ.items() if k != admin.TOKEN_ENV}
    env.update({admin.TOKEN_FILE_ENV: str(token_file),
                admin.TRITONSERVER_ENV: str(bundled_triton() / "bin" / "tritonserver")})
    http_port, grpc_port = free_port(), free_port()
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chattts_serving.deploy.container", f"--model-repository={empty}",
             f"--http-port={http_port}", f"--grpc-port={grpc_port}", "--allow-metrics=false"],
            stdout=subprocess.DEVNULL, stderr=err, env=env, text=True)
    try:
        _wait_ready(http_port, proc)
        token = admin.token_from_env({admin.TOKEN_FILE_ENV: str(token_file)})
        assert token and len(token) >= 32
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        announced = [line for line in stderr.read_text().splitlines() if token in line]
        assert len(announced) == 1 and "generated" in announced[0], stderr.read_text()
        url = f"http://127.0.0.1:{http_port}/v2/logging"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 403
        with urllib.request.urlopen(urllib.request.Request(url, headers=admin.http_headers(token)), timeout=10) as r:
            assert r.status == 200
        proc.terminate()  # passed on to tritonserver's own graceful stop; its exit code is the command's
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


