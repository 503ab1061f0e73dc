"""Register rows "final responses" and "is_cancelled after the final"
(docs/triton-workarounds.md): a final response leaves only while the instance runs ``execute``.

- symptom: under ordinary load (waves of streams ending while the next are accepted) glibc
  aborts tritonserver (``malloc(): unsorted double linked list corrupted``); and a stub that
  asks ``is_cancelled()`` after a request's final response crashes the server (use after free).
- cause: python_backend's ``ProcessRequests`` clears ``closed_requests_`` at the start of every
  ``execute`` without the mutex under which its thread pool appends to it for every final
  response; ``ProcessIsRequestCancelled`` asks a response factory that the final deleted.
- what we do: ``execute`` runs inside :meth:`DeferredFinals.executing`; a final response sent
  at any other moment is queued and sent by the next ``execute`` of the instance, and when none
  is due a ping (:mod:`.pings`) brings one within a BLS round trip; after :data:`MAX_HOLD_S`
  of failed pings it is sent anyway. Responses without the final flag leave at once.
  :class:`DeferredFinalSender` wraps a request's sender so: ``send`` with the final flag goes
  through :class:`DeferredFinals`, and after it ``is_cancelled`` answers from memory.
- shown by: ``tests/unit/test_finals.py``; every server test (streams still end).
- delete when: python_backend takes ``closed_requests_mutex_`` around the reset and answers
  ``is_cancelled`` for a deleted factory; the models then send finals from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from ...serving.threads import Spawn, start_thread

log = logging.getLogger(__name__)

PING_RETRY_S = 0.05
"""Pause between pings while queued finals wait and no ``execute`` began."""

MAX_HOLD_S = 1.0
"""A queued final response older than this is sent outside ``execute``, with a warning: the
pings failed for that long (the server is stopping or broken), and a client that never hears
its stream end is worse than the race's small chance. A healthy ping takes milliseconds."""


