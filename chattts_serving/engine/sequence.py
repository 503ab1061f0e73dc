"""One sequence inside the engine: the request it was asked with and the scheduler's state of it.

Two ids name a sequence, each under its own name and nowhere else: ``request.stream_id``, the
sequence's handle (what :meth:`~chattts_serving.engine.scheduler.Engine.cancel` and the log
lines of a sink take), and ``request.request_id``, the request the sequence belongs to (shared
by a request's sequences: refine-text's segments, ChatTTS' groups of 4; the waiting queue's
request count, ``EngineConfig.max_waiting``). What the pipeline asked for is read from
``Sequence.request``; what the scheduler keeps is a field of :class:`Sequence` itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..contract import SequenceMode
from ..params import SamplingParams
from .request import SequenceRequest
from .sampling import RequestSampler
from .sinks import TokenSink


@dataclass(eq=False)
class Sequence:
    """One request inside the engine: its :class:`~chattts_serving.engine.request.SequenceRequest`
    (checked when it was made), the sink its tokens go to, and the engine's state of it.

    deadline_s: ``time.monotonic()`` (the engine's clock) after which the sequence is dropped
    with an error; acknowledge: the engine thread's first sink call for the sequence is an
    empty one (no tokens, stop reason ''), made as soon as it sees the submission (a BLS caller
    returns from its call at the first response and can then watch its client; every response
    is sent from the engine thread). A text-mode sequence (refine-text) embeds its prompt and
    new tokens with ``emb_text`` and samples from the text head; prompt codes (ChatTTS'
    ``spk_smp``, see :mod:`chattts_serving.audio.reference`) are embedded as the sum of the 4
    code embeddings after the text prompt.
    """

    request: SequenceRequest
    sink: TokenSink
    deadline_s: float | None = None
    acknowledge: bool = False
    sampler: RequestSampler = field(init=False)
    length: int = 0  # tokens in this sequence's KV cache
    generated: int = 0
    last_codes: np.ndarray | None = None
    pending_codes: list[np.ndarray] = field(default_factory=list)
    pending_hidden: list[np.ndarray] = field(default_factory=list)
    done: bool = False
    submitted_s: float = field(default_factory=time.monotonic)
    answered_s: float = 0.0  # the engine clock's time of the last sink call (0: none yet)
    cancel_requested: bool = False
    cancel_polled: int = 0  # engine iteration at which the sink was last asked whether it was cancelled
    emit_point: int = 0  # index of the first of request.emit_at not yet passed

    def __post_init__(self) -> None:
        self.sampler = RequestSampler(self.request.params)

    def at_emit_point(self) -> bool:
        """Whether ``generated`` is one of ``request.emit_at`` (the points passed meanwhile are
        skipped: they were answered by ``emit_tokens``)."""
        at, i = self.request.emit_at, self.emit_point
        while i < len(at) and at[i] < self.generated:
            i += 1
        hit = i < len(at) and at[i] == self.generated
        self.emit_point = i + hit
        return hit


def make_sequence(input_ids: np.ndarray, spk_emb: np.ndarray | None, params: SamplingParams, sink: TokenSink, *,
                  emit_tokens: int = 1, emit_at: tuple[int, ...] = (), priority: int = 0,
                  deadline_s: float | None = None, stream_id: str = "", request_id: str = "",
                  mode: SequenceMode = SequenceMode.CODE, acknowledge: bool = False,
                  prompt_codes: np.ndarray | None = None) -> Sequence:
    """A :class:`Sequence` from its parts (the engine's own callers: benchmarks, tests);
    the keywords are :class:`~chattts_serving.engine.request.SequenceRequest`'s fields and
    :class:`Sequence`'s. Raises :class:`~chattts_serving.engine.request.InvalidSequence`."""
    return Sequence(SequenceRequest(np.asarray(input_ids), spk_emb, params, emit_tokens=emit_tokens,
                                    emit_at=emit_at, priority=priority, mode=mode,
                                    prompt_codes=prompt_codes, stream_id=stream_id, request_id=request_id),
                    sink, deadline_s=deadline_s, acknowledge=acknowledge)
