"""vLLM-Omni's streaming-text dialect on ``/v1/audio/speech/stream`` against the real gateway
and a real tritonserver.

:class:`DocClient` is written from vLLM-Omni's documentation of the protocol only (its
``docs/serving/speech_api.md``, "Streaming Text Input (WebSocket)": client ``session.config``,
``input.text``, ``input.done``, ``session.close``; server ``audio.start``, binary frames,
``audio.done``, ``session.done``, ``error``), not from this gateway's code. The same path
still speaks this gateway's own dialect when the first message is ``start``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH
from tests.support.servers import SAME_PCM16_LSB, Server, pcm16_gap, running_gateway

websockets = pytest.importorskip("websockets")

TOKENS = 16
CONFIG = {"type": "session.config", "voice": "alloy", "seed": 3, "max_new_tokens": TOKENS}
"""Only fields vLLM-Omni documents (max_new_tokens and seed bound and fix the test audio)."""


@dataclass
class Sentence:
    start: dict[str, Any]
    frames: list[bytes] = field(default_factory=list)
    done: dict[str, Any] | None = None


@dataclass
class Utterance:
    sentences: list[Sentence] = field(default_factory=list)
    done: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)


class DocClient:
    """A client of the documented protocol: send a config, text chunks and input.done; collect
    audio.start / binary frames / audio.done per sentence until session.done."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def utterance(self, chunks: list[str]) -> Utterance:
        for c in chunks:
            await self.send(type="input.text", text=c)
        await self.send(type="input.done")
        return await self.collect()

    async def collect(self) -> Utterance:
        u = Utterance()
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), 120)
            if isinstance(msg, bytes):
                u.sentences[-1].frames.append(msg)
                continue
            event = json.loads(msg)
            if event["type"] == "audio.start":
                u.sentences.append(Sentence(event))
            elif event["type"] == "audio.done":
                assert u.sentences[-1].start["sentence_index"] == event["sentence_index"]
                u.sentences[-1].done = event
            elif event["type"] == "session.done":
                u.done = event
                return u
            elif event["type"] == "error":
                u.errors.append(event)


def run(url: str, script: Any) -> Any:
    async def go() -> Any:
        async with websockets.connect(url.replace("http", "ws", 1) + WS_PATH, max_size=None) as ws:
            return await script(DocClient(ws), ws)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, ws_lookahead=0)) as url:
        yield url


def _speech(url: str, text: str, **fields: Any) -> bytes:
    r = httpx.post(url + "/v1/audio/speech", timeout=120, json={"model": "chattts", "voice": "alloy", "seed": 3,
                                                                 "max_new_tokens": TOKENS, "input": text, **fields})
    assert r.status_code == 200, r.text
    return r.content


def test_buffered_utterances_flush_on_input_done_and_the_connection_stays_open(gateway_url: str) -> None:
    async def script(c: DocClient, ws: Any) -> tuple[Utterance, Utterance, Utterance, int | None]:
        await c.send(**CONFIG)  # response_format defaults to wav, split_granularity to none
        first = await c.utterance(["你好，", "今天天气很好。", "我们出去走走吧。"])
        await c.send(**CONFIG, split_granularity="sentence", response_format="pcm")
        second = await c.utterance(["第一句。第二", "句。"])
        empty = await c.utterance([])
        await c.send(type="session.close")
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)
        return first, second, empty, ws.close_code

    first, second, empty, code = run(gateway_url, script)
    assert not first.errors and first.done == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    (s,) = first.sentences
    assert s.start["utterance_index"] == 0 and s.start["sentence_index"] == 0 and s.start["format"] == "wav"
    assert s.start["sentence_text"] == "你好，今天天气很好。我们出去走走吧。"
    assert len(s.frames) == 1  # stream_audio false: the sentence as one file
    with wave.open(io.BytesIO(s.frames[0])) as w:
        assert w.getframerate() == contract.SAMPLE_RATE_HZ and w.getnframes() > 0
        assert s.done is not None and s.done["total_bytes"] == len(s.frames[0]) and s.done["error"] is False
        assert s.done["duration_samples"] == w.getnframes() and s.done["start_samples"] == 0
    assert s.frames[0][44:] == _speech(gateway_url, s.start["sentence_text"], response_format="pcm")
    assert second.done == {"type": "session.done", "utterance_index": 1, "total_sentences": 2}
    assert [x.start["sentence_text"] for x in second.sentences] == ["第一句。", "第二句。"]
    assert [x.start["utterance_index"] for x in second.sentences] == [1, 1]
    for x in second.sentences:
        assert b"".join(x.frames) == _speech(gateway_url, x.start["sentence_text"], response_format="pcm")
    assert empty.done == {"type": "session.done", "utterance_index": 2, "total_sentences": 0}
    assert code == 1000


