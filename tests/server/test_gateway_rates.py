"""Telephone and chosen-rate audio, and sentence timings, on every door of the real gateway
(HTTP bytes, SSE, the WebSocket) over a real tritonserver: the audio decodes with FFmpeg at
the rate the response states, its length is the 24 kHz stream's at that rate, it is the 24 kHz
synthesis resampled; invalid combinations are OpenAI 400s; each sentence's start and duration
match the audio delivered."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import struct
import wave
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio import rates as R
from chattts_serving.audio.rates import resampled_length
from chattts_serving.client import SynthesisRequest, iter_parts
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH, Close
from tests.support.servers import Server, running_gateway

TOKENS = 24
BODY = {"model": "chattts", "voice": "alloy", "input": "你好，欢迎使用。", "seed": 5, "max_new_tokens": TOKENS,
        "min_new_tokens": TOKENS}
N24 = contract.samples_for_tokens(TOKENS)
"""Samples of one request at 24 kHz."""
MULTI = ("第一句话很短，但是它也不算太短。第二句话稍微长一点，对吧，朋友们？"
         "Third sentence is here, and it is English. 最后一句。")
"""Several sentences: the entry model's streaming segmentation makes segments of them (short
ones merged)."""


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, ws_lookahead=0)) as url:
        yield url


def _post(url: str, **changes: Any) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={**BODY, **changes}, timeout=120)


def _float24(url: str, **changes: Any) -> np.ndarray:
    r = _post(url, response_format="float32", **changes)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<f4")


def _resampled(x: np.ndarray, rate: int) -> np.ndarray:
    r = R.Resampler(rate)
    return np.concatenate([r.process(x), r.flush()])


def _decode(data: bytes, raw_format: str | None = None) -> tuple[np.ndarray, int, str]:
    import av

    options = {"sample_rate": "8000", "ch_layout": "mono"} if raw_format else {}
    with av.open(io.BytesIO(data), format=raw_format, options=options) as c:
        stream = c.streams.audio[0]
        y = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(stream)]).astype(np.float64) / 32768.0
        return y, int(stream.codec_context.sample_rate), str(stream.codec_context.name)


@pytest.mark.parametrize("rate", R.OUTPUT_RATES_HZ)
def test_pcm_and_wav_at_every_rate_are_the_24k_synthesis_resampled(gateway_url: str, rate: int) -> None:
    x = _float24(gateway_url)
    assert x.size == N24
    want = _resampled(x, rate)
    pcm = _post(gateway_url, response_format="pcm", sample_rate=rate)
    assert pcm.status_code == 200 and pcm.headers["x-sample-rate"] == str(rate)
    y = np.frombuffer(pcm.content, "<i2") / 32767.0
    assert y.size == resampled_length(N24, rate) == want.size
    assert np.abs(y - np.clip(want, -1, 1)).max() <= 1.5 / 32767
    wav = _post(gateway_url, response_format="wav", sample_rate=rate)
    decoded, got_rate, codec = _decode(wav.content)
    assert (got_rate, codec, decoded.size) == (rate, "pcm_s16le", want.size)
    assert wav.content[44:] == pcm.content


@pytest.mark.parametrize("law", ["mulaw", "alaw"])
@pytest.mark.parametrize("container", [None, "wav"])
def test_g711_raw_and_in_wav_decodes_at_8_khz(gateway_url: str, law: str, container: str | None) -> None:
    x = _float24(gateway_url)
    r = _post(gateway_url, response_format=law, **({"container": container} if container else {}))
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "8000" and r.headers["x-audio-format"] == law
    assert r.headers["content-type"].startswith("audio/wav" if container else R.G711_FORMATS[law].media_type)
    y, rate, codec = _decode(r.content, None if container else law)
    assert (rate, codec) == (8000, f"pcm_{law}")
    assert y.size == resampled_length(N24, 8000) == len(r.content) - (58 if container else 0)
    assert np.abs(y - _resampled(x, 8000)).max() < 0.03  # 8-bit logarithmic steps


def test_sse_carries_telephone_audio_in_its_deltas(gateway_url: str) -> None:
    raw = _post(gateway_url, response_format="mulaw").content
    with httpx.stream("POST", gateway_url + "/v1/audio/speech", json={**BODY, "response_format": "mulaw",
                                                                       "stream_format": "sse"}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta") == raw


BAD = [({"response_format": "pcm", "sample_rate": 11025}, "sample_rate"),
       ({"response_format": "mp3", "sample_rate": 8000}, "sample_rate"),
       ({"response_format": "opus", "sample_rate": 24000}, "sample_rate"),
       ({"response_format": "mulaw", "sample_rate": 16000}, "sample_rate"),
       ({"response_format": "pcm", "sample_rate": "8000"}, "sample_rate"),
       ({"response_format": "pcm", "sample_rate": 8000.0}, "sample_rate"),
       ({"response_format": "mp3", "container": "wav"}, "container"),
       ({"response_format": "float32", "container": "wav"}, "container"),
       ({"response_format": "pcm", "container": "ogg"}, "container"),
       ({"response_format": "ulaw"}, "response_format")]


@pytest.mark.parametrize("change, param", BAD, ids=[json.dumps(b[0]) for b in BAD])
def test_invalid_rate_and_container_combinations_are_openai_400s(gateway_url: str, change: dict[str, Any],
                                                                  param: str) -> None:
    r = _post(gateway_url, **change)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["code"] == "invalid_value"


# --- sentence timings ------------------------------------------------------------------------------

def _direct_segment_starts(triton_server: Server) -> tuple[list[int], int]:
    """The Triton door's ``info.segment_starts`` for MULTI (from the chunks that start each
    segment) and the stream's length, at 24 kHz."""
    req = SynthesisRequest(text=MULTI, voice="alloy", seed=5, max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    starts: list[int] = []
    n = 0
    final: dict[str, Any] = {}
    for part in iter_parts(triton_server.grpc_url, req):
        if part.info and part.audio.size:
            assert part.info["segment_starts"][-1] == n  # this chunk is where the newest segment begins
            starts = part.info["segment_starts"]
        if part.info and part.info.get("final"):
            final = part.info
        n += part.audio.size
    assert final["segment_starts"] == starts and len(starts) == final["segments"] >= 2
    return starts, n


@pytest.mark.parametrize("rate", [24000, 8000])
def test_offline_timings_in_a_json_body_match_the_audio(gateway_url: str, triton_server: Server, rate: int) -> None:
    starts, n24 = _direct_segment_starts(triton_server)
    fmt = {"response_format": "pcm", "sample_rate": rate} if rate != 24000 else {"response_format": "wav"}
    r = _post(gateway_url, input=MULTI, sentence_timings=True, **fmt)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    audio = base64.b64decode(body["audio"])
    pcm = audio[44:] if fmt["response_format"] == "wav" else audio
    if fmt["response_format"] == "wav":  # a whole file: its header tells its sizes, not a stream's maxima
        with wave.open(io.BytesIO(audio)) as w:
            assert w.getnframes() == len(pcm) // 2 and struct.unpack_from("<I", audio, 4)[0] == len(audio) - 8
    assert body["capped_segments"] == list(range(len(body["sentences"])))  # min = max_new_tokens: each at its cap
    assert body["sample_rate_hz"] == rate and body["samples"] == len(pcm) // 2 == resampled_length(n24, rate)
    sentences = body["sentences"]
    assert [s["index"] for s in sentences] == list(range(len(starts)))
    assert [s["start_samples"] for s in sentences] == [resampled_length(s, rate) for s in starts]
    ends = [s["start_samples"] + s["duration_samples"] for s in sentences]
    assert ends == [s["start_samples"] for s in sentences[1:]] + [len(pcm) // 2]
    for s in sentences:
        assert s["start_s"] == round(s["start_samples"] / rate, 4) and s["duration_s"] > 0 and s["text"]


def test_sse_sentence_events_follow_their_audio(gateway_url: str, triton_server: Server) -> None:
    starts, n24 = _direct_segment_starts(triton_server)
    with httpx.stream("POST", gateway_url + "/v1/audio/speech", timeout=120,
                      json={**BODY, "input": MULTI, "response_format": "pcm", "stream_format": "sse",
                            "sentence_timings": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    delivered = 0
    seen = []
    for e in events:
        if e["type"] == "speech.audio.delta":
            delivered += len(base64.b64decode(e["audio"])) // 2
        elif e["type"] == "speech.sentence":
            assert delivered == e["start_samples"] + e["duration_samples"]  # all of it, nothing of the next
            seen.append(e)
    assert [e["start_samples"] for e in seen] == starts and delivered == n24
    assert events[-1]["type"] == "speech.audio.done"
    plain = _post(gateway_url, input=MULTI, response_format="pcm", stream_format="sse")
    assert "speech.sentence" not in plain.text  # only when asked for


def _ws(url: str, start: dict[str, Any], deltas: list[str]) -> list[Any]:
    import websockets

    async def run() -> list[Any]:
        out: list[Any] = []
        async with websockets.connect(url.replace("http", "ws", 1) + WS_PATH, max_size=None) as ws:
            await ws.send(json.dumps(start))
            for d in deltas:
                await ws.send(json.dumps({"type": "text", "text": d}))
            await ws.send(json.dumps({"type": "end"}))
            with contextlib.suppress(websockets.ConnectionClosed):
                async for msg in ws:
                    out.append(msg if isinstance(msg, bytes) else json.loads(msg))
            out.append(("close", ws.close_code))
        return out

    return asyncio.run(run())


WS_START = {"type": "start", "voice": "alloy", "seed": 5, "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}


@pytest.mark.parametrize("fmt", [{"response_format": "pcm"}, {"response_format": "pcm", "sample_rate": 16000},
                                 {"response_format": "mulaw"}])
def test_websocket_timings_and_rates_match_the_frames(gateway_url: str, fmt: dict[str, Any]) -> None:
    msgs = _ws(gateway_url, {**WS_START, **fmt}, ["第一句。第二", "句话。Third one."])
    started = msgs[0]
    rate = fmt.get("sample_rate", 8000 if fmt["response_format"] == "mulaw" else 24000)
    assert started["type"] == "started" and started["sample_rate_hz"] == rate
    width = 1 if fmt["response_format"] == "mulaw" else 2
    delivered = 0
    total24 = 0
    current: dict[str, Any] = {}
    for m in msgs[1:]:
        if isinstance(m, bytes):
            delivered += len(m) // width
        elif m[0] == "close" if isinstance(m, tuple) else False:
            assert m[1] == Close.NORMAL
        elif m["type"] == "sentence_start":
            current = m
            assert m["start_samples"] == resampled_length(total24, rate)
            if rate == 24000:
                assert delivered == m["start_samples"]
        elif m["type"] == "sentence_done":
            assert m["start_samples"] == current["start_samples"] and m["index"] == current["index"]
            total24 += N24  # every sentence is TOKENS tokens long
            assert abs(m["audio_s"] * 24000 - N24) < 2
            assert m["start_samples"] + m["duration_samples"] == resampled_length(total24, rate)
            if rate == 24000:
                assert delivered == m["start_samples"] + m["duration_samples"]  # the frames between the events
        elif m["type"] == "done":
            assert m["sentences"] == 3
    assert delivered == resampled_length(total24, rate) == resampled_length(3 * N24, rate)


def test_websocket_refuses_a_bad_rate_at_start(gateway_url: str) -> None:
    msgs = _ws(gateway_url, {**WS_START, "response_format": "mp3", "sample_rate": 8000}, [])
    assert msgs[0]["type"] == "error" and msgs[0]["param"] == "sample_rate" and msgs[0]["kind"] == "invalid"
    assert msgs[-1] == ("close", Close.INVALID_DATA)
