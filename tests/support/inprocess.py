"""The pipeline's stages in process, without Triton: the real front end (with the DVAE encoder
and the prompt cache, as the front-end model runs them), the real GPT engine driven step by
step with ``Engine.run_once`` by the thread that reads its tokens, and the real vocoder
runners, over the small generated artifacts.

:class:`InProcessStages` implements :class:`chattts_serving.serving.boundary.Stages`, so the
entry service, the stream lifecycle and the pipeline run exactly as in the server, with BLS
calls replaced by function calls. :class:`RecordingChannel` and :class:`RecordingObserver` stand
in for the response sender and the Prometheus metrics and keep what they were given.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.audio.encoder import DvaeEncoderRunner
from chattts_serving.audio.vocoder import CarriedStreams, StreamingVocoderRunner, VocoderRunner
from chattts_serving.contract import VocoderPath
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.request import SequenceRequest
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import Sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.errors import RequestError
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.boundary import CarriedWindow, FrontendCall, FrontendOutput, TokenBatch
from chattts_serving.serving.frontend_service import FrontendService
from chattts_serving.text.frontend import FrontEnd
from chattts_serving.text.voices import VoiceBook


class EngineTokens:
    """A :class:`~chattts_serving.serving.boundary.TokenStream` over an in-process engine: the
    reader runs the engine (``run_once``) until its sequence has a new batch."""

    def __init__(self, engine: Engine, lock: threading.Lock, call: SequenceRequest) -> None:
        self.engine, self.lock = engine, lock
        self.stream_id = uuid.uuid4().hex
        self.sink = CollectingSink()
        self.read = 0
        deadline = time.monotonic() + call.timeout_s if call.timeout_s is not None else None
        engine.submit(Sequence(replace(call, stream_id=self.stream_id), self.sink, deadline_s=deadline))

    def __iter__(self) -> Iterator[TokenBatch]:
        while True:
            while self.read >= len(self.sink.codes) and not self.sink.errors:
                with self.lock:
                    self.engine.run_once()
            if self.read < len(self.sink.codes):
                i = self.read
                self.read += 1
                last = i == len(self.sink.codes) - 1 and self.sink.reason is not None
                yield TokenBatch(self.sink.codes[i], self.sink.hidden[i], self.sink.reason if last else None)
                if last:
                    return
            elif self.sink.errors:
                raise self.sink.errors[0]

    def request_cancel(self) -> None:
        self.engine.cancel(self.stream_id)

    def cancel(self) -> None:
        if self.sink.done:
            return
        self.request_cancel()
        while not self.sink.done:
            with self.lock:
                self.engine.run_once()


class InProcessStages:
    """Front end, engine and vocoders in this process (see the module docstring). Counts the
    calls each stage received in ``calls`` and keeps weak references to the token streams it
    made in ``token_streams``."""

    def __init__(self, artifacts: Artifacts, max_text_chars: int = 4096, default_voice_seed: int = 2,
                 engine_config: EngineConfig | None = None, voices: VoiceBook | None = None) -> None:
        self.encoder = DvaeEncoderRunner(artifacts)
        self.frontend_impl = FrontendService(FrontEnd(artifacts, max_text_chars, default_voice_seed, voices=voices),
                                             self.encoder.run)
        self.engine = Engine(GptStepRunner(artifacts), Embeddings(artifacts), engine_config or EngineConfig())
        self.vocoders = {path: VocoderRunner(artifacts, path) for path in VocoderPath}
        self.carried = {path: CarriedStreams(StreamingVocoderRunner(artifacts, path), max_streams=64)
                        for path in VocoderPath}
        """The vocoder model's carried streams, per path (a profile with carry_vocoder_state)."""
        self.lock = threading.Lock()
        self.calls = {"frontend": 0, "generate": 0, "vocode": 0}
        self.token_streams: weakref.WeakSet[EngineTokens] = weakref.WeakSet()
        """The token streams :meth:`generate` returned that are still alive."""

    def frontend(self, call: FrontendCall) -> list[FrontendOutput]:
        self.calls["frontend"] += 1
        return self.frontend_impl.prepare(call)

    def generate(self, call: SequenceRequest) -> EngineTokens:
        self.calls["generate"] += 1
        tokens = EngineTokens(self.engine, self.lock, call)
        self.token_streams.add(tokens)
        return tokens

    def vocode(self, path: VocoderPath, window: np.ndarray, request_id: str = "") -> np.ndarray:
        self.calls["vocode"] += 1
        return self.vocoders[path].run(window[None])[0]

    def vocode_carried(self, path: VocoderPath, window: np.ndarray, request_id: str,
                       carried: CarriedWindow) -> np.ndarray:
        self.calls["vocode"] += 1
        try:
            return self.carried[path].vocode(carried.stream_id, window, carried.start, carried.carry_from,
                                             carried.action)
        except ValueError as exc:  # as the vocoder model answers it
            raise RequestError(str(exc), param=contract.VO_STREAM_PLAN.name) from exc


