"""Where a server listens and who may run inference on it, over real tritonservers.

The session's server (``TritonServer``'s defaults) binds loopback only. A server started with
an inference key (``$CHATTTS_INFERENCE_KEY``) refuses inference without it on every path a
client takes (gRPC stream, HTTP generate_stream and /infer, the gateway, the admission watch,
the probe, ``chattts-client``) and says "inference key required"; health, metadata and
metrics stay open. Its models load explicitly, so the admin token can unload and load one:
after a model process is killed, unload then load starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import tritonclient.grpc as grpcclient

from chattts_serving import contract
from chattts_serving.client import (
    AioStreamClient,
    ClientError,
    SynthesisRequest,
    synthesize_offline,
    synthesize_sse,
    synthesize_stream,
)
from chattts_serving.client import cli as client_cli
from chattts_serving.client.admission_watch import AdmissionWatch
from chattts_serving.client.keys import INFERENCE_HEADER, INFERENCE_KEY_ENV, INFERENCE_KEY_FILE_ENV
from chattts_serving.deploy import admin
from chattts_serving.deploy.probe import probe
from chattts_serving.errors import ErrorKind
from chattts_serving.gateway.settings import GatewaySettings
from chattts_serving.runtime import Artifacts
from tests.support.servers import Server, running_gateway, serve_profile, wait_until

KEY = "inference-key-for-tests-0123456789"
REQUEST = SynthesisRequest(text="你好。", max_new_tokens=4, min_new_tokens=4)


def _non_loopback_ipv4() -> list[str]:
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


def _listening(pid: int) -> dict[int, str]:
    """port -> local address of every listening TCP socket of process ``pid``."""
    return {c.laddr.port: c.laddr.ip for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_the_ports_bind_loopback_by_default(triton_server: Server) -> None:
    proc = triton_server.server.proc
    assert proc is not None
    listening = _listening(proc.pid)
    for port in (triton_server.http_port, triton_server.grpc_port, triton_server.metrics_port):
        # gRPC listens on an IPv6 socket holding the IPv4-mapped loopback address
        assert listening.get(port) in ("127.0.0.1", "::ffff:127.0.0.1"), (port, listening)
        for address in _non_loopback_ipv4():
            with socket.socket() as s, pytest.raises(ConnectionRefusedError):
                s.settimeout(5)
                s.connect((address, port))


@pytest.fixture(scope="module")
def keyed(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose inference needs :data:`KEY` (given the operator's way, the environment);
    the environment holds no key while the tests run."""
    old = os.environ.get(INFERENCE_KEY_ENV)
    os.environ[INFERENCE_KEY_ENV] = KEY
    try:
        srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("keyed"))
    finally:
        if old is None:
            del os.environ[INFERENCE_KEY_ENV]
        else:
            os.environ[INFERENCE_KEY_ENV] = old
    try:
        assert srv.inference_key == KEY
        yield Server.of(srv, small_artifacts)
    finally:
        srv.stop()


@pytest.fixture(autouse=True)
def _no_configured_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INFERENCE_KEY_ENV, raising=False)
    monkeypatch.delenv(INFERENCE_KEY_FILE_ENV, raising=False)


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


CORE_QUIRK = "Internal error from Core"
"""What Triton 2.51 sometimes answers a gRPC stream it refuses for its key instead of the
refusal (docs/operations.md, "Who can reach what"); a later request gets the refusal."""


def _refused(exc: ClientError, sent: bool) -> None:
    assert exc.message.startswith("inference key required"), exc.message
    assert ("refused the key this client sent" in exc.message) == sent, exc.message
    assert KEY not in exc.message
    # not "server busy" (Triton's own status, UNAVAILABLE) and not "unreachable"
    assert exc.kind not in (ErrorKind.BUSY, ErrorKind.UNAVAILABLE) and not exc.connection


