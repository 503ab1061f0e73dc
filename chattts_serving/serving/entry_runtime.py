"""The entry stub's runtime, free of Triton: one owner for an entry model's admission slots,
its threads and the process-wide helpers it uses.

An entry model (``chattts_entry`` / ``chattts`` and ``chattts_offline_entry`` /
``chattts_offline``) is a small concurrent program inside a Python-backend stub. Its
``execute`` only takes a slot or refuses (:meth:`EntryRuntime.arrive`); everything else runs
on threads. This is the map of those threads; each is started by the runtime (directly, or by a
component through the runtime's :meth:`~chattts_serving.serving.threads.ThreadOwner.spawn`)
and joined by :meth:`EntryRuntime.stop`:

- ``entry_N``, a pool of ``slots.limit`` (:meth:`EntryRuntime.serve`): runs one accepted
  request, admission then the whole stream or utterance; ends with its request (the service
  ends live streams at unload).
- ``refuse_N``, a pool of ``entry.refusal_threads`` (:meth:`EntryRuntime.serve`): sends one
  "busy" refusal.
- ``entry-dispatch`` (:meth:`EntryRuntime.serve`): hands accepted requests to the workers once
  their burst's refusals are out (:class:`~chattts_serving.serving.admission.RefusalsFirst`).
- ``refusal-record`` (:class:`~chattts_serving.serving.entry.RefusalRecorder`): counts and logs
  refusals once their burst has settled.
- ``degrade-tick`` (:class:`~chattts_serving.serving.entry.EntryService`): re-evaluates the
  degraded mode every second.
- ``cancel-watch`` (:class:`~chattts_serving.serving.lifecycle.CancelWatcher`): polls clients'
  cancels, ends stalled streams; ``unload-cancels`` (its ``close``): tells the engine to end the
  live streams' sequences at unload.
- ``deferred-finals`` (the adapter's
  :class:`~chattts_serving.triton.compat.finals.DeferredFinals`, spawned here): pings the model
  for an ``execute`` while final responses wait; closed first at unload.
- ``receipts-accept``, ``receipts-read`` (the process-wide
  :class:`~chattts_serving.triton.compat.receipts.ReceiptBoard`, a :class:`SharedHelper`):
  accept the engine's receipt connections and read receipts; stopped by the process's last
  runtime.
- ``bls-iterator-grave`` (the process-wide
  :class:`~chattts_serving.triton.compat.grave.IteratorGrave`, a :class:`SharedHelper`): lets go
  of finished BLS iterators after their grace; stopped by the process's last user, every held
  iterator let go first.

Slots: :meth:`arrive` takes a :class:`~chattts_serving.serving.slots.SlotToken` or sends
"busy"; the token travels with the request and is released exactly once: by
:meth:`EntryService.finish <chattts_serving.serving.entry.EntryService.finish>` when an
admitted request ends, or here when a request never became one (refused at admission, never
handed to a worker).

Why the order of :meth:`stop` matters: a thread of the model that wakes while the stub exits
crashes it (:mod:`chattts_serving.triton.compat.unload`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ..errors import ErrorKind, RequestError, drop_tracebacks
from .admission import RefusalsFirst
from .entry import EntryService, unloading_error
from .job import SynthesisJob
from .slots import SlotToken
from .threads import ThreadOwner

log = logging.getLogger(__name__)

UNLOAD_WAIT_S = 5.0
"""How long :meth:`EntryRuntime.stop` waits for the model's threads, all together. Once their
streams are ended and their engine sequences cancelled, a request's thread only has to read the
engine's last response (one decode step, milliseconds); the bound keeps an unload from hanging
on a stage that does not answer, and stays inside tritonserver's ``--exit-timeout-secs`` (10 s
in ``chattts-serve``, 30 s by default)."""

H = TypeVar("H")


class SharedHelper(Generic[H]):
    """A process-wide helper (one per stub process, shared by the models in it): made and
    started by its first :meth:`acquire`, stopped by the :meth:`release` that matches the last
    acquire. ``make()`` builds and starts it (an ``OSError`` means "none in this process": logged
    once, :meth:`get` then answers None until the helper is made again); ``stop(helper,
    deadline_s)`` stops it and joins its threads."""

    def __init__(self, name: str, make: Callable[[], H], stop: Callable[[H, float], None]) -> None:
        self.name = name
        self._make, self._stop = make, stop
        self._lock = threading.Lock()
        self._users = 0
        self._helper: H | None = None

    def acquire(self) -> H | None:
        """One more user; the helper (made now for the first), or None when it cannot exist."""
        with self._lock:
            self._users += 1
            if self._users == 1:
                try:
                    self._helper = self._make()
                except OSError as exc:
                    log.warning("%s: not available in this process (%s)", self.name, exc)
                    self._helper = None
            return self._helper

    def get(self) -> H | None:
        """The running helper, or None (no user, or it could not be made)."""
        with self._lock:
            return self._helper

    def release(self, deadline_s: float) -> None:
        """One user fewer; the last stops the helper (joined until ``deadline_s``,
        ``time.monotonic()``)."""
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            helper = self._helper if self._users == 0 else None
            if self._users == 0:
                self._helper = None
        if helper is not None:
            self._stop(helper, deadline_s)

    @property
    def users(self) -> int:
        with self._lock:
            return self._users


class EntryHandler(Protocol):
    """What the Triton adapter does for the runtime (``request`` and ``sender`` are its own
    objects, opaque here)."""

    def parse(self, request: Any) -> tuple[Mapping[str, np.ndarray], Mapping[str, object], str]:
        """The request's tensors, request parameters and request id."""

    def run(self, job: SynthesisJob, sender: Any) -> None:
        """Run an admitted request to its end on ``sender`` (never raises)."""

    def send_error(self, sender: Any, exc: RequestError) -> None:
        """End the request with ``exc`` (one final error response)."""

    def request_id(self, request: Any) -> str:
        """The request's id as Triton has it ('' when the client gave none)."""


