"""Voice-agent frameworks as real clients of the gateway over a real tritonserver: pipecat's
``OpenAITTSService`` and LiveKit Agents' ``livekit.plugins.openai.TTS``, each pointed at the
gateway by ``base_url`` and driven through its own API (a pipecat pipeline with a frame
collector; LiveKit's ``synthesize()`` and ``stream()``), as a voice bot would use them.

For a Chinese and an English sentence, the frames each framework would play have the rate it
asked for (24 kHz: both frameworks' OpenAI services take OpenAI's rate), whole int16 samples,
and every sample the gateway produces for the same request sent directly; the same for an LLM's
reply in deltas, which each framework cuts into sentences (pipecat's aggregator, LiveKit's
``StreamAdapter``, what an ``AgentSession`` wraps a non-streaming TTS in). An interruption
through the framework (pipecat's ``InterruptionFrame``, what its barge-in pushes; LiveKit's
``aclose()`` of the stream) cancels the gateway's request and frees its engine row.

The frameworks are the optional ``agents`` extra (``make setup`` installs it on CPU hosts):
without them the tests are skipped, naming the extra; under CI they fail instead."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings
from tests.support.browser import under_ci
from tests.support.servers import Server, metric, running_gateway, wait_until

API_KEY = "agents-key-1234"
SENTENCES = {"zh": "你好，欢迎使用语音合成。", "en": "The weather is nice today."}
LONG = "这是一段很长的话，要说很久。" * 40 + "And then some more words, for a long while." * 20
"""Text that keeps the engine busy long after its first audio (many sentences): an
interruption after the first frame finds the request still running."""
DELTAS = ["你好，", "欢迎使用", "语音合成。The weather ", "is nice today. ", "我们明天", "再聊。"]
"""An LLM's reply as it streams: Chinese and English, sentences cut across deltas."""
CANCELLED = {"model": contract.MODEL_STREAM, "status": "cancelled"}


def _need(module: str) -> None:
    """Skip when the ``agents`` extra is not installed; under CI fail instead, except on a
    GPU host (onnxruntime-gpu), where ``make setup`` leaves the extra out on purpose."""
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        problem = f"{module} is not installed (pip install -e '.[agents]'; make setup installs it on CPU hosts)"
        import onnxruntime

        if under_ci() and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            pytest.fail(problem)
        pytest.skip(problem)


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY)) as url:
        yield url


def _direct(url: str, text: str, **body: Any) -> bytes:
    """What the gateway produces for ``text`` asked for directly, as 16-bit PCM at 24 kHz: the
    framework's request (model, voice, its fields) with ``response_format`` pcm, unstreamed."""
    r = httpx.post(url + "/v1/audio/speech", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                   json={"model": "tts-1", "voice": "alloy", "input": text, **body, "response_format": "pcm"})
    assert r.status_code == 200, r.text
    assert r.content and len(r.content) % 2 == 0
    return r.content


def _engine_freed(server: Server, cancelled_before: float) -> None:
    """The interrupted request was cancelled at the server (``chattts``' cancelled count grew)
    and left the engine (no active sequence)."""
    assert wait_until(lambda: metric(server.metrics_port, "tts_request_total", **CANCELLED) > cancelled_before, 30), \
        "the server never saw the cancel"
    assert wait_until(lambda: metric(server.metrics_port, "tts_engine_active_sequences") == 0, 30), \
        "the interrupted request stayed in the engine"


def _gateway_cancelled(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('tts_gateway_requests_total{status="cancelled"}'))


# --- pipecat ---------------------------------------------------------------------------------

def _pipecat_service(url: str, voice: str = "alloy") -> Any:
    from pipecat.services.openai.tts import OpenAITTSService

    return OpenAITTSService(api_key=API_KEY, base_url=url + "/v1", sample_rate=contract.SAMPLE_RATE_HZ,
                            settings=OpenAITTSService.Settings(model="tts-1", voice=voice))


