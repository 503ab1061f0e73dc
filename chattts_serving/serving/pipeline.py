"""The synthesis pipeline of the entry models, free of Triton.

A request's text is split into segments (:class:`~chattts_serving.contract.Segmentation`:
``streaming`` sentence segments, or ``chattts``, ChatTTS' own pieces); each goes through three
stages:

1. the front end (normalisation, prompt ids, speaker vector, and a reference recording encoded
   into audio-prompt codes): :meth:`Stages.frontend`;
2. the GPT engine, which streams token batches: :meth:`Stages.generate` (with refine-text,
   a text-mode sequence per segment runs first and the code prompt is built from its output);
3. the vocoder, over token windows: :meth:`Stages.vocode`.

An audio prompt (ChatTTS' ``spk_smp`` + ``txt_smp``: the request's recording or ``spk_smp``,
or a voice's recording) precedes every segment's prompt. In ``chattts`` segmentation a text of
several pieces without one gets ChatTTS' own: the first piece generated and vocoded alone,
its audio encoded, then every piece generated with that audio and the first piece's text
(:func:`prepare_segments`; ChatTTS 0.2.5 ``Chat.infer``, docs/chattts-multisentence.md).

:func:`stream_audio` vocodes each window of the chunk schedule as soon as its tokens exist and
hands every chunk to a :class:`StreamOutput`; :func:`offline_audio` vocodes each segment in one
window (ChatTTS' offline decode; in ``chattts`` segmentation zero-padded to the longest piece of
its group of 4, as ChatTTS' ``_decode_to_wavs`` does). In the server :class:`Stages` is a set of
BLS calls (:class:`chattts_serving.triton.stages.BlsStages`); in tests the same stages run in
process.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule, StreamChunker
from ..contract import Segmentation, SequenceMode, StopReason, VocoderPath
from ..engine.request import SequenceRequest
from ..errors import NOTHING_SPEAKABLE, Cancelled, DeadlineExceeded, ErrorKind, RequestError
from ..text.normalize import speakable
from ..text.request_text import carry_speed
from ..text.segments import SegmentRules, chattts_groups, split_like_chattts, split_segments
from .request import EntryRequest, FrontendCall, Reference
from .slots import SlotToken

log = logging.getLogger(__name__)

__all__ = [
    "FrontendCall",
    "FrontendOutput",
    "PreparedText",
    "SequenceRequest",
    "Stages",
    "StreamOutput",
    "StreamResult",
    "SynthesisJob",
    "TokenBatch",
    "TokenStream",
    "info_json",
    "offline_audio",
    "prepare_segments",
    "stream_audio",
    "validate_request",
]


# --- what crosses the stage boundary --------------------------------------------------------
# FrontendCall (one segment for the front end) lives with the request parsers
# (:mod:`chattts_serving.serving.request`): the front-end model parses its tensors into one.


@dataclass(frozen=True, kw_only=True)
class FrontendOutput:
    """One segment after the front end: prompt ids (T,) int32, speaker vector (H,) float32
    (None without one: ``[empty_spk]`` prompt), the text after normalisation (or refinement),
    what was not spoken (characters or reserved tokens, in order of appearance), when asked
    for the refine-text prompt ids (T',) int32 (``[Sbreak]{normalized}[Pbreak]{refine_prompt}``;
    None also for a piece with nothing speakable), and the audio-prompt codes (P, 4) int32 of
    the call's recording or of the voice's (None for none)."""

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    normalized_text: str = ""
    dropped: tuple[str, ...] = ()
    refine_ids: np.ndarray | None = None
    prompt_codes: np.ndarray | None = None


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

    def generate(self, call: SequenceRequest) -> TokenStream:
        """Start a sequence on the engine (:class:`SequenceRequest`)."""

    def vocode(self, path: VocoderPath, window: np.ndarray, request_id: str = "") -> np.ndarray:
        """Window (T, H) float32 (hidden path) or (T, 4) int32 (codes path) -> audio
        (512T-256,) float32."""

    def vocode_carried(self, path: VocoderPath, window: np.ndarray, request_id: str,
                       carried: CarriedWindow) -> np.ndarray:
        """A carried stream's window (:class:`CarriedWindow`; window as for :meth:`vocode`) ->
        its complete samples (:meth:`~chattts_serving.audio.vocoder.VocoderStream.vocode`); a
        ``STREAM_RELEASE`` (empty window) frees the stream's state and returns no samples."""


