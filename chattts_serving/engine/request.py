"""One engine sequence, as the pipeline asks for it and the scheduler runs it.

:class:`SequenceRequest` is the one type from the pipeline (:mod:`chattts_serving.serving.pipeline`
builds it) over the wire (:func:`chattts_serving.triton.stages.engine_inputs` writes it as
tensors, :func:`chattts_serving.serving.request.parse_engine` reads it back) to the scheduler
(:class:`chattts_serving.engine.sequence.Sequence` holds it). Its rules are checked once, when
it is made: a request that exists is valid. What only the engine can judge (the context
length, the artifacts' text head, the queue) stays in ``Engine.submit``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .. import contract
from ..contract import SequenceMode
from ..errors import ErrorKind, RequestError
from ..params import SamplingParams

MAX_EMIT_TOKENS = 4096
"""Most tokens per response a sequence may ask for."""

MAX_EMIT_POINTS = 64
"""Most token counts a sequence may ask to be answered at besides every ``emit_tokens``
(``emit_at``: a stream's window ready points, :func:`~chattts_serving.audio.chunking.ready_points`;
a 2048-token stream of the shipped schedules has about 40)."""


class InvalidSequence(RequestError, ValueError):
    """A sequence request that breaks a rule (kind INVALID; a ValueError too, for the engine's
    own callers)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, ErrorKind.INVALID, param=param)


@dataclass(frozen=True)
class SequenceRequest:
    """One GPT-engine sequence.

    input_ids: (T,) integer prompt ids in [0, ``contract.TEXT_VOCAB_SIZE``), T >= 1; spk_emb:
    (H,) finite float32 speaker vector, None for none (always None in text mode); params:
    sampling; emit_tokens: tokens per response, [1, :data:`MAX_EMIT_TOKENS`];
    emit_at: also respond when exactly one of these many tokens exist (ascending, each >= 1,
    at most :data:`MAX_EMIT_POINTS`: the points at which a stream's vocoder windows become
    complete, so that each is vocoded at once); priority: the engine's scheduling class (0
    realtime, lower runs first); timeout_s:
    the engine ends the sequence with a DEADLINE error this long after submission, None for
    never; mode: code (speech) or text (refine-text: codes (N, 4) carry the text id in every
    column); prompt_codes: (P, 4) audio-prompt codes in [0, ``contract.EOS_CODE``) after the
    text prompt (ChatTTS' ``spk_smp``), code mode only, None for none (an empty (0, 4) array
    reads as none); stream_id: the sequence's name (a later cancel names it); request_id: the
    request it belongs to (the entry's request id, shared by a request's sequences; logs and
    the engine queue's owner rule). Raises :class:`InvalidSequence`.
    """

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    params: SamplingParams
    emit_tokens: int = 1
    emit_at: tuple[int, ...] = ()
    priority: int = 0
    timeout_s: float | None = None
    mode: SequenceMode = SequenceMode.CODE
    prompt_codes: np.ndarray | None = None
    stream_id: str = ""
    request_id: str = ""

    def __post_init__(self) -> None:
        ids = np.asarray(self.input_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidSequence("input_ids must be a non-empty 1-D integer tensor (empty prompt)",
                                  param=contract.FE_INPUT_IDS.name)
        if ids.min() < 0 or ids.max() >= contract.TEXT_VOCAB_SIZE:
            raise InvalidSequence(f"input_ids must be in [0, {contract.TEXT_VOCAB_SIZE})",
                                  param=contract.FE_INPUT_IDS.name)
        if self.mode not in tuple(SequenceMode):
            raise InvalidSequence(f"unknown sequence mode {self.mode!r}; expected one of "
                                  f"{[m.value for m in SequenceMode]}", param=contract.EN_MODE.name)
        codes = self.prompt_codes
        if codes is not None and codes.ndim == 2 and codes.shape == (0, contract.NUM_VQ):
            object.__setattr__(self, "prompt_codes", codes := None)
        if codes is not None and (codes.ndim != 2 or codes.shape[1] != contract.NUM_VQ or (
                codes.min() < 0 or codes.max() >= contract.EOS_CODE)):
            raise InvalidSequence(f"audio-prompt codes must be (P, {contract.NUM_VQ}) in [0, {contract.EOS_CODE})",
                                  param=contract.EN_PROMPT_CODES.name)
        spk = self.spk_emb
        if spk is not None and (spk.ndim != 1 or not np.isfinite(spk).all()):
            raise InvalidSequence("spk_emb must be a finite 1-D vector", param=contract.EN_SPK_EMB.name)
        if self.mode == SequenceMode.TEXT and (spk is not None or codes is not None):
            raise InvalidSequence("a text-mode (refine) sequence takes no speaker vector and no audio-prompt codes",
                                  param=contract.EN_SPK_EMB.name if spk is not None else contract.EN_PROMPT_CODES.name)
        if not 1 <= self.emit_tokens <= MAX_EMIT_TOKENS:
            raise InvalidSequence(f"emit_tokens must be in [1, {MAX_EMIT_TOKENS}]", param=contract.EN_EMIT_TOKENS.name)
        object.__setattr__(self, "emit_at", at := tuple(int(a) for a in self.emit_at))
        if len(at) > MAX_EMIT_POINTS or (at and at[0] < 1) or any(b <= a for a, b in itertools.pairwise(at)):
            raise InvalidSequence(f"emit_at_tokens must be at most {MAX_EMIT_POINTS} ascending token counts >= 1",
                                  param=contract.EN_EMIT_AT.name)
        if self.priority < 0:
            raise InvalidSequence("priority must be >= 0", param=contract.EN_PRIORITY.name)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InvalidSequence("timeout_s must be > 0 (or None for never)", param=contract.EN_TIMEOUT_MS.name)

    @property
    def prompt_length(self) -> int:
        """Prompt positions: text ids plus audio-prompt codes."""
        return int(self.input_ids.size) + (0 if self.prompt_codes is None else len(self.prompt_codes))
