"""The real OpenAI-compatible gateway (uvicorn) in front of a real tritonserver: the official
``openai`` client, raw HTTP for every client mistake, voices, CORS, metrics, overload (503 with
Retry-After), streams that end by inactivity rather than by a wall clock, and reference
recordings. Speed and error mapping, the app without Triton and the settings:
tests/unit/test_gateway.py."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.formats import to_pcm16
from chattts_serving.audio.reference import encode_spk_smp
from chattts_serving.client import SynthesisRequest, iter_chunks, read_wav
from chattts_serving.errors import ErrorKind
from chattts_serving.gateway import GatewaySettings
from chattts_serving.runtime import Artifacts
from chattts_serving.text.voices import OPENAI_VOICES, VoiceBook
from tests.support.servers import (
    ROOT,
    SAME_PCM16_LSB,
    Server,
    free_port,
    metric,
    pcm16_gap,
    running_gateway,
    serve_profile,
    wait_until,
)

API_KEY = "test-key-123"
TOKENS = 40
"""max_new_tokens of the test requests: 40 tokens = 0.85 s of audio, a few chunks."""
EXTRA = {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS, "seed": 7}
TEXT = "你好，欢迎使用ChatTTS, the weather is 25°C today."
ORIGIN = "https://app.example"
"""The browser origin the test gateway allows (CORS)."""
RETRY_AFTER_S = 3

AUTH = {"Authorization": f"Bearer {API_KEY}"}


# --- against a real tritonserver ------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    """The gateway in front of the test tritonserver, with an API key and one allowed origin."""
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, cors_origins=(ORIGIN,),
                               retry_after_s=RETRY_AFTER_S)
    with running_gateway(settings) as url:
        yield url


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


def test_pcm_equals_the_direct_triton_stream_and_is_deterministic(client, triton_server: Server) -> None:
    first = _speech(client, "pcm").content
    second = _speech(client, "pcm").content
    expected = contract.samples_for_tokens(TOKENS)
    assert len(first) == 2 * expected
    assert first == second == _direct_pcm(triton_server)
    other_voice = _speech(client, "pcm", voice="echo").content
    assert len(other_voice) == 2 * expected and other_voice != first


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


def test_request_id_and_unspoken_text_come_back_in_headers(client) -> None:
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input="你好😀。", response_format="pcm", extra_body=dict(EXTRA),
            extra_headers={"X-Request-Id": "call-centre-7"}) as response:
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "call-centre-7"
        assert json.loads(response.headers["x-unspoken-text"]) == ["😀"]
        assert response.read()


def test_a_long_reply_ending_in_an_emoji_is_spoken_and_the_emoji_reported(client) -> None:
    """Past the merge limit the emoji after a sentence end was a segment of its own, with nothing
    to speak, and the whole request was refused 400 nothing speakable."""
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input="Thank you very much for calling our line today! 🎉",
            response_format="pcm", extra_body=dict(EXTRA)) as response:
        assert response.status_code == 200
        assert json.loads(response.headers["x-unspoken-text"]) == ["🎉"]
        assert response.read()


def test_characters_the_tokenizer_lacks_come_back_as_unspoken(client) -> None:
    """龟 is [UNK] in the generated tokenizer (tests/server/test_textnorm_unk.py): left out and reported."""
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="7", input="乌龟爬得很慢。", response_format="pcm",
            extra_body=dict(EXTRA)) as response:
        assert response.status_code == 200
        assert json.loads(response.headers["x-unspoken-text"]) == ["龟"]
        assert response.read()


def test_language_reaches_the_server_and_reads_a_bare_quantity_in_it(client, triton_server: Server) -> None:
    """``language`` chooses the reading of text without context of its own (25kg: 二十五千克 or
    twenty five kilograms): each equals the direct Triton stream with that language, and the
    two differ."""
    pcm = {lang: _speech(client, "pcm", input="25kg", extra_body={**EXTRA, "language": lang}).content
           for lang in ("zh", "en")}
    for lang, audio in pcm.items():
        req = SynthesisRequest(text="25kg", voice="alloy", language=lang, **EXTRA)  # type: ignore[arg-type]
        assert audio == to_pcm16(np.concatenate(list(iter_chunks(triton_server.grpc_url, req))))
    assert pcm["zh"] != pcm["en"]


def test_sse_stream_carries_base64_deltas_and_done(client) -> None:
    pcm = _speech(client, "pcm").content
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body=dict(EXTRA)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert pcm16_gap(b"".join(base64.b64decode(e["audio"]) for e in deltas), pcm) <= SAME_PCM16_LSB
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == TOKENS and usage["total_tokens"] == usage["input_tokens"] + TOKENS
    assert events[-1]["capped_segments"] == [0]  # min_new_tokens = max_new_tokens: it ended at the cap, and says so


def test_speed_changes_the_prompt_and_so_the_audio(client) -> None:
    normal = _speech(client, "pcm").content
    # speed 1 is ChatTTS' default [speed_5]
    assert pcm16_gap(_speech(client, "pcm", speed=1.0).content, normal) <= SAME_PCM16_LSB
    assert pcm16_gap(_speech(client, "pcm", speed=3.0).content, normal) > SAME_PCM16_LSB


def test_auth_and_length_errors_through_the_openai_client(gateway_url: str, client) -> None:
    import openai

    anonymous = openai.OpenAI(base_url=gateway_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        _speech(anonymous, "mp3")
    assert auth.value.status_code == 401
    with pytest.raises(openai.BadRequestError) as long:
        _speech(client, "mp3", input="好" * 4097)
    assert long.value.status_code == 400 and long.value.code == "string_above_max_length"


SPEECH_BODY = {"model": "tts-1", "input": "你好。", "voice": "alloy", "response_format": "pcm", **EXTRA}
DROP = object()
"""A change that removes the field."""
MISTAKES: list[tuple[str, bytes | dict[str, Any], int, str, str | None]] = [
    # the body itself
    ("malformed JSON", b'{"model": "tts-1", "input": ', 400, "invalid_json", None),
    ("not UTF-8", b'{"model": "tts-1", "input": "\xff\xfe", "voice": "alloy"}', 400, "invalid_body", None),
    ("not an object", b'["tts-1", "hello", "alloy"]', 400, "invalid_value", None),
    ("empty body", b"", 400, "invalid_value", None),
    # lone surrogates (valid JSON escapes, no valid UTF-8 text)
    ("lone surrogate in input", b'{"model":"tts-1","input":"\\u4f60\\u597d\\ud83d","voice":"alloy"}', 400,
     "invalid_value", "input"),
    ("lone surrogate in voice", b'{"model":"tts-1","input":"hi","voice":"\\udc00"}', 400, "invalid_value", "voice"),
    ("lone surrogate in voice id", b'{"model":"tts-1","input":"hi","voice":{"id":"a\\ud800"}}', 400,
     "invalid_value", "voice"),
    # wrong types
    ("input a number", {"input": 123}, 400, "invalid_value", "input"),
    ("voice a float", {"voice": 1.5}, 400, "invalid_value", "voice"),
    ("voice a boolean", {"voice": True}, 400, "invalid_value", "voice"),
    ("speed a string", {"speed": "fast"}, 400, "invalid_value", "speed"),
    ("seed a string", {"seed": "3"}, 400, "invalid_value", "seed"),
    ("top_k a boolean", {"top_k": True}, 400, "invalid_value", "top_k"),
    ("refine_text a string", {"refine_text": "yes"}, 400, "invalid_value", "refine_text"),
    # unknown formats
    ("unknown response_format", {"response_format": "ogg"}, 400, "invalid_value", "response_format"),
    ("unknown stream_format", {"stream_format": "websocket"}, 400, "invalid_value", "stream_format"),
    # out of range
    ("speed too low", {"speed": 0.1}, 400, "invalid_value", "speed"),
    ("speed too high", {"speed": 5}, 400, "invalid_value", "speed"),
    ("speed NaN", b'{"model":"tts-1","input":"hi","voice":"alloy","speed":NaN}', 400, "invalid_value", "speed"),
    ("temperature infinite", b'{"model":"tts-1","input":"hi","voice":"alloy","temperature":Infinity}', 400,
     "invalid_value", "temperature"),
    ("top_k beyond int32", {"top_k": 2**40}, 400, "invalid_value", "top_k"),
    ("top_p above 1", {"top_p": 3.0}, 400, "invalid_value", "top_p"),
    ("negative seed", {"seed": -1}, 400, "invalid_value", "seed"),
    ("max_new_tokens 0", {"max_new_tokens": 0}, 400, "invalid_value", "max_new_tokens"),
    ("max_new_tokens above the profile's cap", {"max_new_tokens": 3000, "min_new_tokens": 0}, 400, "invalid_value",
     "max_new_tokens"),  # refused by the chattts model, which names the input
    # missing or empty
    ("missing model", {"model": DROP}, 400, "invalid_value", "model"),
    ("missing voice", {"voice": DROP}, 400, "invalid_value", "voice"),
    ("empty input", {"input": ""}, 400, "invalid_value", "input"),
    ("blank input", {"input": "  \n "}, 400, "invalid_value", "input"),
    ("empty voice", {"voice": " "}, 400, "invalid_value", "voice"),
    ("null voice without a reference", {"voice": None}, 400, "invalid_value", "voice"),
    ("voice none without a reference", {"voice": "none"}, 400, "invalid_value", "voice"),
    # too long, unsupported, unknown
    ("input too long", {"input": "好" * 4097}, 400, "string_above_max_length", "input"),
    ("instructions", {"instructions": "whisper"}, 400, "unsupported_parameter", "instructions"),
    ("unknown model", {"model": "whisper-1"}, 404, "model_not_found", "model"),
    # refused by the chattts model itself
    ("nothing speakable", {"input": "，。！"}, 400, "invalid_value", "input"),
    ("unknown voice", {"voice": "nobody"}, 400, "invalid_value", "voice"),
    ("control token out of range", {"input": "你好[break_9]"}, 400, "invalid_value", "input"),
    ("unknown vocoder", {"vocoder": "magic"}, 400, "invalid_value", "vocoder"),
    ("unknown language", {"language": "fr"}, 400, "invalid_value", "language"),
    ("language a number", {"language": 3}, 400, "invalid_value", "language"),
]


def _body(change: bytes | dict[str, Any]) -> bytes:
    if isinstance(change, bytes):
        return change
    body = {k: v for k, v in {**SPEECH_BODY, **change}.items() if v is not DROP}
    return json.dumps(body).encode()


@pytest.mark.parametrize("case, change, status, code, param", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_every_client_mistake_is_a_4xx_openai_error(gateway_url: str, case: str, change: bytes | dict[str, Any],
                                                     status: int, code: str, param: str | None) -> None:
    request_id = "mistake-" + re.sub(r"[^A-Za-z0-9]+", "-", case)  # unique: the server log's ids never repeat
    r = httpx.post(f"{gateway_url}/v1/audio/speech", content=_body(change), timeout=60,
                   headers={**AUTH, "Content-Type": "application/json", "X-Request-Id": request_id})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers.get("x-request-id") == request_id  # an error is traced by the id the client sent
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), error
    assert error["message"] and "Traceback" not in error["message"] and not error["message"].startswith("[")


@pytest.mark.parametrize("voice, got", [(1.5, "a number (1.5)"), (True, "a boolean (true)"), ([7], "an array"),
                                         ({"name": "alloy"}, "an object")])
def test_a_voice_of_no_form_it_takes_is_told_every_form(gateway_url: str, voice: Any, got: str) -> None:
    """``voice`` is a string, a seed or ``{"id": ...}``: a value of none of them is told all
    three and what it was, not only the first form's complaint."""
    r = httpx.post(f"{gateway_url}/v1/audio/speech", json={**SPEECH_BODY, "voice": voice}, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message == f'voice: expected a string, an integer or an object {{"id": "..."}}, got {got}', message


def test_unknown_fields_are_ignored_and_named(gateway_url: str) -> None:
    """A field this server does not know (a newer OpenAI field, a misspelt extension) does not
    refuse the request, and the response names it; a request without one has no such header."""
    with httpx.stream("POST", f"{gateway_url}/v1/audio/speech", headers=AUTH, timeout=120,
                      json={**SPEECH_BODY, "temprature": 0.1, "stream": True, "top_k": 20}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["x-ignored-fields"] == "stream, temprature"
        assert b"".join(r.iter_bytes())
    with httpx.stream("POST", f"{gateway_url}/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200 and "x-ignored-fields" not in r.headers
        r.read()


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate"])
def test_a_body_declared_compressed_is_refused_even_where_it_is_plain_json(gateway_url: str, encoding: str) -> None:
    """The gateway reads no compressed body: one declared compressed is a 400 naming the
    encoding, whether or not its bytes happen to parse as JSON (they were ignored before)."""
    r = httpx.post(f"{gateway_url}/v1/audio/speech", content=_body({}), timeout=60,
                   headers={**AUTH, "Content-Type": "application/json", "Content-Encoding": encoding,
                            "X-Request-Id": f"zipped-{encoding}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_body" and encoding in error["message"], error
    assert r.headers.get("x-request-id") == f"zipped-{encoding}"
    ok = httpx.post(f"{gateway_url}/v1/audio/speech", content=_body({}), timeout=60,
                    headers={**AUTH, "Content-Type": "application/json", "Content-Encoding": "identity"})
    assert ok.status_code == 200, ok.text


def test_wrong_routes_and_methods_are_openai_errors_too(gateway_url: str) -> None:
    for method, path, status in (("GET", "/v1/audio/speech", 405), ("PUT", "/v1/audio/voices", 405),
                                 ("GET", "/v1/audio/nothing", 404)):
        r = httpx.request(method, gateway_url + path, headers=AUTH, timeout=10)
        assert r.status_code == status and r.json()["error"]["type"] == "invalid_request_error", r.text


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


# --- voices, CORS, metrics ----------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/audio/voices", "/v1/voices"])
def test_voice_list_names_every_builtin_and_file_voice(gateway_url: str, path: str) -> None:
    assert httpx.get(gateway_url + path, timeout=10).status_code == 401
    voices = httpx.get(gateway_url + path, headers=AUTH, timeout=10).json()["voices"]
    ids = [v["id"] for v in voices]
    assert all(set(v) == {"id", "name"} and v["name"] for v in voices)
    assert ids[:len(OPENAI_VOICES)] == list(OPENAI_VOICES)
    assert set(ids) == set(VoiceBook.load().names()) and len(ids) == len(set(ids))
    assert {"narrator", "storyteller"} <= set(ids)  # from voices/voices.toml


def test_every_listed_voice_speaks(gateway_url: str) -> None:
    voices = httpx.get(gateway_url + "/v1/audio/voices", headers=AUTH, timeout=10).json()["voices"]
    for voice in voices:
        body = {**SPEECH_BODY, "voice": voice["id"], "max_new_tokens": 4, "min_new_tokens": 4}
        r = httpx.post(gateway_url + "/v1/audio/speech", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, (voice, r.text)
        assert len(r.content) == 2 * contract.samples_for_tokens(4), voice


def test_cors_preflight_needs_no_key_and_responses_expose_the_audio_headers(gateway_url: str) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type, x-request-id"}
    r = httpx.options(gateway_url + "/v1/audio/speech", headers=preflight, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type", "x-request-id"} <= {
        h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    other = httpx.options(gateway_url + "/v1/audio/speech", timeout=10,
                          headers={**preflight, "Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers

    r = httpx.post(gateway_url + "/v1/audio/speech", json={**SPEECH_BODY, "input": "你好😀。"}, timeout=60,
                   headers={**AUTH, "Origin": ORIGIN, "X-Request-Id": "browser-1"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-request-id", "x-sample-rate", "x-unspoken-text"} <= exposed
    assert r.headers["x-request-id"] == "browser-1" and json.loads(r.headers["x-unspoken-text"]) == ["😀"]
    refused = httpx.post(gateway_url + "/v1/audio/speech", json=SPEECH_BODY, headers={"Origin": ORIGIN}, timeout=10)
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def _scrape(url: str) -> dict[str, float]:
    """``/metrics`` of the gateway: sample name with labels -> value."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("tts_gateway_")}


@contextmanager
def open_stream(url: str, tokens: int = 2000, text: str = "这是一个一直占着位置的长请求。") -> Iterator[httpx.Response]:
    """A speech stream through the gateway that is held open (its first audio read) until the
    block ends; closing it cancels the synthesis."""
    body = {**SPEECH_BODY, "input": text, "max_new_tokens": tokens, "min_new_tokens": tokens}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200, r.read()
        chunks = r.iter_bytes()  # kept: a discarded iterator would close the response
        next(chunks)
        yield r


def wait_for(what: str, check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_metrics_count_requests_errors_ttfa_and_streams_in_flight(gateway_url: str) -> None:
    before = _scrape(gateway_url)
    ok = httpx.post(gateway_url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60)
    assert ok.status_code == 200
    assert httpx.post(gateway_url + "/v1/audio/speech", json={**SPEECH_BODY, "speed": 9}, headers=AUTH,
                      timeout=60).status_code == 400
    assert httpx.post(gateway_url + "/v1/audio/speech", json={**SPEECH_BODY, "voice": "nobody"}, headers=AUTH,
                      timeout=60).status_code == 400
    with open_stream(gateway_url):
        assert _scrape(gateway_url)["tts_gateway_streams_in_flight"] == 1.0
    wait_for("the held stream to be released", lambda: _scrape(gateway_url)["tts_gateway_streams_in_flight"] == 0.0)
    after = _scrape(gateway_url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta['tts_gateway_requests_total{status="ok"}'] == 1
    assert delta['tts_gateway_requests_total{status="error"}'] == 2
    assert delta['tts_gateway_requests_total{status="cancelled"}'] == 1
    assert delta['tts_gateway_errors_total{kind="invalid",phase="before_audio"}'] == 2
    assert delta["tts_gateway_time_to_first_audio_seconds_count"] == 2  # the ok one and the held one
    assert delta["tts_gateway_request_duration_seconds_count"] == 1
    assert delta["tts_gateway_audio_seconds_total"] >= len(ok.content) / 2 / contract.SAMPLE_RATE_HZ
    assert after['tts_gateway_time_to_first_audio_seconds_bucket{le="+Inf"}'] == \
        after["tts_gateway_time_to_first_audio_seconds_count"]
    for kind in ErrorKind:  # every kind exists from the start, so rates over it exist
        assert f'tts_gateway_errors_total{{kind="{kind.value}",phase="mid_stream"}}' in after


# --- overload: 503 with Retry-After at once ------------------------------------------------

def _assert_busy(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == str(RETRY_AFTER_S)
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "server_busy") and "busy" in error["message"]


def test_the_gateways_own_stream_limit_answers_503_with_retry_after(triton_server: Server) -> None:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, max_streams=1,
                               retry_after_s=RETRY_AFTER_S)
    with running_gateway(settings) as url:
        with open_stream(url):
            _assert_busy(httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60))
            assert _scrape(url)['tts_gateway_errors_total{kind="busy",phase="before_audio"}'] == 1
        wait_for("the slot to be free", lambda: _scrape(url)["tts_gateway_streams_in_flight"] == 0.0)
        assert httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60).status_code == 200


def test_a_client_that_reads_no_audio_is_cut_off_and_its_slot_freed(triton_server: Server) -> None:
    """A client that sends a request and never reads held its stream slot (and its engine row)
    for as long as it kept the connection open: the gateway's write waited forever. After
    ``send_timeout_s`` without a byte taken the stream is cancelled and the slot is free while
    the socket is still open."""
    import socket

    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, max_streams=1,
                               retry_after_s=RETRY_AFTER_S, send_timeout_s=1.0)
    with running_gateway(settings) as url:
        host, port = url.removeprefix("http://").split(":")
        tokens = 2048  # float32: 4 MB a sentence, more than the socket buffers between the two hold
        body = json.dumps({**SPEECH_BODY, "input": "第一句话。第二句话。第三句话。", "response_format": "float32",
                           "max_new_tokens": tokens, "min_new_tokens": tokens}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        try:
            sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_for("the stream to start", lambda: _scrape(url)["tts_gateway_streams_in_flight"] == 1.0)
            wait_for("the stalled stream to be cut off", lambda: _scrape(url)["tts_gateway_streams_in_flight"] == 0.0,
                     timeout_s=120)
            assert httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60).status_code == 200
        finally:
            sock.close()


def test_a_body_over_the_limit_is_refused_413_whether_its_length_is_told_or_not(gateway_url: str,
                                                                                  triton_server: Server) -> None:
    """No limit on the body let a 200 MB request (an unknown field padded) hold 600 MB of the
    gateway's memory: past ``max_body_bytes`` the answer is 413, before reading when the
    Content-Length says so, and as soon as a chunked body passes it."""
    limit = 65536
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, max_body_bytes=limit)
    big = json.dumps({**SPEECH_BODY, "pad": "x" * (2 * limit)}).encode()
    with running_gateway(settings) as url:
        told = httpx.post(url + "/v1/audio/speech", content=big, headers={**AUTH, "Content-Type": "application/json"},
                          timeout=60)
        pieces = iter([big[i:i + 8192] for i in range(0, len(big), 8192)])
        chunked = httpx.post(url + "/v1/audio/speech", content=pieces,
                             headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
        upload = httpx.post(url + "/v1/audio/voices", files={"audio_sample": ("me.wav", b"\0" * (2 * limit))},
                            data={"name": "me"}, headers=AUTH, timeout=60)
        for r in (told, chunked, upload):
            assert r.status_code == 413, r.text
            assert r.json()["error"]["code"] == "body_too_large" and str(limit) in r.json()["error"]["message"]
        assert "transfer-encoding" not in told.request.headers and chunked.request.headers["transfer-encoding"]
        assert httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60).status_code == 200


def test_a_long_voice_string_is_refused_400_without_being_echoed(gateway_url: str) -> None:
    """An unknown voice's message quoted the whole string: past gRPC's 16 KB trailer it came back
    as a retryable 503 backend_unavailable, and below it as a 300 KB error body."""
    for size in (50_000, 300_000):
        r = httpx.post(gateway_url + "/v1/audio/speech", json={**SPEECH_BODY, "voice": "x" * size}, headers=AUTH,
                       timeout=60)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == "voice" and "unknown voice" in error["message"] and f"{size} characters" in \
            error["message"]
        assert len(r.content) < 2000


@pytest.fixture(scope="module")
def one_slot_server(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A tritonserver whose entry model admits one stream at a time (the gate on)."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("one-slot"), entry={"max_concurrent_streams": 1})
    try:
        yield srv
    finally:
        srv.stop()


def _gate_refusals(srv: Any) -> float:
    return metric(srv.metrics_port, "tts_rejected_total", model=contract.MODEL_STREAM, reason="busy", stage="gate")


def _health_admission(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/health", timeout=10).json()["admission"])


def test_triton_server_busy_becomes_503_with_retry_after(one_slot_server: Any) -> None:
    """Without the admission watch every request goes to Triton: its "busy" is the 503, each
    refusal made (and counted) by the gate."""
    settings = GatewaySettings(triton_url=f"127.0.0.1:{one_slot_server.grpc_port}", api_key=API_KEY,
                               retry_after_s=RETRY_AFTER_S, admission_watch=False)
    with running_gateway(settings) as url:
        with open_stream(url):
            before = _gate_refusals(one_slot_server)
            _assert_busy(httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60))
            sse = httpx.post(url + "/v1/audio/speech", json={**SPEECH_BODY, "stream_format": "sse"}, headers=AUTH,
                             timeout=60)
            _assert_busy(sse)  # refused before any audio: a status, not an event
            assert wait_until(lambda: _gate_refusals(one_slot_server) - before == 2, 10)
        assert _scrape(url)['tts_gateway_errors_total{kind="busy",phase="before_audio"}'] == 2
        assert "admission" not in httpx.get(url + "/health", timeout=10).json()


def test_while_every_slot_is_taken_the_gateway_refuses_without_calling_triton(one_slot_server: Any) -> None:
    """With the admission watch (the default): while the server's one stream slot is held, a
    speech request, even one the gateway could not parse, is answered 503 with Retry-After by
    the gateway itself (the gate counts no refusal: nothing reached Triton), and so is a
    WebSocket start; an unauthorized one still gets its 401. Once the slot is free again the
    next request streams audio."""
    grpc_url = f"127.0.0.1:{one_slot_server.grpc_port}"
    settings = GatewaySettings(triton_url=grpc_url, api_key=API_KEY, retry_after_s=RETRY_AFTER_S)
    with running_gateway(settings) as url:
        wait_for("the watch's first report", lambda: _health_admission(url)["watched"] == 1)
        assert _health_admission(url)["full"] == {door: False for door in contract.ADMISSION_DOORS}
        with open_stream(url):
            wait_for("the watch to report chattts full", lambda: _health_admission(url)["full"]["chattts"])
            before = _gate_refusals(one_slot_server)
            for body in (SPEECH_BODY, {**SPEECH_BODY, "stream_format": "sse"}, b"{not json"):
                r = httpx.post(url + "/v1/audio/speech", headers={**AUTH, "Content-Type": "application/json"},
                               timeout=60, **({"content": body} if isinstance(body, bytes) else {"json": body}))
                _assert_busy(r)
                assert "every stream slot" in r.json()["error"]["message"]
            assert httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, timeout=60).status_code == 401
            from websockets.exceptions import ConnectionClosed
            from websockets.sync.client import connect

            events: list[dict[str, Any]] = []
            with connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream",
                         additional_headers=AUTH) as ws:
                ws.send(json.dumps({"type": "start", "model": "tts-1", "voice": "alloy"}))
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        events.append(json.loads(ws.recv(timeout=30)))
            assert [e["type"] for e in events] == ["error"] and events[0]["code"] == "server_busy", events
            assert events[0]["retryable"] and closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert _gate_refusals(one_slot_server) == before  # decided here, not by Triton's gate
            assert _scrape(url)['tts_gateway_errors_total{kind="busy",phase="before_audio"}'] == 4
        wait_for("the watch to report a free slot", lambda: not _health_admission(url)["full"]["chattts"])
        ok = httpx.post(url + "/v1/audio/speech", json=SPEECH_BODY, headers=AUTH, timeout=60)
        assert ok.status_code == 200 and len(ok.content) > 0


# --- streams end by inactivity, not by a wall clock ----------------------------------------

def _sse_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + "/v1/audio/speech", json={**body, "stream_format": "sse"}, headers=AUTH,
                      timeout=600) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]


LONG_INPUT = ("今天天气很好，我们一起去公园散步吧。" * 300)[:4096]
"""The longest legal input (4096 characters): over 200 sentences."""


def test_the_longest_input_streams_to_the_end_under_an_idle_timeout(triton_server: Server) -> None:
    """With an idle timeout of a few seconds and no total cap, the longest legal input runs for
    longer than the idle timeout and completes: only silence from Triton ends a stream, never
    its length, so a total deadline of the idle timeout's size would have cut this one.

    The stream outlasts the idle timeout by construction, not by the host's speed: the client
    reads its events slowly (``pause_s`` after each, ``1.5 * idle_s`` over the 200 sentences'
    events at least); the gateway then waits on the client (HTTP back-pressure), not on Triton,
    so no wait for Triton grows by it."""
    idle_s = 5.0
    pause_s = 1.5 * idle_s / 200
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, stream_idle_timeout_s=idle_s)
    body = {**SPEECH_BODY, "input": LONG_INPUT, "max_new_tokens": 8, "min_new_tokens": 8, "stream_format": "sse"}
    events: list[dict[str, Any]] = []
    with running_gateway(settings) as url:
        t0 = time.monotonic()
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=AUTH, timeout=600) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: "):]))
                    time.sleep(pause_s)
        elapsed = time.monotonic() - t0
    print(f"\n4096 characters: {len(events)} events in {elapsed:.1f} s (idle timeout {idle_s:g} s)")
    assert [e["type"] for e in events if e["type"] != "speech.audio.delta"] == ["speech.audio.done"]
    assert events[-1]["usage"]["input_tokens"] == 4096
    assert events[-1]["usage"]["output_tokens"] > 200 * 7  # every sentence spoke (8 tokens each)
    assert len(events) > 200 and elapsed >= len(events) * pause_s > idle_s  # it outlived the idle timeout


def test_the_optional_total_cap_cuts_a_stream_with_an_error_event(triton_server: Server) -> None:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, stream_max_s=3.0)
    with running_gateway(settings) as url:
        events = _sse_events(url, {**SPEECH_BODY, "input": LONG_INPUT[:600], "max_new_tokens": 500,
                                   "min_new_tokens": 500})
        assert events[0]["type"] == "speech.audio.delta" and events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "server_busy" and "within 3 s" in events[-1]["error"]["message"]
        # a raw audio body cannot carry an error: it is cut, never ended as if complete
        body = {**SPEECH_BODY, "input": LONG_INPUT[:600], "max_new_tokens": 500, "min_new_tokens": 500}
        with pytest.raises(httpx.RemoteProtocolError), \
                httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=AUTH, timeout=60) as r:
            assert r.status_code == 200
            for _ in r.iter_bytes():
                pass
        assert _scrape(url)['tts_gateway_errors_total{kind="deadline",phase="mid_stream"}'] == 2


def test_a_reference_wav_in_base64_speaks_in_chattts_segmentation_and_a_bad_one_is_400(client) -> None:
    """``reference_audio`` (base64 of a PCM WAV, here 16 kHz) + ``reference_text`` and
    ``segmentation`` reach the server; the server's refusal of a missing transcript and the
    gateway's of bytes that are no WAV are 400 naming the parameter."""
    import openai

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.round(0.2 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 220) * 32767).astype("<i2"))
    ref = base64.b64encode(buf.getvalue()).decode()
    extra = {**EXTRA, "reference_audio": ref, "reference_text": "参考录音。", "segmentation": "chattts"}
    pcm = _speech(client, "pcm", input="今天天气很好。明天见。", extra_body=extra).content
    assert len(pcm) == 2 * 2 * contract.samples_for_tokens(TOKENS)  # two pieces of min = max tokens
    with pytest.raises(openai.BadRequestError) as info:
        _speech(client, "pcm", extra_body={**EXTRA, "reference_audio": ref})
    assert "needs its transcript" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        _speech(client, "pcm", extra_body={**EXTRA, "reference_audio": "bm90IGEgd2F2", "reference_text": "参考。"})
    assert info.value.param == "reference_audio" and "FFmpeg" in info.value.message


def _pcm_over_http(url: str, body: dict[str, Any]) -> bytes:
    r = httpx.post(f"{url}/v1/audio/speech", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.content


def test_spk_smp_with_or_without_a_voice_speaks_as_the_triton_door_does(gateway_url: str,
                                                                         triton_server: Server) -> None:
    """The gateway's ``spk_smp`` (+ ``reference_text``) reaches the server: with a voice the PCM
    equals a direct Triton stream with that voice and spk_smp; with ``voice`` omitted, null,
    ``"none"`` (any case) or ``{"id": "none"}`` it equals the direct stream with voice ``''``,
    the Triton door's prompt without a speaker vector (``[empty_spk]``: ChatTTS' zero-shot use,
    tests/server/test_refvoice_server.py), and differs from the voiced one. A malformed spk_smp is the
    server's 400."""
    smp = encode_spk_smp(np.random.default_rng(5).integers(0, 625, (30, contract.NUM_VQ)))
    ref = {"spk_smp": smp, "reference_text": "参考。"}
    body = {**SPEECH_BODY, **ref}

    def direct(voice: str) -> bytes:
        req = SynthesisRequest(text=SPEECH_BODY["input"], voice=voice, **EXTRA, **ref)  # type: ignore[arg-type]
        return to_pcm16(np.concatenate(list(iter_chunks(triton_server.grpc_url, req))))

    voiced = _pcm_over_http(gateway_url, body)
    assert pcm16_gap(voiced, direct("alloy")) <= SAME_PCM16_LSB
    assert len(voiced) == 2 * contract.samples_for_tokens(TOKENS)
    unvoiced = direct("")
    assert pcm16_gap(unvoiced, voiced) > SAME_PCM16_LSB
    no_voice = {k: v for k, v in body.items() if k != "voice"}
    for voice in (DROP, None, "none", "NONE", {"id": "none"}):
        got = _pcm_over_http(gateway_url, no_voice if voice is DROP else {**no_voice, "voice": voice})
        assert pcm16_gap(got, unvoiced) <= SAME_PCM16_LSB, voice
    r = httpx.post(f"{gateway_url}/v1/audio/speech", json={**body, "spk_smp": "not an audio prompt"}, headers=AUTH,
                   timeout=60)
    assert r.status_code == 400 and "spk_smp" in r.json()["error"]["message"], r.text


def test_a_reference_recording_without_a_voice_has_no_speaker_vector(gateway_url: str, triton_server: Server) -> None:
    """``reference_audio`` with ``voice`` omitted: the same audio as the Triton door's request
    with that recording and voice ``''`` (no speaker vector), not the one with a voice."""
    rec = (0.2 * np.sin(np.arange(12000) / 24000 * 2 * np.pi * 180)).astype(np.float32)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(contract.SAMPLE_RATE_HZ)
        w.writeframes(np.round(rec * 32767).astype("<i2").tobytes())
    body = {k: v for k, v in SPEECH_BODY.items() if k != "voice"}
    body.update(reference_audio=base64.b64encode(buf.getvalue()).decode(), reference_text="参考录音。")
    got = _pcm_over_http(gateway_url, body)
    samples, rate = read_wav(buf.getvalue())  # what the gateway sends of that WAV
    assert rate == contract.SAMPLE_RATE_HZ

    def direct(voice: str) -> bytes:
        req = SynthesisRequest(text=SPEECH_BODY["input"], voice=voice, reference_audio=samples,
                               reference_sample_rate_hz=contract.SAMPLE_RATE_HZ, reference_text="参考录音。",
                               **EXTRA)  # type: ignore[arg-type]
        return to_pcm16(np.concatenate(list(iter_chunks(triton_server.grpc_url, req))))

    assert pcm16_gap(got, direct("")) <= SAME_PCM16_LSB < pcm16_gap(got, direct("alloy"))
