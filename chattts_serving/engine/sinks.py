"""Where an engine sequence's output goes: the :class:`TokenSink` protocol the scheduler calls,
and :class:`CollectingSink`, a sink that keeps what it is given, for running the engine in
process (tests, benchmarks, scripts, the in-process pipeline). The Triton model binds its own
sinks to a response sender (:mod:`chattts_serving.triton.responses`)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .. import contract
from ..contract import StopReason
from ..errors import RequestError


class TokenSink(Protocol):
    """Where a sequence's output goes. Called from the engine thread only."""

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> None:
        """New tokens: codes (N, 4) int32, hidden (N, H) float32; ``stop_reason`` is None while
        the sequence runs and set on its last call (EOS, MAX_TOKENS or CANCELLED).
        For a text-mode sequence each row of ``codes`` holds the new text token id (in
        [0, 21178)) in all 4 columns (ChatTTS' ``inputs_ids`` layout in text mode); take
        column 0."""

    def error(self, exc: RequestError) -> None:
        """The sequence ended with an error (DEADLINE when its deadline passed, INTERNAL for a
        failure); no further calls follow."""

    def cancelled(self) -> bool:
        """True once the client no longer wants output (asked at admission, then once per
        :data:`~chattts_serving.engine.scheduler.CANCEL_POLL_STEPS`
        engine iterations)."""


class CollectingSink:
    """Keeps every batch of one sequence: ``codes`` (list of (N, 4) int32), ``hidden`` (list
    of (N, H) float32), the ``reason`` the sequence stopped for (None while it runs) and the
    ``errors`` it ended with. ``cancel_after``: report the client as gone once this many tokens
    arrived (None: never).

    Raises RuntimeError from :meth:`tokens` when the engine sends a batch after the last one.
    """

    def __init__(self, cancel_after: int | None = None) -> None:
        self.codes: list[np.ndarray] = []
        self.hidden: list[np.ndarray] = []
        self.reason: StopReason | None = None
        self.errors: list[RequestError] = []
        self.cancel_after = cancel_after

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> None:
        if self.reason is not None or self.errors:
            raise RuntimeError("tokens after the sequence's last batch")
        self.codes.append(codes)
        self.hidden.append(hidden.copy())
        self.reason = stop_reason

    def error(self, exc: RequestError) -> None:
        self.errors.append(exc)

    def cancelled(self) -> bool:
        return self.cancel_after is not None and self.count >= self.cancel_after

    @property
    def done(self) -> bool:
        """The sequence ended (a stop reason or an error)."""
        return self.reason is not None or bool(self.errors)

    @property
    def count(self) -> int:
        """Tokens received so far."""
        return sum(len(c) for c in self.codes)

    @property
    def all_codes(self) -> np.ndarray:
        """(N, 4) int32: every token's codes, in order."""
        return np.concatenate(self.codes) if self.codes else np.zeros((0, contract.NUM_VQ), np.int32)

    @property
    def all_hidden(self) -> np.ndarray:
        """(N, H) float32: every token's last hidden state, in order (N = 0: shape (0, 0))."""
        rows = [h for h in self.hidden if len(h)]
        return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
