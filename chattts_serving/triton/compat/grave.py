"""Register row "iterator grave" (docs/triton-workarounds.md): finished BLS response iterators
are kept referenced for a grace time, then let go from a Python thread of ours.

- symptom: the entry stub dies (segmentation fault, ``corrupted size vs. prev_size``) during
  bursts of cancelled streams.
- cause: python_backend r24.10 frees a BLS iterator that Python let go of before the stub's
  cleanup of it on the stub-to-parent thread, its responses' numpy arrays without the GIL.
- what we do: :func:`keep_iterator` hands every finished iterator (engine streams, cancel
  control requests, pings) to the process's :class:`IteratorGrave`, which holds it for
  :data:`ITERATOR_GRACE_S` and lets it go on its thread ``bls-iterator-grave``, with the GIL.
  The grave is a :class:`~chattts_serving.serving.entry_runtime.SharedHelper`: started by the
  first model of the process that uses it, stopped (every held iterator let go) by the last.
- shown by: ``tests/unit/test_bls_iterators.py``.
- delete when: Triton >= 25.01 (its python_backend holds the GIL when deleting numpy arrays);
  :func:`keep_iterator` then becomes ``del``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from ...serving.entry_runtime import SharedHelper

ITERATOR_GRACE_S = 2.0
"""How long a finished BLS response iterator is kept referenced after its last response was
read (see :class:`IteratorGrave`)."""


class IteratorGrave:
    """Keeps finished decoupled-BLS response iterators referenced for ``grace_s`` seconds, then
    lets them go from its own Python thread.

    Kept past the stub's cleanup, an iterator is freed by its last Python reference, with the
    GIL (see the module). Costs the iterator's responses' memory for ``grace_s`` seconds."""

    def __init__(self, grace_s: float = ITERATOR_GRACE_S) -> None:
        self.grace_s = grace_s
        self._held: deque[tuple[float, Any]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> IteratorGrave:
        """Start the thread that lets iterators go (``bls-iterator-grave``)."""
        self._thread = threading.Thread(target=self._loop, name="bls-iterator-grave", daemon=True)
        self._thread.start()
        return self

    def stop(self, deadline_s: float) -> int:
        """Let go of every held iterator now (the model unloads: held past the stub's exit, they
        would be freed after its shared memory is gone), stop the thread and join it until
        ``deadline_s`` (``time.monotonic()``). Returns how many were let go."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline_s - time.monotonic()))
        return self.release_due(now_s=float("inf"))

    def keep(self, iterator: Any) -> None:
        """Hold ``iterator`` (whose last response has been read) for ``grace_s`` seconds."""
        with self._lock:
            self._held.append((time.monotonic() + self.grace_s, iterator))
        self._wake.set()

    def held(self) -> int:
        """Iterators held now."""
        with self._lock:
            return len(self._held)

    def release_due(self, now_s: float | None = None) -> int:
        """Let go of the iterators whose grace has passed (on the calling Python thread);
        returns how many."""
        now_s = time.monotonic() if now_s is None else now_s
        due = []
        with self._lock:
            while self._held and self._held[0][0] <= now_s:
                due.append(self._held.popleft())
        n = len(due)
        del due  # the last references: freed here, with the GIL
        return n

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait()
            self._wake.clear()  # before looking: a keep() from now on sets it again
            while not self._stopped.is_set():
                with self._lock:
                    next_due = self._held[0][0] if self._held else None
                if next_due is None:
                    break
                self._stopped.wait(max(0.0, next_due - time.monotonic()))
                self.release_due()


ITERATOR_GRAVE: SharedHelper[IteratorGrave] = SharedHelper(
    "BLS iterator grave", lambda: IteratorGrave().start(), lambda grave, deadline_s: _stop_grave(grave, deadline_s))
"""The process's :class:`IteratorGrave`: started by the first model that uses it (an entry
runtime, the engine model), stopped by the last
(:class:`~chattts_serving.serving.entry_runtime.SharedHelper`)."""


def _stop_grave(grave: IteratorGrave, deadline_s: float) -> None:
    grave.stop(deadline_s)


def keep_iterator(iterator: Any) -> None:
    """Hold a finished decoupled BLS response iterator in the process's grave; when no model
    holds the grave (the process unloads), let it go here, on this Python thread."""
    grave = ITERATOR_GRAVE.get()
    if grave is not None:
        grave.keep(iterator)
