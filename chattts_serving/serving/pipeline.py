"""The synthesis pipeline of the entry models, free of Triton.

A request's text is split into sentence segments; each goes through three stages:

1. the front end (normalisation, prompt ids, speaker vector): :meth:`Stages.frontend`;
2. the GPT engine, which streams token batches: :meth:`Stages.generate` (with refine-text,
   a text-mode sequence per segment runs first and the code prompt is built from its output);
3. the vocoder, over token windows: :meth:`Stages.vocode`.

:func:`stream_audio` vocodes each window of the chunk schedule as soon as its tokens exist and
hands every chunk to a :class:`StreamOutput`; :func:`offline_audio` vocodes each segment in one
window (ChatTTS' offline decode). In the server :class:`Stages` is a set of BLS calls
(:class:`chattts_serving.triton.stages.BlsStages`); in tests the same stages run in process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule, StreamChunker
from ..contract import SequenceMode, StopReason, VocoderPath
from ..errors import Cancelled, DeadlineExceeded, ErrorKind, RequestError
from ..params import SamplingParams
from ..text.normalize import carry_speed
from ..text.segments import SegmentRules, split_segments
from .request import EntryRequest


# --- what crosses the stage boundary --------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FrontendCall:
    """One segment for the front end: its text and voice; ``refine_prompt`` (control tokens,
    '' for none) also asks for the refine-text prompt; ``refined_ids`` ((N,) int32 text ids
    the refine stage generated for this segment) builds the code prompt from them."""

    text: str
    voice: str = ""
    request_id: str = ""
    refine_prompt: str | None = None
    refined_ids: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class FrontendOutput:
    """One segment after the front end: prompt ids (T,) int32, speaker vector (H,) float32,
    the text after normalisation (or refinement), what was not spoken (characters or reserved
    tokens, in order of appearance) and, when asked for, the refine-text prompt ids (T',)
    int32 (``[Sbreak]{normalized}[Pbreak]{refine_prompt}``)."""

    input_ids: np.ndarray
    spk_emb: np.ndarray
    normalized_text: str = ""
    dropped: tuple[str, ...] = ()
    refine_ids: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class GenerateCall:
    """One sequence for the GPT engine.

    input_ids: (T,) int prompt ids; spk_emb: (H,) float32, None in text mode; params:
    sampling; emit_tokens: tokens per batch; first_emit_tokens: also deliver a batch when
    exactly this many tokens exist (the first chunk's need; 0: off); priority: the engine's
    scheduling class (0 realtime); timeout_s: the engine ends the sequence with a DEADLINE
    error after this long, None for never; mode: code (speech) or text (refine-text: codes
    (N, 4) carry the text id in every column).
    """

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    params: SamplingParams
    emit_tokens: int
    first_emit_tokens: int = 0
    priority: int = 0
    timeout_s: float | None = None
    request_id: str = ""
    mode: SequenceMode = SequenceMode.CODE


@dataclass(frozen=True)
class TokenBatch:
    """Tokens from the engine: codes (N, 4) int32, hidden (N, H) float32, and the stop reason
    on the sequence's last batch (None before)."""

    codes: np.ndarray
    hidden: np.ndarray
    stop_reason: StopReason | None = None


class TokenStream(Protocol):
    """Tokens of one sequence: iterate for batches (iteration raises RequestError when the
    sequence fails); ``cancel()`` ends it early and drains (a no-op once its last batch was
    read); ``request_cancel()`` (any thread) asks the engine to end it, the iterator then ends
    with a CANCELLED batch."""

    def __iter__(self) -> Iterator[TokenBatch]: ...

    def cancel(self) -> None: ...

    def request_cancel(self) -> None: ...


class Stages(Protocol):
    """The three stages the entry models call (BLS in the server). Each raises
    :class:`~chattts_serving.errors.RequestError`."""

    def frontend(self, call: FrontendCall) -> FrontendOutput:
        """Normalise and tokenize one segment, resolve the voice (:class:`FrontendCall`)."""

    def generate(self, call: GenerateCall) -> TokenStream:
        """Start a sequence on the engine (:class:`GenerateCall`)."""

    def vocode(self, path: VocoderPath, window: np.ndarray, request_id: str = "") -> np.ndarray:
        """Window (T, H) float32 (hidden path) or (T, 4) int32 (codes path) -> audio
        (512T-256,) float32."""


Watch = Callable[[Callable[[], None]], Callable[[], None]]
"""``watch(on_cancel)`` arranges for ``on_cancel()`` to run as soon as the client cancels and
returns a function that stops watching."""


def _no_watch(on_cancel: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


# --- the job and its result ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SynthesisJob:
    """One admitted request and how to run it.

    schedule: the chunk schedule (streaming; the request's ``lookahead_tokens`` is applied by
    :func:`stream_audio`); emit_tokens: tokens per engine batch; arrival_s:
    ``time.monotonic()`` at arrival (the deadline counts from it); segments: how the text is
    split; degraded: run in the server's degraded mode (reported in ``info``).
    """

    req: EntryRequest
    schedule: ChunkSchedule
    emit_tokens: int
    arrival_s: float
    segments: SegmentRules = SegmentRules()
    degraded: bool = False


@dataclass
class StreamResult:
    """What a finished request did: chunks and samples sent, tokens, stop reason, timings (s),
    and what the front end made of the text (per segment; ``dropped`` merged, in order)."""

    chunks: int = 0
    samples: int = 0
    tokens: int = 0
    stop_reason: StopReason | None = None
    first_audio_s: float | None = None
    chunk_samples: list[int] = field(default_factory=list)
    segments: int = 0
    capped_segments: list[int] = field(default_factory=list)
    """Indices of segments that hit max_new_tokens (their sentence may be cut short)."""
    normalized_text: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def add_prepared(self, prepared: list[FrontendOutput]) -> None:
        """Record the front end's view of every segment (before any audio is sent)."""
        self.normalized_text = [p.normalized_text for p in prepared]
        self.dropped = list(dict.fromkeys(d for p in prepared for d in p.dropped))

    @property
    def cancelled(self) -> bool:
        return self.stop_reason == StopReason.CANCELLED


def info_json(job: SynthesisJob, result: StreamResult, final: bool) -> str:
    """The entry models' ``info`` output (``contract.OUT_INFO``): a JSON object with the keys
    ``contract.INFO_HEADER_KEYS`` (``final`` false: a stream's first audio response) or
    ``contract.INFO_FINAL_KEYS`` (``final`` true). Non-ASCII text is kept as is (UTF-8)."""
    req = job.req
    info: dict[str, object] = {
        "request_id": req.request_id, "sample_rate_hz": contract.SAMPLE_RATE_HZ,
        "normalized_text": result.normalized_text, "dropped": result.dropped,
        "segments": len(result.normalized_text), "vocoder": req.vocoder, "refined": req.refine is not None,
        "degraded": job.degraded, "final": final}
    if final:
        info.update(audio_s=round(result.samples / contract.SAMPLE_RATE_HZ, 6), chunks=result.chunks,
                    tokens=result.tokens, capped_segments=result.capped_segments,
                    stop_reason=result.stop_reason or "")
    return json.dumps(info, ensure_ascii=False)


class StreamOutput(Protocol):
    """Where :func:`stream_audio` delivers a stream (the entry model's client)."""

    def audio(self, chunk: np.ndarray, result: StreamResult) -> None:
        """Send one chunk (1-D float32, 24 kHz); ``result`` is the stream so far (its
        ``chunks`` is 0 for the first chunk, and the front end's view of the text is in it)."""

    def cancelled(self) -> bool:
        """The client no longer wants the stream."""

    def progress(self) -> None:
        """Called on every token batch (a stall watchdog's heartbeat)."""

    def watch(self, on_cancel: Callable[[], None]) -> Callable[[], None]:
        """Run ``on_cancel()`` as soon as the client cancels (see :data:`Watch`)."""


# --- the pipeline ------------------------------------------------------------------------------
class _TokenStore:
    """Growing (N, 4) codes and (N, H) hidden arrays with amortised appends (capacity doubles,
    starting at ``MIN_CAPACITY`` tokens)."""

    MIN_CAPACITY = 64

    def __init__(self) -> None:
        self.n = 0
        self.codes = np.zeros((0, contract.NUM_VQ), np.int32)
        self.hidden = np.zeros((0, 0), np.float32)

    def add(self, b: TokenBatch) -> None:
        k = len(b.codes)
        if not k:
            return
        if self.n + k > len(self.codes):
            cap = max(self.MIN_CAPACITY, 2 * (self.n + k))
            codes = np.zeros((cap, contract.NUM_VQ), np.int32)
            hidden = np.zeros((cap, b.hidden.shape[1]), np.float32)
            if self.n:
                codes[:self.n], hidden[:self.n] = self.codes[:self.n], self.hidden[:self.n]
            self.codes, self.hidden = codes, hidden
        self.codes[self.n:self.n + k] = b.codes
        self.hidden[self.n:self.n + k] = b.hidden
        self.n += k

    def window(self, path: VocoderPath, start: int, end: int) -> np.ndarray:
        return self.hidden[start:end] if path == VocoderPath.HIDDEN else self.codes[start:end]


def seconds_left(job: SynthesisJob) -> float | None:
    """Seconds before the request's deadline (None without one). Raises DeadlineExceeded."""
    timeout = job.req.timeout_s
    if timeout is None:
        return None
    left = timeout - (time.monotonic() - job.arrival_s)
    if left <= 0:
        raise DeadlineExceeded(timeout)
    return left


REFINE_EMIT_TOKENS = 16
"""Refined text ids per engine batch (the BLS sees progress, and cancels, that often)."""
NO_AUDIO = "the model ended the utterance before producing any audio; try another seed or set min_new_tokens"


def prepare_segments(job: SynthesisJob, stages: Stages, watch: Watch = _no_watch) -> list[FrontendOutput]:
    """Split the text into segments and run the front end on each; with ``req.refine``, run
    the refine-text stage for all segments at once (one engine text-mode sequence each,
    batched together) and build each code prompt from its refined text, as ChatTTS'
    ``_infer`` does (refine, then ``_infer_code`` on the refined text). ``watch`` ends the
    refine sequences in the engine as soon as the client cancels.
    Raises RequestError (DeadlineExceeded past the deadline; Cancelled when the client
    cancelled during refine-text)."""
    req = job.req
    segments = carry_speed(split_segments(req.text, job.segments))
    prompt = req.refine.prompt if req.refine is not None else None
    prepared = [stages.frontend(FrontendCall(text=seg, voice=req.voice, request_id=req.request_id,
                                             refine_prompt=prompt)) for seg in segments]
    if req.refine is None:
        return prepared
    params = req.refine.sampling_params()
    streams: list[TokenStream] = []
    unwatch: list[Callable[[], None]] = []
    refined: list[np.ndarray] = []
    try:
        for p in prepared:
            # A BLS call to a decoupled model returns at its first response: the engine
            # answers every REFINE_EMIT_TOKENS tokens, so each sequence is watched for a
            # client cancel a few steps after it starts (not after its whole text).
            stream = stages.generate(GenerateCall(
                input_ids=p.refine_ids if p.refine_ids is not None else np.zeros(0, np.int32), spk_emb=None,
                params=params, emit_tokens=REFINE_EMIT_TOKENS, priority=req.priority.engine_class,
                timeout_s=seconds_left(job), request_id=req.request_id, mode=SequenceMode.TEXT))
            streams.append(stream)
            unwatch.append(watch(stream.request_cancel))
        for stream in streams:
            ids: list[np.ndarray] = []
            for batch in stream:
                ids.append(np.asarray(batch.codes)[:, 0])
                if batch.stop_reason == StopReason.CANCELLED:
                    raise Cancelled("cancelled by the client during refine-text")
                if batch.stop_reason:
                    break
            refined.append(np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32))
    finally:
        for stop in unwatch:
            stop()
        for stream in streams:
            stream.cancel()  # ends and drains what an error or a cancel left running; no-op on finished ones
    seconds_left(job)
    return [stages.frontend(FrontendCall(text=seg, voice=req.voice, request_id=req.request_id, refined_ids=r))
            for seg, r in zip(segments, refined, strict=True)]


def stream_audio(job: SynthesisJob, stages: Stages, out: StreamOutput) -> StreamResult:
    """Run one streaming request: hand each audio chunk to ``out`` as soon as it is ready.

    Segments are generated one after the other and streamed in order; a client cancel
    (``out.watch``) reaches the engine at its next step. Returns the :class:`StreamResult`
    (stop reason CANCELLED, without error, when the client cancelled). Raises RequestError
    (the caller sends it as the stream's error), DeadlineExceeded past the request's deadline.
    """
    req = job.req
    schedule = job.schedule if req.lookahead_tokens is None else job.schedule.with_lookahead(req.lookahead_tokens)
    result = StreamResult()
    try:
        prepared = prepare_segments(job, stages, out.watch)
    except Cancelled:
        result.stop_reason = StopReason.CANCELLED
        return result
    result.add_prepared(prepared)
    for index, seg in enumerate(prepared):
        result.segments += 1
        reason, n = _stream_segment(job, stages, schedule, seg, result, out)
        result.tokens += n
        result.stop_reason = reason
        if reason == StopReason.CANCELLED:
            return result
        if reason == StopReason.MAX_TOKENS:
            result.capped_segments.append(index)
    return result


def _stream_segment(job: SynthesisJob, stages: Stages, schedule: ChunkSchedule, seg: FrontendOutput,
                    result: StreamResult, out: StreamOutput) -> tuple[StopReason, int]:
    req = job.req
    chunker = StreamChunker(schedule)
    store = _TokenStore()
    tokens = stages.generate(GenerateCall(
        input_ids=seg.input_ids, spk_emb=seg.spk_emb, params=req.params, emit_tokens=job.emit_tokens,
        first_emit_tokens=schedule.tokens_before_first_chunk(), priority=req.priority.engine_class,
        timeout_s=seconds_left(job), request_id=req.request_id))
    unwatch = out.watch(tokens.request_cancel)
    reason: StopReason | None = None
    try:
        for batch in tokens:
            out.progress()
            store.add(batch)
            reason = batch.stop_reason
            if reason == StopReason.CANCELLED or out.cancelled():
                return StopReason.CANCELLED, store.n
            seconds_left(job)
            while (w := chunker.next_window(store.n, reason is not None)) is not None:
                audio = stages.vocode(req.vocoder, store.window(req.vocoder, w.start, w.end), req.request_id)
                chunk = chunker.emit(w, audio)
                if chunk.size:
                    if result.first_audio_s is None:
                        result.first_audio_s = time.monotonic() - job.arrival_s
                    out.audio(chunk, result)
                    result.chunks += 1
                    result.samples += chunk.size
                    result.chunk_samples.append(chunk.size)
            if reason is not None:
                break
    finally:
        unwatch()
        if reason is None:
            tokens.cancel()
    return _checked(reason, store.n), store.n


def _checked(reason: StopReason | None, tokens: int) -> StopReason:
    """The segment's stop reason. Raises RequestError (INTERNAL) when the engine ended without
    one or without a single token."""
    if reason is None:
        raise RequestError("the GPT engine ended the stream without a stop reason", ErrorKind.INTERNAL)
    if tokens == 0:
        raise RequestError(NO_AUDIO, ErrorKind.INTERNAL)
    return reason


def offline_audio(job: SynthesisJob, stages: Stages) -> tuple[np.ndarray, StreamResult]:
    """Run one request to the end and vocode each segment in one window (ChatTTS' offline
    decode). Returns (audio (sum of 512N-256 per segment,) float32, result). Raises
    RequestError."""
    req = job.req
    result = StreamResult()
    pieces = []
    prepared = prepare_segments(job, stages)
    result.add_prepared(prepared)
    for index, seg in enumerate(prepared):
        store = _TokenStore()
        reason: StopReason | None = None
        for batch in stages.generate(GenerateCall(
                input_ids=seg.input_ids, spk_emb=seg.spk_emb, params=req.params, emit_tokens=job.emit_tokens,
                priority=req.priority.engine_class, timeout_s=seconds_left(job), request_id=req.request_id)):
            store.add(batch)
            reason = batch.stop_reason or reason
        reason = _checked(reason, store.n)
        seconds_left(job)
        pieces.append(stages.vocode(req.vocoder, store.window(req.vocoder, 0, store.n), req.request_id))
        result.segments += 1
        result.tokens += store.n
        result.stop_reason = reason
        if reason == StopReason.MAX_TOKENS:
            result.capped_segments.append(index)
    audio = np.concatenate(pieces).astype(np.float32, copy=False)
    result.samples, result.chunks = int(audio.size), 1
    return audio, result