@dataclass(frozen=True)
class CarriedWindow:
    """Which carried stream a window belongs to and what the vocoder does with it:
    ``stream_id`` (unique per segment), the window's first token ``start``, the token to commit
    ``carry_from`` and ``action`` (``contract.STREAM_CONTINUE``, ``STREAM_FINAL``,
    ``STREAM_RELEASE``)."""

    stream_id: str
    start: int
    carry_from: int
    action: int


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
    split; degraded: run in the server's degraded mode (reported in ``info``); slot: see below.
    """

    req: EntryRequest
    schedule: ChunkSchedule
    emit_tokens: int
    arrival_s: float
    segments: SegmentRules = SegmentRules()
    degraded: bool = False
    slot: SlotToken | None = field(default=None, compare=False)
    """The admission slot the request holds until it ends (released once, by whoever ends it)."""


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
    reference: str = ""
    """Where the audio prompt came from (``contract.REFERENCE_SOURCES``)."""
    segment_starts: list[int] = field(default_factory=list)
    """Sample offset (24 kHz) in the request's audio where each segment's audio begins, one per
    segment whose audio has started (``info.segment_starts``)."""
    asked_work_s: float = 0.0
    """Seconds spent before any audio on work the request asked for (refine-text, ChatTTS'
    first-piece reference pass, encoding its reference recording): ``first_audio_s`` less this
    is what the load made it wait (the degraded mode's TTFA signal)."""

    def add_prepared(self, prepared: PreparedText) -> None:
        """Record the front end's view of every segment (before any audio is sent)."""
        self.normalized_text = [p.normalized_text for p in prepared.segments]
        self.dropped = list(dict.fromkeys(d for p in prepared.segments for d in p.dropped))
        self.reference = prepared.reference
        self.asked_work_s = prepared.asked_work_s

    @property
    def load_ttfa_s(self) -> float | None:
        """Time to first audio less the work the request asked for (s); None without audio."""
        return None if self.first_audio_s is None else max(0.0, self.first_audio_s - self.asked_work_s)

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
        "degraded": job.degraded, "segmentation": req.segmentation, "reference": result.reference,
        "segment_starts": list(result.segment_starts), "final": final}
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

    def progress(self, working: bool) -> None:
        """A stall watchdog's heartbeat: ``working=True`` when a token batch arrives and after
        each vocoder call (the stream's thread now vocodes and sends it), ``working=False``
        when the thread goes back to waiting for the engine. The waits count towards a stall
        in full, each stretch of work only beyond one stall timeout."""

    def watch(self, on_cancel: Callable[[], None]) -> Callable[[], None]:
        """Run ``on_cancel()`` as soon as the client cancels (see :data:`Watch`)."""


# --- the pipeline ------------------------------------------------------------------------------
class TokenStore:
    """Growing (N, 4) codes and (N, H) hidden arrays with amortised appends (capacity doubles,
    starting at ``MIN_CAPACITY`` tokens)."""

    MIN_CAPACITY = 64
    """Tokens allocated at the first append (a larger first batch allocates twice its size).
    Not a deployment knob: it trades a few reallocations against memory and never changes the
    output. 64 tokens (1.4 s of audio; 192 KiB of hidden states at ChatTTS' H = 768) hold the
    profiles' first streamed chunks (``first_chunk_tokens`` 4, ``emit_tokens`` 4) and one whole
    ``offline_emit_tokens`` batch (64) in the first allocation, and as capacity doubles from
    there, a sequence at the profiles' ``max_new_tokens_cap`` (2048) is copied about five times."""

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

    def padded(self, path: VocoderPath, width: int) -> np.ndarray:
        """The whole sequence as one vocoder window of ``width`` >= n tokens, right-padded with
        zeros as ChatTTS' ``_decode_to_wavs`` pads a batch (zero hidden states, or code 0 on
        every head)."""
        src = self.window(path, 0, self.n)
        if width == self.n:
            return src
        out = np.zeros((width, src.shape[1]), src.dtype)
        out[:self.n] = src
        return out


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


