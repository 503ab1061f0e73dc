"""Saved voices (``POST/GET/DELETE /v1/audio/voices``) through the real gateway over a real
tritonserver, stored on SQLite and on a real PostgreSQL server the tests start
(tests/support/pg.py): a recording computed once into ChatTTS' audio prompt and spoken by name
on every door, two gateways on one database seeing each other's voices, a duplicate name, bad
uploads, a voice deleted while a stream speaks with it, and the database going away (503, then
everything back as it was). The store alone: tests/unit/test_saved_voices.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import wave
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.formats import to_pcm16
from chattts_serving.audio.reference import decode_spk_smp
from chattts_serving.client import SynthesisRequest, iter_chunks
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH, Close
from tests.support.pg import PgServer, running_pg
from tests.support.servers import SAME_PCM16_LSB, Server, pcm16_gap, running_gateway

TOKENS = 16
SPEECH = {"model": "chattts", "input": "你好，今天天气很好。", "seed": 9, "max_new_tokens": TOKENS,
          "min_new_tokens": TOKENS, "response_format": "pcm"}
TRANSCRIPT = "这是一段参考录音。"


def _recording(seconds: float = 2.0, rate: int = 16000, hz: float = 210.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(to_pcm16((0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t)))
                               .astype(np.float32)))
    return buf.getvalue()


RECORDING = base64.b64encode(_recording()).decode()


# --- through the gateway ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from running_pg()


@pytest.fixture(scope="module")
def sqlite_gateway(triton_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('voices') / 'voices.sqlite3'}"
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, voice_store=url, ws_lookahead=0)) as gw:
        yield gw


@pytest.fixture(scope="module")
def pg_gateways(triton_server: Server, pg: PgServer) -> Iterator[tuple[str, str]]:
    """Two gateways (two replicas) on one PostgreSQL database."""
    settings = GatewaySettings(triton_url=triton_server.grpc_url, voice_store=pg.url, retry_after_s=2)
    with running_gateway(settings) as a, running_gateway(settings) as b:
        yield a, b


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def _speak(url: str, **fields: Any) -> bytes:
    r = _post(url, "/v1/audio/speech", {**SPEECH, **fields})
    assert r.status_code == 200, r.text
    return r.content


def _direct(triton_server: Server, **inputs: Any) -> bytes:
    req = SynthesisRequest(text=SPEECH["input"], seed=9, max_new_tokens=TOKENS, min_new_tokens=TOKENS, **inputs)
    return to_pcm16(np.concatenate(list(iter_chunks(triton_server.grpc_url, req))))


def test_a_saved_recording_speaks_by_name_as_the_recording_itself_does(sqlite_gateway: str,
                                                                       triton_server: Server) -> None:
    r = _post(sqlite_gateway, "/v1/audio/voices", {"name": "Reader", "reference_audio": RECORDING,
                                                    "reference_text": TRANSCRIPT})
    assert r.status_code == 201, r.text
    voice = r.json()["voice"]
    assert voice["name"] == "reader" and voice["kind"] == "recording" and voice["recording_s"] == 2.0
    listed = httpx.get(sqlite_gateway + "/v1/audio/voices", timeout=30).json()
    assert {"id": "reader", "name": "reader"} in listed["voices"] and "alloy" in [v["id"] for v in listed["voices"]]
    assert [v["name"] for v in listed["saved_voices"]] == ["reader"]
    inputs = httpx.get(sqlite_gateway + "/v1/audio/voices/READER", timeout=30).json()["inputs"]
    assert inputs["voice"] == "none" and inputs["reference_text"] == TRANSCRIPT
    assert decode_spk_smp(inputs["spk_smp"]).shape == (contract.encoder_tokens(2 * 24000), contract.NUM_VQ)
    by_name = _speak(sqlite_gateway, voice="reader")
    with_recording = _speak(sqlite_gateway, reference_audio=RECORDING, reference_text=TRANSCRIPT)
    assert pcm16_gap(by_name, with_recording) <= SAME_PCM16_LSB  # the codes computed once are the recording's
    assert pcm16_gap(by_name, _direct(triton_server, voice="", spk_smp=inputs["spk_smp"],
                                      reference_text=TRANSCRIPT)) <= SAME_PCM16_LSB  # the Triton door's inputs
    assert pcm16_gap(by_name, _speak(sqlite_gateway, voice="alloy")) > SAME_PCM16_LSB
    # the other doors: SSE, telephone audio, both WebSocket dialects
    sse = _post(sqlite_gateway, "/v1/audio/speech", {**SPEECH, "voice": "Reader", "stream_format": "sse"})
    deltas = [json.loads(x[6:]) for x in sse.text.splitlines() if x.startswith("data: ")]
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas if e["type"] == "speech.audio.delta") == by_name
    assert _speak(sqlite_gateway, voice="reader", response_format="mulaw")
    assert pcm16_gap(_ws_ours(sqlite_gateway, "reader")[0], by_name) <= SAME_PCM16_LSB
    assert pcm16_gap(_ws_omni(sqlite_gateway, "reader"), by_name) <= SAME_PCM16_LSB


def _ws_ours(url: str, voice: str, delete_after_first: str | None = None) -> tuple[bytes, list[dict[str, Any]]]:
    """Our dialect: one sentence, or with ``delete_after_first`` (a gateway URL) two, the
    voice deleted there after the first sentence's audio arrived."""
    import websockets

    async def go() -> tuple[bytes, list[dict[str, Any]]]:
        audio, events = b"", []
        deleter = delete_after_first
        async with websockets.connect(url.replace("http", "ws", 1) + WS_PATH, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "voice": voice, "seed": 9, "max_new_tokens": TOKENS,
                                      "min_new_tokens": TOKENS}))
            await ws.send(json.dumps({"type": "text", "text": SPEECH["input"]}))
            if deleter is None:
                await ws.send(json.dumps({"type": "end"}))
            with contextlib.suppress(websockets.ConnectionClosed):
                async for msg in ws:
                    if isinstance(msg, bytes):
                        audio += msg
                        continue
                    events.append(json.loads(msg))
                    if events[-1]["type"] == "sentence_done" and deleter is not None:
                        r = await asyncio.to_thread(httpx.delete, deleter + f"/v1/audio/voices/{voice}",
                                                    timeout=30)
                        assert r.status_code == 200, r.text
                        await ws.send(json.dumps({"type": "text", "text": "第二句话。"}))
                        await ws.send(json.dumps({"type": "end"}))
                        deleter = None
            events.append({"type": "close", "code": ws.close_code})
        return audio, events

    return asyncio.run(go())