async def _pipecat_run(url: str, text: str | list[str], interrupted: Callable[[], None] | None = None,
                       requests: list[str] | None = None) -> list[Any]:
    """Speak ``text`` through a pipeline ``[OpenAITTSService, collector]`` and return the
    ``TTSAudioRawFrame`` objects the collector saw: a string as one ``TTSSpeakFrame``, a list
    as an LLM's reply (``LLMTextFrame`` deltas between the response's start and end frames,
    cut into sentences by pipecat). ``requests`` collects the texts pipecat sent to the
    gateway (its ``on_tts_request`` event). With ``interrupted``: push an
    ``InterruptionFrame`` (a barge-in) once the first audio frame arrived, call
    ``interrupted()`` (in a thread) while the pipeline still runs, then end it."""
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    frames: list[Any] = []
    first = asyncio.Event()

    class Collector(FrameProcessor):  # type: ignore[misc]
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                frames.append(frame)
                first.set()
            await self.push_frame(frame, direction)

    tts = _pipecat_service(url)

    @tts.event_handler("on_tts_request")  # type: ignore[misc]
    async def on_tts_request(_service: Any, _context_id: str, sent: str) -> None:
        if requests is not None:
            requests.append(sent)

    worker = PipelineWorker(Pipeline([tts, Collector()]),
                            params=PipelineParams(audio_out_sample_rate=contract.SAMPLE_RATE_HZ),
                            idle_timeout_secs=None)
    if isinstance(text, str):
        await worker.queue_frame(TTSSpeakFrame(text))
    else:
        await worker.queue_frames([LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in text),
                                   LLMFullResponseEndFrame()])
    if interrupted is None:
        await worker.queue_frame(EndFrame())
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    if interrupted is not None:
        await asyncio.wait_for(first.wait(), 120)
        await worker.queue_frame(InterruptionFrame())
        await asyncio.to_thread(interrupted)  # before the EndFrame, which would end the request too
        await worker.queue_frame(EndFrame())
    await asyncio.wait_for(running, 120)
    return frames


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_pipecat_speaks_whole_samples_at_its_rate_and_every_sample(gateway_url: str, lang: str) -> None:
    _need("pipecat.services.openai.tts")
    frames = asyncio.run(_pipecat_run(gateway_url, SENTENCES[lang]))
    assert frames, "pipecat played nothing"
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(contract.SAMPLE_RATE_HZ, 1)}
    assert all(len(f.audio) % 2 == 0 for f in frames), [len(f.audio) for f in frames]
    played = b"".join(f.audio for f in frames)
    assert played == _direct(gateway_url, SENTENCES[lang])


def test_pipecat_speaks_an_llm_reply_sentence_by_sentence(gateway_url: str) -> None:
    """An LLM's reply in deltas, as a bot's LLM service pushes it: pipecat cuts it into
    sentences and asks the gateway for each; the frames are every sample of each, in order."""
    _need("pipecat.services.openai.tts")
    sent: list[str] = []
    frames = asyncio.run(_pipecat_run(gateway_url, DELTAS, requests=sent))
    assert len(sent) >= 2, sent
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(contract.SAMPLE_RATE_HZ, 1)}
    assert all(len(f.audio) % 2 == 0 for f in frames)
    assert b"".join(f.audio for f in frames) == b"".join(_direct(gateway_url, text) for text in sent)


def test_pipecat_interruption_cancels_the_request(gateway_url: str, triton_server: Server) -> None:
    _need("pipecat.services.openai.tts")
    assert wait_until(lambda: metric(triton_server.metrics_port, "tts_engine_active_sequences") == 0, 60)
    before = metric(triton_server.metrics_port, "tts_request_total", **CANCELLED)
    gateway_before = _gateway_cancelled(gateway_url)
    frames = asyncio.run(_pipecat_run(gateway_url, LONG, lambda: _engine_freed(triton_server, before)))
    assert frames and wait_until(lambda: _gateway_cancelled(gateway_url) == gateway_before + 1, 30)


# --- LiveKit Agents --------------------------------------------------------------------------

def _livekit_tts(url: str, **kw: Any) -> Any:
    from livekit.plugins import openai as lk_openai

    return lk_openai.TTS(base_url=url + "/v1", api_key=API_KEY, voice="alloy", **kw)


async def _livekit_frames(url: str, text: str, **kw: Any) -> list[Any]:
    """The ``rtc.AudioFrame`` objects of ``tts.synthesize(text)``, in order, less LiveKit's own
    end marker: when the last audio went out before the stream ended, LiveKit sends a final
    event of 10 ms of zeros (its "tiny empty marker"), which is not audio from the server."""
    tts = _livekit_tts(url, **kw)
    try:
        async with tts.synthesize(text) as stream:
            events = [ev async for ev in stream]
    finally:
        await tts.aclose()
    assert events and events[-1].is_final
    last = events[-1].frame
    if last.samples_per_channel == last.sample_rate // 100 and not any(bytes(last.data.cast("B"))):
        events.pop()
    return [ev.frame for ev in events]