def test_health_metadata_and_metrics_stay_open(keyed: Server) -> None:
    base = f"http://{keyed.http_url}"
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{contract.MODEL_STREAM}",
                 f"/v2/models/{contract.MODEL_STREAM}/ready", f"/v2/models/{contract.MODEL_STREAM}/config"):
        assert _get(base + path) == 200, path
    assert _get(f"http://127.0.0.1:{keyed.metrics_port}/metrics") == 200
    client = grpcclient.InferenceServerClient(keyed.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_model_metadata(contract.MODEL_STREAM).name == contract.MODEL_STREAM
        assert client.get_model_config(contract.MODEL_OFFLINE).config.name == contract.MODEL_OFFLINE
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "sse", "http"])
def test_inference_needs_the_key_on_every_protocol(keyed: Server, protocol: str) -> None:
    synthesize, url = {"grpc": (synthesize_stream, keyed.grpc_url), "sse": (synthesize_sse, keyed.http_url),
                       "http": (synthesize_offline, keyed.http_url)}[protocol]
    with pytest.raises(ClientError) as missing:
        synthesize(url, REQUEST, timeout_s=60, inference_key="")  # type: ignore[operator]
    _refused(missing.value, sent=False)
    with pytest.raises(ClientError) as wrong:
        synthesize(url, REQUEST, timeout_s=60, inference_key="w" * 32)  # type: ignore[operator]
    _refused(wrong.value, sent=True)
    assert synthesize(url, REQUEST, timeout_s=60, inference_key=KEY).audio.size > 0  # type: ignore[operator]


