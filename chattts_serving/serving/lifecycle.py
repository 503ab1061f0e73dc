"""The life of one stream, free of Triton: chunks, then exactly one final response or error.

A stream's client is a :class:`ResponseChannel` (in the server, a decoupled response sender:
:class:`chattts_serving.triton.responses.SenderChannel`). :class:`StreamGuard` enforces the
final-response rule on it (after the final response or the error nothing more is sent, and
the client is never left waiting); :class:`CancelWatcher` polls the live streams for client
cancels (and stalls) on one thread, so that a cancel reaches the engine within about one
decode step while the stream's own thread waits for tokens.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..errors import RequestError
from .threads import Spawn, start_thread

log = logging.getLogger(__name__)


class ResponseChannel(Protocol):
    """The client side of one stream, as the Triton layer provides it."""

    def send_audio(self, chunk: np.ndarray, info: str | None) -> None:
        """Send one audio chunk (1-D float32), with the ``info`` JSON string when given."""

    def send_final(self, info: str | None) -> None:
        """Send the final response (carrying ``info`` when given, else empty)."""

    def send_error(self, exc: RequestError) -> None:
        """End the stream with ``exc`` (a final response)."""

    def is_cancelled(self) -> bool:
        """The client cancelled. Must not be asked once the stream has ended
        (docs/triton-workarounds.md, "is_cancelled after the final")."""


class StreamGuard:
    """Exactly one end per stream: chunks, then one :meth:`finish` or :meth:`fail`, whichever
    comes first (the stream's own thread, or the watchdog after a stall); later sends are
    dropped. ``touch()`` records progress for the stall watchdog; ``working`` is true while
    the stream's own thread works on what the engine sent (vocoding, sending), time that is
    not the engine's silence (:meth:`silent_s`)."""

    def __init__(self, channel: ResponseChannel) -> None:
        self.channel = channel
        self.last_activity = time.monotonic()
        self.working = False
        self.closed = False
        self._lock = threading.Lock()

    def touch(self, working: bool | None = None) -> None:
        """Record progress now; with ``working``, also whether the stream's thread now works
        (True: a token batch arrived) or waits for the engine again (False)."""
        self.last_activity = time.monotonic()
        if working is not None:
            self.working = working

    def silent_s(self, now: float, stall_s: float) -> float:
        """Seconds of silence the watchdog holds against the stream: the time it has waited
        for the engine since its last answer, or, while the stream's thread works on a token
        batch, that work's time less ``stall_s`` (a vocoder call queued behind long offline
        windows is not a stall; a vocoder that never answers still is, after twice
        ``stall_s``)."""
        quiet = now - self.last_activity
        return quiet - stall_s if self.working else quiet

    def is_cancelled(self) -> bool:
        """The client cancelled; False once the stream is closed (asking the channel then is
        not allowed, so the check and the closing exclude each other)."""
        with self._lock:
            return False if self.closed else bool(self.channel.is_cancelled())

    def send_chunk(self, chunk: np.ndarray, info: str | None = None) -> None:
        """Send one audio chunk unless the stream is closed."""
        with self._lock:
            if not self.closed:
                self.channel.send_audio(chunk, info)
        self.touch()

    def finish(self, info: str | None = None) -> bool:
        """Send the final response unless the stream is closed; True if this call closed it."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            self.channel.send_final(info)
            return True

    def fail(self, exc: RequestError) -> bool:
        """End the stream with ``exc`` unless it is closed; True if this call closed it."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            self.channel.send_error(exc)
            return True


class CancelWatcher:
    """Polls the watched streams' ``is_cancelled()`` on one thread and runs their
    ``on_cancel`` once. With ``stall_s`` it also ends the guarded streams when none of them has
    made progress for that long (the GPT engine's process died or hangs: docs/triton-workarounds.md,
    "stuck model, nobody says so"); ``on_stall(guard, context)`` runs on the watcher thread for each. While
    any stream progresses, streams that merely wait (queued behind full engine batches) are
    left alone.

    A poll round asks every watched stream, every ``interval_s`` seconds at the most often, and
    no more than ``max_polls_per_s`` questions a second in all: in Triton each question is a
    round trip from the model's process to the server's, through the same channel as every
    response the model sends, so polling 64 streams every 5 ms (12,800 round trips a second)
    would delay the very responses (audio, and "busy" refusals) it competes with. A cancel is
    therefore seen within ``max(interval_s, streams / max_polls_per_s)`` seconds (64 streams at
    2,000 a second: 32 ms).
    """

    def __init__(self, interval_s: float, stall_s: float | None = None,
                 on_stall: Callable[[StreamGuard, Any], None] | None = None,
                 max_polls_per_s: float = float("inf"), spawn: Spawn = start_thread) -> None:
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.on_stall = on_stall
        self.max_polls_per_s = max_polls_per_s
        self._watched: dict[int, tuple[Callable[[], bool], Callable[[], None]]] = {}
        self._guards: dict[int, tuple[StreamGuard, Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._on_close: Callable[[StreamGuard, Any], None] | None = None
        self._spawn = spawn
        self._thread = spawn("cancel-watch", self._loop)

    def round_interval_s(self) -> float:
        """Seconds between two poll rounds with the streams watched now."""
        with self._lock:
            n = len(self._watched)
        return max(self.interval_s, n / self.max_polls_per_s)

    def _add(self, table: dict[int, Any], entry: Any) -> tuple[bool, Callable[[], None]]:
        """Put ``entry`` into ``table`` under a new key unless the watcher is closed; returns
        (added, the function that removes it)."""
        key = next(self._ids)
        with self._lock:
            added = not self._closed.is_set()
            if added:
                table[key] = entry

        def remove() -> None:
            with self._lock:
                table.pop(key, None)
        return added, remove

    def guard(self, guard: StreamGuard, context: Any) -> Callable[[], None]:
        """Watch ``guard`` for stalls; returns a function that stops watching it. After
        :meth:`close` the stream is ended at once, as close ended the others."""
        added, remove = self._add(self._guards, (guard, context))
        if not added and self._on_close is not None:
            self._on_close(guard, context)
        return remove

    def watcher(self, is_cancelled: Callable[[], bool]) -> Callable[[Callable[[], None]], Callable[[], None]]:
        """A :data:`~chattts_serving.serving.boundary.Watch` for one stream whose client is
        asked with ``is_cancelled()``; after :meth:`close`, ``on_cancel`` runs at once."""
        def watch(on_cancel: Callable[[], None]) -> Callable[[], None]:
            added, remove = self._add(self._watched, (is_cancelled, on_cancel))
            if not added:
                on_cancel()
            return remove
        return watch

    def poll(self) -> None:
        """One round: fire the cancels, then the stalls (the loop calls this every interval)."""
        fire = []
        # is_cancelled() runs under the lock that unwatch() takes: once a stream has unwatched
        # (before it sends its final response) it is never polled again. Polling a sender
        # whose request has completed crashes Triton 2.51 (docs/triton-workarounds.md,
        # "is_cancelled after the final").
        with self._lock:
            for key, (is_cancelled, on_cancel) in list(self._watched.items()):
                try:
                    if is_cancelled():
                        del self._watched[key]
                        fire.append(on_cancel)
                except Exception:  # a failing check must not stop the watcher
                    log.exception("cancel watcher")
        for on_cancel in fire:
            try:
                on_cancel()
            except Exception:
                log.exception("cancel watcher")
        if self.stall_s is None or self.on_stall is None:
            return
        now = time.monotonic()
        with self._lock:
            # A stream queued in the engine behind full batches gets no tokens for as long as
            # the sequences before it run (minutes with long texts): that is load, not a fault.
            # The engine sends queued sequences an empty response every
            # engine.waiting_heartbeat_s (progress here), and the engine is taken for dead only
            # when no guarded stream has progressed for stall_s; then every stream without
            # progress for that long is ended. A stream counts only the time it waits for the
            # engine: its own work on a token batch (a vocoder call queued behind long offline
            # windows) is not the engine's silence.
            stall_s = self.stall_s
            quietest = min((g.silent_s(now, stall_s) for g, _ in self._guards.values()), default=0.0)
            stalled = ([] if quietest <= stall_s else
                       [(k, g, c) for k, (g, c) in self._guards.items() if g.silent_s(now, stall_s) > stall_s])
            for k, _, _ in stalled:
                del self._guards[k]
        for _, g, c in stalled:
            try:
                self.on_stall(g, c)
            except Exception:
                log.exception("stall watcher")

    def close(self, end: Callable[[StreamGuard, Any], None], deadline_s: float) -> int:
        """Stop watching (the model unloads). ``end(guard, context)`` ends every guarded
        stream first (so that it is not ended by its engine sequence's cancel instead), then
        every watched stream's ``on_cancel`` tells the engine to end its sequence; streams
        guarded or watched later are ended the same way at once. The cancels (a BLS round trip
        each when the engine's cancel socket is not used) run on a thread of their own, and
        that thread and the watcher's are waited for until ``deadline_s``
        (``time.monotonic()``). Returns how many streams were guarded."""
        with self._lock:
            self._closed.set()
            self._on_close = end
            cancels = [on_cancel for _, on_cancel in self._watched.values()]
            guarded = list(self._guards.values())
            self._watched.clear()
            self._guards.clear()
        for guard, context in guarded:
            try:
                end(guard, context)
            except Exception:
                log.exception("cancel watcher")

        def cancel_all() -> None:
            for on_cancel in cancels:
                try:
                    on_cancel()
                except Exception:
                    log.exception("cancel watcher")
        canceller = self._spawn("unload-cancels", cancel_all)
        for thread in (canceller, self._thread):
            thread.join(max(0.0, deadline_s - time.monotonic()))
        return len(guarded)

    def _loop(self) -> None:
        while not self._closed.wait(self.round_interval_s()):
            self.poll()