class DeferredFinals:
    """The times at which this model instance may send final responses (see the module).

    ``ping()`` asks Triton for an ``execute`` of this instance (a BLS request to the model
    itself); it is called from this object's own thread, one at a time, whenever finals are
    queued while no ``execute`` runs. ``clock`` is injectable for tests."""

    def __init__(self, ping: Callable[[], None], *, max_hold_s: float = MAX_HOLD_S,
                 retry_s: float = PING_RETRY_S, clock: Callable[[], float] = time.monotonic,
                 spawn: Spawn = start_thread) -> None:
        self._ping = ping
        self.max_hold_s, self.retry_s = max_hold_s, retry_s
        self._clock = clock
        self._cv = threading.Condition()
        self._executing = False      # the stub is inside execute
        self._direct = False    # no execute can start any more (the model unloads)
        self._stopped = False
        self._sending = 0       # finals being sent inside execute by other threads
        self._entered = 0       # how many times execute began
        self._pending: list[tuple[float, Callable[[], None]]] = []
        self.deferred = 0
        """Finals that were queued (sent by a later execute) instead of sent at once."""
        self.pings = 0
        """Pings sent."""
        self.forced = 0
        """Finals sent outside ``execute`` after :attr:`max_hold_s` (pings failing)."""
        self._thread = spawn("deferred-finals", self._pinger)

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Wrap the body of ``execute``: queued finals are sent first, finals sent meanwhile by
        other threads go out at once, and on exit it returns only once the finals it let
        through have been sent (the backend has acknowledged each)."""
        with self._cv:
            self._executing = True
            self._entered += 1
            self._cv.notify_all()
        self._drain()
        try:
            yield
        finally:
            self._drain()
            with self._cv:
                self._executing = False
                while self._sending:
                    self._cv.wait()

    def send_final(self, send: Callable[[], None]) -> bool:
        """Run ``send`` (which sends one final response) now if ``execute`` runs, else queue
        it for the next ``execute``. Returns True when it was sent now (its exceptions
        propagate); a queued one's exceptions are logged when it runs."""
        with self._cv:
            if not (self._executing or self._direct):
                self._pending.append((self._clock(), send))
                self.deferred += 1
                self._cv.notify_all()
                return False
            self._sending += 1
        try:
            send()
        finally:
            with self._cv:
                self._sending -= 1
                self._cv.notify_all()
        return True

    def pending(self) -> int:
        """Finals queued now."""
        with self._cv:
            return len(self._pending)

    def close(self) -> None:
        """The model unloads: Triton starts no more ``execute``, so finals are sent at once from
        now on; the queued ones are sent here. The pinging thread stops."""
        with self._cv:
            self._direct = True
            self._stopped = True
            self._cv.notify_all()
        self._drain()
        self._thread.join(timeout=5.0)
        self._ping = _no_ping  # the model's bound method: a reference cycle through the model

    def _drain(self) -> None:
        """Send the queued finals on this thread (inside ``execute``, or once they go out directly)."""
        while True:
            with self._cv:
                batch, self._pending = self._pending, []
            if not batch:
                return
            for _, send in batch:
                _run(send)

    def _pinger(self) -> None:
        """While finals are queued and no execute begins, ping; after
        :attr:`max_hold_s` of failed pings send the oldest outside ``execute``."""
        while True:
            with self._cv:
                while not self._stopped and (not self._pending or self._executing):
                    self._cv.wait()
                if self._stopped:
                    return
                opened = self._entered
                oldest = self._pending[0][0]
            if self._clock() - oldest > self.max_hold_s:
                self._force_oldest()
                continue
            try:
                self.pings += 1
                self._ping()
            except Exception as exc:  # the server stops, or the model is gone: try again
                log.warning("deferred finals: ping failed (%s)", str(exc))  # text: a record keeps no frames
            with self._cv:  # the ping's execute drains the queue; wait for it
                self._cv.wait_for(partial(self._served, opened), timeout=self.retry_s)

    def _served(self, opened: int) -> bool:
        """(Under the lock.) The pinger may go on: stopped, nothing queued, or an ``execute``
        began since it had begun ``opened`` times."""
        return self._stopped or not self._pending or self._entered != opened

    def _force_oldest(self) -> None:
        with self._cv:
            if not self._pending or self._executing:
                return
            _, send = self._pending.pop(0)
            self.forced += 1
            forced = self.forced
        if forced == 1 or forced % 100 == 0:
            log.warning("deferred finals: a final response waited over %.1f s for an execute; "
                        "sent outside it (%d so far)", self.max_hold_s, forced)
        _run(send)


def _no_ping() -> None:
    pass


def _run(send: Callable[[], None]) -> None:
    try:
        send()
    except Exception:  # the client is gone, or the server stops: nothing left to tell anyone
        log.exception("deferred finals: sending a queued final response failed")


class DeferredFinalSender:
    """A request's response sender whose final response goes through ``finals``
    (``sender``: the ``pb_utils`` response sender, or a wrapper with the same ``send`` and
    ``is_cancelled``; ``final_flag``: ``pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL``)."""

    def __init__(self, sender: Any, finals: DeferredFinals, final_flag: int) -> None:
        self._sender, self._finals, self._final_flag = sender, finals, final_flag
        self._lock = threading.Lock()  # a final send and an is_cancelled round trip never overlap
        self._final = False            # a final response was handed over (sent or queued)
        self._cancelled = False

    def send(self, response: Any = None, flags: int = 0) -> None:
        if not flags & self._final_flag:
            self._sender.send(response, flags=flags)
            return
        with self._lock:
            if self._final:
                raise RuntimeError("a final response was already sent on this response sender")
            self._final = True

        def send_now() -> None:
            with self._lock:
                self._sender.send(response, flags=flags)
        self._finals.send_final(send_now)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled; once the final response was handed over, the last
        answer (the server is not asked about a finished request)."""
        with self._lock:
            if not self._final:
                self._cancelled = bool(self._sender.is_cancelled())
            return self._cancelled
