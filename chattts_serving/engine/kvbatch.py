"""The running batch: which sequence holds which row of the preallocated KV cache.

A row is taken by a sequence when it joins (its prefill KV copied in, O(prompt)) and freed
when it ends; nothing else ever moves in the cache: each decode step the graph writes one
column per row in place, and a row's positions never shift (no growth, no compaction). The
decode step runs over the first :attr:`KvBatch.span` rows (up to the last taken one); a free
row among them costs one position of attention and its output is discarded.

No ONNX here: the cache is any object with ``rows``, ``capacity`` and
``copy_row(row, src, src_row, n)`` (:class:`~chattts_serving.engine.gpt.KvCache`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import numpy as np

S = TypeVar("S")


class KvBatch(Generic[S]):
    """Rows of ``cache`` and the sequences (any objects) holding them.

    ``lengths[r]``: positions row r's sequence has in the cache (0 for a free row).
    """

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.seqs: list[S | None] = [None] * cache.rows
        self.lengths = np.zeros(cache.rows, np.int64)

    @property
    def capacity(self) -> int:
        """Positions a row can hold (a sequence's prompt + generated tokens at most)."""
        return int(self.cache.capacity)

    def free_rows(self) -> int:
        return sum(1 for s in self.seqs if s is None)

    def occupied(self) -> list[int]:
        """Rows that hold a sequence, in row order."""
        return [r for r, s in enumerate(self.seqs) if s is not None]

    def running(self) -> list[S]:
        """The sequences holding rows, in row order."""
        return [s for s in self.seqs if s is not None]

    @property
    def span(self) -> int:
        """Rows a decode step covers: up to and including the last taken row (0 when empty)."""
        for r in range(len(self.seqs) - 1, -1, -1):
            if self.seqs[r] is not None:
                return r + 1
        return 0

    def join(self, seq: S, src: Any, src_row: int, n: int) -> int:
        """Give ``seq`` the lowest free row and copy its ``n`` prefill positions (row
        ``src_row`` of cache ``src``) into it; returns the row.

        Raises:
            RuntimeError: no free row.
            ValueError: ``n`` exceeds the capacity.
        """
        if n > self.capacity:
            raise ValueError(f"{n} positions do not fit a row of {self.capacity}")
        for r, s in enumerate(self.seqs):
            if s is None:
                self.cache.copy_row(r, src, src_row, n)
                self.seqs[r] = seq
                self.lengths[r] = n
                return r
        raise RuntimeError("no free row in the KV batch")

    def leave(self, row: int) -> None:
        """Free ``row`` (its columns are left as they are: never read again)."""
        self.seqs[row] = None
        self.lengths[row] = 0

    def row_of(self, seq: S) -> int:
        """The row ``seq`` holds. Raises ValueError when it holds none."""
        for r, s in enumerate(self.seqs):
            if s is seq:
                return r
        raise ValueError("sequence holds no row")

    def step_lengths(self) -> np.ndarray:
        """(span,) int64: positions before the next decode step, the graph's ``lengths``."""
        return self.lengths[:self.span].copy()

    def advance(self) -> None:
        """After a decode step: each taken row holds one more position."""
        for r, s in enumerate(self.seqs):
            if s is not None:
                self.lengths[r] += 1

    def resident_tokens(self) -> int:
        """Positions held by all taken rows."""
        return int(self.lengths.sum())
