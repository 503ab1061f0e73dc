"""The entry models' shared service: admission, priorities, deadlines, degradation, metrics,
structured logs. ``model_repository/chattts*/1/model.py`` bind it to Triton.

A request's life: :meth:`EntryService.admit` parses and validates it (Triton tensors and
request parameters), applies the admission limit and load shedding, and returns an
:class:`Admitted`; the model runs :func:`~chattts_serving.pipeline.stream_audio` or
:func:`~chattts_serving.pipeline.offline_audio` with it; :meth:`EntryService.finish` records
the outcome. Every accepted request ends in exactly one ``finish``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from . import contract
from .chunking import ChunkSchedule
from .logs import log_event
from .metrics import EntryMetrics
from .pipeline import CANCELLED, INVALID, UNAVAILABLE, EntryRequest, RequestError, StreamResult, parse_entry
from .profile import Profile
from .resilience import Degrader, DegradeThresholds
from .triton_glue import BlsStages, StreamSlots, request_inputs


@dataclass
class Admitted:
    """An accepted request: what to run, with which schedule, since when."""

    req: EntryRequest
    schedule: ChunkSchedule
    arrival_s: float
    degraded: bool


class EntryService:
    """One per entry-model instance."""

    def __init__(self, pb: Any, model: str, profile: Profile) -> None:
        self.pb, self.model, self.profile = pb, model, profile
        self.metrics = EntryMetrics(pb, model)
        d = profile.degrade
        self.degrader = Degrader(DegradeThresholds(d.live_high, d.live_low, d.ttfa_p95_high_s, d.ttfa_p95_low_s,
                                                   d.window, d.min_dwell_s, d.max_age_s),
                                 on_switch=self._on_switch)
        # Re-evaluate once a second too, not only on arrivals: a server whose load has gone
        # must leave the degraded mode without waiting for new requests.
        threading.Thread(target=self._tick, name="degrade-tick", daemon=True).start()
        self.slots = StreamSlots(profile.entry.max_concurrent_streams)
        self.stages = BlsStages(pb, profile.entry.breaker_failures, profile.entry.breaker_cooldown_s)
        self.schedule = profile.stream.schedule()
        self._waiting = 0
        self._lock = threading.Lock()

    def _tick(self, interval_s: float = 1.0) -> None:
        while True:
            time.sleep(interval_s)
            try:
                self.degrader.update(self.slots.live)
            except Exception:  # never let the ticker die
                logging.getLogger("chattts_serving.entry").exception("degrade tick")

    def _on_switch(self, degraded: bool) -> None:
        self.metrics.set_gauge(self.metrics.degraded, 1.0 if degraded else 0.0)
        log_event("degraded_mode", level="warning", model=self.model, degraded=degraded,
                  live_streams=self.slots.live, ttfa_p95_s=round(self.degrader.ttfa_p95_s(), 3))

    def admit(self, request: Any) -> Admitted:
        """Validate and admit one request. Raises RequestError (already counted and logged)."""
        arrival = time.monotonic()
        request_id = request.request_id() or uuid.uuid4().hex
        try:
            try:
                params = json.loads(request.parameters() or "{}")
            except (ValueError, TypeError):
                params = {}
            inputs = request_inputs(self.pb, request, contract.ENTRY_INPUTS)
            req = parse_entry(inputs, self.profile.engine.max_new_tokens_cap, self.profile.stream.default_vocoder,
                              params, request_id, self.profile.frontend.max_text_chars)
            degraded = self.degrader.update(self.slots.live)
            if degraded and req.priority == "batch":
                raise RequestError("server busy: batch-priority requests are shed while the server is degraded",
                                   UNAVAILABLE)
            if not self.slots.acquire():
                raise RequestError(f"server busy: {self.slots.limit} streams already live", UNAVAILABLE)
        except RequestError as exc:
            reason = "busy" if exc.kind == UNAVAILABLE else "invalid" if exc.kind == INVALID else exc.kind
            self.metrics.rejected(reason)
            log_event("request_rejected", level="warning", model=self.model, request_id=request_id,
                      reason=reason, status=exc.kind, message=str(exc))
            raise
        schedule = self.schedule
        if degraded:
            deg = self.profile.degrade
            req = replace(req, vocoder="codes", refine=None,
                          params=replace(req.params, max_new_tokens=min(req.params.max_new_tokens,
                                                                        deg.max_new_tokens),
                                         min_new_tokens=min(req.params.min_new_tokens, deg.max_new_tokens)))
            schedule = replace(schedule, first_chunk_tokens=schedule.first_chunk_tokens * 2,
                               max_chunk_tokens=schedule.max_chunk_tokens * 2)
        with self._lock:
            self._waiting += 1
            self.metrics.set_gauge(self.metrics.queue, float(self._waiting))
        log_event("request_accepted", model=self.model, request_id=request_id, priority=req.priority,
                  degraded=degraded, text_chars=len(req.text), vocoder=req.vocoder)
        return Admitted(req, schedule, arrival, degraded)

    def first_audio(self, adm: Admitted) -> None:
        """The request produced its first audio: it no longer counts as queued."""
        with self._lock:
            self._waiting = max(0, self._waiting - 1)
            self.metrics.set_gauge(self.metrics.queue, float(self._waiting))

    def finish(self, adm: Admitted, result: StreamResult | None, error: RequestError | None) -> None:
        """Record the end of an accepted request (exactly once)."""
        duration = time.monotonic() - adm.arrival_s
        if result is None or result.first_audio_s is None:
            self.first_audio(adm)
        self.slots.release()
        if error is not None and error.kind == INVALID:
            status = "invalid"  # client input refused by a stage (e.g. nothing speakable): not a server error
            self.metrics.rejected("invalid")
        else:
            status = "error" if error else ("cancelled" if result and result.stop_reason == CANCELLED else "ok")
        audio_s = (result.samples / contract.SAMPLE_RATE_HZ) if result else 0.0
        ttfa = result.first_audio_s if result else None
        self.metrics.finished(status, adm.req.priority, duration, audio_s, ttfa)
        if ttfa is not None:
            self.degrader.record_ttfa(ttfa)
        log_event("request_finished", level="error" if status == "error" else "info", model=self.model,
                  request_id=adm.req.request_id, priority=adm.req.priority, status=status,
                  duration_ms=round(duration * 1000, 1),
                  ttfa_ms=round(ttfa * 1000, 1) if ttfa is not None else None,
                  audio_s=round(audio_s, 3), chunks=result.chunks if result else 0,
                  tokens=result.tokens if result else 0, segments=result.segments if result else 0,
                  capped_segments=result.capped_segments if result else [],
                  dropped=result.dropped if result else [],
                  stop_reason=result.stop_reason if result else None,
                  error=str(error) if error else None, error_kind=error.kind if error else None)