def internal_error(exc: BaseException) -> RequestError:
    """What a client hears of an unexpected exception: its type, never a traceback."""
    return RequestError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL)


_Item = tuple[Any, Any, float, SlotToken]
"""An accepted request on its way to a worker: request, sender, arrival (monotonic s), slot."""


class EntryRuntime:
    """The owner of one entry-model instance's slots, threads and process-wide helpers (see
    the module docstring for the map of threads).

    Build it first (it acquires ``helpers``, so that the stages can use them), hand its
    :attr:`spawn` to the components that start threads, then :meth:`serve`; ``execute`` calls
    :meth:`arrive` per request; ``finalize`` calls :meth:`stop`."""

    def __init__(self, helpers: Sequence[SharedHelper[Any]] = ()) -> None:
        self.threads = ThreadOwner()
        self.spawn = self.threads.spawn
        self._helpers = list(helpers)
        for helper in self._helpers:
            helper.acquire()
        self.service: EntryService | None = None
        self._handler: EntryHandler | None = None
        self._pools: list[ThreadPoolExecutor] = []
        self._accepted: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._running: set[Future[None]] = set()
        self._running_lock = threading.Lock()
        self._unloading = False
        self._stopped = False

    def serve(self, service: EntryService, handler: EntryHandler, *, refusal_threads: int, settle_s: float,
              max_wait_s: float) -> None:
        """Start serving: the worker and refusal pools and the dispatcher."""
        self.service, self._handler = service, handler
        self.workers = ThreadPoolExecutor(service.admission.slots.limit, thread_name_prefix="entry")
        self.refusals = ThreadPoolExecutor(refusal_threads, thread_name_prefix="refuse")
        self._pools = [self.workers, self.refusals]
        self.refusals_first = RefusalsFirst(settle_s, max_wait_s)
        self._dispatcher = self.spawn("entry-dispatch", self._dispatch)

    # ---- execute's side ------------------------------------------------------------------------
    def arrive(self, request: Any, sender: Any, arrival_s: float) -> None:
        """A request has arrived (called from ``execute``): take a slot and queue it for the
        dispatcher, or queue its "busy" refusal on the refusal threads. Reads nothing of it."""
        assert self.service is not None
        taken = self.service.reserve()
        refused = isinstance(taken, RequestError)
        self.refusals_first.arrived(refused, arrival_s)
        if isinstance(taken, RequestError):
            self.refusals.submit(self._refuse, request, sender, taken)
        else:
            self._accepted.put((request, sender, arrival_s, taken))

    # ---- the threads ---------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Hand accepted requests to the workers, in arrival order, each once the refusals of
        its burst have been sent (:class:`RefusalsFirst`): one thread waits, not one per
        request."""
        while (item := self._accepted.get()) is not None:
            try:
                self.refusals_first.wait(item[2])
                future = self.workers.submit(self._serve, *item)
                with self._running_lock:
                    self._running.add(future)
                future.add_done_callback(self._ran)
            except RuntimeError:  # the workers were shut down: the model is unloading
                self._unserved(item, unloading_error())
                while True:
                    try:
                        rest = self._accepted.get_nowait()
                    except queue.Empty:
                        return
                    if rest is not None:
                        self._unserved(rest, unloading_error())
            except Exception as exc:  # never leave an accepted request without an answer
                log.exception("dispatching a request failed")
                self._unserved(item, internal_error(exc))

    def _ran(self, future: Future[None]) -> None:
        with self._running_lock:
            self._running.discard(future)

    def _unserved(self, item: _Item, exc: RequestError) -> None:
        """An accepted request that no worker will run: its slot back, its stream ended."""
        assert self._handler is not None
        item[3].release()
        try:
            self._handler.send_error(item[1], exc)
        except Exception:
            log.exception("ending an unserved request failed")

    def _refuse(self, request: Any, sender: Any, busy: RequestError) -> None:
        assert self.service is not None and self._handler is not None
        try:
            self._handler.send_error(sender, busy)
        except Exception:  # the client is gone: still counted and logged
            log.exception("sending a refusal failed")
        finally:
            self.refusals_first.sent()
            self.service.refused(self._handler.request_id(request), busy)

    def _serve(self, request: Any, sender: Any, arrival_s: float, slot: SlotToken) -> None:
        """Admit a request that holds ``slot`` and run it to its end (on a worker thread)."""
        assert self.service is not None and self._handler is not None
        if self._unloading:
            self._unserved((request, sender, arrival_s, slot), unloading_error())
            return
        try:
            inputs, params, request_id = self._handler.parse(request)
            job = self.service.admit(inputs, params, request_id, arrival_s, slot=slot)
        except RequestError as exc:  # counted, logged, slot given back
            drop_tracebacks(exc)  # docs/triton-workarounds.md, "tracebacks"
            slot.release()
            self._handler.send_error(sender, exc)
            return
        except Exception as exc:
            log.exception("admission failed")
            drop_tracebacks(exc)
            slot.release()
            self._handler.send_error(sender, internal_error(exc))
            return
        self._handler.run(job, sender)

    # ---- unload --------------------------------------------------------------------------------
    def stop(self, wait_s: float = UNLOAD_WAIT_S, first: Callable[[], None] | None = None) -> list[str]:
        """Unload in order, all within ``wait_s``: ``first()`` (the adapter's: its hooks close,
        so the streams' last finals go out at once); requests no worker has
        started end with :func:`unloading_error`; the dispatcher and the refusal threads are
        joined; live streams end with UNAVAILABLE (:meth:`EntryService.close`, their engine
        sequences cancelled); the workers are joined; every other thread the runtime started
        is joined; the process-wide helpers are released (the last user stops them); the
        handler is dropped once no request runs (it holds this runtime: a reference cycle,
        :mod:`chattts_serving.triton.compat.unload`). Returns the names of the threads still
        alive (logged; empty when all ended)."""
        deadline = time.monotonic() + wait_s

        def left() -> float:
            return max(0.0, deadline - time.monotonic())
        if self._stopped:
            return []
        self._stopped = True
        if first is not None:
            first()
        self._unloading = True  # a request that a worker has yet to start ends "model unloading"
        if self.service is not None:
            self.workers.shutdown(wait=False)  # and so does what the dispatcher is still handed
            self.refusals_first.close()  # the dispatcher waits for no burst any more
            self._accepted.put(None)
            self._dispatcher.join(left())
            self.refusals.shutdown(wait=True)  # each refusal is one send: never long
            self.service.close(deadline)
            with self._running_lock:
                running = set(self._running)
            _, still = futures_wait(running, left())
            if still:
                log.warning("%d requests still running at unload", len(still))
            else:
                self.workers.shutdown(wait=True)  # the idle threads exit now, not while the stub does
                # the adapter (the model) holds this runtime: no cycle left for the stub's exit
                self._handler = None
        alive = [t.name for t in self.threads.join(deadline)]
        for helper in self._helpers:
            helper.release(deadline)
        alive += [t.name for t in pool_threads(self._pools) if t.is_alive()]
        if alive:
            log.warning("threads still alive after unload: %s", ", ".join(sorted(alive)))
        return alive

    def running(self) -> int:
        """Accepted requests a worker is running now."""
        with self._running_lock:
            return len(self._running)

    def live_threads(self) -> list[threading.Thread]:
        """The runtime's own threads and its pools' that are alive now."""
        return self.threads.alive() + [t for t in pool_threads(self._pools) if t.is_alive()]


def pool_threads(pools: Sequence[ThreadPoolExecutor]) -> list[threading.Thread]:
    """The threads a thread pool has started (``ThreadPoolExecutor`` keeps them in ``_threads``)."""
    return [t for pool in pools for t in getattr(pool, "_threads", ())]
