"""The engine's waiting queue: sequences submitted and not yet given a row.

Pure bookkeeping, no ONNX and no threads: the engine calls it under its own lock, with the
time from an injected clock, so that deadlines and heartbeats are unit-tested without
sleeping. Order: lower ``priority`` first, then arrival.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class WaitingRequest(Protocol):
    """What the queue reads of a sequence's request
    (:class:`~chattts_serving.engine.request.SequenceRequest`): its scheduling class, its own
    handle, the request it belongs to, its prompt positions."""

    @property
    def priority(self) -> int: ...
    @property
    def stream_id(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def prompt_length(self) -> int: ...


class Waiting(Protocol):
    """What the queue reads of a sequence (:class:`~chattts_serving.engine.sequence.Sequence`)."""

    @property
    def request(self) -> WaitingRequest: ...
    deadline_s: float | None
    cancel_requested: bool
    done: bool
    acknowledge: bool
    answered_s: float


@dataclass
class Admission:
    """What :meth:`WaitingQueue.admit` decided: ``admitted`` in queue order, ``gone``: taken
    out because :meth:`WaitingQueue.cancel` named them or their deadline passed."""

    admitted: list[Any]
    gone: list[Any]


class QueueFull(Exception):
    """:meth:`WaitingQueue.push` refused a new request: ``waiting`` requests already queued."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests already waiting")
        self.waiting = waiting


class WaitingQueue:
    """Sequences waiting for a row, at most ``max_waiting`` requests (distinct non-empty
    ``request.request_id``; a sequence without one counts as a request of its own).

    ``clock``: seconds, monotonic (``time.monotonic`` in the engine; a fake in tests).
    """

    def __init__(self, max_waiting: int, clock: Callable[[], float]) -> None:
        self.max_waiting = max_waiting
        self.clock = clock
        self._heap: list[tuple[int, int, Any]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def sequences(self) -> list[Any]:
        """The waiting sequences (heap order, not admission order)."""
        return [q[2] for q in self._heap]

    def requests(self) -> int:
        """Requests with a sequence in the queue."""
        ids = {q[2].request.request_id for q in self._heap if q[2].request.request_id}
        return len(ids) + sum(1 for q in self._heap if not q[2].request.request_id)

    def push(self, seq: Waiting, request_live: bool = False) -> None:
        """Queue ``seq``. ``request_live``: a sequence of the same request is already live
        (waiting or running), so ``seq`` is part of an admitted request and never refused.

        Raises:
            QueueFull: ``max_waiting`` requests wait already and ``seq``'s request is not live.
        """
        rid = seq.request.request_id
        part_of_live = request_live or (rid and any(q[2].request.request_id == rid for q in self._heap))
        if not part_of_live and (queued := self.requests()) >= self.max_waiting:
            raise QueueFull(queued)
        heapq.heappush(self._heap, (seq.request.priority, next(self._order), seq))

    def cancel(self, stream_id: str) -> bool:
        """Mark the waiting sequence whose ``request.stream_id`` is ``stream_id`` for removal
        (it leaves at the next :meth:`sweep` or :meth:`admit`). False when none waits."""
        for q in self._heap:
            if q[2].request.stream_id == stream_id and not q[2].done:
                q[2].cancel_requested = True
                return True
        return False

    def _gone(self, seq: Waiting, now: float) -> bool:
        return seq.cancel_requested or (seq.deadline_s is not None and now > seq.deadline_s)

    def sweep(self) -> list[Any]:
        """Take out and return the sequences that :meth:`cancel` named or whose deadline passed."""
        now = self.clock()
        keep: list[tuple[int, int, Any]] = []
        gone: list[tuple[int, int, Any]] = []
        for q in self._heap:
            (gone if self._gone(q[2], now) else keep).append(q)
        if gone:
            self._heap = keep
            heapq.heapify(self._heap)
        return [q[2] for q in gone]

    def heartbeats_due(self, period_s: float) -> list[Any]:
        """Acknowledged waiting sequences that have heard nothing for ``period_s`` seconds
        (``answered_s`` is the clock's time of their last sink call, 0 before the first)."""
        now = self.clock()
        return [q[2] for q in self._heap
                if q[2].acknowledge and q[2].answered_s and now - q[2].answered_s >= period_s]

    def admit(self, room: int, batch_room: int | None, max_prefill_tokens: int) -> Admission:
        """Take up to ``room`` sequences in queue order for free rows: at most ``batch_room``
        of priority > 0 (None: no limit; the queue stops at the first one beyond it, as only
        batch sequences are left behind it), and while the padded prefill (longest prompt x
        count) stays within ``max_prefill_tokens`` (the first one always fits)."""
        now = self.clock()
        out: list[Any] = []
        gone: list[Any] = []
        while self._heap and len(out) < room:
            seq = self._heap[0][2]
            if self._gone(seq, now):
                gone.append(heapq.heappop(self._heap)[2])
                continue
            if seq.request.priority > 0 and batch_room is not None and batch_room <= 0:
                break
            width = max([s.request.prompt_length for s in out] + [seq.request.prompt_length])
            if out and width * (len(out) + 1) > max_prefill_tokens:
                break
            out.append(heapq.heappop(self._heap)[2])
            if seq.request.priority > 0 and batch_room is not None:
                batch_room -= 1
        return Admission(out, gone)

    def drain(self) -> list[Any]:
        """Empty the queue; returns what waited."""
        out = [q[2] for q in self._heap]
        self._heap.clear()
        return out
