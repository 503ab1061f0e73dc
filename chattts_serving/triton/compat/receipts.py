"""Register row "receipts" (docs/triton-workarounds.md): delivery receipts from the GPT engine
to the entry models, outside Triton, so that an entry thread asks a BLS response iterator for
a response only once it is there.

- symptom: a stub with many decoupled BLS streams deadlocks for good.
- cause: a GIL and mutex cycle through python_backend's ``ResponseIterator::Next``
  (``pb_response_iterator.cc``, ``pb_stub.cc``; the register's details tell the cycle).
- what we do: ``Next`` waits only when the iterator's buffer is empty, and the engine's
  ``send`` returns only once the caller's stub has queued the response; so the engine writes
  one receipt after each send (:class:`ReceiptSender`, :class:`ReceiptWriter`), and the entry
  thread waits for the receipt (:class:`ReceiptBoard`, a semaphore, GIL released) before it
  calls ``next`` (``triton/stages.py`` ``EngineStream``).
- shown by: ``tests/unit/test_receipts.py``, ``tests/server/test_receipts.py``,
  ``tests/unit/test_bls_iterators.py``.
- delete when: the iterator never waits for the GIL while holding its mutex.

Transport: each entry stub listens on a Unix stream socket in Linux's abstract namespace,
named after the tritonserver process (the stubs' parent) and the stub's own process id, and
passes the address to the engine with every sequence (``contract.EN_DELIVERY_ADDRESS``). A
receipt is the sequence's ``stream_id`` in ASCII and a newline. A stream socket, not
datagrams: Linux queues only ``net.unix.max_dgram_qlen`` (10) datagrams per socket, fewer than
the receipts of one engine step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from typing import Any

from ... import contract
from ...serving.entry_runtime import SharedHelper
from ...serving.threads import ThreadOwner
from ..tensors import first_string

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0
"""How long one receipt may wait for room in the socket (the entry's reader takes each in
microseconds; a full buffer means the entry stub is gone or stuck, and the engine then stops
writing to that address)."""

RECEIPT_FIRST_WAIT_S = 2.0
"""How long an entry waits for a stream's first receipt (the engine writes it microseconds after
its acknowledgement, which ``exec`` already returned) before it reads that stream without
receipts, as an engine that cannot reach the entry's socket would leave it."""

MAX_LINE_BYTES = 256
"""Longest receipt a reader accepts (a stream id is a 32-character UUID hex); a longer line
is dropped."""


def delivery_prefix(server_pid: int | None = None) -> str:
    """The start of every receipt-socket address on the server ``server_pid`` (default: this
    process's parent, the tritonserver of a stub): the engine writes to no other address."""
    return f"\0chattts-serving/{server_pid or os.getppid()}/deliveries/"


def delivery_address(stub_pid: int | None = None, server_pid: int | None = None) -> str:
    """The abstract-namespace address of the receipt socket of the entry stub whose process id
    is ``stub_pid`` (default: this process) on the server ``server_pid`` (default: this
    process's parent, the tritonserver of a stub)."""
    return f"{delivery_prefix(server_pid)}{stub_pid or os.getpid()}"


