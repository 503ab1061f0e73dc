"""The engine's parts without ONNX: the waiting queue (on an injected clock) and the KV batch's
row bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from chattts_serving.engine.kvbatch import KvBatch
from chattts_serving.engine.waiting import QueueFull, WaitingQueue


@dataclass(frozen=True)
class Req:
    priority: int = 0
    request_id: str = ""
    stream_id: str = ""
    prompt_length: int = 10


@dataclass(eq=False)
class State:
    request: Req
    deadline_s: float | None = None
    cancel_requested: bool = False
    done: bool = False
    acknowledge: bool = False
    answered_s: float = 0.0


def Seq(priority: int = 0, request_id: str = "", stream_id: str = "", length: int = 10, **state: Any) -> State:
    """A waiting sequence: its request's fields, then the scheduler's state of it."""
    return State(Req(priority, request_id, stream_id, length), **state)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_queue_admits_by_priority_then_arrival() -> None:
    q = WaitingQueue(10, Clock())
    a, b, c, d = Seq(priority=1, stream_id="a"), Seq(stream_id="b"), Seq(priority=1, stream_id="c"), Seq()
    for s in (a, b, c, d):
        q.push(s)
    assert q.admit(room=3, batch_room=None, max_prefill_tokens=10**6).admitted == [b, d, a]
    assert q.sequences() == [c]


def test_queue_keeps_batch_sequences_within_their_rows() -> None:
    q = WaitingQueue(10, Clock())
    batch = [Seq(priority=1) for _ in range(3)]
    rt = Seq(priority=0)
    for s in (*batch, rt):
        q.push(s)
    got = q.admit(room=4, batch_room=1, max_prefill_tokens=10**6)
    assert got.admitted == [rt, batch[0]] and len(q) == 2


def test_queue_bounds_the_padded_prefill_but_always_takes_one() -> None:
    q = WaitingQueue(10, Clock())
    seqs = [Seq(length=n) for n in (30, 50, 10)]
    for s in seqs:
        q.push(s)
    assert q.admit(room=3, batch_room=None, max_prefill_tokens=100).admitted == [seqs[0], seqs[1]]  # 2 x 50
    assert q.admit(room=3, batch_room=None, max_prefill_tokens=5).admitted == [seqs[2]]


def test_queue_counts_requests_by_owner() -> None:
    q = WaitingQueue(2, Clock())
    q.push(Seq(request_id="a"))
    q.push(Seq(request_id="b"))
    q.push(Seq(request_id="a"))  # a second sequence of a queued request
    with pytest.raises(QueueFull, match="2 requests"):
        q.push(Seq(request_id="c"))
    with pytest.raises(QueueFull):
        q.push(Seq())  # no request id: a request of its own
    q.push(Seq(request_id="z"), request_live=True)  # its request already runs
    assert q.requests() == 3


def test_deadlines_and_cancels_leave_on_the_clock_not_on_sleep() -> None:
    clock = Clock(100.0)
    q = WaitingQueue(10, clock)
    late, named, fine = Seq(deadline_s=105.0), Seq(stream_id="x"), Seq(deadline_s=200.0)
    for s in (late, named, fine):
        q.push(s)
    assert q.sweep() == []
    assert q.cancel("x") and not q.cancel("nobody")
    assert q.sweep() == [named]
    clock.t = 105.5
    got = q.admit(room=5, batch_room=None, max_prefill_tokens=10**6)
    assert got.gone == [late] and got.admitted == [fine]


def test_heartbeats_are_due_per_sequence_after_the_period() -> None:
    clock = Clock(100.0)
    q = WaitingQueue(10, clock)
    acked, silent, unanswered = Seq(acknowledge=True, answered_s=100.0), Seq(answered_s=100.0), Seq(acknowledge=True)
    for s in (acked, silent, unanswered):
        q.push(s)
    clock.t = 104.9
    assert q.heartbeats_due(5.0) == []
    clock.t = 105.0
    assert q.heartbeats_due(5.0) == [acked]


class FakeCache:
    """A KV cache of one buffer (rows, capacity) recording what was copied where."""

    def __init__(self, rows: int, capacity: int) -> None:
        self.buf = np.zeros((rows, capacity), np.int64)

    @property
    def rows(self) -> int:
        return self.buf.shape[0]

    @property
    def capacity(self) -> int:
        return self.buf.shape[1]

    def copy_row(self, row: int, src: FakeCache, src_row: int, n: int) -> None:
        self.buf[row, :n] = src.buf[src_row, :n]


def test_kv_batch_joins_lowest_free_rows_and_spans_to_the_last_taken_one() -> None:
    batch: KvBatch[str] = KvBatch(FakeCache(4, 16))
    prompts = FakeCache(3, 16)
    prompts.buf[:] = np.arange(16) + 100 * np.arange(1, 4)[:, None]
    assert batch.span == 0 and batch.free_rows() == 4
    assert [batch.join(name, prompts, i, 3 + i) for i, name in enumerate("abc")] == [0, 1, 2]
    np.testing.assert_array_equal(batch.cache.buf[1, :4], [200, 201, 202, 203])
    assert batch.cache.buf[1, 4] == 0  # only the prompt's positions are copied
    batch.leave(1)
    assert batch.span == 3 and batch.running() == ["a", "c"] and batch.lengths.tolist() == [3, 0, 5, 0]
    batch.advance()
    assert batch.step_lengths().tolist() == [4, 0, 6]
    assert batch.join("d", prompts, 0, 2) == 1
    batch.leave(2)
    assert batch.span == 2 and batch.resident_tokens() == 4 + 2
    batch.leave(0)
    batch.leave(1)
    assert batch.span == 0 and batch.step_lengths().size == 0


def test_kv_batch_refuses_what_does_not_fit() -> None:
    batch: KvBatch[str] = KvBatch(FakeCache(1, 8))
    src = FakeCache(1, 16)
    with pytest.raises(ValueError, match="do not fit"):
        batch.join("a", src, 0, 9)
    batch.join("a", src, 0, 8)
    with pytest.raises(RuntimeError, match="no free row"):
        batch.join("b", src, 0, 1)