def _check_livekit(frames: list[Any]) -> bytes:
    assert frames, "LiveKit played nothing"
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(contract.SAMPLE_RATE_HZ, 1)}
    assert all(len(bytes(f.data.cast("B"))) == 2 * f.samples_per_channel for f in frames)
    return b"".join(bytes(f.data.cast("B")) for f in frames)


@pytest.mark.parametrize(("lang", "model"), [("zh", "gpt-4o-mini-tts"), ("en", "tts-1")])
def test_livekit_pcm_frames_are_every_sample_at_its_rate(gateway_url: str, lang: str, model: str) -> None:
    """pcm through both of LiveKit's body readers: SSE deltas (``gpt-4o-mini-tts``, the
    default model) and the raw audio body (``tts-1``)."""
    _need("livekit.plugins.openai")
    frames = asyncio.run(_livekit_frames(gateway_url, SENTENCES[lang], model=model, response_format="pcm"))
    played = _check_livekit(frames)
    direct = _direct(gateway_url, SENTENCES[lang], model=model, speed=1.0)
    assert played == direct


def test_livekit_stream_adapter_speaks_llm_deltas_sentence_by_sentence(gateway_url: str) -> None:
    """What an ``AgentSession`` does with a TTS that does not stream text: a ``StreamAdapter``
    cuts the LLM's deltas into sentences (its blingfire tokenizer) and synthesizes each. The
    frames are every sample of those sentences asked for directly, in order, each followed by
    LiveKit's end marker."""
    _need("livekit.plugins.openai")
    from livekit.agents import tokenize
    from livekit.agents import tts as lk_tts

    async def main() -> tuple[list[Any], list[str]]:
        words = tokenize.blingfire.SentenceTokenizer(retain_format=True).stream()  # the adapter's default
        for piece in DELTAS:
            words.push_text(piece)
        words.end_input()
        sentences = [ev.token async for ev in words]
        tts = _livekit_tts(gateway_url, model="tts-1", response_format="pcm")
        adapter = lk_tts.StreamAdapter(tts=tts)
        try:
            async with adapter.stream() as stream:
                for piece in DELTAS:
                    stream.push_text(piece)
                stream.end_input()
                frames = [ev.frame async for ev in stream]
        finally:
            await adapter.aclose()
            await tts.aclose()
        return frames, sentences

    frames, sentences = asyncio.run(main())
    assert len(sentences) >= 2, sentences
    played = _check_livekit(frames)
    # each sentence's synthesis ends with LiveKit's end marker (10 ms of zeros), the stream with one more
    marker = bytes(2 * contract.SAMPLE_RATE_HZ // 100)
    expected = b"".join(_direct(gateway_url, sentence, speed=1.0) + marker for sentence in sentences)
    assert played in (expected, expected + marker), (len(played) // 2, len(expected) // 2)


def test_livekit_default_mp3_decodes_to_the_full_duration(gateway_url: str) -> None:
    """LiveKit's default ``response_format`` (mp3), decoded by LiveKit: the duration of the
    direct pcm within one MP3 frame (1152 samples: encoder delay and padding)."""
    _need("livekit.plugins.openai")
    text = SENTENCES["en"]
    played = _check_livekit(asyncio.run(_livekit_frames(gateway_url, text, model="tts-1")))
    direct = _direct(gateway_url, text, speed=1.0)
    assert abs(len(played) - len(direct)) // 2 <= 1152, (len(played) // 2, len(direct) // 2)
    got = np.frombuffer(played, np.int16).astype(np.float64)
    assert np.sqrt(np.mean(got**2)) > 0, "LiveKit decoded silence"


def test_livekit_aclose_cancels_the_request(gateway_url: str, triton_server: Server) -> None:
    _need("livekit.plugins.openai")
    assert wait_until(lambda: metric(triton_server.metrics_port, "tts_engine_active_sequences") == 0, 60)
    before = metric(triton_server.metrics_port, "tts_request_total", **CANCELLED)
    gateway_before = _gateway_cancelled(gateway_url)

    async def main() -> Any:
        tts = _livekit_tts(gateway_url, model="tts-1", response_format="pcm")
        try:
            stream = tts.synthesize(LONG)
            first = await asyncio.wait_for(stream.__anext__(), 120)
            await stream.aclose()
            return first.frame
        finally:
            await tts.aclose()

    frame = asyncio.run(main())
    assert frame.sample_rate == contract.SAMPLE_RATE_HZ
    _engine_freed(triton_server, before)
    assert wait_until(lambda: _gateway_cancelled(gateway_url) == gateway_before + 1, 30)
