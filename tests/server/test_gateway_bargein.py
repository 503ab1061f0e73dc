"""Barge-in on ``/v1/audio/speech/stream``, both dialects, over the real gateway and a real
tritonserver: an interrupt (ours ``interrupt``, vLLM-Omni's ``input.cancel``) after the first
audio stops the utterance (no frame of it after the answer), frees the engine's rows, says what
was sent (samples matching the bytes received, the text spoken and not), and the next utterance
is spoken in full on the same socket; an interrupt with nothing playing is answered, malformed
ones get an error event. Hang bounds only, never wall-clock assertions."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH
from tests.support.servers import Server, metric, running_gateway, wait_until

websockets = pytest.importorskip("websockets")

TOKENS = 500
"""Tokens of every test sentence (max = min): about 10.7 s of audio each, so an utterance of
several sentences is still being made when the interrupt comes after its first audio."""
LONG = "第一句话会被打断。The second sentence is never heard. 第三句也没有机会。Fourth and last."
NEXT = "下一句。"
HANG_S = 120


def _same(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, ws_idle_flush_s=30.0)) as url:
        yield url


def _connect(url: str) -> Any:
    return websockets.connect(url.replace("http", "ws", 1) + WS_PATH, max_size=None)


async def _recv(ws: Any) -> Any:
    return await asyncio.wait_for(ws.recv(), HANG_S)


async def _events_to_close(ws: Any) -> list[dict[str, Any]]:
    """The JSON events the server sends until it closes the socket (audio frames skipped)."""
    events: list[dict[str, Any]] = []
    while True:
        try:
            m = await _recv(ws)
        except websockets.ConnectionClosed:
            return events
        if isinstance(m, str):
            events.append(json.loads(m))


def _engine_idle(server: Server) -> bool:
    return metric(server.metrics_port, "tts_engine_active_sequences") == 0


# --- ours --------------------------------------------------------------------------------------

def test_interrupt_stops_the_utterance_reports_what_was_heard_and_the_next_one_plays(
        gateway_url: str, triton_server: Server) -> None:
    assert wait_until(lambda: _engine_idle(triton_server))
    cancelled = {"model": contract.MODEL_STREAM, "status": "cancelled"}
    before = metric(triton_server.metrics_port, "tts_request_total", **cancelled)

    async def main() -> tuple[dict[str, Any], int, bool, list[Any], int | None]:
        async with _connect(gateway_url) as ws:
            await ws.send(json.dumps({"type": "start", "voice": "alloy", "seed": 5, "response_format": "pcm",
                                      "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}))
            assert json.loads(await _recv(ws))["type"] == "started"
            for piece in (LONG[:20], LONG[20:]):
                await ws.send(json.dumps({"type": "text", "text": piece}))
            await ws.send(json.dumps({"type": "end"}))
            received = 0
            while not isinstance(msg := await _recv(ws), bytes):
                pass
            received += len(msg)
            await ws.send(json.dumps({"type": "interrupt"}))
            while True:  # frames sent before the answer still arrive; none after it
                msg = await _recv(ws)
                if isinstance(msg, bytes):
                    received += len(msg)
                elif (ev := json.loads(msg))["type"] == "interrupted":
                    break
            idle = await asyncio.to_thread(wait_until, lambda: _engine_idle(triton_server), HANG_S)
            await ws.send(json.dumps({"type": "text", "text": NEXT}))
            await ws.send(json.dumps({"type": "end"}))
            after = []
            while True:
                try:
                    after.append(await _recv(ws))
                except websockets.ConnectionClosed:
                    break
            return ev, received, idle, after, ws.close_code

    ev, received, idle, after, code = asyncio.run(main())
    assert idle, "the interrupted utterance's sequences stayed in the engine"
    assert wait_until(lambda: metric(triton_server.metrics_port, "tts_request_total", **cancelled) >= before + 1)
    assert ev["utterance_index"] == 0 and ev["sample_rate_hz"] == contract.SAMPLE_RATE_HZ
    assert ev["delivered_samples"] == received // 2 > 0  # pcm: what the client got, exactly
    assert ev["delivered_s"] == round(received / 2 / contract.SAMPLE_RATE_HZ, 4)
    assert _same(ev["spoken_text"] + ev["unspoken_text"], LONG)
    assert ev["unspoken_text"], "a 4-sentence utterance cut after its first audio left nothing unspoken"
    if ev["sentence_index"] is not None:  # cut inside a sentence: it is unspoken, whole
        assert ev["unspoken_text"].startswith(ev["sentence_text"])
        assert 0 <= ev["sentence_samples"] <= ev["delivered_samples"]
    # the next utterance: its own events from index 0, no frame of the old one in between
    events = [json.loads(m) for m in after if isinstance(m, str)]
    assert isinstance(after[0], str) and events[0]["type"] == "sentence_start"
    assert events[0]["index"] == 0 and events[0]["text"] == NEXT and events[0]["start_samples"] == 0
    assert [e["type"] for e in events] == ["sentence_start", "sentence_done", "done"]
    audio = b"".join(m for m in after if isinstance(m, bytes))
    assert events[1]["duration_samples"] == len(audio) // 2
    assert events[2]["sentences"] == 1 and len(audio) > 0
    assert code == 1000
    assert wait_until(lambda: _engine_idle(triton_server))


def test_an_interrupt_with_nothing_playing_is_answered_and_the_stream_goes_on(gateway_url: str) -> None:
    async def main() -> tuple[dict[str, Any], list[str], int | None]:
        async with _connect(gateway_url) as ws:
            await ws.send(json.dumps({"type": "start", "voice": "alloy", "seed": 5, "response_format": "pcm",
                                      "max_new_tokens": 12, "min_new_tokens": 12}))
            assert json.loads(await _recv(ws))["type"] == "started"
            await ws.send(json.dumps({"type": "interrupt"}))
            ev = json.loads(await _recv(ws))
            await ws.send(json.dumps({"type": "text", "text": "你好。"}))
            await ws.send(json.dumps({"type": "end"}))
            types = [e["type"] for e in await _events_to_close(ws)]
            return ev, types, ws.close_code

    ev, types, code = asyncio.run(main())
    assert ev == {"type": "interrupted", "utterance_index": 0, "sentence_index": None, "sentence_text": None,
                  "sentence_samples": 0, "sentence_s": 0.0, "delivered_samples": 0, "delivered_s": 0.0,
                  "sample_rate_hz": contract.SAMPLE_RATE_HZ, "spoken_text": "", "unspoken_text": ""}
    assert types == ["sentence_start", "sentence_done", "done"] and code == 1000


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([{"type": "interrupt"}], "type", "before"),
    ([{"type": "start", "voice": "alloy"}, {"type": "interrupt", "context_id": "a"}], "context_id", "no fields"),
])
def test_a_malformed_or_early_interrupt_is_an_error_event_and_1007(gateway_url: str, messages: list[Any], param: str,
                                                                   words: str) -> None:
    async def main() -> tuple[list[dict[str, Any]], int | None]:
        async with _connect(gateway_url) as ws:
            for m in messages:
                await ws.send(json.dumps(m))
            events = []
            while True:
                try:
                    m = await _recv(ws)
                except websockets.ConnectionClosed:
                    break
                events.append(json.loads(m))
            return events, ws.close_code

    events, code = asyncio.run(main())
    error = events[-1]
    assert error["type"] == "error" and error["param"] == param and words in error["message"]
    assert code == 1007


# --- vLLM-Omni's --------------------------------------------------------------------------------

OMNI = {"type": "session.config", "voice": "alloy", "seed": 5, "max_new_tokens": TOKENS, "min_new_tokens": TOKENS,
        "split_granularity": "sentence"}


@pytest.mark.parametrize("stream_audio", [True, False])
def test_input_cancel_stops_the_utterance_and_the_session_speaks_the_next(gateway_url: str, triton_server: Server,
                                                                         stream_audio: bool) -> None:
    """With ``stream_audio`` the cancel comes after the first chunk; without, each sentence is
    one file, and it comes after the first sentence's file."""
    assert wait_until(lambda: _engine_idle(triton_server))
    fmt = "pcm" if stream_audio else "wav"

    async def main() -> tuple[dict[str, Any], int, bool, list[Any]]:
        async with _connect(gateway_url) as ws:
            await ws.send(json.dumps({**OMNI, "response_format": fmt, "stream_audio": stream_audio}))
            await ws.send(json.dumps({"type": "input.text", "text": LONG}))
            await ws.send(json.dumps({"type": "input.done"}))
            while not isinstance(msg := await _recv(ws), bytes):
                pass
            received = len(msg) - (0 if stream_audio else 44)
            await ws.send(json.dumps({"type": "input.cancel"}))
            while True:
                msg = await _recv(ws)
                if isinstance(msg, bytes):
                    received += len(msg) - (0 if stream_audio else 44)
                elif (ev := json.loads(msg))["type"] == "audio.cancelled":
                    break
                else:
                    assert ev["type"] in ("audio.start", "audio.done"), ev
            idle = await asyncio.to_thread(wait_until, lambda: _engine_idle(triton_server), HANG_S)
            await ws.send(json.dumps({"type": "input.text", "text": NEXT}))
            await ws.send(json.dumps({"type": "input.done"}))
            after = []
            while not (isinstance(m := await _recv(ws), str) and json.loads(m)["type"] == "session.done"):
                after.append(m)
            after.append(m)
            await ws.send(json.dumps({"type": "session.close"}))
            return ev, received, idle, after

    ev, received, idle, after = asyncio.run(main())
    assert idle, "the cancelled utterance's sequences stayed in the engine"
    assert ev["reason"] == "client_cancel" and ev["utterance_index"] == 0
    assert ev["delivered_samples"] == received // 2 > 0
    assert ev["delivered_s"] == round(received / 2 / contract.SAMPLE_RATE_HZ, 4)
    assert _same(ev["spoken_text"] + ev["unspoken_text"], LONG) and ev["unspoken_text"]
    if not stream_audio:  # whole files: what was heard is whole sentences
        assert ev["sentence_samples"] == 0 and len(ev["spoken_text"]) > 0
    assert isinstance(after[0], str)
    first = json.loads(after[0])
    assert first["type"] == "audio.start" and first["utterance_index"] == 1 and first["sentence_index"] == 0
    assert first["sentence_text"] == NEXT
    events = [json.loads(m) for m in after if isinstance(m, str)]
    assert [e["type"] for e in events] == ["audio.start", "audio.done", "session.done"]
    assert events[1]["error"] is False and events[1]["total_bytes"] == sum(len(m) for m in after
                                                                             if isinstance(m, bytes)) > 0
    assert events[2] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