def _ws_omni(url: str, voice: str) -> bytes:
    import websockets

    async def go() -> bytes:
        audio = b""
        async with websockets.connect(url.replace("http", "ws", 1) + WS_PATH, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": voice, "seed": 9, "max_new_tokens": TOKENS,
                                      "min_new_tokens": TOKENS, "response_format": "pcm", "stream_audio": True}))
            await ws.send(json.dumps({"type": "input.text", "text": SPEECH["input"]}))
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    audio += msg
                    continue
                event = json.loads(msg)
                assert event["type"] != "error", event
                if event["type"] == "session.done":
                    return audio

    return asyncio.run(go())


BAD_UPLOADS = [
    ({"name": "x1", "reference_audio": base64.b64encode(b"not audio at all").decode(), "reference_text": "好。"},
     400, "reference_audio"),
    ({"name": "x2", "reference_audio": base64.b64encode(_recording(0.1)).decode(), "reference_text": "好。"},
     400, "reference_audio"),  # 0.1 s: under the server's minimum
    ({"name": "x3", "reference_audio": RECORDING}, 400, "reference_text"),
    ({"name": "x4", "reference_audio": "%%%", "reference_text": "好。"}, 400, "reference_audio"),
    ({"name": "x5", "spk_smp": "not a prompt", "reference_text": "好。"}, 400, "spk_smp"),
    ({"name": "x6", "spk_emb": "not a speaker"}, 400, "spk_emb"),
    ({"name": "x7", "seed": -1}, 400, "seed"),
    ({"name": "x8", "seed": 3, "spk_emb": "abc"}, 400, "seed"),  # the second source named
    ({"name": "x9"}, 400, "reference_audio"),  # no source: the recording is what is missing
    ({"name": "9lives", "seed": 3}, 400, "name"),
    ({"name": "none", "seed": 3}, 400, "name"),
    ({"name": "alloy", "seed": 3}, 409, "name"),
    ({"name": "narrator", "seed": 3}, 409, "name"),  # voices/voices.toml
    ({"name": "x10", "seed": 3, "speaker": 5}, 400, "speaker"),
    ({"name": "x11", "seed": 3, "colour": "blue"}, 400, "colour"),
]