def test_stream_audio_sends_pcm_chunks_with_rate_and_timings(gateway_url: str) -> None:
    async def script(c: DocClient, ws: Any) -> Utterance:
        await c.send(**CONFIG, response_format="pcm", stream_audio=True, split_granularity="sentence")
        return await c.utterance(["Hello there. ", "第二句话。", "Third!"])

    u = run(gateway_url, script)
    assert not u.errors and u.done is not None and u.done["total_sentences"] == 3
    offset = 0
    for x in u.sentences:
        assert x.start["sample_rate"] == contract.SAMPLE_RATE_HZ and x.start["channels"] == 1
        pcm = b"".join(x.frames)
        assert x.done is not None and x.done["total_bytes"] == len(pcm)
        assert x.done["start_samples"] == offset and x.done["duration_samples"] == len(pcm) // 2
        offset += len(pcm) // 2
        assert pcm16_gap(pcm, _speech(gateway_url, x.start["sentence_text"], response_format="pcm")) <= SAME_PCM16_LSB
    assert len(u.sentences[0].frames) >= 2  # streamed, not one frame


def test_telephone_audio_and_clause_splitting_through_the_dialect(gateway_url: str) -> None:
    async def script(c: DocClient, ws: Any) -> Utterance:
        await c.send(**CONFIG, response_format="mulaw", stream_audio=True, split_granularity="clause")
        return await c.utterance(["你好，我是客服", "；请问有什么", "可以帮您？"])

    u = run(gateway_url, script)
    assert [x.start["sentence_text"] for x in u.sentences] == ["你好，", "我是客服；", "请问有什么可以帮您？"]
    for x in u.sentences:
        assert x.start["sample_rate"] == 8000 and x.done is not None
        assert x.done["sample_rate_hz"] == 8000 and x.done["duration_samples"] == len(b"".join(x.frames))


def test_errors_are_error_events_and_the_session_goes_on(gateway_url: str) -> None:
    async def script(c: DocClient, ws: Any) -> tuple[list[dict[str, Any]], Utterance]:
        await c.send(**CONFIG, response_format="pcm", split_granularity="sentence")
        errors = []
        await ws.send("not json")
        errors.append(json.loads(await ws.recv()))
        await c.send(type="input.audio")
        errors.append(json.loads(await ws.recv()))
        await c.send(type="input.text", text=5)
        errors.append(json.loads(await ws.recv()))
        await c.send(**CONFIG, response_format="aiff")  # refused: the previous config stays
        errors.append(json.loads(await ws.recv()))
        await c.send(type="input.text", text="你好。")
        await c.send(**CONFIG)  # while an utterance is in progress
        await c.send(type="input.text", text="😀😀。")  # nothing speakable: no error either
        u = await c.utterance(["再见。"])
        return errors, u

    errors, u = run(gateway_url, script)
    assert [e["type"] for e in errors] == ["error"] * 4 and all(e["message"] for e in errors)
    assert "Unknown message type" in errors[1]["message"] and "string" in errors[2]["message"]
    assert errors[3]["param"] == "response_format"
    assert any("in progress" in e["message"] for e in u.errors)
    # an LLM's stray emoji is no error (issue 29): it stays with the sentence before it, unspoken
    assert [x.start["sentence_text"] for x in u.sentences] == ["你好。😀😀。", "再见。"]
    assert u.done is not None and u.done["total_sentences"] == 2
    assert all(x.done is not None and not x.done["error"] and x.frames for x in u.sentences)


