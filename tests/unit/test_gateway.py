"""The OpenAI-compatible gateway without a server: speed mapping, Triton's errors as OpenAI's,
the app in process (FastAPI's ``TestClient``) with no Triton behind it (503 with Retry-After,
the API key, models, health, metrics, CORS), and its settings from the environment, the flags
and the docs. The real gateway over a real tritonserver: tests/server/test_gateway.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from chattts_serving.client import ClientError
from chattts_serving.errors import ErrorKind
from chattts_serving.gateway import GatewaySettings, create_app, speed_to_token
from chattts_serving.gateway.__main__ import parse_args, settings_from_args
from chattts_serving.gateway.errors import from_client_error
from tests.support.servers import ROOT, free_port

API_KEY = "test-key-123"
ORIGIN = "https://app.example"
"""The browser origin the test gateway allows (CORS)."""
RETRY_AFTER_S = 3


SPEEDS = [(0.25, 0), (0.35, 1), (0.5, 3), (0.75, 4), (1.0, 5), (1.25, 6), (1.5, 6), (2.0, 7), (3.0, 8), (4.0, 9)]


@pytest.mark.parametrize("speed, token", SPEEDS)
def test_speed_maps_monotonically_to_chattts_speed_tokens(speed: float, token: int) -> None:
    assert speed_to_token(speed) == token


def test_speed_mapping_is_monotonic_and_bounded() -> None:
    values = [speed_to_token(s) for s in np.linspace(0.25, 4.0, 200)]
    assert values == sorted(values) and values[0] == 0 and values[-1] == 9
    for bad in (0.2, 4.5, float("nan")):
        with pytest.raises(ValueError):
            speed_to_token(bad)


INV, BUSY, UNAV, DEAD = ErrorKind.INVALID, ErrorKind.BUSY, ErrorKind.UNAVAILABLE, ErrorKind.DEADLINE
ERRORS = [
    (ClientError("cannot connect", "StatusCode.UNAVAILABLE", connection=True), 503, "backend_unavailable", UNAV),
    (ClientError("lost the connection to 127.0.0.1:1: Socket closed", "StatusCode.UNAVAILABLE", connection=True), 503,
     "backend_unavailable", UNAV),
    (ClientError("[invalid] text is empty"), 400, "invalid_value", INV),
    (ClientError("[invalid] unknown voice 'x': not a seed"), 400, "invalid_value", INV),
    (ClientError("[busy] server busy: 8 streams already live"), 503, "server_busy", BUSY),
    (ClientError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE"), 503, "server_busy", BUSY),
    (ClientError("Request timeout expired", 503), 503, "server_busy", BUSY),
    (ClientError("[deadline] deadline exceeded: the request did not finish within timeout_s=1"), 503, "server_busy",
     DEAD),
    (ClientError("[cancelled] cancelled by the client"), 499, "cancelled", ErrorKind.CANCELLED),
    (ClientError("[internal] internal error: RuntimeError"), 500, "internal_error", ErrorKind.INTERNAL),
    # Triton's own words while a model process is dead, a model (re)loads or the server stops:
    # retryable whatever status they came with (docs/operations.md, "Faults and recovery")
    (ClientError("Stub process 'chattts_gpt_0_0' is not healthy."), 503, "backend_unavailable", UNAV),
    (ClientError("Stub process 'chattts_vocoder_0_0' is not healthy.", "StatusCode.INTERNAL"), 503,
     "backend_unavailable", UNAV),
    (ClientError("Request for unknown model: 'chattts' has no available versions", "StatusCode.NOT_FOUND"), 503,
     "backend_unavailable", UNAV),
    (ClientError("Request for unknown model: 'chattts' has no available versions", 400), 503,
     "backend_unavailable", UNAV),
    (ClientError("in ensemble 'chattts_ensemble', Server not ready", 500), 503, "backend_unavailable", UNAV),
    (ClientError("Server is stopping, scheduler for model has stopped accepting new inference requests"), 503,
     "backend_unavailable", UNAV),
    (ClientError("Request for unknown model: 'nope' is not found", "StatusCode.NOT_FOUND"), 500, "internal_error",
     ErrorKind.INTERNAL),
    (ClientError("[internal] vocoder failed"), 500, "internal_error", ErrorKind.INTERNAL),
    (ClientError("[unavailable] server unavailable: engine is failing"), 503, "backend_unavailable", UNAV),
    (ClientError("[invalid] top_p=3 is out of range"), 400, "invalid_value", INV),
    (ClientError("no response within 5 s", "timeout"), 503, "server_busy", DEAD),
    (ClientError("bad", "StatusCode.INVALID_ARGUMENT"), 400, "invalid_value", INV),
    (ClientError("boom", "StatusCode.INTERNAL"), 500, "internal_error", ErrorKind.INTERNAL),
]


@pytest.mark.parametrize("error, status, code, kind", ERRORS, ids=[e[0].message[:24] for e in ERRORS])
def test_triton_errors_map_to_openai_errors(error: ClientError, status: int, code: str, kind: ErrorKind) -> None:
    api = from_client_error(error, "127.0.0.1:1")
    assert (api.status, api.code, api.kind) == (status, code, kind)
    body = api.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and not body["message"].startswith("[")


@pytest.fixture
def offline_client() -> Iterator[TestClient]:
    """The app pointed at a port where nothing listens, with an API key and default settings
    otherwise (CORS off)."""
    app = create_app(GatewaySettings(triton_url=f"127.0.0.1:{free_port()}", api_key=API_KEY, health_timeout_s=0.5,
                                     retry_after_s=RETRY_AFTER_S))
    with TestClient(app) as client:
        yield client


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_without_triton_speech_is_503_with_retry_after_and_auth_is_still_checked(offline_client: TestClient) -> None:
    body = {"model": "tts-1", "input": "hi", "voice": "alloy"}
    r = offline_client.post("/v1/audio/speech", json=body, headers=AUTH)
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert r.json()["error"]["code"] == "backend_unavailable"
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = offline_client.post("/v1/audio/speech", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_json_body_sent_as_another_media_type_is_told_to_send_json(offline_client: TestClient,
                                                                     content_type: str | None) -> None:
    """``curl -d '{...}'`` sends form data's media type: the 400 says to send the body as JSON
    with its Content-Type (pydantic's "valid dictionary" said nothing of why); a JSON body that
    is no object keeps the field's message."""
    body = json.dumps({"model": "tts-1", "input": "hi", "voice": "alloy"})
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    r = offline_client.post("/v1/audio/speech", content=body.encode(), headers=headers)
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "invalid_json", r.text
    assert "Content-Type: application/json" in error["message"] and (content_type or "no Content-Type") in \
        error["message"]
    json_type = {**AUTH, "Content-Type": "application/json"}
    listed = offline_client.post("/v1/audio/speech", content=b"[1]", headers=json_type)
    assert listed.status_code == 400 and "Content-Type" not in listed.json()["error"]["message"]


def test_models_health_and_metrics_without_triton(offline_client: TestClient) -> None:
    assert offline_client.get("/v1/models").status_code == 401
    models = offline_client.get("/v1/models", headers=AUTH).json()
    assert models["object"] == "list" and "tts-1" in [m["id"] for m in models["data"]]
    assert offline_client.get("/v1/models/chattts", headers=AUTH).json()["id"] == "chattts"
    health = offline_client.get("/health")  # no key needed
    assert health.status_code == 503 and health.json()["triton"] == "not ready"
    assert offline_client.get("/health/live").status_code == 200  # liveness does not depend on Triton
    assert "tts_gateway_streams_in_flight 0.0" in offline_client.get("/metrics").text  # no key needed


@pytest.mark.parametrize("headers, problem", [
    ({"Origin": "https://elsewhere.example"}, "origin 'https://elsewhere.example' is not allowed"),
    ({"Access-Control-Request-Method": "PUT"}, "method 'PUT' is not allowed"),
    ({"Access-Control-Request-Headers": "authorization, x-secret"}, "header(s) x-secret not allowed"),
])
def test_a_refused_cors_preflight_carries_the_openai_error_object(headers: dict[str, str], problem: str) -> None:
    """Every refusal of the gateway has OpenAI's error shape: a CORS preflight refused was
    Starlette's plain text ("Disallowed CORS origin")."""
    app = create_app(GatewaySettings(triton_url=f"127.0.0.1:{free_port()}", cors_origins=(ORIGIN,)))
    with TestClient(app) as client:
        r = client.options("/v1/audio/speech", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                        **headers})
        ok = client.options("/v1/audio/speech", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "cors_not_allowed"
    assert problem in error["message"], error["message"]
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN


def test_a_page_on_an_allowed_origin_may_delete_a_saved_voice() -> None:
    """The preflight of ``DELETE /v1/audio/voices/{name}`` from an allowed origin passes."""
    app = create_app(GatewaySettings(triton_url=f"127.0.0.1:{free_port()}", cors_origins=(ORIGIN,)))
    with TestClient(app) as client:
        r = client.options("/v1/audio/voices/reader", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "DELETE",
            "Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN and "DELETE" in r.headers["access-control-allow-methods"]


def test_cors_is_off_by_default(offline_client: TestClient) -> None:
    r = offline_client.options("/v1/audio/speech", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


def test_settings_from_environment_and_flags() -> None:
    env = {"CHATTTS_API_KEY": " k ", "CHATTTS_TRITON_URL": "h:1", "CHATTTS_GATEWAY_STREAM_IDLE_TIMEOUT_S": "30",
           "CHATTTS_GATEWAY_CORS_ORIGINS": "https://a.example/, http://localhost:3000",
           "CHATTTS_GATEWAY_STREAM_MAX_S": "600"}
    s = GatewaySettings.from_env(env, max_streams=3)
    assert (s.api_key, s.triton_url, s.max_streams, s.stream_idle_timeout_s, s.stream_max_s) == ("k", "h:1", 3, 30.0,
                                                                                                 600.0)
    assert s.cors_origins == ("https://a.example", "http://localhost:3000")
    default = GatewaySettings.from_env({})
    assert default.api_key is None and default.stream_max_s is None and default.cors_origins == ()
    assert GatewaySettings.from_env({"CHATTTS_GATEWAY_STREAM_MAX_S": "0"}).stream_max_s is None
    with pytest.raises(ValueError, match="CHATTTS_GATEWAY_MAX_STREAMS"):
        GatewaySettings.from_env({"CHATTTS_GATEWAY_MAX_STREAMS": "many"})
    for bad in ({"max_input_chars": 0}, {"stream_idle_timeout_s": 0.0}, {"stream_max_s": -1.0},
                {"max_streams": 0}, {"retry_after_s": -1}):
        with pytest.raises(ValueError):
            GatewaySettings(**bad)  # type: ignore[arg-type]


def test_every_knob_is_documented_with_its_flag_and_variable() -> None:
    from chattts_serving.gateway.settings import OPTIONS

    doc = (ROOT / "docs" / "openai-gateway.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert f"| `{opt.flag}` | `{opt.env}` |" in doc, opt.flag


def test_the_command_line_refuses_a_malformed_voices_file(tmp_path: Path) -> None:
    bad = tmp_path / "voices.toml"
    bad.write_text("[voices]\nnarrator = -5\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.gateway", "--voices-file", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "narrator" in proc.stderr and "Traceback" not in proc.stderr


def test_a_flag_wins_over_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATTTS_GATEWAY_STREAM_MAX_S", "600")
    monkeypatch.setenv("CHATTTS_GATEWAY_RETRY_AFTER_S", "7")
    s = settings_from_args(parse_args(["--stream-max-s", "0", "--stream-idle-timeout-s", "12",
                                       "--cors-origins", "*"]))
    assert (s.stream_max_s, s.stream_idle_timeout_s, s.retry_after_s, s.cors_origins) == (None, 12.0, 7, ("*",))
    with pytest.raises(ValueError, match="--max-streams"):
        settings_from_args(parse_args(["--max-streams", "x"]))
