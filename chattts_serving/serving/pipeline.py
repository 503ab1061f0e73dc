"""The synthesis pipeline of the entry models, free of Triton.

A request's text is split into segments (:class:`~chattts_serving.contract.Segmentation`:
``streaming`` sentence segments, or ``chattts``, ChatTTS' own pieces), which go through three
stages:

1. the front end (normalisation, prompt ids, speaker vector, and a reference recording encoded
   into audio-prompt codes), one call for all segments, whose result every later stage
   carries: :meth:`~.boundary.Stages.frontend`, :func:`~.prepare.prepare_segments`;
2. the GPT engine, which streams token batches: :meth:`~.boundary.Stages.generate` (with refine-text,
   a text-mode sequence per segment runs first and the code prompt is built from its output);
3. the vocoder, over token windows: :meth:`~.boundary.Stages.vocode`.

An audio prompt (ChatTTS' ``spk_smp`` + ``txt_smp``: the request's recording or ``spk_smp``,
or a voice's recording) precedes every segment's prompt. In ``chattts`` segmentation a text of
several pieces without one gets ChatTTS' own: the first piece generated and vocoded alone,
its audio encoded, then every piece generated with that audio and the first piece's text
(:func:`~.prepare.prepare_segments`; ChatTTS 0.2.5 ``Chat.infer``, docs/chattts-multisentence.md).

:func:`stream_audio` vocodes each window of the chunk schedule as soon as its tokens exist and
hands every chunk to a :class:`StreamOutput`; :func:`offline_audio` vocodes each segment in one
window (ChatTTS' offline decode; in ``chattts`` segmentation zero-padded to the longest piece of
its group of 4, as ChatTTS' ``_decode_to_wavs`` does). In the server :class:`~.boundary.Stages` is a set of
BLS calls (:class:`chattts_serving.triton.stages.BlsStages`); in tests the same stages run in
process.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule, StreamChunker
from ..contract import Segmentation, StopReason
from ..errors import Cancelled
from ..text.segments import chattts_groups
from .boundary import CarriedWindow, FrontendOutput, Stages, no_watch
from .job import StreamResult, SynthesisJob, seconds_left
from .prepare import prepare_segments, validate_request
from .request import EntryRequest
from .tokens import TokenStore, checked, code_call, no_progress, run_all

log = logging.getLogger(__name__)

__all__ = ["StreamOutput", "offline_audio", "stream_audio"]


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
        """Run ``on_cancel()`` as soon as the client cancels (see :data:`~.boundary.Watch`)."""


def stream_audio(job: SynthesisJob, stages: Stages, out: StreamOutput) -> StreamResult:
    """Run one streaming request: hand each audio chunk to ``out`` as soon as it is ready.

    Segments are generated one after the other and streamed in order (in ``chattts``
    segmentation after :func:`~.prepare.prepare_segments`' reference pass, when it makes one; a stream
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
    tokens = stages.generate(code_call(job, seg, schedule))
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
    return checked(reason, store.n), store.n


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


def offline_audio(job: SynthesisJob, stages: Stages,
                  progress: Callable[[bool], None] = no_progress) -> tuple[np.ndarray, StreamResult]:
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
        runs = run_all(stages, [code_call(job, segs[i]) for i in group], no_watch, "cancelled", progress)
        seconds_left(job)
        width = max(store.n for store, _ in runs)
        for index, (store, reason) in zip(group, runs, strict=True):
            reason = checked(reason, store.n)
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