class ReceiptBoard:
    """The entry stub's end: a listening socket, one reader thread per connected engine, and
    one semaphore per registered stream id, released once per receipt (so its value is the
    number of the stream's responses queued in its iterator and not yet read). When an engine's
    connection closes (it died, or reconnected after a failed write), ``epoch`` grows and every
    registered semaphore is released once, so that no stream waits for a receipt that cannot
    come (its reader sees the new epoch and reads without receipts).

    :meth:`start` raises OSError when the address cannot be bound (the callers then iterate
    without receipts). Its threads (``receipts-accept``, one ``receipts-read`` per engine
    connection) end at :meth:`stop`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._lock = threading.Lock()
        self._streams: dict[str, threading.Semaphore] = {}
        self._sock: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._threads = ThreadOwner()
        self.unknown = 0
        """Receipts for ids not registered (a stream that ended early): counted, dropped."""
        self.epoch = 0
        """Engine connections closed so far."""
        self._late = 0

    def start(self) -> ReceiptBoard:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.address)
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._threads.spawn("receipts-accept", self._accept_loop, sock)
        return self

    def count_late(self) -> int:
        """One more read went ahead without its receipt; returns how many so far."""
        with self._lock:
            self._late += 1
            return self._late

    @property
    def late(self) -> int:
        """Reads, over all streams of this board, that went ahead without their receipt."""
        with self._lock:
            return self._late

    def register(self, stream_id: str) -> threading.Semaphore:
        """The semaphore of ``stream_id`` (new, value 0); call before the request is sent."""
        sem = threading.Semaphore(0)
        with self._lock:
            self._streams[stream_id] = sem
        return sem

    def unregister(self, stream_id: str) -> None:
        with self._lock:
            self._streams.pop(stream_id, None)

    def receipt(self, stream_id: str) -> None:
        """One response of ``stream_id`` is queued (what a reader calls per line)."""
        with self._lock:
            sem = self._streams.get(stream_id)
            if sem is None:
                self.unknown += 1
                return
        sem.release()

    def _accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._sock is None:
                    conn.close()
                    return
                self._conns.add(conn)
            self._threads.spawn("receipts-read", self._read_loop, conn)

    def _read_loop(self, conn: socket.socket) -> None:
        try:
            self._read_receipts(conn)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self.epoch += 1
                waiting = list(self._streams.values())
            for sem in waiting:
                sem.release()

    def _read_receipts(self, conn: socket.socket) -> None:
        pending = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return  # the engine closed its end
                pending += data
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_LINE_BYTES:
                    pending = b""
                for line in lines:
                    if 0 < len(line) <= MAX_LINE_BYTES:
                        self.receipt(line.decode("ascii", errors="replace"))

    def close(self) -> None:
        """Stop accepting engines (connected readers end when their engine closes: ``epoch``
        then grows)."""
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stop(self, deadline_s: float) -> list[str]:
        """:meth:`close`, end every engine connection too (each waiting stream is woken, as when
        an engine goes), and join the board's threads until ``deadline_s``
        (``time.monotonic()``); returns the names of those still alive."""
        self.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return [t.name for t in self._threads.join(deadline_s)]


class ReceiptWriter:
    """The engine's end: one connection per entry-stub address, opened at the first receipt
    and kept; thread-safe. An address that cannot be reached (its stub is gone) or whose socket
    stays full for :data:`SEND_TIMEOUT_S` is dropped; the next receipt for it connects again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[str, socket.socket] = {}
        self._conn_locks: dict[str, threading.Lock] = {}
        self.failed = 0
        """Receipts that could not be written (the entry then falls back to waiting in ``next``)."""

    def _lock_for(self, address: str) -> threading.Lock:
        with self._lock:
            return self._conn_locks.setdefault(address, threading.Lock())

    def send(self, address: str, stream_id: str) -> bool:
        """Write the receipt for one response of ``stream_id`` to ``address`` (connecting once
        more when a kept connection fails). Returns False when it could not be written."""
        line = stream_id.encode("ascii", errors="replace") + b"\n"
        with self._lock_for(address):  # one writer per address: never two connections to one board
            with self._lock:
                conn = self._conns.get(address)
            for _ in range(2):
                if conn is None:
                    conn = self._connect(address)
                    if conn is None:
                        break
                try:
                    conn.sendall(line)
                    return True
                except OSError:
                    self._drop(address, conn)
                    conn = None
        with self._lock:
            self.failed += 1
            failed = self.failed
        if failed == 1 or failed % 1000 == 0:
            log.warning("%d delivery receipts could not be written (last to %r)", failed, address)
        return False

    def _connect(self, address: str) -> socket.socket | None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(SEND_TIMEOUT_S)
        try:
            conn.connect(address)
        except OSError:
            conn.close()
            return None
        with self._lock:
            self._conns[address] = conn
        return conn

    def _drop(self, address: str, conn: socket.socket) -> None:
        with self._lock:
            if self._conns.get(address) is conn:
                del self._conns[address]
        conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()


class ReceiptSender:
    """A decoupled response sender that writes a receipt to ``address`` after each ``send``
    that returned (``sender``: the request's ``pb_utils`` response sender)."""

    def __init__(self, sender: Any, writer: ReceiptWriter, address: str, stream_id: str) -> None:
        self._sender, self._writer = sender, writer
        self.address, self.stream_id = address, stream_id

    def send(self, response: Any = None, flags: int = 0) -> None:
        self._sender.send(response, flags=flags)
        self._writer.send(self.address, self.stream_id)

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