REFUSED = [({"response_format": "wav", "stream_audio": True}, "response_format"),
           ({"word_timestamps": True}, "word_timestamps"), ({"speaker_embedding": [0.1, 0.2]}, "speaker_embedding"),
           ({"ref_audio": "https://example.com/a.wav", "ref_text": "x"}, "ref_audio"),
           ({"model": "tts-9"}, "model"), ({"instructions": "speak happily"}, "instructions"),
           ({"split_granularity": "word"}, "split_granularity"), ({"sample_rate": 11025}, "sample_rate")]


@pytest.mark.parametrize("change, param", REFUSED, ids=[next(iter(r[0])) for r in REFUSED])
def test_a_config_chattts_cannot_honour_is_refused_with_an_error_and_a_close(gateway_url: str,
                                                                            change: dict[str, Any],
                                                                            param: str) -> None:
    async def script(c: DocClient, ws: Any) -> tuple[dict[str, Any], int | None]:
        await c.send(**{**CONFIG, **change})
        await c.send(type="input.text", text="你好。")
        await c.send(type="input.done")
        event = json.loads(await ws.recv())
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.recv()
        return event, ws.close_code

    event, code = run(gateway_url, script)
    assert event["type"] == "error" and event["message"] and event["param"] == param
    assert code is not None and code >= 1007


def test_a_reference_recording_as_a_data_url_clones_the_voice(gateway_url: str) -> None:
    t = np.arange(contract.SAMPLE_RATE_HZ * 2) / 16000
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes())
    url = "data:audio/wav;base64," + base64.b64encode(wav.getvalue()).decode()

    async def script(c: DocClient, ws: Any) -> Utterance:
        await c.send(type="session.config", ref_audio=url, ref_text="这是参考录音。", seed=3, max_new_tokens=TOKENS,
                     response_format="pcm", task_type="Base")
        return await c.utterance(["你好。"])

    u = run(gateway_url, script)
    assert not u.errors and u.sentences[0].frames
    plain = _speech(gateway_url, "你好。", response_format="pcm")
    assert b"".join(u.sentences[0].frames) != plain  # the recording changed the voice


def test_our_own_dialect_still_answers_on_the_same_path(gateway_url: str) -> None:
    async def script(c: DocClient, ws: Any) -> list[Any]:
        await c.send(type="start", voice="alloy", max_new_tokens=TOKENS, min_new_tokens=TOKENS)
        await c.send(type="text", text="你好。")
        await c.send(type="end")
        out = []
        with contextlib.suppress(websockets.ConnectionClosed):
            async for m in ws:
                out.append(m if isinstance(m, bytes) else json.loads(m)["type"])
        return out

    out = run(gateway_url, script)
    assert out[0] == "started" and out[-1] == "done" and any(isinstance(m, bytes) for m in out)




async def _until_close(ws: Any) -> list[Any]:
    """Every message until the server closes (JSON events decoded, binary frames as bytes)."""
    out: list[Any] = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            out.append(msg if isinstance(msg, bytes) else json.loads(msg))
    return out


INVALID_CONFIGS = [({"voice": "zzz-nope"}, "voice", "unknown voice"),
                   ({"voice": None, "speaker": "zzz-nope"}, "speaker", "unknown voice"),
                   ({"max_new_tokens": 3000}, "max_new_tokens", "max_new_tokens"),  # the profile's cap: the server's
                   ({"max_new_tokens": 5000}, "max_new_tokens", "max_new_tokens"),  # the contract's range
                   ({"temperature": 0}, "temperature", "temperature"), ({"top_p": 1.5}, "top_p", "top_p"),
                   ({"top_k": 0}, "top_k", "top_k"), ({"speed": 9}, "speed", "speed"),
                   ({"vocoder": "nope"}, "vocoder", "vocoder")]


