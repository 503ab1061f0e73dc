"""Admission slots (an entry-model instance's, the ensemble door's), each taken as a token that
is released exactly once.

A slot is taken when a request arrives (at an entry model, before anything of it is read; at
the ensemble door, once the engine has validated it) and given back when
the request ends, whichever way it ends: refused at admission, never handed to a worker
(unloading), failed, finished. Those ends are in several places; the token makes "exactly
once" a property of the slot instead of a convention of its callers: a second
:meth:`SlotToken.release` does nothing and says so.
"""

from __future__ import annotations

import threading


class StreamSlots:
    """At most ``limit`` live requests: an entry-model instance's (:class:`~.admission.Admission`)
    or the ensemble door's (:class:`~.admission.EnsembleDoor`).

    A decoupled model that hands requests to threads empties Triton's queue at once, so the
    queue policy cannot bound live streams; this counter does (docs/triton-workarounds.md,
    "gate, not max_queue_size")."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.live = 0
        self._lock = threading.Lock()

    def acquire(self) -> SlotToken | None:
        """Take a slot; None when all are taken."""
        with self._lock:
            if self.live >= self.limit:
                return None
            self.live += 1
        return SlotToken(self)

    def _give_back(self) -> None:
        with self._lock:
            self.live -= 1


class SlotToken:
    """One taken slot of :class:`StreamSlots`."""

    def __init__(self, slots: StreamSlots) -> None:
        self._slots = slots
        self._lock = threading.Lock()
        self._held = True

    @property
    def held(self) -> bool:
        """Not released yet."""
        with self._lock:
            return self._held

    def release(self) -> bool:
        """Give the slot back; True the first time, False (nothing done) after that."""
        with self._lock:
            if not self._held:
                return False
            self._held = False
        self._slots._give_back()
        return True