@pytest.mark.parametrize("body, status, param", BAD_UPLOADS, ids=[b[0]["name"] for b in BAD_UPLOADS])
def test_bad_uploads_are_openai_errors_and_store_nothing(sqlite_gateway: str, body: dict[str, Any], status: int,
                                                         param: str) -> None:
    r = _post(sqlite_gateway, "/v1/audio/voices", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error
    saved = httpx.get(sqlite_gateway + "/v1/audio/voices", timeout=30).json()["saved_voices"]
    assert body["name"].lower() not in [v["name"] for v in saved]


def test_two_gateways_on_one_postgresql_share_voices_and_names(pg_gateways: tuple[str, str]) -> None:
    a, b = pg_gateways
    r = _post(a, "/v1/audio/voices", {"name": "shared", "reference_audio": RECORDING, "reference_text": TRANSCRIPT,
                                      "speaker": 7})
    assert r.status_code == 201, r.text
    assert "shared" in [v["name"] for v in httpx.get(b + "/v1/audio/voices", timeout=30).json()["saved_voices"]]
    assert pcm16_gap(_speak(a, voice="shared"), _speak(b, voice="shared")) <= SAME_PCM16_LSB
    dup = _post(b, "/v1/audio/voices", {"name": "SHARED", "seed": 1})
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "voice_exists"
    assert _post(b, "/v1/audio/voices", {"name": "seven", "seed": 7}).status_code == 201
    assert pcm16_gap(_speak(a, voice="seven"), _speak(a, voice="7")) <= SAME_PCM16_LSB
    assert httpx.delete(b + "/v1/audio/voices/seven", timeout=30).status_code == 200
    gone = _post(a, "/v1/audio/speech", {**SPEECH, "voice": "seven"})
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "voice"
    assert httpx.delete(a + "/v1/audio/voices/seven", timeout=30).status_code == 404


def test_a_voice_deleted_while_a_stream_speaks_with_it_does_not_cut_the_stream(pg_gateways: tuple[str, str]) -> None:
    a, b = pg_gateways
    assert _post(a, "/v1/audio/voices", {"name": "brief", "reference_audio": RECORDING,
                                         "reference_text": TRANSCRIPT}).status_code == 201
    audio, events = _ws_ours(a, "brief", delete_after_first=b)
    kinds = [e["type"] for e in events]
    assert kinds.count("sentence_done") == 2 and "error" not in kinds and events[-1]["code"] == Close.NORMAL
    assert len(audio) == 2 * 2 * contract.samples_for_tokens(TOKENS)  # both sentences, whole
    assert _post(a, "/v1/audio/speech", {**SPEECH, "voice": "brief"}).status_code == 400


def test_the_database_going_away_is_a_clear_503_and_nothing_is_lost(pg_gateways: tuple[str, str],
                                                                      pg: PgServer) -> None:
    a, b = pg_gateways
    assert _post(a, "/v1/audio/voices", {"name": "keeper", "seed": 11}).status_code == 201
    before = httpx.get(b + "/v1/audio/voices", timeout=30).json()["saved_voices"]
    pg.stop()
    try:
        for r in (_post(a, "/v1/audio/voices", {"name": "lost", "seed": 1}),
                  httpx.get(b + "/v1/audio/voices", timeout=30),
                  httpx.delete(a + "/v1/audio/voices/keeper", timeout=30),
                  _post(b, "/v1/audio/speech", {**SPEECH, "voice": "keeper"})):
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] == "voice_store_unavailable"
            assert "unavailable" in r.json()["error"]["message"]
        assert _speak(a, voice="alloy")  # voices that need no store still speak
        assert _speak(b, voice="123")
        _, events = _ws_ours(a, "keeper")
        assert events[0]["type"] == "error" and events[0]["retryable"] is True
        assert events[-1]["code"] == Close.TRY_AGAIN
    finally:
        pg.start()
    after = httpx.get(b + "/v1/audio/voices", timeout=30).json()["saved_voices"]
    assert after == before and "lost" not in [v["name"] for v in after]
    assert _speak(a, voice="keeper")
    assert _post(a, "/v1/audio/voices", {"name": "lost", "seed": 1}).status_code == 201
