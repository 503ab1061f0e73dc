"""``/v1/audio/speech/stream``: a real WebSocket client (``websockets``) over the real gateway
(uvicorn) and a real tritonserver on the small config: deltas cut anywhere give the audio of
each sentence requested alone, closing cancels the engine's sequence, malformed messages get an
error event and a close code, ten connections at once complete or are told busy, a client that
stops reading is cut off. The sentence splitter alone: tests/unit/test_gateway_ws.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH, Close
from chattts_serving.runtime import Artifacts
from chattts_serving.text.sentences import split_sentences
from tests.support.servers import Server, metric, running_gateway, serve_profile, wait_until

websockets = pytest.importorskip("websockets")

API_KEY = "ws-key-5"
TOKENS = 12
"""max_new_tokens = min_new_tokens of the test sentences: 12 tokens, 0.26 s of audio each."""
START = {"type": "start", "voice": "alloy", "seed": 11, "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}


# --- against a real gateway and tritonserver ---------------------------------------------

@dataclass
class Conversation:
    """What one connection received: events in order, audio bytes per sentence, close code."""

    events: list[dict[str, Any]] = field(default_factory=list)
    audio: dict[int, bytearray] = field(default_factory=dict)
    close_code: int | None = None

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def _ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + WS_PATH


async def _messages(ws: Any) -> Any:
    """The messages of ``ws`` until it closes, whatever the close code."""
    while True:
        try:
            yield await ws.recv()
        except websockets.ConnectionClosed:
            return


async def _converse(url: str, messages: list[Any], *, key: str | None = API_KEY, delay_s: float = 0.0,
                    on_event: Any = None) -> Conversation:
    conv = Conversation()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with websockets.connect(_ws_url(url), additional_headers=headers, max_size=None) as ws:
        async def send() -> None:
            for m in messages:
                await ws.send(m if isinstance(m, (bytes, str)) else json.dumps(m))
                if delay_s:
                    await asyncio.sleep(delay_s)

        sender = asyncio.create_task(send())
        current = -1
        try:
            async for msg in _messages(ws):
                if isinstance(msg, bytes):
                    conv.audio.setdefault(current, bytearray()).extend(msg)
                    continue
                ev = json.loads(msg)
                conv.events.append(ev)
                if ev["type"] == "sentence_start":
                    current = ev["index"]
                if on_event is not None and await on_event(ws, ev):
                    break
        finally:
            sender.cancel()
        conv.close_code = ws.close_code
    return conv


def _speak(url: str, deltas: list[str], **start: Any) -> Conversation:
    """One connection: ``start`` fields over :data:`START`, each delta as a text message (a
    dict in ``deltas`` as a flush), then end."""
    msgs: list[Any] = [{**START, **start},
                       *({"type": "text", "text": d} if isinstance(d, str) else {"type": "flush"} for d in deltas),
                       {"type": "end"}]
    return asyncio.run(_converse(url, msgs))


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, ws_idle_flush_s=30.0)
    with running_gateway(settings) as url:
        yield url


SPOKEN = "你好，欢迎使用ChatTTS。The weather is 25.5°C today. 明天见！"
SENTENCES = ["你好，欢迎使用ChatTTS。", "The weather is 25.5°C today.", "明天见！"]


def _pcm16(data: bytes | bytearray) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype="<i2").astype(np.int32)


@pytest.mark.parametrize("lookahead", [0, 1])
def test_deltas_split_mid_word_give_the_audio_of_each_sentence_requested_alone(triton_server: Server,
                                                                               lookahead: int) -> None:
    """'Same audio': the stream of sentences s1..sn is sample for sample the n separate
    ``/v1/audio/speech`` requests of s1..sn with the start message's fields (same seed), with
    sentences synthesised one at a time (lookahead 0). With lookahead, sentence i+1's GPT and
    vocoder run batched with sentence i's, and the vocoder's float sums may round differently:
    the codes are the same, the PCM16 samples within one step.

    At the default lookahead (1) the whole text sent at once and the same text split mid-word
    and mid-sentence are also compared with each other, directly, within that one PCM16 step
    (both are the same float samples up to rounding noise far below one step, so after rounding
    they can differ by one step at most). Exact equality holds only at lookahead 0: only then is
    every sentence alone in the engine; with lookahead, which sentences share a batch, and from
    which step on, depends on when each delta arrived and how far the previous sentence had got,
    which differs between the two ways of sending, and so does the order of the float sums."""
    assert split_sentences(SPOKEN) == SENTENCES
    assert GatewaySettings().ws_lookahead == 1  # the default, the second case
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY, ws_idle_flush_s=30.0,
                               ws_lookahead=lookahead)
    with running_gateway(settings) as url:
        whole = _speak(url, [SPOKEN])
        pieces = [SPOKEN[i:i + 3] for i in range(0, len(SPOKEN), 3)]  # "25." | "5°C": mid-number, mid-word
        split = _speak(url, pieces)
        alone = []
        for sentence in SENTENCES:
            body = {"model": "tts-1", "voice": "alloy", "input": sentence, "response_format": "pcm", "seed": 11,
                    "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}
            alone.append(httpx.post(url + "/v1/audio/speech", json=body, timeout=60,
                                    headers={"Authorization": f"Bearer {API_KEY}"}).content)
        scraped = httpx.get(url + "/metrics", timeout=10).text
    assert "tts_gateway_ws_sentence_first_audio_seconds_count 6.0" in scraped  # 2 connections, 3 sentences each
    for conv in (whole, split):
        assert conv.close_code == Close.NORMAL
        assert conv.types() == ["started", *["sentence_start", "sentence_done"] * 3, "done"], conv.events
        assert [e["text"] for e in conv.events if e["type"] == "sentence_start"] == SENTENCES
        assert sorted(conv.audio) == [0, 1, 2]
    assert whole.events[0]["sample_rate_hz"] == contract.SAMPLE_RATE_HZ and whole.events[0]["format"] == "pcm"
    for i in range(3):
        assert len(alone[i]) == len(whole.audio[i]) == len(split.audio[i]) == 2 * contract.samples_for_tokens(TOKENS)
        if lookahead == 0:
            assert bytes(whole.audio[i]) == bytes(split.audio[i]) == alone[i], f"sentence {i} differs"
        else:
            for got in (whole.audio[i], split.audio[i]):
                assert np.abs(_pcm16(got) - _pcm16(alone[i])).max() <= 1, f"sentence {i} differs"
            diff = np.abs(_pcm16(whole.audio[i]) - _pcm16(split.audio[i])).max()
            assert diff <= 1, f"sentence {i}: whole and split text differ by {diff} PCM16 steps"
    done = whole.events[-1]
    assert done["sentences"] == 3 and done["audio_s"] == pytest.approx(3 * contract.samples_for_tokens(TOKENS)
                                                                       / contract.SAMPLE_RATE_HZ, abs=1e-3)


def test_a_start_without_a_voice_but_with_spk_smp_speaks_with_no_speaker_vector(gateway_url: str) -> None:
    """As on ``POST /v1/audio/speech``: with ``spk_smp`` the start may omit ``voice`` (no speaker
    vector); the sentence's audio is that request's."""
    from chattts_serving.audio.reference import encode_spk_smp

    ref = {"spk_smp": encode_spk_smp(np.random.default_rng(5).integers(0, 625, (30, contract.NUM_VQ))),
           "reference_text": "参考。"}
    start = {k: v for k, v in {**START, **ref}.items() if k != "voice"}
    conv = asyncio.run(_converse(gateway_url, [start, {"type": "text", "text": "你好。"}, {"type": "end"}]))
    assert conv.close_code == Close.NORMAL and conv.types()[-1] == "done", conv.events
    body = {k: v for k, v in start.items() if k != "type"}
    alone = httpx.post(gateway_url + "/v1/audio/speech", json={**body, "model": "tts-1", "input": "你好。",
                                                               "response_format": "pcm"},
                       headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert alone.status_code == 200 and bytes(conv.audio[0]) == alone.content


def test_sentence_events_carry_normalised_and_unspoken_text(gateway_url: str) -> None:
    conv = _speak(gateway_url, ["气温25℃😀。"])
    start = next(e for e in conv.events if e["type"] == "sentence_start")
    assert "二十五" in start["normalized_text"] and start["unspoken"] == ["😀"]


def test_an_unspeakable_fragment_is_reported_dropped_and_the_stream_goes_on(gateway_url: str) -> None:
    """An emoji alone (here the whole first sentence, and the tail an LLM adds after its last
    sentence) has nothing to speak: it is reported as dropped in its sentence events and in
    ``done``, never as an ``error`` (the issue: 好的，没问题！😀 ended on a red error)."""
    conv = _speak(gateway_url, ["😀😀。", "你好。", "好的，没问题！😀", " 👍"])
    assert "error" not in conv.types(), conv.events
    starts = [e for e in conv.events if e["type"] == "sentence_start"]
    dones = [e for e in conv.events if e["type"] == "sentence_done"]
    assert [e["text"] for e in starts] == ["😀😀。", "你好。", "好的，没问题！😀", "👍"]
    assert [e["dropped"] for e in starts] == [True, False, False, True] == [e["dropped"] for e in dones]
    assert starts[0]["unspoken"] == ["😀"] and starts[2]["unspoken"] == ["😀"] and starts[3]["unspoken"] == ["👍"]
    assert dones[0]["audio_s"] == 0.0 and dones[0]["first_audio_ms"] is None
    assert [e["capped"] for e in dones] == [False, True, True, False]  # the spoken two end at max_new_tokens
    assert sorted(conv.audio) == [1, 2] and len(conv.audio[1]) == 2 * contract.samples_for_tokens(TOKENS)
    done = conv.events[-1]
    assert done["type"] == "done" and done["dropped_sentences"] == [0, 3] and done["unspoken"] == ["😀", "👍"]
    assert done["sentences"] == 4 and conv.close_code == Close.NORMAL


def test_flush_ends_a_sentence_and_wav_has_one_header_for_the_connection(gateway_url: str) -> None:
    conv = _speak(gateway_url, ["没有句号", {"flush": True}, "第二句"], response_format="wav")  # type: ignore[list-item]
    assert [e["text"] for e in conv.events if e["type"] == "sentence_start"] == ["没有句号", "第二句"]
    assert conv.events[0]["format"] == "wav"
    data = b"".join(bytes(conv.audio[i]) for i in sorted(conv.audio))
    assert data[:4] == b"RIFF" and data.count(b"RIFF") == 1
    assert len(data) == 44 + 2 * 2 * contract.samples_for_tokens(TOKENS)


def test_an_unfinished_sentence_is_spoken_after_the_idle_time(triton_server: Server) -> None:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, ws_idle_flush_s=0.3)

    async def end_after_first_sentence(ws: Any, ev: dict[str, Any]) -> bool:
        if ev["type"] == "sentence_done":
            await ws.send(json.dumps({"type": "end"}))
        return False

    with running_gateway(settings) as url:  # no sentence end, no end message: only the idle time
        conv = asyncio.run(_converse(url, [START, {"type": "text", "text": "没有句号"}], key=None,
                                     on_event=end_after_first_sentence))
    assert conv.types() == ["started", "sentence_start", "sentence_done", "done"]
    assert conv.events[1]["text"] == "没有句号" and conv.close_code == Close.NORMAL


def test_closing_mid_stream_cancels_the_engine_sequence(gateway_url: str, triton_server: Server) -> None:
    port = triton_server.metrics_port
    assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0)
    cancelled = {"model": contract.MODEL_STREAM, "status": "cancelled"}
    before = metric(port, "tts_request_total", **cancelled)

    async def main() -> int:
        async with websockets.connect(_ws_url(gateway_url), additional_headers={"Authorization": f"Bearer {API_KEY}"},
                                      max_size=None) as ws:
            await ws.send(json.dumps({**START, "max_new_tokens": 2000, "min_new_tokens": 2000}))
            await ws.send(json.dumps({"type": "text", "text": "这是一个会被提前关闭的长句子。"}))
            received = 0
            async for msg in ws:
                if isinstance(msg, bytes):
                    received += len(msg)
                    break
            assert metric(port, "tts_engine_active_sequences") == 1
            return received

    assert asyncio.run(main()) > 0  # the socket is closed on leaving the block, mid-sentence
    assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0), "the sequence stayed in the engine"
    assert wait_until(lambda: metric(port, "tts_request_total", **cancelled) == before + 1)


def test_the_next_sentence_is_synthesised_while_this_one_is_sent(gateway_url: str, triton_server: Server) -> None:
    """Lookahead 1: once sentence 0's audio flows, sentence 1 is in the engine too; closing the
    socket then cancels both."""
    port = triton_server.metrics_port
    assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0)

    async def main() -> bool:
        async with websockets.connect(_ws_url(gateway_url), additional_headers={"Authorization": f"Bearer {API_KEY}"},
                                      max_size=None) as ws:
            await ws.send(json.dumps({**START, "max_new_tokens": 2000, "min_new_tokens": 2000}))
            await ws.send(json.dumps({"type": "text", "text": "第一个长句子。第二个长句子。第三句。"}))
            await ws.send(json.dumps({"type": "end"}))
            while not isinstance(await ws.recv(), bytes):
                pass
            return await asyncio.to_thread(wait_until, lambda: metric(port, "tts_engine_active_sequences") == 2, 30.0)

    assert asyncio.run(main()), "sentence 1 did not start while sentence 0 was being sent"
    assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0), "a sequence stayed in the engine"


MALFORMED = [
    ("not JSON", ["{start"], Close.INVALID_DATA, "invalid_json"),
    ("binary message", [b"\x00\x01"], Close.UNSUPPORTED, "invalid_message"),
    ("text before start", [{"type": "text", "text": "hi"}], Close.INVALID_DATA, "invalid_message"),
    ("not an object", [[1, 2]], Close.INVALID_DATA, "invalid_message"),
    ("bad field", [{**START, "speed": "fast"}], Close.INVALID_DATA, "invalid_value"),
    ("unknown model", [{**START, "model": "x"}], Close.INVALID_DATA, "model_not_found"),
    ("non-streaming option", [{**START, "stream_format": "sse"}], Close.INVALID_DATA, "unsupported_parameter"),
    ("unknown type", [START, {"type": "say", "text": "hi"}], Close.INVALID_DATA, "invalid_message"),
    ("text not a string", [START, {"type": "text", "text": 5}], Close.INVALID_DATA, "invalid_message"),
    ("lone surrogate", [START, '{"type": "text", "text": "\\ud83d"}'], Close.INVALID_DATA, "invalid_message"),
    ("no voice and no reference", [{k: v for k, v in START.items() if k != "voice"}], Close.INVALID_DATA,
     "invalid_value"),
    ("voice none without a reference", [{**START, "voice": "none"}], Close.INVALID_DATA, "invalid_value"),
    ("empty voice", [{**START, "voice": " "}], Close.INVALID_DATA, "invalid_value"),
]
"""Mistakes the gateway sees in the message itself."""
START_MISTAKES = [
    ("unknown voice", {"voice": "no-such-voice"}, "voice"),
    ("voice seed out of range", {"voice": "99999999999"}, "voice"),
    ("malformed spk_emb voice", {"voice": "蘁淰" + "x" * 40}, "voice"),
    ("unknown vocoder", {"vocoder": "wavenet"}, "vocoder"),
    ("unknown segmentation", {"segmentation": "paragraphs"}, "segmentation"),
    ("unknown format", {"response_format": "ogg"}, "response_format"),
    ("min above max tokens", {"max_new_tokens": 8, "min_new_tokens": 20}, "min_new_tokens"),
    ("temperature out of range", {"temperature": 0.0}, "temperature"),
    ("refine prompt without refine", {"refine_prompt": "[oral_2]"}, "refine_text"),
    ("bad refine prompt", {"refine_text": True, "refine_prompt": "[oral_99]"}, "refine_prompt"),
    ("transcript without a reference", {"reference_text": "你好。"}, "reference_text"),
    ("malformed spk_smp", {"spk_smp": "not-a-spk-smp", "reference_text": "你好。"}, "spk_smp"),
    ("reference audio not a WAV", {"reference_audio": base64.b64encode(b"RIFF1234").decode(),
                                   "reference_text": "你好。"}, "reference_audio"),
]
"""Mistakes in the start message that ``POST /v1/audio/speech`` refuses with 400, most of them
only the server can see (the voice book, the profile's limits, the front end's checks): each is
refused at the start, with one error and 1007, before ``started`` (the issue: an unknown voice
was accepted and every sentence then failed, the stream ending ``done`` with no audio)."""


@pytest.mark.parametrize("case,fields,param", START_MISTAKES, ids=[m[0] for m in START_MISTAKES])
def test_a_start_is_validated_whole_before_started(gateway_url: str, case: str, fields: dict[str, Any],
                                                   param: str) -> None:
    start = {**START, **fields}
    conv = asyncio.run(_converse(gateway_url, [start, {"type": "text", "text": "你好。"}, {"type": "end"}]))
    assert conv.types() == ["error"], conv.events
    error = conv.events[0]
    assert error["kind"] == "invalid" and error["retryable"] is False and error["param"] == param, error
    assert conv.close_code == Close.INVALID_DATA and not conv.audio
    # the HTTP door refuses the same fields with 400 and the same param
    body = {k: v for k, v in start.items() if k != "type"}
    http = httpx.post(gateway_url + "/v1/audio/speech", json={**body, "model": "tts-1", "input": "你好。"},
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert http.status_code == 400 and http.json()["error"]["param"] == param, http.text


@pytest.mark.parametrize("case,messages,code,error_code", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_message_gets_an_error_event_and_a_close_code(gateway_url: str, case: str, messages: list[Any],
                                                                 code: int, error_code: str) -> None:
    conv = asyncio.run(_converse(gateway_url, messages))
    error = conv.events[-1]
    assert error["type"] == "error" and error["kind"] == "invalid" and error["retryable"] is False, conv.events
    assert error["code"] == error_code and error["message"]
    assert conv.close_code == code


@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_missing_or_wrong_key_is_refused_with_1008(gateway_url: str, key: str | None) -> None:
    conv = asyncio.run(_converse(gateway_url, [START], key=key))
    assert conv.types() == ["error"] and conv.events[0]["code"] == "invalid_api_key"
    assert conv.close_code == Close.POLICY


def test_a_silent_client_is_closed_after_the_idle_timeout(triton_server: Server) -> None:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, stream_idle_timeout_s=0.5)
    with running_gateway(settings) as url:
        silent = asyncio.run(_converse(url, [], key=None))  # connects, never sends start
        quiet = asyncio.run(_converse(url, [START, {"type": "text", "text": "没有结尾"}], key=None))
    assert silent.types() == ["error"] and silent.close_code == Close.POLICY
    error = silent.events[0]
    assert (error["kind"], error["code"], error["retryable"]) == ("deadline", "idle_timeout", False)
    # the held text is spoken after the idle flush (1 s); no message within 0.5 s then ends the connection
    assert quiet.types()[0] == "started" and quiet.events[-1]["code"] == "idle_timeout"


def test_a_client_being_sent_audio_is_not_idle(triton_server: Server) -> None:
    """An audiobook client sends a long first text in ``start`` and nothing more: while its
    audio is still being sent it is not idle (every sentence comes, though the audio takes
    longer than the idle timeout: 3200 tokens and their vocoding, one sentence at a time, take
    seconds on any CPU); once everything is sent and no ``end`` came, the idle timeout ends the
    connection."""
    settings = GatewaySettings(triton_url=triton_server.grpc_url, stream_idle_timeout_s=1.0, ws_lookahead=0)
    sentences = [f"第{i}句话。" for i in range(8)]
    long_start = {**START, "max_new_tokens": 400, "min_new_tokens": 400, "input": "".join(sentences)}
    with running_gateway(settings) as url:
        conv = asyncio.run(_converse(url, [long_start], key=None))
    starts = [e for e in conv.events if e["type"] == "sentence_start"]
    assert [e["text"] for e in starts] == sentences, conv.types()
    assert conv.types().count("sentence_done") == len(sentences)
    assert conv.events[-1]["code"] == "idle_timeout" and conv.close_code == Close.POLICY


def test_the_key_is_accepted_as_a_subprotocol(gateway_url: str) -> None:
    async def main() -> tuple[str | None, dict[str, Any]]:
        async with websockets.connect(_ws_url(gateway_url), subprotocols=["chattts.v1", f"bearer.{API_KEY}"]) as ws:
            await ws.send(json.dumps(START))
            return ws.subprotocol, json.loads(await ws.recv())

    protocol, first = asyncio.run(main())
    assert protocol == "chattts.v1" and first["type"] == "started"


def test_ten_connections_at_once_complete_or_are_told_busy(triton_server: Server) -> None:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, max_streams=4)

    async def one(i: int, all_started: asyncio.Event, answered: list[int]) -> Conversation:
        async def after_first(ws: Any, ev: dict[str, Any]) -> bool:
            if len(conv_events) == 0:
                answered.append(i)
                if len(answered) == 10:
                    all_started.set()
                if ev["type"] == "started":
                    await all_started.wait()  # hold the slot until every connection was answered
                    await ws.send(json.dumps({"type": "text", "text": f"第{i}个连接。"}))
                    await ws.send(json.dumps({"type": "end"}))
            conv_events.append(ev)
            return False

        conv_events: list[dict[str, Any]] = []
        return await _converse(url, [START], key=None, on_event=after_first)

    async def main() -> list[Conversation]:
        started, answered = asyncio.Event(), []  # type: ignore[var-annotated]
        return await asyncio.gather(*(one(i, started, answered) for i in range(10)))

    with running_gateway(settings) as url:
        convs = asyncio.run(main())
    done = [c for c in convs if c.types()[-1] == "done"]
    busy = [c for c in convs if c.types() == ["error"]]
    assert len(done) + len(busy) == 10 and len(done) == 4, [c.types() for c in convs]
    for c in done:
        assert c.close_code == Close.NORMAL and len(c.audio[0]) == 2 * contract.samples_for_tokens(TOKENS)
    for c in busy:
        error = c.events[0]
        assert (error["kind"], error["code"], error["retryable"]) == ("busy", "server_busy", True)
        assert c.close_code == Close.TRY_AGAIN


def test_tritons_busy_answer_is_a_retryable_busy_event_and_1013(small_artifacts: Artifacts,
                                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """Triton admits one stream (the gateway's own limit is far, and its admission watch is off,
    so that requests meet Triton's gate). A connection that starts while another speaks is told
    busy at its start, by the server's check of the start: one retryable busy event, close 1013,
    no ``started``. A connection that started while the server was free and whose sentence then
    meets the full server gets ``started``, then the busy event and 1013. With the watch, the
    gateway refuses the start itself: tests/server/test_gateway.py."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("ws-one-slot"), entry={"max_concurrent_streams": 1})
    try:
        settings = GatewaySettings(triton_url=f"127.0.0.1:{srv.grpc_port}", ws_lookahead=0, admission_watch=False)
        with running_gateway(settings) as url:
            async def main() -> tuple[Conversation, Conversation]:
                async with websockets.connect(_ws_url(url), max_size=None) as early:
                    await early.send(json.dumps(START))
                    assert json.loads(await early.recv())["type"] == "started"  # the server was free
                    async with websockets.connect(_ws_url(url), max_size=None) as holder:
                        await holder.send(json.dumps({**START, "max_new_tokens": 2000, "min_new_tokens": 2000}))
                        await holder.send(json.dumps({"type": "text", "text": "占住唯一的名额。"}))
                        while not isinstance(await holder.recv(), bytes):
                            pass  # audio flows: Triton's only slot is taken
                        late = await _converse(url, [START, {"type": "text", "text": "你好。"}, {"type": "end"}],
                                               key=None)
                        await early.send(json.dumps({"type": "text", "text": "你好。"}))
                        await early.send(json.dumps({"type": "end"}))
                        rest = Conversation(events=[{"type": "started"}])
                        async for msg in _messages(early):
                            if isinstance(msg, str):
                                rest.events.append(json.loads(msg))
                        rest.close_code = early.close_code
                        return late, rest

            late, early = asyncio.run(main())
    finally:
        srv.stop()
    assert late.types() == ["error"], late.events
    assert early.types() == ["started", "error"], early.events
    for conv in (late, early):
        error = conv.events[-1]
        assert (error["kind"], error["code"], error["retryable"]) == ("busy", "server_busy", True)
        assert conv.close_code == Close.TRY_AGAIN


def _raw_handshake(url: str) -> socket.socket:
    """A TCP connection to the gateway's WebSocket path, upgraded by hand, with a 4 KiB receive
    buffer: unlike a WebSocket library, nothing reads from it behind the test's back."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(random.randbytes(16)).decode()
    sock.sendall((f"GET {WS_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "the gateway closed during the handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _raw_send_text(sock: socket.socket, text: str) -> None:
    """One masked text frame (RFC 6455 section 5.2; a client's frames are always masked)."""
    payload = text.encode()
    mask = random.randbytes(4)
    size = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big"))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def _raw_close_code(sock: socket.socket) -> tuple[int, list[dict[str, Any]]]:
    """Read the connection to its end: (the close code of the server's close frame, or 1006
    when the connection ended without one; the JSON events sent before it)."""
    data = bytearray()
    sock.settimeout(60)
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 16):
            data += chunk
    events: list[dict[str, Any]] = []
    pos = 0
    while pos + 2 <= len(data):
        opcode, size, pos = data[pos] & 0x0F, data[pos + 1] & 0x7F, pos + 2
        if size >= 126:
            width = 2 if size == 126 else 8
            size, pos = int.from_bytes(data[pos:pos + width], "big"), pos + width
        if pos + size > len(data):
            break  # cut off mid-frame
        payload, pos = bytes(data[pos:pos + size]), pos + size
        if opcode == 0x1:
            events.append(json.loads(payload))
        elif opcode == 0x8:
            return int.from_bytes(payload[:2], "big"), events
    return 1006, events


@pytest.mark.parametrize("late_s", [0.0, 3.0], ids=["reads-at-once", "reads-late"])
def test_a_client_that_stops_reading_is_cut_off_and_its_synthesis_cancelled(triton_server: Server,
                                                                              late_s: float) -> None:
    """Policy: the gateway holds a bounded amount of audio per connection and, once the client
    has taken nothing for ``ws_send_timeout_s``, cancels the synthesis and closes with 1008
    after an error event (or drops the connection, 1006, when even the close frame cannot be
    delivered): never a normal close (1000), also when the client reads again after it was cut
    off. Three sentences of 2000 tokens are 12 MB of float32 audio, more than the socket
    buffers hold (about 3 MB on loopback with a 4 KiB receive buffer), so the first sentence
    can never be delivered and, with one sentence of lookahead, the third is never synthesised.
    The cut-off is awaited on the gateway's own error counter: the engine's sequences may end
    before it (the engine runs ahead of the vocoder), so they say nothing about it."""
    port = triton_server.metrics_port
    assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0)
    streams_before = metric(port, "tts_request_total", model=contract.MODEL_STREAM)
    settings = GatewaySettings(triton_url=triton_server.grpc_url, ws_send_timeout_s=2.0, ws_queue_chunks=2,
                               ws_lookahead=1)
    with running_gateway(settings) as url:
        gateway_port = int(url.rsplit(":", 1)[1])
        sock = _raw_handshake(url)
        with sock:
            start = {**START, "response_format": "float32", "max_new_tokens": 2000, "min_new_tokens": 2000}
            for message in (start, {"type": "text", "text": "一个很长的句子。第二个很长的句子。第三句。"},
                            {"type": "end"}):
                _raw_send_text(sock, json.dumps(message))
            # read nothing until the gateway has given up on this client
            assert wait_until(lambda: metric(gateway_port, "tts_gateway_errors_total", kind="deadline",
                                             phase="mid_stream") >= 1, 180.0), "the gateway never cut the client off"
            assert wait_until(lambda: metric(gateway_port, "tts_gateway_streams_in_flight") == 0)
            assert wait_until(lambda: metric(port, "tts_engine_active_sequences") == 0, 60.0), "still generating"
            time.sleep(late_s)
            code, events = _raw_close_code(sock)
    assert code in (Close.POLICY, 1006), (code, events[-3:])  # 1006: the close frame could not get past the audio
    assert not any(e["type"] in ("done", "sentence_done") for e in events), "the stream was not cut off"
    if code == Close.POLICY:
        assert (events[-1]["type"], events[-1]["code"]) == ("error", "slow_reader")

    def streams_finished() -> float:
        return metric(port, "tts_request_total", model=contract.MODEL_STREAM) - streams_before

    assert wait_until(lambda: streams_finished() >= 1) and streams_finished() <= 2, \
        "the third sentence was synthesised although the first was never delivered"
