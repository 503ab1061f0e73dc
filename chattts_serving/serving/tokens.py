"""The GPT engine's tokens for the pipeline, free of Triton: the growing store of one
sequence's tokens (:class:`TokenStore`), the speech sequence of a prepared segment
(:func:`code_call`), several sequences run together to their end (:func:`run_all`) and the check
of how one ended (:func:`checked`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule, ready_points
from ..contract import StopReason, VocoderPath
from ..engine.request import MAX_EMIT_POINTS, SequenceRequest
from ..errors import Cancelled, ErrorKind, RequestError
from .boundary import FrontendOutput, Stages, TokenBatch, TokenStream, Watch
from .job import SynthesisJob, seconds_left

__all__ = ["NO_AUDIO", "TokenStore", "checked", "code_call", "no_progress", "run_all"]

NO_AUDIO = "the model ended the utterance before producing any audio; try another seed or set min_new_tokens"


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

def no_progress(working: bool) -> None:
    pass


def run_all(stages: Stages, calls: list[SequenceRequest], watch: Watch, cancelled: str,
             progress: Callable[[bool], None] = no_progress) -> list[tuple[TokenStore, StopReason | None]]:
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


def code_call(job: SynthesisJob, seg: FrontendOutput, schedule: ChunkSchedule | None = None) -> SequenceRequest:
    """The speech sequence of one prepared segment; streamed under ``schedule``, the engine
    also answers at each point where a window becomes complete (:func:`ready_points`)."""
    req = job.req
    emit_at = ready_points(schedule, req.params.max_new_tokens, MAX_EMIT_POINTS) if schedule is not None else ()
    return SequenceRequest(input_ids=seg.input_ids, spk_emb=seg.spk_emb, params=req.params, emit_tokens=job.emit_tokens,
                        emit_at=emit_at, priority=req.priority.engine_class,
                        timeout_s=seconds_left(job), request_id=req.request_id, prompt_codes=seg.prompt_codes)


def checked(reason: StopReason | None, tokens: int) -> StopReason:
    """The segment's stop reason. Raises RequestError (INTERNAL) when the engine ended without
    one or without a single token."""
    if reason is None:
        raise RequestError("the GPT engine ended the stream without a stop reason", ErrorKind.INTERNAL)
    if tokens == 0:
        raise RequestError(NO_AUDIO, ErrorKind.INTERNAL)
    return reason