@dataclass(frozen=True)
class PreparedText:
    """A request's text ready for the engine: one :class:`FrontendOutput` per segment, each
    carrying the request's audio-prompt codes (None for none), and where that prompt came from
    (``contract.REFERENCE_SOURCES``)."""

    segments: list[FrontendOutput]
    reference: str = ""
    asked_work_s: float = 0.0
    """Seconds spent on work the request asked for (refine-text, the first-piece reference
    pass, encoding its recording): see :attr:`StreamResult.asked_work_s`."""


def _no_progress(working: bool) -> None:
    pass


def _run_all(stages: Stages, calls: list[SequenceRequest], watch: Watch, cancelled: str,
             progress: Callable[[bool], None] = _no_progress) -> list[tuple[TokenStore, StopReason | None]]:
    """Start every sequence of ``calls`` at once (the engine batches them), then read each to
    its end: its tokens and stop reason, in order. ``watch`` ends them in the engine as soon as
    the client cancels; ``progress(False)`` is called at every batch the engine sends (its
    heartbeats included), for a stall watchdog. A BLS call to a decoupled model returns at its
    first response, so each sequence is watched a few steps after it starts. Raises
    RequestError (:class:`Cancelled` with ``cancelled`` when the client cancelled)."""
    streams: list[TokenStream] = []
    unwatch: list[Callable[[], None]] = []
    out = []
    try:
        for call in calls:
            stream = stages.generate(call)
            streams.append(stream)
            unwatch.append(watch(stream.request_cancel))
        for stream in streams:
            store = TokenStore()
            reason: StopReason | None = None
            for batch in stream:
                progress(False)
                store.add(batch)
                reason = batch.stop_reason or reason
                if reason == StopReason.CANCELLED:
                    raise Cancelled(cancelled)
                if reason:
                    break
            out.append((store, reason))
    finally:
        for stop in unwatch:
            stop()
        for stream in streams:
            stream.cancel()  # ends and drains what an error or a cancel left running; no-op on finished ones
    return out


def _code_call(job: SynthesisJob, seg: FrontendOutput, first_emit_tokens: int = 0) -> SequenceRequest:
    """The speech sequence of one prepared segment (``first_emit_tokens``: a streamed one's
    first chunk)."""
    req = job.req
    return SequenceRequest(input_ids=seg.input_ids, spk_emb=seg.spk_emb, params=req.params, emit_tokens=job.emit_tokens,
                        first_emit_tokens=first_emit_tokens, priority=req.priority.engine_class,
                        timeout_s=seconds_left(job), request_id=req.request_id, prompt_codes=seg.prompt_codes)


def prepare_segments(job: SynthesisJob, stages: Stages, watch: Watch = _no_watch) -> PreparedText:
    """Split the text into segments (``req.segmentation``) and run the front end on each.

    With ``req.refine``, the refine-text stage runs for all segments at once (one engine
    text-mode sequence each, batched together) and each code prompt is built from its refined
    text, as ChatTTS' ``_infer`` does (refine, then ``_infer_code`` on the refined text).

    The audio prompt: the request's ``spk_smp`` codes, its recording (sent to the front end
    once, with the first segment, which encodes and caches it), or a reference voice's
    recording (the front end's); its transcript precedes ``[speed_N]`` in every prompt and a
    request that brings a recording without a voice has no speaker vector (``[empty_spk]``,
    ChatTTS' zero-shot use). In ``chattts`` segmentation pieces with nothing speakable are kept,
    as ChatTTS keeps them; and a text of several pieces without an audio prompt gets ChatTTS'
    own: :func:`_first_piece_audio` (piece 0 generated alone and vocoded whole), encoded by the
    front end (neither cached nor held to the recording limits), with piece 0's text as the
    transcript of every piece.

    ``watch`` ends the refine and reference-pass sequences in the engine as soon as the client
    cancels. Raises RequestError (DeadlineExceeded past the deadline; Cancelled when the client
    cancelled before the first audio; INVALID for a text with nothing speakable)."""
    req = job.req
    chattts = req.segmentation == Segmentation.CHATTTS
    texts = carry_speed(split_like_chattts(req.text) if chattts else split_segments(req.text, job.segments))
    if not texts:
        raise RequestError("text is empty", param=contract.IN_TEXT.name)
    ref = req.reference
    base = FrontendCall(text="", voice=req.voice, request_id=req.request_id,
                        reference_text=ref.transcript if ref is not None else None,
                        no_speaker=ref is not None and not req.voice.strip(), keep_unspeakable=chattts,
                        language=req.language)
    asked = _Stopwatch()
    refined: list[np.ndarray | None] = [None] * len(texts)
    if req.refine is not None:
        with asked:
            refined = _refine(job, stages, watch, texts, base)
    calls = [replace(base, text=t, refined_ids=r) for t, r in zip(texts, refined, strict=True)]
    if ref is not None and ref.audio is not None:  # the recording travels once, with the first segment
        calls[0] = replace(calls[0], reference_audio=ref.audio, reference_rate_hz=ref.rate_hz)
        with asked:
            first_segment = stages.frontend(calls[0])  # encodes the recording (or finds it cached)
        prepared = [first_segment, *(stages.frontend(c) for c in calls[1:])]
    else:
        prepared = [stages.frontend(c) for c in calls]
    if chattts and not any(speakable(p.normalized_text) for p in prepared):
        raise RequestError(f"{NOTHING_SPEAKABLE} (only punctuation, symbols or unsupported characters)",
                           param=contract.IN_TEXT.name)
    codes, source = _request_prompt(ref, prepared[0])
    if codes is None and chattts and len(prepared) > 1:
        with asked:
            wav = _first_piece_audio(job, stages, watch, prepared[0])
            transcript = prepared[0].normalized_text
            first = stages.frontend(replace(calls[0], reference_text=transcript, reference_audio=wav,
                                            reference_rate_hz=contract.SAMPLE_RATE_HZ, transient_reference=True))
            codes, source = first.prompt_codes, "first_piece"
            prepared = [first, *(stages.frontend(replace(c, reference_text=transcript)) for c in calls[1:])]
    return PreparedText([replace(p, prompt_codes=codes) for p in prepared], source, asked.total_s)


