"""Register row "cancel datagram" (docs/triton-workarounds.md): cancels from the entry models
(and the ensemble's last step) to the GPT engine, outside Triton, over one Unix datagram socket.

- symptom: a storm of BLS control requests (64 clients cancelling at once) deadlocks the entry
  stub; and a BLS caller cannot cancel a request it sent.
- cause: the sibling of the *receipts* cycle through ``InferenceRequest.exec(decoupled=True)``
  (``Stub::GetResponseIterator``), and python_backend's BLS has no cancel.
- what we do: :func:`send_cancel` sends the engine's ``stream_id`` to the engine's
  :class:`CancelListener`: no Triton, no GIL held while waiting, one ``sendto``. Where nothing
  listens, the callers fall back to a BLS control request (``triton/stages.py``).
- shown by: ``tests/unit/test_cancels.py``, ``tests/server/test_cancels.py``.
- delete when: the iterator never waits for the GIL while holding its mutex, and BLS requests
  can be cancelled.

The socket lives in Linux's abstract namespace (no file to clean up), named after the
tritonserver process (the stubs' parent) and the engine model, so two servers on one host
never share it. A datagram is the engine's ``stream_id`` in UTF-8 (at most
:data:`MAX_ID_BYTES` bytes).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_ID_BYTES = 256
"""Largest datagram the listener reads; a stream id is a 32-character UUID hex."""


def cancel_address(engine_model: str, server_pid: int | None = None) -> str:
    """The abstract-namespace address of ``engine_model``'s cancel socket on the server whose
    process id is ``server_pid`` (default: this process's parent, the tritonserver of a stub)."""
    return f"\0chattts-serving/{server_pid or os.getppid()}/{engine_model}/cancel"


SEND_TIMEOUT_S = 2.0
"""How long a cancel may wait for room in the engine socket's queue (Linux queues only
``net.unix.max_dgram_qlen`` datagrams, 10 by default, so a storm of cancels waits for the
engine's listener, which takes each in microseconds)."""


def send_cancel(address: str, stream_id: str) -> bool:
    """Ask the engine listening at ``address`` to cancel ``stream_id``, waiting at most
    :data:`SEND_TIMEOUT_S` for room in its queue (the GIL is released meanwhile). Returns False
    when nothing listens there or the datagram could not be sent: the caller then cancels
    another way."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(SEND_TIMEOUT_S)
            s.sendto(stream_id.encode(), address)
        return True
    except OSError:
        return False


class CancelListener:
    """The engine's end: a thread that reads stream ids from the socket at ``address`` and
    calls ``cancel(stream_id)`` for each. Raises OSError at :meth:`start` when the address is
    taken (another engine of the same name on this server)."""

    def __init__(self, address: str, cancel: Callable[[str], object]) -> None:
        self.address, self.cancel = address, cancel
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> CancelListener:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.address)
        self._sock = sock
        self._thread = threading.Thread(target=self._loop, name="engine-cancels", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while self._sock is not None:
            try:
                data = sock.recv(MAX_ID_BYTES)
            except OSError:
                return  # closed
            if not data:
                return
            try:
                self.cancel(data.decode("utf-8", errors="replace"))
            except Exception:  # one bad cancel must not stop the others
                log.exception("cancel of %r failed", data[:64])

    def close(self) -> None:
        """Stop listening: an empty datagram ends the thread's loop, then the socket closes."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b"", self.address)
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        sock.close()