def test_input_cancel_between_utterances_is_answered_and_a_malformed_one_is_an_error(gateway_url: str) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        async with _connect(gateway_url) as ws:
            await ws.send(json.dumps({**OMNI, "max_new_tokens": 12, "min_new_tokens": 12, "response_format": "pcm"}))
            await ws.send(json.dumps({"type": "input.cancel"}))
            idle = json.loads(await _recv(ws))
            await ws.send(json.dumps({"type": "input.text", "text": "你好。"}))
            await ws.send(json.dumps({"type": "input.cancel", "utterance_index": 0}))  # refused: no effect
            await ws.send(json.dumps({"type": "input.done"}))
            seen = []
            error: dict[str, Any] = {}
            while True:
                m = await _recv(ws)
                if isinstance(m, str):
                    ev = json.loads(m)
                    seen.append(ev["type"])
                    if ev["type"] == "error":
                        error = ev
                    if ev["type"] == "session.done":
                        break
            await ws.send(json.dumps({"type": "session.close"}))
            return idle, error, seen

    idle, error, seen = asyncio.run(main())
    assert idle["type"] == "audio.cancelled" and idle["utterance_index"] == 0 and idle["sentence_index"] is None
    assert idle["delivered_samples"] == 0 and idle["spoken_text"] == "" == idle["unspoken_text"]
    assert error["param"] == "utterance_index" and "no fields" in error["message"]
    assert seen.count("audio.done") == 1 and seen[-1] == "session.done" and "audio.cancelled" not in seen