class _Stopwatch:
    """Adds up the seconds spent inside its ``with`` blocks (``total_s``)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> _Stopwatch:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total_s += time.monotonic() - self._t0


def _request_prompt(ref: Reference | None, first: FrontendOutput) -> tuple[np.ndarray | None, str]:
    """The request's audio-prompt codes and their source: a ``spk_smp``, else what the front
    end encoded for the first segment (the request's recording, or the voice's)."""
    if ref is not None and ref.codes is not None:
        return ref.codes, "spk_smp"
    if first.prompt_codes is not None and len(first.prompt_codes):
        return first.prompt_codes, "recording" if ref is not None else "voice"
    return None, ""


def _refine(job: SynthesisJob, stages: Stages, watch: Watch, texts: list[str],
            base: FrontendCall) -> list[np.ndarray | None]:
    """The refine-text stage for every segment: the refined text ids (N,) int32 of each, None
    for a segment the front end gave no refine prompt (nothing speakable in it). Raises
    RequestError (Cancelled, DeadlineExceeded)."""
    req = job.req
    assert req.refine is not None
    prompts = [stages.frontend(replace(base, text=t, refine_prompt=req.refine.prompt)).refine_ids for t in texts]
    params = req.refine.sampling_params()
    todo = {i: ids for i, ids in enumerate(prompts) if ids is not None and ids.size}
    runs = _run_all(stages, [SequenceRequest(input_ids=ids, spk_emb=None, params=params,
                                          emit_tokens=REFINE_EMIT_TOKENS, priority=req.priority.engine_class,
                                          timeout_s=seconds_left(job), request_id=req.request_id,
                                          mode=SequenceMode.TEXT) for ids in todo.values()],
                    watch, "cancelled by the client during refine-text")
    seconds_left(job)
    refined: list[np.ndarray | None] = [None] * len(texts)
    for i, (store, _) in zip(todo, runs, strict=True):
        refined[i] = store.codes[:store.n, 0].astype(np.int32)
    return refined


def _first_piece_audio(job: SynthesisJob, stages: Stages, watch: Watch, first: FrontendOutput) -> np.ndarray:
    """ChatTTS' reference pass (``Chat.infer`` with several pieces and no ``spk_smp``): the first
    piece generated alone, without an audio prompt, and vocoded whole on the request's vocoder
    path (``_infer_code`` + ``_decode_to_wavs`` of ``text[0]``): (N,) float32 at 24 kHz.
    Raises RequestError: Cancelled, DeadlineExceeded, INTERNAL when the piece ended too early
    to be encoded (fewer than ``contract.ENCODER_MIN_SAMPLES`` samples)."""
    req = job.req
    ((store, reason),) = _run_all(stages, [_code_call(job, first)], watch,
                                  "cancelled by the client during the first piece's reference pass")
    _checked(reason, store.n)
    seconds_left(job)
    wav = stages.vocode(req.vocoder, store.window(req.vocoder, 0, store.n), req.request_id)
    if wav.size < contract.ENCODER_MIN_SAMPLES:
        raise RequestError(f"the first sentence ended after {store.n} token(s), too short to be ChatTTS' audio "
                           "prompt; try another seed or set min_new_tokens", ErrorKind.INTERNAL)
    return wav


def validate_request(job: SynthesisJob, stages: Stages) -> StreamResult:
    """A ``validate_only`` request: what only the front end can check (the voice, the reference
    recording or ``spk_smp`` with its transcript, the refine prompt), checked on the request's
    text as one piece that may have nothing speakable in it; nothing is generated. The
    recording is encoded and cached, so the synthesis that follows finds it ready. Returns an
    empty :class:`StreamResult` with the front end's view of the text. Raises RequestError
    (INVALID naming the input at fault)."""
    req, ref = job.req, job.req.reference
    call = FrontendCall(text=req.text, voice=req.voice, request_id=req.request_id,
                        refine_prompt=req.refine.prompt if req.refine is not None else None,
                        reference_text=ref.transcript if ref is not None else None,
                        reference_audio=ref.audio if ref is not None else None,
                        reference_rate_hz=ref.rate_hz if ref is not None else contract.SAMPLE_RATE_HZ,
                        no_speaker=ref is not None and not req.voice.strip(), keep_unspeakable=True)
    out = stages.frontend(call)
    result = StreamResult()
    result.add_prepared(PreparedText([out], _request_prompt(ref, out)[1]))
    return result


def stream_audio(job: SynthesisJob, stages: Stages, out: StreamOutput) -> StreamResult:
    """Run one streaming request: hand each audio chunk to ``out`` as soon as it is ready.

    Segments are generated one after the other and streamed in order (in ``chattts``
    segmentation after :func:`prepare_segments`' reference pass, when it makes one; a stream
    cannot pad a piece to its group's longest, so its audio differs from :func:`offline_audio`'s
    in the last ~52 tokens of pieces shorter than their group's longest); a client cancel
    (``out.watch``) reaches the engine at its next step. Returns the :class:`StreamResult`
    (stop reason CANCELLED, without error, when the client cancelled). Raises RequestError
    (the caller sends it as the stream's error), DeadlineExceeded past the request's deadline.
    """
    req = job.req
    if req.validate_only:
        return validate_request(job, stages)
    schedule = job.schedule if req.lookahead_tokens is None else job.schedule.with_lookahead(req.lookahead_tokens)
    result = StreamResult()
    try:
        prepared = prepare_segments(job, stages, out.watch)
    except Cancelled:
        result.stop_reason = StopReason.CANCELLED
        return result
    result.add_prepared(prepared)
    for index, seg in enumerate(prepared.segments):
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
    store = TokenStore()
    carried_id = uuid.uuid4().hex if schedule.carried else None  # the vocoder's state for this segment
    carried_open = False
    tokens = stages.generate(_code_call(job, seg, first_emit_tokens=schedule.tokens_before_first_chunk()))
    unwatch: Callable[[], None] | None = None
    reason: StopReason | None = None
    try:
        unwatch = out.watch(tokens.request_cancel)  # inside: a watch that fails still ends the sequence
        for batch in tokens:
            out.progress(True)
            try:
                store.add(batch)
                reason = batch.stop_reason
                if reason == StopReason.CANCELLED or out.cancelled():
                    return StopReason.CANCELLED, store.n
                seconds_left(job)
                while (w := chunker.next_window(store.n, reason is not None)) is not None:
                    window = store.window(req.vocoder, w.start, w.end)
                    if carried_id is None:
                        audio = stages.vocode(req.vocoder, window, req.request_id)
                    else:
                        action = contract.STREAM_FINAL if w.final else contract.STREAM_CONTINUE
                        carried_open = carried_open or not w.final
                        plan = CarriedWindow(carried_id, w.start, chunker.carry_point(w), action)
                        audio = stages.vocode_carried(req.vocoder, window, req.request_id, plan)
                        carried_open = carried_open and not w.final
                    out.progress(True)  # each vocoder call has its own allowance (see StreamOutput.progress)
                    chunk = chunker.emit(w, audio)
                    if chunk.size:
                        if result.first_audio_s is None:
                            result.first_audio_s = time.monotonic() - job.arrival_s
                        if len(result.segment_starts) < result.segments:  # this segment's first audio
                            result.segment_starts.append(result.samples)
                        out.audio(chunk, result)
                        result.chunks += 1
                        result.samples += chunk.size
                        result.chunk_samples.append(chunk.size)
            finally:
                out.progress(False)
            if reason is not None:
                break
    finally:
        if unwatch is not None:
            unwatch()
        if reason is None:
            tokens.cancel()
        if carried_id is not None and carried_open:
            _release(stages, req, carried_id, store)
    return _checked(reason, store.n), store.n


def _release(stages: Stages, req: EntryRequest, carried_id: str, store: TokenStore) -> None:
    """Free a carried stream's vocoder state after its segment ended without a final window
    (cancel, error, deadline). Best effort: a failure is logged, never raised over the
    segment's own outcome (the vocoder also frees a stream left idle)."""
    try:
        stages.vocode_carried(req.vocoder, store.window(req.vocoder, store.n, store.n), req.request_id,
                              CarriedWindow(carried_id, 0, 0, contract.STREAM_RELEASE))
    except Exception as exc:  # the segment's own error or cancel is what the client hears
        # Only its text is logged: the exception chains the segment's own (raised in this
        # finally), whose frames hold the engine stream, and a kept log record would keep them.
        message = f"{type(exc).__name__}: {exc}"
        log.warning("could not free the vocoder state of stream %s: %s", carried_id, message)


def _checked(reason: StopReason | None, tokens: int) -> StopReason:
    """The segment's stop reason. Raises RequestError (INTERNAL) when the engine ended without
    one or without a single token."""
    if reason is None:
        raise RequestError("the GPT engine ended the stream without a stop reason", ErrorKind.INTERNAL)
    if tokens == 0:
        raise RequestError(NO_AUDIO, ErrorKind.INTERNAL)
    return reason


def offline_audio(job: SynthesisJob, stages: Stages,
                  progress: Callable[[bool], None] = _no_progress) -> tuple[np.ndarray, StreamResult]:
    """Run one request to the end and vocode each segment in one window (ChatTTS' offline
    decode). In ``chattts`` segmentation the pieces are generated and vocoded in ChatTTS'
    groups of 4 (:func:`~chattts_serving.text.segments.chattts_groups`), each piece's window
    zero-padded to its group's longest, so every piece of a group has ``512 * T_max - 256``
    samples, as ``Chat._decode_to_wavs`` returns them (``Chat.infer`` then deletes every sample
    with ``|x| <= 1e-5``; the server does not). Otherwise one segment after the other.
    ``progress(working)`` tells a stall watchdog of each engine batch (False) and of each
    vocoder call's start (True) and end (False). Returns (audio (n,) float32, result). Raises
    RequestError."""
    req = job.req
    if req.validate_only:
        return np.zeros(0, np.float32), validate_request(job, stages)
    result = StreamResult()
    prepared = prepare_segments(job, stages)
    result.add_prepared(prepared)
    segs = prepared.segments
    chattts = req.segmentation == Segmentation.CHATTTS
    groups = chattts_groups(len(segs)) if chattts else [range(i, i + 1) for i in range(len(segs))]
    pieces = []
    for group in groups:
        runs = _run_all(stages, [_code_call(job, segs[i]) for i in group], _no_watch, "cancelled", progress)
        seconds_left(job)
        width = max(store.n for store, _ in runs)
        for index, (store, reason) in zip(group, runs, strict=True):
            reason = _checked(reason, store.n)
            progress(True)
            pieces.append(stages.vocode(req.vocoder, store.padded(req.vocoder, width), req.request_id))
            progress(False)
            result.segment_starts.append(sum(p.size for p in pieces[:-1]))
            result.segments += 1
            result.tokens += store.n
            result.stop_reason = reason
            if reason == StopReason.MAX_TOKENS:
                result.capped_segments.append(index)
    audio = np.concatenate(pieces).astype(np.float32, copy=False)
    result.samples, result.chunks = int(audio.size), 1
    return audio, result