class RecordingChannel:
    """A :class:`~chattts_serving.serving.lifecycle.ResponseChannel` that keeps every response:
    ``events`` is a list of ("audio", chunk, info), ("final", info) or ("error", exc); ``ended``
    is set at the first final response or error. Asking ``is_cancelled`` after the end, or
    sending after it, is recorded in ``violations`` (Triton 2.51 would crash or drop it)."""

    def __init__(self, cancel_after_chunks: int | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.violations: list[str] = []
        self.cancel_after_chunks = cancel_after_chunks
        self.cancelled = False
        self.ended = threading.Event()

    def _check_open(self, what: str) -> None:
        if self.ended.is_set():
            self.violations.append(f"{what} after the stream ended")

    def send_audio(self, chunk: np.ndarray, info: str | None) -> None:
        self._check_open("audio")
        self.events.append(("audio", chunk, info))
        if self.cancel_after_chunks is not None and len(self.chunks) >= self.cancel_after_chunks:
            self.cancelled = True

    def send_final(self, info: str | None) -> None:
        self._check_open("final")
        self.events.append(("final", info))
        self.ended.set()

    def send_error(self, exc: RequestError) -> None:
        self._check_open("error")
        self.events.append(("error", exc))
        self.ended.set()

    def is_cancelled(self) -> bool:
        self._check_open("is_cancelled")
        return self.cancelled

    @property
    def chunks(self) -> list[np.ndarray]:
        return [e[1] for e in self.events if e[0] == "audio"]

    @property
    def ends(self) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] in ("final", "error")]


class RecordingObserver:
    """An :class:`~chattts_serving.serving.entry.EntryObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.rejections: list[str] = []
        self.finishes: list[tuple[str, str, float, float, float | None]] = []
        self.queue: list[int] = []
        self.active: list[int] = []
        self.degraded: list[bool] = []
        self.degraded_requests = 0

    def rejected(self, reason: str, count: int = 1) -> None:
        self.rejections.extend([reason] * count)

    def finished(self, status: str, priority: str, duration_s: float, audio_s: float, ttfa_s: float | None) -> None:
        self.finishes.append((status, priority, duration_s, audio_s, ttfa_s))

    def set_queue(self, waiting: int) -> None:
        self.queue.append(waiting)

    def set_active(self, active: int) -> None:
        self.active.append(active)

    def set_degraded(self, on: bool) -> None:
        self.degraded.append(on)

    def degraded_request(self) -> None:
        self.degraded_requests += 1




def run_offline(service: Any, job: Any) -> tuple[np.ndarray, str]:
    """``service.offline(job, channel)`` (an :class:`~chattts_serving.serving.entry.EntryService`)
    on a :class:`RecordingChannel`: the audio and the final ``info``; raises the request's error."""
    channel = RecordingChannel()
    service.offline(job, channel)
    kind, *rest = channel.events[-1]
    if kind == "error":
        raise rest[0]
    assert not channel.violations, channel.violations
    return channel.chunks[0], rest[0]
