"""The entry models' service, free of Triton: a request's whole life in ``chattts`` (streaming)
and ``chattts_offline``.

1. :meth:`EntryService.admit`: parse, validate and admit (:class:`~.admission.Admission`), or
   refuse at once (counted in ``tts_rejected_total`` and logged);
2. :meth:`EntryService.stream` (on a worker thread) or :meth:`EntryService.offline`: run the
   pipeline against the stages (:mod:`~chattts_serving.serving.pipeline`);
3. exactly one end per accepted request: the final response or one error
   (:class:`~.lifecycle.StreamGuard`), then :meth:`EntryService.finish` records it (slot
   freed, metrics, a ``request_finished`` log line).

The Triton layer (:mod:`chattts_serving.triton.models`) provides the stages (BLS calls), the
metrics and the response channel; tests provide in-process ones.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from .. import contract
from ..errors import ErrorKind, RequestError, drop_tracebacks
from .admission import OFFLINE_BUSY_DETAIL, Admission, entry_slots, rejection_reason
from .boundary import Stages
from .job import StreamResult, SynthesisJob, info_json
from .lifecycle import CancelWatcher, ResponseChannel, StreamGuard
from .logs import log_event
from .pipeline import offline_audio, stream_audio
from .profile import Profile
from .slots import SlotToken
from .threads import Spawn, start_thread

log = logging.getLogger(__name__)

DEGRADE_TICK_S = 1.0
"""How often the degraded mode is re-evaluated without new requests, in seconds."""


class EntryObserver(Protocol):
    """Request-level measurements of an entry model (Prometheus in the server:
    :class:`chattts_serving.triton.metrics.EntryMetrics`)."""

    def rejected(self, reason: str, count: int = 1) -> None:
        """``count`` requests were refused before any work ('busy' or 'invalid')."""

    def finished(self, status: str, priority: str, duration_s: float, audio_s: float, ttfa_s: float | None) -> None:
        """An accepted request ended with ``status`` ('ok', 'cancelled', 'error', 'invalid')."""

    def set_queue(self, waiting: int) -> None:
        """Accepted requests that have not produced audio yet."""

    def set_active(self, active: int) -> None:
        """Accepted requests in flight (admitted, not yet finished): what a drain waits for."""

    def set_degraded(self, on: bool) -> None:
        """The degraded mode switched."""

    def degraded_request(self) -> None:
        """A request was admitted in the degraded mode (counted per door)."""


@dataclass(frozen=True, kw_only=True)
class EntryOutcome:
    """How an accepted request ended: its result (None when it failed before any audio) and
    its error (None when it completed or was cancelled)."""

    result: StreamResult | None
    error: RequestError | None


class RefusalRecorder:
    """Counts and logs refusals off the refusal path, after their errors were sent.

    Under overload "busy" answers come in bursts (200 clients at once in ``make bench``), and in
    Triton every metric update is a round trip from the model's process to the server's, through
    the same channel as the refusals still being sent. :meth:`add` only queues; one thread waits
    until no refusal has arrived for ``settle_s`` seconds (at most ``max_delay_s`` after the
    first of a burst), then makes one ``observer.rejected(reason, count)`` call per reason and
    writes one ``request_rejected`` log line per request. A queued refusal is therefore counted
    about ``max_delay_s`` (plus one such update) after it was sent at the latest;
    :meth:`record` counts one at once, on the caller's thread. The admission gate logs its
    refusals with the same settling times (``SETTLE_S``, ``MAX_DELAY_S``).
    """

    SETTLE_S: ClassVar[float] = 0.01
    MAX_DELAY_S: ClassVar[float] = 0.1

    def __init__(self, model: str, observer: EntryObserver, settle_s: float = SETTLE_S,
                 max_delay_s: float = MAX_DELAY_S, spawn: Spawn = start_thread) -> None:
        self.model, self.observer = model, observer
        self.settle_s, self.max_delay_s = settle_s, max_delay_s
        self._queue: queue.SimpleQueue[tuple[str, RequestError] | None] = queue.SimpleQueue()
        self._thread = spawn("refusal-record", self._loop)

    def close(self, deadline_s: float) -> None:
        """Record what is queued, then stop the thread (waited for until ``deadline_s``,
        ``time.monotonic()``); later refusals are not recorded."""
        self._queue.put(None)
        self._thread.join(max(0.0, deadline_s - time.monotonic()))

    def add(self, request_id: str, exc: RequestError) -> None:
        """A refusal whose error has been sent: count and log it soon."""
        self._queue.put((request_id, exc))

    def record(self, request_id: str, exc: RequestError) -> None:
        """Count and log one refusal now (a refusal off the busy path, e.g. invalid input)."""
        self._record([(request_id, exc)])

    def _record(self, items: list[tuple[str, RequestError]]) -> None:
        reasons = [rejection_reason(exc) for _, exc in items]
        for reason, n in collections.Counter(reasons).items():
            self.observer.rejected(reason, n)
        for (request_id, exc), reason in zip(items, reasons, strict=True):
            log_event("request_rejected", level="warning", model=self.model, request_id=request_id,
                      reason=reason, status=exc.kind, message=str(exc))

    def _loop(self) -> None:
        closing = False
        while not closing and (first := self._queue.get()) is not None:
            items = [first]
            deadline = time.monotonic() + self.max_delay_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=min(self.settle_s, left))
                except queue.Empty:
                    break  # the burst has settled
                if item is None:
                    closing = True
                    break
                items.append(item)
            try:
                self._record(items)
            except Exception:  # a failing metric or log call must not stop the recorder
                log.exception("refusal recorder")


def unloading_error() -> RequestError:
    """The error of a request that the entry model's unloading ends (UNAVAILABLE: retry on
    another server)."""
    return RequestError("server unavailable: the model is unloading", ErrorKind.UNAVAILABLE)


class EntryService:
    """One per entry-model instance: admission, the stream lifecycle, metrics and logs.

    ``model``: the Triton model name (for logs and metrics); ``stages``: the pipeline's stages;
    ``observer``: the metrics; ``offline``: serve ``chattts_offline`` (whole utterances, at most
    ``entry.offline_threads`` at once, ``entry.offline_emit_tokens`` per engine batch) instead
    of streams (at most ``entry.max_concurrent_streams``, ``stream.emit_tokens`` per batch,
    client cancels polled by a :class:`CancelWatcher`). ``gated``: the requests come through
    the admission gate, which decides admission; this model's slots are then a safety limit
    (:func:`~chattts_serving.serving.admission.entry_slots`). ``spawn`` starts the service's threads
    (``refusal-record``, ``cancel-watch``, ``unload-cancels``, ``degrade-tick``): in a stub, the
    :class:`~chattts_serving.serving.entry_runtime.EntryRuntime`'s, which joins them.
    """

    def __init__(self, model: str, profile: Profile, stages: Stages, observer: EntryObserver,
                 offline: bool = False, gated: bool = False,
                 on_stall: Callable[[str], None] | None = None, spawn: Spawn = start_thread) -> None:
        self.model, self.profile, self.stages, self.observer = model, profile, stages, observer
        self.on_stall = on_stall
        entry = profile.entry
        self.emit_tokens = entry.offline_emit_tokens if offline else profile.stream.emit_tokens
        # The queueing signal of the degraded mode: streams still waiting for their first audio
        # (an offline request has none until it ends, so its door has no such signal).
        slots = entry_slots(profile, offline, gated)
        self.admission = (Admission(profile, slots, OFFLINE_BUSY_DETAIL, on_degrade_switch=self._on_switch)
                          if offline else
                          Admission(profile, slots, on_degrade_switch=self._on_switch, queued=lambda: self._waiting))
        # Offline requests are watched for stalls only (their clients' cancels are not polled).
        self.watcher = CancelWatcher(entry.cancel_poll_interval_s, entry.stall_timeout_s, self._stalled,
                                     entry.cancel_polls_per_s, spawn=spawn)
        self.refusals = RefusalRecorder(model, observer, spawn=spawn)
        self._waiting = 0
        self._lock = threading.Lock()
        # Re-evaluate the degraded mode once a second too, not only on arrivals: a server
        # whose load has gone must leave it without waiting for new requests.
        self._closed = threading.Event()
        self._ticker = spawn("degrade-tick", self._tick)

    # ---- admission -------------------------------------------------------------------------
    def reserve(self) -> SlotToken | RequestError:
        """Take a slot for a request that has just arrived, before reading anything of it: its
        token, or the BUSY error to send at once (then :meth:`refused`)."""
        return self.admission.reserve()

    def admit(self, inputs: Mapping[str, np.ndarray], params: Mapping[str, object], request_id: str,
              arrival_s: float | None = None, slot: SlotToken | None = None) -> SynthesisJob:
        """Validate and admit one request that holds ``slot`` (from :meth:`reserve`; None: take
        one now). The job holds the slot until :meth:`finish`. Raises RequestError, already
        counted and logged (the slot given back)."""
        arrival = time.monotonic() if arrival_s is None else arrival_s
        try:
            if slot is None:
                taken = self.reserve()
                if isinstance(taken, RequestError):
                    raise taken
                slot = taken
            job = self.admission.admit(inputs, params, request_id, arrival, self.emit_tokens, slot)
        except RequestError as exc:
            self.rejected(request_id, exc)
            raise
        self._count_waiting(+1)
        self.observer.set_active(self.admission.slots.live)
        if job.degraded and not job.req.validate_only:
            self.observer.degraded_request()
        log_event("request_accepted", model=self.model, request_id=request_id, priority=job.req.priority,
                  degraded=job.degraded, text_chars=len(job.req.text), vocoder=job.req.vocoder)
        return job

    def rejected(self, request_id: str, exc: RequestError) -> None:
        """Count and log a request refused before any work, now (the admission path)."""
        self.refusals.record(request_id, exc)

    def refused(self, request_id: str, exc: RequestError) -> None:
        """A :meth:`reserve` refusal whose error has been sent: counted and logged by the
        :class:`RefusalRecorder` once the burst it belongs to has settled."""
        self.refusals.add(request_id, exc)

    # ---- streaming ---------------------------------------------------------------------------
    def stream(self, job: SynthesisJob, channel: ResponseChannel) -> None:
        """Run one admitted streaming request to its end on ``channel``: audio chunks (the first
        with the ``info`` header), then the final response with the final ``info``, or one
        error. Never raises; records the outcome exactly once."""
        guard = StreamGuard(channel)
        unguard = self.watcher.guard(guard, job)
        out = _GuardedOutput(self, job, guard, self.watcher.watcher(guard.is_cancelled))
        result: StreamResult | None = None
        error: RequestError | None = None
        try:
            result = stream_audio(job, self.stages, out)
        except RequestError as exc:
            error = exc
        except Exception as exc:  # never leave a client waiting: end every stream explicitly
            log.exception("stream failed")
            error = RequestError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL)
        finally:
            unguard()
        drop_tracebacks(error)  # free the stream's engine call here, not in the cyclic GC
        if error is not None:
            closed = guard.fail(error)
        else:
            assert result is not None
            closed = guard.finish(info_json(job, result, final=True))
        if closed:
            self.finish(job, EntryOutcome(result=result or out.partial, error=error))

    def close(self, deadline_s: float) -> int:
        """The model unloads: end every live stream now with :func:`unloading_error` and tell
        the engine to end its sequences (a stream that starts later is ended as it starts;
        the streams' threads then finish on their own), record the refusals still queued, and
        stop this service's threads, each waited for until ``deadline_s``
        (``time.monotonic()``). Returns how many streams were live."""
        self._closed.set()
        live = self.watcher.close(self._unloaded, deadline_s)
        self.refusals.close(deadline_s)
        self._ticker.join(max(0.0, deadline_s - time.monotonic()))
        return live

    def _unloaded(self, guard: StreamGuard, job: SynthesisJob) -> None:
        self._end_guarded(guard, job, unloading_error())

    def _end_guarded(self, guard: StreamGuard, job: SynthesisJob, exc: RequestError) -> None:
        """End a stream from outside its thread (watchdog, unload) with ``exc``, recording its
        outcome unless the stream had already ended."""
        if guard.fail(exc):
            self.finish(job, EntryOutcome(result=None, error=exc))

    def _stalled(self, guard: StreamGuard, job: SynthesisJob) -> None:
        """The watchdog's verdict on a request without progress for ``entry.stall_timeout_s``
        (waiting for the engine), or twice that (in its own vocoder call): it ends with
        UNAVAILABLE, and ``on_stall(stage)`` is told (the Triton layer stops the server, so
        that it stops claiming readiness and is restarted: ``health.stop_on_stall``)."""
        stage = "vocoder" if guard.working else "GPT engine"
        self._end_guarded(guard, job, RequestError(f"server unavailable: the {stage} stopped responding",
                                                   ErrorKind.UNAVAILABLE))
        if self.on_stall is not None:
            self.on_stall(stage)

    # ---- offline ---------------------------------------------------------------------------------
    def offline(self, job: SynthesisJob, channel: ResponseChannel) -> None:
        """Run one admitted request to the end and answer it on ``channel`` in one response:
        the whole utterance (one ``send_audio``, (n,) float32 at 24 kHz, which an offline
        channel keeps) with the final ``info``, or one error. Watched for stalls like a stream
        (a stuck engine ends it with UNAVAILABLE). Never raises; records the outcome exactly
        once."""
        guard = StreamGuard(channel)
        unguard = self.watcher.guard(guard, job)
        result: StreamResult | None = None
        error: RequestError | None = None
        audio = np.zeros(0, np.float32)
        try:
            audio, result = offline_audio(job, self.stages, guard.touch)
        except RequestError as exc:
            error = exc
        except Exception as exc:
            log.exception("offline request failed")
            error = RequestError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL)
        finally:
            unguard()
        drop_tracebacks(error)  # free the request's BLS objects here, not in the cyclic GC
        if error is not None:
            closed = guard.fail(error)
        else:
            assert result is not None
            guard.send_chunk(audio)
            closed = guard.finish(info_json(job, result, final=True))
        if closed:
            self.finish(job, EntryOutcome(result=result, error=error))

    # ---- bookkeeping -------------------------------------------------------------------------------
    def first_audio(self, job: SynthesisJob) -> None:
        """The request produced its first audio: it no longer counts as queued."""
        self._count_waiting(-1)

    def finish(self, job: SynthesisJob, outcome: EntryOutcome) -> None:
        """Record the end of an accepted request (exactly once): slot, metrics, log line."""
        result, error = outcome.result, outcome.error
        duration = time.monotonic() - job.arrival_s
        if result is None or result.first_audio_s is None:
            self.first_audio(job)
        if job.slot is not None:
            job.slot.release()
        self.observer.set_active(self.admission.slots.live)
        if error is not None and error.kind == ErrorKind.INVALID:
            status = "invalid"  # client input refused by a stage (e.g. nothing speakable): not a server error
            self.observer.rejected("invalid")
        elif error is None and job.req.validate_only:
            status = "validated"  # a check that generated nothing: not a synthesis in the request metrics
        else:
            status = "error" if error else ("cancelled" if result and result.cancelled else "ok")
        audio_s = (result.samples / contract.SAMPLE_RATE_HZ) if result else 0.0
        ttfa = result.first_audio_s if result else None
        if status != "validated":
            self.observer.finished(status, str(job.req.priority), duration, audio_s, ttfa)
        if result is not None and (load_ttfa := result.load_ttfa_s) is not None:
            self.admission.record_ttfa(load_ttfa)  # without the work the request asked for
        log_event("request_finished", level="error" if status == "error" else "info", model=self.model,
                  request_id=job.req.request_id, priority=job.req.priority, status=status,
                  duration_ms=round(duration * 1000, 1),
                  ttfa_ms=round(ttfa * 1000, 1) if ttfa is not None else None,
                  audio_s=round(audio_s, 3), chunks=result.chunks if result else 0,
                  tokens=result.tokens if result else 0, segments=result.segments if result else 0,
                  capped_segments=result.capped_segments if result else [],
                  dropped=result.dropped if result else [],
                  stop_reason=(result.stop_reason or "") if result else None,
                  error=str(error) if error else None, error_kind=error.kind if error else None)

    def _count_waiting(self, delta: int) -> None:
        with self._lock:
            self._waiting = max(0, self._waiting + delta)
            waiting = self._waiting
        self.observer.set_queue(waiting)

    def _on_switch(self, degraded: bool) -> None:
        self.observer.set_degraded(degraded)
        log_event("degraded_mode", level="warning", model=self.model, degraded=degraded,
                  live_streams=self.admission.slots.live,
                  queued=self._waiting, ttfa_p95_s=round(self.admission.degrader.ttfa_p95_s(), 3))

    def _tick(self) -> None:
        while not self._closed.wait(DEGRADE_TICK_S):
            try:
                self.admission.tick()
            except Exception:  # never let the ticker die
                log.exception("degrade tick")


class _GuardedOutput:
    """The :class:`~chattts_serving.serving.pipeline.StreamOutput` of one stream: chunks go
    through its :class:`StreamGuard`, the first one with the ``info`` header."""

    def __init__(self, service: EntryService, job: SynthesisJob, guard: StreamGuard,
                 watch: Callable[[Callable[[], None]], Callable[[], None]]) -> None:
        self.service, self.job, self.guard = service, job, guard
        self.watch = watch
        self.partial: StreamResult | None = None
        """The stream's result as of its last chunk (what an error leaves of it)."""
        self._segments = 0
        """Segments whose start was announced (``info.segment_starts``)."""

    def audio(self, chunk: np.ndarray, result: StreamResult) -> None:
        """Send ``chunk``; the first with the ``info`` header, the first of every later segment
        with ``{"segment_starts": [...]}`` (where each segment's audio began, so far)."""
        self.partial = result
        header = None
        if not result.chunks:
            self.service.first_audio(self.job)
            header = info_json(self.job, result, final=False)
        elif len(result.segment_starts) > self._segments:
            header = json.dumps({"segment_starts": result.segment_starts})
        self._segments = len(result.segment_starts)
        self.guard.send_chunk(chunk, header)

    def cancelled(self) -> bool:
        """The client cancelled, or the stream was ended for it (stall verdict, unload): its
        thread stops generating what nobody will receive."""
        return self.guard.closed or self.guard.is_cancelled()

    def progress(self, working: bool) -> None:
        self.guard.touch(working)