# --- during the drain ----------------------------------------------------------------------------

def test_an_interrupt_during_the_drain_is_answered_then_the_connection_ends_1012(triton_server: Server,
                                                                                tmp_path: Any) -> None:
    """SIGTERM while both dialects speak; an interrupt then is answered as always, and the
    connection ends with the drain's retryable error and 1012 (its next utterance would be
    refused); the engine is freed and the gateway exits 0."""
    import signal

    from tests.server.test_gateway_drain import AUTH, Gateway

    gw = Gateway(triton_server, tmp_path, drain_timeout_s=60)

    async def one(first: dict[str, Any], done: str, interrupt: str, playing: asyncio.Event,
                  go: asyncio.Event) -> tuple[list[str], dict[str, Any], int | None]:
        async with websockets.connect(gw.url.replace("http", "ws", 1) + WS_PATH, additional_headers=AUTH,
                                      max_size=None) as ws:
            await ws.send(json.dumps(first))
            await ws.send(json.dumps({"type": "text" if done == "end" else "input.text", "text": LONG}))
            await ws.send(json.dumps({"type": done}))
            while not isinstance(await _recv(ws), bytes):
                pass
            playing.set()
            await go.wait()
            await ws.send(json.dumps({"type": interrupt}))
            events = await _events_to_close(ws)
            return [e["type"] for e in events], (events[-1] if events else {}), ws.close_code

    async def main() -> list[tuple[list[str], dict[str, Any], int | None]]:
        playing = [asyncio.Event(), asyncio.Event()]
        go = asyncio.Event()
        ours = asyncio.create_task(one({"type": "start", "voice": "alloy", "seed": 5, "response_format": "pcm",
                                        "max_new_tokens": TOKENS, "min_new_tokens": TOKENS},
                                       "end", "interrupt", playing[0], go))
        omni = asyncio.create_task(one({**OMNI, "response_format": "pcm", "stream_audio": True},
                                       "input.done", "input.cancel", playing[1], go))
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in playing)), HANG_S)
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)  # let the drain begin (no claim on time: the result holds either way)
        go.set()
        return list(await asyncio.gather(ours, omni))

    try:
        (seen_ours, last_ours, code_ours), (seen_omni, last_omni, code_omni) = asyncio.run(main())
        assert "interrupted" in seen_ours and seen_ours[-1] == "error", seen_ours
        assert "audio.cancelled" in seen_omni and seen_omni[-1] == "error", seen_omni
        for last in (last_ours, last_omni):
            assert last["code"] == "server_shutting_down" and last["retryable"] is True
        assert code_ours == code_omni == 1012
        assert wait_until(lambda: _engine_idle(triton_server), HANG_S)
        assert gw.proc.wait(HANG_S) == 0, gw.output()
    finally:
        gw.stop()
