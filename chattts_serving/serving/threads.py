"""Who starts a thread, and who joins it.

The entry models' components (the refusal recorder, the cancel watcher, the degraded mode's
tick, ...) do not start threads of their own accord: each takes a :data:`Spawn`, a function
that starts a named thread. Standing alone (in tests) that is :func:`start_thread`; in an entry
stub it is :meth:`ThreadOwner.spawn` of the stub's
:class:`~chattts_serving.serving.entry_runtime.EntryRuntime`, which joins every thread it
started when the model unloads and can say which are still alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Spawn = Callable[..., threading.Thread]
"""``spawn(name, target, *args)``: a started daemon thread named ``name`` running ``target(*args)``."""


def start_thread(name: str, target: Callable[..., Any], *args: Any) -> threading.Thread:
    """A :data:`Spawn` that starts a daemon thread and keeps no record of it."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


class ThreadOwner:
    """Starts named daemon threads (:meth:`spawn`, a :data:`Spawn`), keeps each until it has
    ended, and joins them (:meth:`join`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def spawn(self, name: str, target: Callable[..., Any], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def alive(self) -> list[threading.Thread]:
        """The threads started here that have not ended."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def join(self, deadline_s: float) -> list[threading.Thread]:
        """Wait for every thread started here until ``deadline_s`` (``time.monotonic()``);
        returns those still alive."""
        for thread in self.alive():
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline_s - time.monotonic()))
        return self.alive()