def test_the_configured_key_is_sent_and_the_raw_refusal_is_triton_s(
        keyed: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Triton's own answer to a bare generate_stream: 403 naming the header
    r = httpx.post(f"http://{keyed.http_url}/v2/models/{contract.MODEL_STREAM}/generate_stream",
                   json=REQUEST.json_inputs(), timeout=60)
    assert r.status_code == 403 and INFERENCE_HEADER in r.json()["error"]
    key_file = tmp_path / "inference-key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv(INFERENCE_KEY_FILE_ENV, str(key_file))  # a mounted secret
    assert synthesize_stream(keyed.grpc_url, REQUEST, timeout_s=60).audio.size > 0
    monkeypatch.delenv(INFERENCE_KEY_FILE_ENV)
    monkeypatch.setenv(INFERENCE_KEY_ENV, KEY)
    assert synthesize_sse(keyed.http_url, REQUEST, timeout_s=60).audio.size > 0


def test_the_client_cli_says_inference_key_required(keyed: Server, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    argv = ["--url", keyed.grpc_url, "--text", "你好。", "--max-new-tokens", "4", "--out", str(out)]
    assert client_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("chattts-client: error: inference key required") and INFERENCE_KEY_ENV in err, err
    monkeypatch.setenv(INFERENCE_KEY_ENV, KEY)
    assert client_cli.main(argv) == 0 and out.stat().st_size > 44


def test_the_probe_sends_the_key(keyed: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = keyed.http_url, keyed.grpc_url
    blind = probe(*urls, timeout_s=60, admin_token=keyed.admin_token)
    assert not blind.healthy and blind.reason.startswith("synthesis: inference key required"), blind.reason
    assert probe(*urls, timeout_s=60, admin_token=keyed.admin_token, inference_key=KEY).healthy
    monkeypatch.setenv(INFERENCE_KEY_ENV, KEY)  # the container's health check and the supervisor's way
    assert probe(*urls, timeout_s=60, admin_token=keyed.admin_token).healthy


def test_the_aio_client_and_the_admission_watch_send_the_key(keyed: Server) -> None:
    async def run() -> None:
        bare, keyed_client = AioStreamClient(keyed.grpc_url, inference_key=""), AioStreamClient(keyed.grpc_url,
                                                                                                inference_key=KEY)
        watches = [AdmissionWatch(keyed.grpc_url, inference_key=k, retry_s=0.2) for k in ("", KEY)]
        try:
            assert await bare.ready(10), "health needs no key"
            answers: list[ClientError] = []
            while len(answers) < 5 and (not answers or answers[-1].message == CORE_QUIRK):
                with pytest.raises(ClientError) as refused:
                    async for _ in bare.stream(REQUEST, idle_timeout_s=60):
                        pass
                answers.append(refused.value)
            _refused(answers[-1], sent=False)  # never served; the quirk at most before the refusal
            parts = [p async for p in keyed_client.stream(REQUEST, idle_timeout_s=60)]
            assert sum(p.audio.size for p in parts) > 0
            for w in watches:
                w.start()
            for _ in range(200):
                if watches[1].describe()["watched"] == 1:
                    break
                await asyncio.sleep(0.05)
            without, with_key = (w.describe() for w in watches)
            assert with_key["watched"] == 1, with_key
            # refused for its key: no report, but not taken for an unreachable server either
            assert without["watched"] == 0 and without["unreachable"] == 0, without
        finally:
            for w in watches:
                await w.close()
            await bare.close()
            await keyed_client.close()

    asyncio.run(run())


def test_the_gateway_sends_its_inference_key_setting(keyed: Server, caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": "chattts", "voice": "7", "input": "你好。", "response_format": "pcm",
            "max_new_tokens": 4, "min_new_tokens": 4}
    settings = GatewaySettings.from_env({INFERENCE_KEY_ENV: KEY}, triton_url=keyed.grpc_url, voices_file=None)
    assert settings.triton_inference_key == KEY
    with running_gateway(settings) as url:
        r = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)
        assert r.status_code == 200 and len(r.content) > 0, r.text
    # Without the setting no request is served, and the gateway says why in its log (its
    # admission watch is refused for the key). The requests' own 500s carry Triton's refusal or,
    # as Triton 2.51 answers some refused streams of one connection, "Internal error from Core".
    with caplog.at_level(logging.WARNING, logger="chattts_serving"), \
            running_gateway(GatewaySettings(triton_url=keyed.grpc_url, voices_file=None)) as url:
        answers = [httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60) for _ in range(3)]
        assert wait_until(lambda: "inference key required" in caplog.text, 30), caplog.text
    assert all(r.status_code == 500 for r in answers), [r.text for r in answers]
    messages = [r.json()["error"]["message"] for r in answers]
    assert all(m.startswith("inference key required") or m == CORE_QUIRK for m in messages), messages


def _post(server: Server, path: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}", method="POST",
                                 headers=admin.http_headers(token))
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def test_a_killed_model_process_comes_back_by_unload_and_load(keyed: Server) -> None:
    """Runs last in this module: it leaves the server with a model instance that never unloads."""
    model = "chattts_gpt"
    path = f"/v2/repository/models/{model}"
    assert _post(keyed, f"{path}/load", None)[0] == 403, "load and unload need the admin token"
    (old,) = [pid for pid, m in keyed.server.stub_pids().items() if m == model]
    os.kill(old, signal.SIGKILL)
    assert wait_until(lambda: old not in keyed.server.stub_pids(), 30)
    with pytest.raises(ClientError):
        synthesize_stream(keyed.grpc_url, REQUEST, timeout_s=60, inference_key=KEY)
    # A load alone reloads only a model whose files changed since it loaded (in this fresh
    # repository Python's __pycache__ counts as a change): unload first, then load.
    assert _post(keyed, f"{path}/unload", keyed.admin_token)[0] == 200
    assert _post(keyed, f"{path}/load", keyed.admin_token)[0] == 200
    assert keyed.server.stub_counts()[model] == 1
    # the entry's circuit breaker may still hold the engine's earlier failures for a moment

    def serves() -> bool:
        try:
            return synthesize_stream(keyed.grpc_url, REQUEST, timeout_s=60, inference_key=KEY).audio.size > 0
        except ClientError:
            return False

    assert wait_until(serves, 60)
