"""Final responses only while the model instance executes: the workaround for a heap
corruption in Triton 2.51's Python backend (docs/triton-workarounds.md, "final responses").

A final response sent from a model's own thread while Triton starts an ``execute`` of the same
instance can corrupt the server's heap (the race is told in the register). :class:`FinalWindow`:
``execute`` runs inside :meth:`FinalWindow.executing`; a final response from any other moment is
queued and sent by the next ``execute`` of this instance, and when none is due a *ping* (a
request to the model itself carrying :data:`~chattts_serving.contract.PING_PARAMETER`, answered
at once by ``execute``) brings one within a BLS round trip. Responses without the final flag
are sent at once.

:class:`WindowedSender` wraps a request's response sender: ``send`` with the final flag goes
through the window (and returns before it is sent when the window is closed); after it,
``is_cancelled`` no longer asks the server (docs/triton-workarounds.md, "is_cancelled after the
final").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from .. import contract
from ..serving.threads import Spawn, start_thread

log = logging.getLogger(__name__)

PING_RETRY_S = 0.05
"""Pause between pings while queued finals wait and no ``execute`` opened the window."""

MAX_HOLD_S = 1.0
"""A queued final response older than this is sent outside the window, with a warning: the
pings failed for that long (the server is stopping or broken), and a client that never hears
its stream end is worse than the race's small chance. A healthy ping takes milliseconds."""


class FinalWindow:
    """The times at which this model instance may send final responses (see the module).

    ``ping()`` asks Triton for an ``execute`` of this instance (a BLS request to the model
    itself); it is called from the window's own thread, one at a time, whenever finals are
    queued while the window is closed. ``clock`` is injectable for tests."""

    def __init__(self, ping: Callable[[], None], *, max_hold_s: float = MAX_HOLD_S,
                 retry_s: float = PING_RETRY_S, clock: Callable[[], float] = time.monotonic,
                 spawn: Spawn = start_thread) -> None:
        self._ping = ping
        self.max_hold_s, self.retry_s = max_hold_s, retry_s
        self._clock = clock
        self._cv = threading.Condition()
        self._open = False      # the stub is inside execute
        self._direct = False    # no execute can start any more (the model unloads)
        self._stopped = False
        self._sending = 0       # finals being sent inside the window by other threads
        self._opened = 0        # how many times the window opened
        self._pending: list[tuple[float, Callable[[], None]]] = []
        self.deferred = 0
        """Finals that were queued (sent by a later execute) instead of sent at once."""
        self.pings = 0
        """Pings sent."""
        self.forced = 0
        """Finals sent outside the window after :attr:`max_hold_s` (pings failing)."""
        self._thread = spawn("final-window", self._pinger)

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Wrap the body of ``execute``: queued finals are sent first, finals sent meanwhile by
        other threads go out at once, and on exit the window closes only once the finals it let
        through have been sent (the backend has acknowledged each)."""
        with self._cv:
            self._open = True
            self._opened += 1
            self._cv.notify_all()
        self._drain()
        try:
            yield
        finally:
            self._drain()
            with self._cv:
                self._open = False
                while self._sending:
                    self._cv.wait()

    def send_final(self, send: Callable[[], None]) -> bool:
        """Run ``send`` (which sends one final response) now if the window is open, else queue
        it for the next ``execute``. Returns True when it was sent now (its exceptions
        propagate); a queued one's exceptions are logged when it runs."""
        with self._cv:
            if not (self._open or self._direct):
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
        """Send the queued finals on this thread (inside the window, or once it is direct)."""
        while True:
            with self._cv:
                batch, self._pending = self._pending, []
            if not batch:
                return
            for _, send in batch:
                _run(send)

    def _pinger(self) -> None:
        """While finals are queued and no execute opens the window, ping; after
        :attr:`max_hold_s` of failed pings send the oldest outside the window."""
        while True:
            with self._cv:
                while not self._stopped and (not self._pending or self._open):
                    self._cv.wait()
                if self._stopped:
                    return
                opened = self._opened
                oldest = self._pending[0][0]
            if self._clock() - oldest > self.max_hold_s:
                self._force_oldest()
                continue
            try:
                self.pings += 1
                self._ping()
            except Exception as exc:  # the server stops, or the model is gone: try again
                log.warning("final-response window: ping failed (%s)", str(exc))  # text: a record keeps no frames
            with self._cv:  # the ping's execute opens (and drains) the window; wait for it
                self._cv.wait_for(partial(self._served, opened), timeout=self.retry_s)

    def _served(self, opened: int) -> bool:
        """(Under the lock.) The pinger may go on: stopped, nothing queued, or the window
        opened since it was ``opened`` times."""
        return self._stopped or not self._pending or self._opened != opened

    def _force_oldest(self) -> None:
        with self._cv:
            if not self._pending or self._open:
                return
            _, send = self._pending.pop(0)
            self.forced += 1
            forced = self.forced
        if forced == 1 or forced % 100 == 0:
            log.warning("final-response window: a final response waited over %.1f s for an execute; "
                        "sent outside it (%d so far)", self.max_hold_s, forced)
        _run(send)


def _no_ping() -> None:
    pass


def _run(send: Callable[[], None]) -> None:
    try:
        send()
    except Exception:  # the client is gone, or the server stops: nothing left to tell anyone
        log.exception("final-response window: sending a queued final response failed")


class WindowedSender:
    """A request's response sender whose final response goes through ``window``
    (``sender``: the ``pb_utils`` response sender, or a wrapper with the same ``send`` and
    ``is_cancelled``; ``final_flag``: ``pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL``)."""

    def __init__(self, sender: Any, window: FinalWindow, final_flag: int) -> None:
        self._sender, self._window, self._final_flag = sender, window, final_flag
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
        self._window.send_final(send_now)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled; once the final response was handed over, the last
        answer (the server is not asked about a finished request)."""
        with self._lock:
            if not self._final:
                self._cancelled = bool(self._sender.is_cancelled())
            return self._cancelled


def is_ping(request: Any) -> bool:
    """Whether a request is a ping (:data:`~chattts_serving.contract.PING_PARAMETER`)."""
    params = request.parameters() or ""
    if contract.PING_PARAMETER not in params:
        return False
    try:
        return json.loads(params).get(contract.PING_PARAMETER) is True
    except (ValueError, AttributeError):
        return False


def ping_inputs(pb: Any, specs: Sequence[contract.TensorSpec]) -> list[Any]:
    """The smallest tensors a ping needs to pass Triton's check of the model's required
    inputs (``specs``): one zero element (an empty string) of each required one."""
    out = []
    for spec in specs:
        if spec.optional:
            continue
        shape = tuple(1 if d < 0 else d for d in spec.dims)
        value = np.full(shape, b"", dtype=np.object_) if spec.np_dtype == np.object_ else np.zeros(shape, spec.np_dtype)
        out.append(pb.Tensor(spec.name, value))
    return out


def answer_ping(pb: Any, sender: Any, decoupled: bool) -> None:
    """End a ping inside ``execute``: the final flag alone (decoupled), or one empty response."""
    final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if decoupled:
        sender.send(flags=final)
    else:
        sender.send(pb.InferenceResponse(output_tensors=[]), flags=final)
