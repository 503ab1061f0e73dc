"""The OpenAI-compatible gateway: speed mapping and error mapping (no server), then the
official ``openai`` client against the gateway in front of a real tritonserver."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import ROOT, Server, free_port
from fastapi.testclient import TestClient

from chattts_serving import contract
from chattts_serving.audio.formats import to_pcm16
from chattts_serving.client import ClientError, SynthesisRequest, iter_chunks
from chattts_serving.gateway import GatewaySettings, create_app, speed_to_token
from chattts_serving.gateway.errors import from_client_error

API_KEY = "test-key-123"
TOKENS = 40
"""max_new_tokens of the test requests: 40 tokens = 0.85 s of audio, a few chunks."""
EXTRA = {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS, "seed": 7}
TEXT = "你好，欢迎使用ChatTTS, the weather is 25°C today."


# --- no server ----------------------------------------------------------------------------

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


ERRORS = [
    (ClientError("cannot connect", "StatusCode.UNAVAILABLE", connection=True), 503, "backend_unavailable"),
    (ClientError("[invalid] text is empty"), 400, "invalid_value"),
    (ClientError("[invalid] unknown voice 'x': not a seed"), 400, "invalid_value"),
    (ClientError("[busy] server busy: 8 streams already live"), 503, "server_busy"),
    (ClientError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE"), 503, "server_busy"),
    (ClientError("Request timeout expired", 503), 503, "server_busy"),
    (ClientError("[deadline] deadline exceeded: the request did not finish within timeout_s=1"), 503, "server_busy"),
    (ClientError("[cancelled] cancelled by the client"), 499, "cancelled"),
    (ClientError("[internal] internal error: RuntimeError"), 500, "internal_error"),
    (ClientError("Stub process 'chattts_gpt_0_0' is not healthy."), 500, "internal_error"),
    (ClientError("[internal] vocoder failed"), 500, "internal_error"),
    (ClientError("[unavailable] server unavailable: engine is failing"), 503, "server_busy"),
    (ClientError("[invalid] top_p=3 is out of range"), 400, "invalid_value"),
    (ClientError("no response within 5 s", "timeout"), 503, "server_busy"),
    (ClientError("bad", "StatusCode.INVALID_ARGUMENT"), 400, "invalid_value"),
    (ClientError("boom", "StatusCode.INTERNAL"), 500, "internal_error"),
]


@pytest.mark.parametrize("error, status, code", ERRORS, ids=[e[0].message[:24] for e in ERRORS])
def test_triton_errors_map_to_openai_errors(error: ClientError, status: int, code: str) -> None:
    api = from_client_error(error, "127.0.0.1:1")
    assert (api.status, api.code) == (status, code)
    body = api.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and not body["message"].startswith("[")


@pytest.fixture
def offline_client() -> Iterator[TestClient]:
    """The app pointed at a port where nothing listens, with an API key."""
    app = create_app(GatewaySettings(triton_url=f"127.0.0.1:{free_port()}", api_key=API_KEY, health_timeout_s=0.5))
    with TestClient(app) as client:
        yield client


AUTH = {"Authorization": f"Bearer {API_KEY}"}
BAD_REQUESTS = [
    ("no key", {}, {"model": "tts-1", "input": "hi", "voice": "alloy"}, 401, "invalid_api_key"),
    ("wrong key", {"Authorization": "Bearer nope"}, {"model": "tts-1", "input": "hi", "voice": "alloy"}, 401,
     "invalid_api_key"),
    ("unknown model", AUTH, {"model": "whisper-1", "input": "hi", "voice": "alloy"}, 404, "model_not_found"),
    ("input too long", AUTH, {"model": "tts-1", "input": "好" * 4097, "voice": "alloy"}, 400,
     "string_above_max_length"),
    ("empty input", AUTH, {"model": "tts-1", "input": "  ", "voice": "alloy"}, 400, "invalid_value"),
    ("bad format", AUTH, {"model": "tts-1", "input": "hi", "voice": "alloy", "response_format": "ogg"}, 400,
     "invalid_value"),
    ("speed too high", AUTH, {"model": "tts-1", "input": "hi", "voice": "alloy", "speed": 5}, 400, "invalid_value"),
    ("missing voice", AUTH, {"model": "tts-1", "input": "hi"}, 400, "invalid_value"),
    ("instructions", AUTH, {"model": "tts-1", "input": "hi", "voice": "alloy", "instructions": "whisper"}, 400,
     "unsupported_parameter"),
    ("triton unreachable", AUTH, {"model": "tts-1", "input": "hi", "voice": "alloy"}, 503, "backend_unavailable"),
]


@pytest.mark.parametrize("case, headers, body, status, code", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_refusals_are_openai_style_json(offline_client: TestClient, case: str, headers: dict, body: dict,
                                        status: int, code: str) -> None:
    r = offline_client.post("/v1/audio/speech", json=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "Traceback" not in err["message"]
    assert err["type"] in ("invalid_request_error", "authentication_error", "server_error")


def test_models_and_health_without_triton(offline_client: TestClient) -> None:
    assert offline_client.get("/v1/models").status_code == 401
    models = offline_client.get("/v1/models", headers=AUTH).json()
    assert models["object"] == "list" and "tts-1" in [m["id"] for m in models["data"]]
    assert offline_client.get("/v1/models/chattts", headers=AUTH).json()["id"] == "chattts"
    health = offline_client.get("/health")  # no key needed
    assert health.status_code == 503 and health.json()["triton"] == "not ready"


def test_settings_from_environment() -> None:
    s = GatewaySettings.from_env({"CHATTTS_API_KEY": " k ", "CHATTTS_TRITON_URL": "h:1"}, max_streams=3)
    assert (s.api_key, s.triton_url, s.max_streams) == ("k", "h:1", 3)
    assert GatewaySettings.from_env({}).api_key is None
    with pytest.raises(ValueError):
        GatewaySettings(max_input_chars=0)


# --- against a real tritonserver ------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    """The gateway in a thread (uvicorn) in front of the test tritonserver, with an API key."""
    import uvicorn

    port = free_port()
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, stream_timeout_s=120)
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


@pytest.fixture(scope="module")
def client(gateway_url: str):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _speech(client, fmt: str, **kw):  # type: ignore[no-untyped-def]
    args = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": fmt, "extra_body": dict(EXTRA)}
    args.update(kw)
    return client.audio.speech.create(**args)


def _direct_pcm(triton_server: Server, voice: str = "alloy", text: str = TEXT) -> bytes:
    req = SynthesisRequest(text=text, voice=voice, **EXTRA)  # type: ignore[arg-type]
    return to_pcm16(np.concatenate(list(iter_chunks(triton_server.grpc_url, req))))


@pytest.mark.server
def test_pcm_equals_the_direct_triton_stream_and_is_deterministic(client, triton_server: Server) -> None:
    first = _speech(client, "pcm").content
    second = _speech(client, "pcm").content
    expected = contract.samples_for_tokens(TOKENS)
    assert len(first) == 2 * expected
    assert first == second == _direct_pcm(triton_server)
    other_voice = _speech(client, "pcm", voice="echo").content
    assert len(other_voice) == 2 * expected and other_voice != first


@pytest.mark.server
def test_wav_and_mp3_decode_at_24_khz(client) -> None:
    import av

    pcm = _speech(client, "pcm").content
    wav = _speech(client, "wav").content
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (contract.SAMPLE_RATE_HZ, 1, 2)
        assert w.readframes(10**9) == pcm
    mp3 = _speech(client, "mp3").content
    assert mp3[0] == 0xFF and (mp3[1] & 0xE0) == 0xE0
    with av.open(io.BytesIO(mp3)) as c:
        stream = c.streams.audio[0]
        decoded = sum(f.samples for f in c.decode(stream))
        assert stream.codec_context.sample_rate == contract.SAMPLE_RATE_HZ
    assert abs(decoded - len(pcm) // 2) < 2 * 1152


@pytest.mark.server
def test_streaming_response_arrives_in_chunks_with_rate_header(client) -> None:
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input=TEXT, response_format="wav", extra_body=dict(EXTRA)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("audio/wav")
        assert response.headers["x-sample-rate"] == str(contract.SAMPLE_RATE_HZ)
        assert len(response.headers["x-request-id"]) == 32  # generated
        assert "x-unspoken-text" not in response.headers
        chunks = [c for c in response.iter_bytes() if c]
    data = b"".join(chunks)
    assert len(chunks) >= 2, "audio was not streamed"
    assert data[:4] == b"RIFF" and data.count(b"RIFF") == 1
    assert len(data) == 44 + 2 * contract.samples_for_tokens(TOKENS)


@pytest.mark.server
def test_request_id_and_unspoken_text_come_back_in_headers(client) -> None:
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input="你好😀。", response_format="pcm", extra_body=dict(EXTRA),
            extra_headers={"X-Request-Id": "call-centre-7"}) as response:
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "call-centre-7"
        assert json.loads(response.headers["x-unspoken-text"]) == ["😀"]
        assert response.read()


@pytest.mark.server
def test_characters_the_tokenizer_lacks_come_back_as_unspoken(client) -> None:
    """龟 is [UNK] in the generated tokenizer (tests/test_textnorm_unk.py): left out and reported."""
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input="乌龟爬得很慢。", response_format="pcm",
            extra_body=dict(EXTRA)) as response:
        assert response.status_code == 200
        assert json.loads(response.headers["x-unspoken-text"]) == ["龟"]
        assert response.read()


@pytest.mark.server
def test_sse_stream_carries_base64_deltas_and_done(client) -> None:
    pcm = _speech(client, "pcm").content
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body=dict(EXTRA)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == pcm
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == TOKENS and usage["total_tokens"] == usage["input_tokens"] + TOKENS


@pytest.mark.server
def test_speed_changes_the_prompt_and_so_the_audio(client) -> None:
    normal = _speech(client, "pcm").content
    assert _speech(client, "pcm", speed=1.0).content == normal  # speed 1 is ChatTTS' default [speed_5]
    assert _speech(client, "pcm", speed=3.0).content != normal


@pytest.mark.server
def test_auth_and_length_errors_through_the_openai_client(gateway_url: str, client) -> None:
    import openai

    anonymous = openai.OpenAI(base_url=gateway_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        _speech(anonymous, "mp3")
    assert auth.value.status_code == 401
    with pytest.raises(openai.BadRequestError) as long:
        _speech(client, "mp3", input="好" * 4097)
    assert long.value.status_code == 400 and long.value.code == "string_above_max_length"


TRITON_REFUSALS = [
    ("nothing speakable", {"input": "，。！"}, "nothing speakable", "input"),
    ("unknown voice", {"voice": "nobody"}, "unknown voice", "voice"),
    ("bad sampling parameter", {"extra_body": {"top_p": 3.0}}, "top_p", None),
    ("control token out of range", {"input": "你好[break_9]"}, "out of range", "input"),
]


@pytest.mark.server
@pytest.mark.parametrize("case, kw, fragment, param", TRITON_REFUSALS, ids=[c[0] for c in TRITON_REFUSALS])
def test_triton_refusals_become_400(client, case: str, kw: dict, fragment: str, param: str | None) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        _speech(client, "mp3", **kw)
    assert fragment in info.value.message and info.value.param == param


@pytest.mark.server
def test_console_entry_serves_health(triton_server: Server) -> None:
    port = free_port()
    env = dict(os.environ, CHATTTS_API_KEY=API_KEY)
    proc = subprocess.Popen([sys.executable, "-m", "chattts_serving.gateway", "--triton-url", triton_server.grpc_url,
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200 and json.loads(r.read())["triton"] == "ready"
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "gateway CLI did not come up"
                time.sleep(0.2)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 401
    finally:
        proc.terminate()
        proc.wait(15)


def _cancelled_total(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tts_request_total{") and 'status="cancelled"' in line)


@pytest.mark.server
def test_closing_the_response_cancels_the_synthesis(client, triton_server: Server) -> None:
    before = _cancelled_total(triton_server.metrics_port)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="这是一个会被提前关闭的长请求", response_format="pcm",
            extra_body={"max_new_tokens": 2000, "min_new_tokens": 2000}) as response:
        received = 0
        for chunk in response.iter_bytes():
            received += len(chunk)
            if received >= 20000:
                break
    deadline = time.monotonic() + 20
    while _cancelled_total(triton_server.metrics_port) <= before:
        assert time.monotonic() < deadline, "the server never saw the cancel"
        time.sleep(0.1)