def receipted(pb: Any, request: Any, sender: Any, writer: ReceiptWriter) -> Any:
    """The engine's sender for ``request``: a :class:`ReceiptSender` when the request names
    this server's receipt socket (``delivery_address``) and its ``stream_id``, else ``sender``
    itself (a control request never gets receipts; a bad input is reported by the engine's
    parser)."""
    address, stream_id, control = (pb.get_input_tensor_by_name(request, spec.name) for spec in
                                   (contract.EN_DELIVERY_ADDRESS, contract.EN_STREAM_ID, contract.EN_CONTROL))
    if address is None or stream_id is None or control is not None:
        return sender
    try:
        addr = first_string(address.as_numpy())
        sid = first_string(stream_id.as_numpy())
    except (ValueError, IndexError, UnicodeDecodeError):
        return sender
    if not addr.startswith(delivery_prefix()) or not sid:
        return sender  # only this server's entry stubs get receipts
    return ReceiptSender(sender, writer, addr, sid)


class StreamReceipts:
    """One engine stream's receipts on this stub's ``board`` (None: no board, every read goes
    ahead at once): registered at once under ``stream_id``; :meth:`before_read` waits (GIL
    released) until the engine's receipts say the next response is queued. The first response
    needs none (``exec`` returns with it); its receipt is taken with the second's, and may take
    :data:`RECEIPT_FIRST_WAIT_S`. A later one is awaited for as long as the engine keeps its
    receipt connection (a sequence may wait in the engine's queue for minutes); once the first
    receipt is missing, or a connection of the board closed (the engine died or reconnected),
    the stream reads on without receipts (the board's ``late`` counts such streams)."""

    def __init__(self, board: ReceiptBoard | None, stream_id: str) -> None:
        self.stream_id = stream_id
        self._board = board
        self._sem = board.register(stream_id) if board is not None else None
        self._epoch = board.epoch if board is not None else 0
        self._reads = 0  # responses read so far
        self.address = board.address if board is not None else ""
        """Where the engine writes this stream's receipts ('' for none)."""

    def before_read(self) -> None:
        """Return once the next response is queued in the stream's BLS iterator (or once the
        stream reads without receipts)."""
        sem, board = self._sem, self._board
        reads, self._reads = self._reads, self._reads + 1
        if sem is None or board is None or reads == 0:
            return
        for first in (True, False) if reads == 1 else (False,):
            got = sem.acquire(timeout=RECEIPT_FIRST_WAIT_S) if first else sem.acquire()
            if got and board.epoch == self._epoch:
                continue
            late = board.count_late()
            if late == 1 or late % 100 == 0:
                why = (f"no receipt within {RECEIPT_FIRST_WAIT_S:.1f} s" if not got
                       else "the engine's receipt connection closed")
                log.warning("engine stream %s reads without receipts: %s (%d streams so far)",
                            self.stream_id, why, late)
            self.close()
            return

    def close(self) -> None:
        """Unregister the stream (its last response was read, or it reads without receipts)."""
        if self._board is not None:
            self._board.unregister(self.stream_id)
            self._board = self._sem = None


RECEIPT_BOARD: SharedHelper[ReceiptBoard] = SharedHelper(
    "delivery-receipt socket (engine responses are then awaited inside the BLS iterator)",
    lambda: ReceiptBoard(delivery_address()).start(), lambda board, deadline_s: _stop_board(board, deadline_s))
"""This stub's :class:`ReceiptBoard`: started by the first entry runtime of the process, stopped
by the last (:class:`~chattts_serving.serving.entry_runtime.SharedHelper`); None where its
socket could not be bound."""


def _stop_board(board: ReceiptBoard, deadline_s: float) -> None:
    if alive := board.stop(deadline_s):
        log.warning("receipt board: threads still alive after its stop: %s", ", ".join(alive))


def receipt_board() -> ReceiptBoard | None:
    """This stub's running :class:`ReceiptBoard`, or None."""
    return RECEIPT_BOARD.get()
