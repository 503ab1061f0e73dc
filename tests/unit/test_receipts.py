"""Delivery receipts from the engine to the entry models (chattts_serving/triton/compat/receipts.py)
in process: the socket pair (board and writer), and an engine stream that reads each response
only after its receipt (over a stand-in for ``triton_python_backend_utils``). On a real server:
tests/server/test_receipts.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.contract import StopReason
from chattts_serving.engine.request import SequenceRequest
from chattts_serving.errors import RequestError
from chattts_serving.params import SamplingParams
from chattts_serving.serving.entry_runtime import SharedHelper
from chattts_serving.serving.resilience import CircuitBreaker, enter
from chattts_serving.triton.compat import grave as grave_module
from chattts_serving.triton.compat import receipts as receipts_module
from chattts_serving.triton.compat.grave import IteratorGrave
from chattts_serving.triton.compat.receipts import (
    ReceiptBoard,
    ReceiptSender,
    ReceiptWriter,
    delivery_address,
    delivery_prefix,
)
from chattts_serving.triton.stages import EngineStream
from tests.support.bls_fakes import FakeBlsPb, FakeIterator, FakeResponse
from tests.support.servers import wait_until


def _board(tag: str) -> ReceiptBoard:
    return ReceiptBoard(delivery_address(stub_pid=os.getpid(), server_pid=hash(tag) & 0xFFFFFF)).start()


def test_each_receipt_releases_its_streams_semaphore_once_and_unknown_ids_are_dropped() -> None:
    board = _board("once")
    writer = ReceiptWriter()
    try:
        a, b = board.register("a" * 32), board.register("b" * 32)
        for _ in range(300):  # more than one engine step's worth, in one connection
            assert writer.send(board.address, "a" * 32)
        assert writer.send(board.address, "b" * 32) and writer.send(board.address, "gone")
        assert all(a.acquire(timeout=5) for _ in range(300))
        assert not a.acquire(timeout=0.05), "more releases than receipts"
        assert b.acquire(timeout=5) and not b.acquire(timeout=0.05)
        assert wait_until(lambda: board.unknown == 1, 5)
        board.unregister("b" * 32)
        assert writer.send(board.address, "b" * 32) and wait_until(lambda: board.unknown == 2, 5)
        assert writer.failed == 0
    finally:
        writer.close()
        board.close()


def test_threads_writing_at_once_share_one_connection() -> None:
    board = _board("threads")
    writer = ReceiptWriter()
    try:
        sem = board.register("t" * 32)
        threads = [threading.Thread(target=lambda: [writer.send(board.address, "t" * 32) for _ in range(50)])
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(sem.acquire(timeout=5) for _ in range(8 * 50)) and writer.failed == 0
        assert len(writer._conns) == 1
        assert board.epoch == 0, "a second connection was opened and dropped (its close wakes every stream)"
    finally:
        writer.close()
        board.close()


def test_a_writer_reports_an_unreachable_board_then_connects_once_it_listens() -> None:
    address = delivery_address(stub_pid=os.getpid(), server_pid=424242)
    writer = ReceiptWriter()
    assert writer.send(address, "x" * 32) is False and writer.failed == 1  # nothing listens
    board = ReceiptBoard(address).start()
    try:
        sem = board.register("x" * 32)
        assert writer.send(address, "x" * 32) and sem.acquire(timeout=5)
        assert writer.failed == 1
    finally:
        writer.close()
        board.close()


def test_a_taken_address_raises_at_start() -> None:
    board = _board("taken")
    try:
        with pytest.raises(OSError):
            ReceiptBoard(board.address).start()
    finally:
        board.close()
    assert delivery_address(1, 2) != delivery_address(2, 2) != delivery_address(1, 3)
    assert delivery_address().startswith("\0") and str(os.getppid()) in delivery_address()
    # the engine writes only to its own server's entry stubs
    assert delivery_address(7).startswith(delivery_prefix())
    assert not delivery_address(7, server_pid=1).startswith(delivery_prefix())


class _Sender:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[Any, int]] = []
        self.fail = fail

    def send(self, response: Any = None, flags: int = 0) -> None:
        if self.fail:
            raise RuntimeError("response factory gone")
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return False


def test_a_receipt_sender_writes_after_each_send_that_returned_only() -> None:
    board = _board("sender")
    writer = ReceiptWriter()
    try:
        sem = board.register("s" * 32)
        inner = _Sender()
        sender = ReceiptSender(inner, writer, board.address, "s" * 32)
        sender.send("resp")
        sender.send(flags=2)
        assert inner.sent == [("resp", 0), (None, 2)]
        assert sem.acquire(timeout=5) and sem.acquire(timeout=5) and not sem.acquire(timeout=0.05)
        broken = ReceiptSender(_Sender(fail=True), writer, board.address, "s" * 32)
        with pytest.raises(RuntimeError):
            broken.send("resp")
        assert not sem.acquire(timeout=0.1), "a receipt for a response that was never sent"
    finally:
        writer.close()
        board.close()


class _Engine:
    """Plays the engine of one sequence: puts its responses in the iterator one at a time and
    writes each one's receipt after it, slowly; records every ``next`` that came before the
    response it asks for was queued."""

    def __init__(self, board: ReceiptBoard, writer: ReceiptWriter, responses: list[FakeResponse],
                 receipts: bool = True, dies_after: int | None = None) -> None:
        self.board, self.writer, self.receipts = board, writer, receipts
        self.dies_after = dies_after  # close the receipt connection after this many responses
        self.items, self.queued, self.read = responses, 1, 0  # the first is there when exec returns
        self.early: list[int] = []
        self.stream_id = ""

    def __iter__(self) -> _Engine:
        return self

    def __next__(self) -> FakeResponse:
        if self.read >= len(self.items):
            raise StopIteration
        if self.read >= self.queued:
            self.early.append(self.read)
            while self.read >= self.queued:  # what Next does: wait inside the iterator
                time.sleep(0.005)
        self.read += 1
        return self.items[self.read - 1]

    def run(self) -> None:
        if self.receipts:
            self.writer.send(self.board.address, self.stream_id)  # the acknowledgement's
        for _ in self.items[1:]:
            if self.dies_after is not None and self.queued == self.dies_after:
                self.writer.close()
                time.sleep(0.3)  # the stream wakes while nothing is queued
                self.receipts = False
            time.sleep(0.02)
            self.queued += 1
            if self.receipts:
                self.writer.send(self.board.address, self.stream_id)


def _stream_over(board: ReceiptBoard | None, engine: _Engine, monkeypatch: Any) -> EngineStream:
    pb = FakeBlsPb()

    class _Request:
        def __init__(self, **kw: Any) -> None:
            ids = {t.name: t.value for t in kw["inputs"]}
            engine.stream_id = ids[contract.EN_STREAM_ID.name][0].decode()
            address = ids.get(contract.EN_DELIVERY_ADDRESS.name)
            assert (address is not None) == (board is not None)
            if address is not None:
                assert address[0].decode() == board.address  # type: ignore[union-attr]

        def exec(self, decoupled: bool = False) -> _Engine:
            assert decoupled
            threading.Thread(target=engine.run, daemon=True).start()
            return engine

    monkeypatch.setattr(pb, "InferenceRequest", _Request, raising=False)
    grave = IteratorGrave(grace_s=3600.0)
    held = SharedHelper("grave", lambda: grave, lambda g, deadline_s: None)
    held.acquire()
    monkeypatch.setattr(grave_module, "ITERATOR_GRAVE", held)
    call = SequenceRequest(input_ids=np.arange(4), spk_emb=np.zeros(8, np.float32), params=SamplingParams(),
                        emit_tokens=2)
    return EngineStream(pb, call, enter(CircuitBreaker("engine", 5, 10.0)), receipts=board)


def _responses(batches: int) -> list[FakeResponse]:
    it = FakeIterator(batches, 8)
    ack = FakeResponse({contract.EN_CODES.name: np.zeros((0, contract.NUM_VQ), np.int32),
                     contract.EN_HIDDEN.name: np.zeros((0, 8), np.float32),
                     contract.EN_STOP.name: np.array([b""], np.object_)})
    return [ack, *it._items]


def test_an_engine_stream_reads_each_response_only_after_its_receipt(monkeypatch: Any) -> None:
    board = _board("stream")
    writer = ReceiptWriter()
    try:
        engine = _Engine(board, writer, _responses(4))
        stream = _stream_over(board, engine, monkeypatch)
        batches = list(stream)
        assert [b.stop_reason for b in batches] == [None, None, None, None, StopReason.EOS]
        assert engine.early == [], f"next() before the response was queued: reads {engine.early}"
        assert engine.read == len(engine.items) and stream.finished
        assert stream.stream_id not in board._streams  # unregistered at the end
    finally:
        writer.close()
        board.close()


def test_without_its_first_receipt_a_stream_reads_as_without_a_board(monkeypatch: Any) -> None:
    monkeypatch.setattr(receipts_module, "RECEIPT_FIRST_WAIT_S", 0.05)
    board = _board("silent")
    late = board.late
    try:
        engine = _Engine(board, ReceiptWriter(), _responses(2), receipts=False)  # an engine that cannot reach it
        stream = _stream_over(board, engine, monkeypatch)
        assert [b.stop_reason for b in stream] == [None, None, StopReason.EOS]
        assert board.late == late + 1  # one wait, then none: no stall per response
        assert stream.stream_id not in board._streams
    finally:
        board.close()


def test_a_closed_engine_connection_wakes_a_waiting_stream_which_reads_on_without_receipts(monkeypatch: Any) -> None:
    board = _board("closed")
    late = board.late
    try:
        engine = _Engine(board, ReceiptWriter(), _responses(3), dies_after=2)
        stream = _stream_over(board, engine, monkeypatch)
        assert [b.stop_reason for b in stream] == [None, None, None, StopReason.EOS]
        assert board.epoch == 1 and board.late == late + 1
        assert engine.early, "the stream should have gone on inside the iterator once the receipts stopped"
        assert stream.stream_id not in board._streams
    finally:
        board.close()


class _TritonError:
    def message(self) -> str:
        return "Failed to process the request(s) for model 'chattts_gpt', message: Stub process is not healthy."


class _ErrorResponse(FakeResponse):
    def __init__(self) -> None:
        super().__init__(None)

    def has_error(self) -> bool:
        return True

    def error(self) -> _TritonError:
        return _TritonError()


class _CountingSemaphore(threading.Semaphore):
    def __init__(self) -> None:
        super().__init__(0)
        self.acquires = 0

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        self.acquires += 1
        return super().acquire(blocking, timeout)


def test_an_engine_that_is_down_answers_at_once_without_a_receipt(monkeypatch: Any) -> None:
    board = _board("down")
    sems: list[_CountingSemaphore] = []

    def register(stream_id: str) -> threading.Semaphore:
        sems.append(_CountingSemaphore())
        board._streams[stream_id] = sems[-1]
        return sems[-1]

    monkeypatch.setattr(board, "register", register)
    late = board.late
    try:
        engine = _Engine(board, ReceiptWriter(), [_ErrorResponse()], receipts=False)  # Triton's error, no engine
        stream = _stream_over(board, engine, monkeypatch)
        with pytest.raises(RequestError, match="not healthy"):
            list(stream)
        assert sems[0].acquires == 0, "waited for a receipt that cannot come"
        assert board.late == late and engine.early == [] and stream.finished
    finally:
        board.close()


def test_late_reads_are_counted_per_board_under_its_lock() -> None:
    """Every worker of an entry stub counts its late reads on the one board: none is lost."""
    import sys

    board = ReceiptBoard("\0chattts-serving/test/late")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=lambda: [board.count_late() for _ in range(2000)]) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert board.late == 16000


def test_a_stopped_board_ends_its_accept_and_read_threads() -> None:
    board = _board("stop")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(board.address)
    try:
        assert wait_until(lambda: len(board._threads.alive()) == 2, 10.0)  # accept + one reader
        assert board.stop(time.monotonic() + 5.0) == []
        assert board.epoch == 1  # the reader ended as when an engine goes
    finally:
        conn.close()