@pytest.mark.parametrize("change, param, words", INVALID_CONFIGS, ids=[f"{r[1]}={next(iter(r[0].values()))}"
                                                                       for r in INVALID_CONFIGS])
def test_an_invalid_first_config_is_one_error_and_close_1007(gateway_url: str, change: dict[str, Any], param: str,
                                                             words: str) -> None:
    """Checked whole before any text, as our dialect's ``start``: one ``error`` naming the
    field, close 1007, and no ``audio.start`` for audio that will not come."""
    async def script(c: DocClient, ws: Any) -> tuple[list[Any], int | None]:
        await c.send(**{k: v for k, v in {**CONFIG, **change}.items() if v is not None})
        await c.send(type="input.text", text="你好。")
        await c.send(type="input.done")
        return await _until_close(ws), ws.close_code

    messages, code = run(gateway_url, script)
    assert len(messages) == 1 and messages[0]["type"] == "error", messages
    assert messages[0]["param"] == param and words in messages[0]["message"], messages[0]
    assert code == 1007
    if "unknown voice" in words:
        assert "GET /v1/audio/voices" in messages[0]["message"]  # where the saved voices are listed


@pytest.mark.parametrize("change", [{"voice": "zzz-nope"}, {"max_new_tokens": 3000}, {"speaker": "zzz-nope",
                                                                                      "voice": None}],
                         ids=["voice", "max_new_tokens", "speaker"])
def test_an_invalid_reconfig_is_refused_and_the_session_keeps_its_config(gateway_url: str,
                                                                         change: dict[str, Any]) -> None:
    """A refused re-config is one ``error``; the session stays open and speaks with its
    previous config; a valid config after it applies."""
    config = {**CONFIG, "response_format": "pcm"}

    async def script(c: DocClient, ws: Any) -> tuple[dict[str, Any], Utterance, Utterance]:
        await c.send(**config)
        await c.send(**{k: v for k, v in {**config, **change}.items() if v is not None})
        refused = json.loads(await asyncio.wait_for(ws.recv(), 60))
        kept = await c.utterance(["你好。"])
        await c.send(**{**config, "voice": "echo"})
        changed = await c.utterance(["你好。"])
        await c.send(type="session.close")
        return refused, kept, changed

    refused, kept, changed = run(gateway_url, script)
    assert refused["type"] == "error" and refused["param"] == next(iter(change)), refused
    assert not kept.errors and not changed.errors
    assert b"".join(kept.sentences[0].frames) == _speech(gateway_url, "你好。", response_format="pcm")
    assert b"".join(changed.sentences[0].frames) == _speech(gateway_url, "你好。", response_format="pcm",
                                                            voice="echo")


def test_a_first_config_over_the_limit_is_refused_as_too_large(gateway_url: str) -> None:
    """A session.config past 4 MiB was taken for our own dialect's first message and refused
    with "the first message must be start": it is the Omni dialect's, refused as too large."""
    async def script(c: DocClient, ws: Any) -> tuple[list[Any], int | None]:
        await c.send(**CONFIG, pad="x" * (4 * 1024 * 1024 + 1))
        return await _until_close(ws), ws.close_code

    messages, code = run(gateway_url, script)
    assert messages and messages[0]["type"] == "error", messages
    assert "too large" in messages[0]["message"] and "4194304" in messages[0]["message"], messages[0]
    assert code is not None and code >= 1007


def test_a_sentence_cut_at_max_new_tokens_says_so_in_audio_done(gateway_url: str) -> None:
    """Two tokens cannot speak the sentence: its audio ends at the cap, and ``audio.done`` says
    ``capped`` (it was shortened without a word before)."""
    async def script(c: DocClient, ws: Any) -> Utterance:
        await c.send(**{**CONFIG, "max_new_tokens": 2})
        return await c.utterance(["你好，今天天气很好，我们出去走走吧。"])

    u = run(gateway_url, script)
    assert not u.errors and [s.done["capped"] for s in u.sentences if s.done] == [True], u.sentences
