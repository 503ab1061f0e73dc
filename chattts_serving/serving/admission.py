"""Admission, free of Triton: which requests each door accepts, and how.

One decision per door (docs/operations.md, "Admission: one decision per door"): the admission
gate's ``max_live`` for ``chattts`` and ``chattts_offline`` when the gate is on
(``chattts_serving/gate/gate.cc``; its limit and busy text are :func:`door_limit` and
:func:`busy_error`), :meth:`Admission.reserve` when it is off, and :class:`EnsembleDoor` for
``chattts_ensemble``. Behind a gate the Python entry model's slots are a safety limit
(:data:`BEHIND_GATE_FACTOR`), never the door's decision.

Busy is decided first and alone: :meth:`Admission.reserve` takes one of the instance's slots
(:func:`entry_slots`) or answers "server busy" without reading the request at all, so that
under overload a refusal costs a counter check.
Only a request that holds a slot is then parsed (:func:`~chattts_serving.serving.request.parse_entry`)
by :meth:`Admission.admit`, which re-evaluates the degraded mode, sheds batch-priority requests
while degraded (refused "busy": retryable) and, in degraded mode, makes the request cheaper
without ever shortening it (another vocoder path, larger chunks, no refine-text; never fewer
tokens than it asked for). Every accepted request holds its slot (a
:class:`~chattts_serving.serving.slots.SlotToken`, released exactly once) until it ends; a
refused one gives it back at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final

import numpy as np

from .. import contract
from ..contract import Priority, VocoderPath
from ..errors import ErrorKind, RequestError
from ..text.segments import SegmentRules
from .job import SynthesisJob
from .logs import log_event
from .profile import Profile
from .request import EntryLimits, parse_entry
from .resilience import Degrader
from .slots import SlotToken, StreamSlots

__all__ = ["BEHIND_GATE_FACTOR", "Admission", "EnsembleDoor", "RefusalsFirst", "SlotToken", "StreamSlots",
           "busy_error", "door_limit", "entry_slots", "rejection_reason"]


class RefusalsFirst:
    """Accepted requests start their work after the refusals of their burst have been sent.

    In a burst Triton hands the entry model one request per ``execute``; the accepted ones go
    to worker threads whose admission work (parsing, validation, the front end's BLS call)
    holds the GIL while the refusal threads wait for it to send "busy", so refusals came out
    behind the admissions (issue: "send the error before admitting the rest of a batch").
    ``execute`` reports each arrival (:meth:`arrived`) and each sent refusal (:meth:`sent`);
    the one thread that hands accepted requests to the workers first calls :meth:`wait` for
    each, which returns once no refusal waits to be sent and no
    request has arrived for ``settle_s`` seconds, or ``max_wait_s`` after its own arrival,
    whichever comes first. A request alone waits ``settle_s`` (profile ``[entry]
    admission_settle_s``; a few ms of a TTFA of hundreds); while requests keep arriving less
    than ``settle_s`` apart (clients retrying "busy" at once, say), or refusals keep waiting,
    each accepted one waits the whole ``max_wait_s``. Figures in docs/performance.md ("Where the busy
    time goes").
    """

    def __init__(self, settle_s: float, max_wait_s: float) -> None:
        self.settle_s, self.max_wait_s = settle_s, max_wait_s
        self._cond = threading.Condition()
        self._last_arrival_s = float("-inf")
        self._pending = 0
        self._closed = False

    def close(self) -> None:
        """The model unloads: every :meth:`wait`, now and later, returns at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def arrived(self, refused: bool, now_s: float) -> None:
        """A request arrived at ``now_s`` (``time.monotonic()``); ``refused``: its "busy" is
        to be sent (then :meth:`sent`)."""
        with self._cond:
            self._last_arrival_s = max(self._last_arrival_s, now_s)
            if refused:
                self._pending += 1

    def sent(self) -> None:
        """A refusal reported by :meth:`arrived` has been sent (or failed to be)."""
        with self._cond:
            self._pending -= 1
            if self._pending <= 0:
                self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Refusals reported and not sent yet."""
        with self._cond:
            return self._pending

    def wait(self, arrival_s: float) -> float:
        """Block until the refusals have gone out and arrivals have settled, or until
        ``arrival_s + max_wait_s``; returns the seconds waited."""
        start = time.monotonic()
        deadline = arrival_s + self.max_wait_s
        with self._cond:
            while not self._closed and (now := time.monotonic()) < deadline:
                quiet_in = self._last_arrival_s + self.settle_s - now
                if self._pending <= 0 and quiet_in <= 0:
                    break
                self._cond.wait(min(deadline - now, quiet_in) if self._pending <= 0 else deadline - now)
        return time.monotonic() - start


DEGRADED_GROWTH: Final = 2.0
"""Chunk growth in degraded mode, each chunk over the one before: fewer, larger windows (less
vocoder context per token) when the server is overloaded, gapless or not."""

STREAMS_BUSY_DETAIL: Final = ("stream", "already live")
"""What a streaming door's busy error says its ``limit`` counts: (noun, state)."""

OFFLINE_BUSY_DETAIL: Final = ("request", "already running")
"""What ``chattts_offline``'s busy error says its ``limit`` counts: (noun, state)."""


def busy_error(limit: int, detail: tuple[str, str] = STREAMS_BUSY_DETAIL) -> RequestError:
    """The "server busy" refusal of an entry model that already runs ``limit`` requests, e.g.
    "server busy: 1 stream already live" (the admission gate sends the same text, rendered into
    its config)."""
    noun, state = detail
    return RequestError(f"server busy: {limit} {noun}{'' if limit == 1 else 's'} {state}",
                        ErrorKind.BUSY)


def door_limit(profile: Profile, offline: bool) -> int:
    """The admission limit of an entry door: ``entry.max_concurrent_streams`` live streams for
    ``chattts``, ``entry.offline_threads`` running requests for ``chattts_offline``."""
    return profile.entry.offline_threads if offline else profile.entry.max_concurrent_streams


BEHIND_GATE_FACTOR: Final = 2
"""Behind an admission gate, the Python entry model's slots are this many times the gate's: a
safety limit on its worker threads, not an admission decision. The gate frees a request's slot
at its final response, a moment before the Python model frees its own, so with as many slots
as the gate a request the gate admitted could be refused here; with twice as many only a gate
that stopped counting would reach the limit."""


def entry_slots(profile: Profile, offline: bool, gated: bool) -> int:
    """The slots of an entry-model instance: its door's limit (:func:`door_limit`, the door's
    admission decision) without a gate; :data:`BEHIND_GATE_FACTOR` times it behind one."""
    return door_limit(profile, offline) * (BEHIND_GATE_FACTOR if gated else 1)


def rejection_reason(exc: RequestError) -> str:
    """The ``tts_rejected_total`` reason of a refusal: 'busy' for BUSY and UNAVAILABLE,
    'invalid' for INVALID, else the kind."""
    if exc.kind in (ErrorKind.BUSY, ErrorKind.UNAVAILABLE):
        return "busy"
    return str(exc.kind)


class EnsembleDoor:
    """The admission decision of the ensemble door (``chattts_ensemble``): at most ``limit``
    (``ensemble.max_concurrent_streams``) live streams, taken where a stream starts (the GPT
    engine's ensemble mode) and given back when it ends, whichever way. Nothing else in the
    ensemble refuses "busy"."""

    def __init__(self, limit: int) -> None:
        self.slots = StreamSlots(limit)

    def admit(self, request_id: str) -> SlotToken:
        """A slot for the stream of ``request_id``; raises the BUSY error (logged as a
        rejection of ``chattts_ensemble``) when every slot is taken."""
        token = self.slots.acquire()
        if token is not None:
            return token
        exc = busy_error(self.slots.limit)
        log_event("request_rejected", level="warning", model=contract.MODEL_ENSEMBLE, request_id=request_id,
                  reason=rejection_reason(exc), status=exc.kind, message=str(exc))
        raise exc


class Admission:
    """The admission decisions of one entry-model instance (see the module docstring):
    ``limit`` requests at once (:func:`entry_slots`: the door's decision without a gate, a
    safety limit behind one); ``busy_detail`` (noun, state) completes the refusal "server busy:
    <limit> <noun(s)> <state>"."""

    def __init__(self, profile: Profile, limit: int,
                 busy_detail: tuple[str, str] = STREAMS_BUSY_DETAIL,
                 on_degrade_switch: Callable[[bool], None] | None = None,
                 queued: Callable[[], int] = lambda: 0) -> None:
        self.profile = profile
        self.busy_detail = busy_detail
        self.queued = queued
        """Accepted requests still waiting for their first audio (the degraded mode's queueing signal)."""
        self.degrader = Degrader(profile.degrade.thresholds(), on_switch=on_degrade_switch)
        self.slots = StreamSlots(limit)
        self.limits = EntryLimits(max_new_tokens_cap=profile.engine.max_new_tokens_cap,
                                  max_text_chars=profile.frontend.max_text_chars,
                                  default_vocoder=profile.stream.default_vocoder,
                                  default_segmentation=profile.frontend.segmentation,
                                  reference=profile.reference.limits())
        self.schedule = profile.stream.schedule()
        self.segments = SegmentRules(max_chars=profile.frontend.max_segment_chars,
                                     merge_chars=profile.frontend.merge_segment_chars)

    def reserve(self) -> SlotToken | RequestError:
        """Take a slot for a request that has just arrived, before reading it: its token, or
        the BUSY error to answer at once."""
        token = self.slots.acquire()
        return token if token is not None else busy_error(self.slots.limit, self.busy_detail)

    def admit(self, inputs: Mapping[str, np.ndarray], params: Mapping[str, object], request_id: str,
              arrival_s: float, emit_tokens: int, slot: SlotToken) -> SynthesisJob:
        """Parse, validate and admit one request that holds ``slot`` (:meth:`reserve`) and
        arrived at ``arrival_s`` (``time.monotonic()``); ``emit_tokens``: tokens per engine
        batch for this entry model. The job holds the slot. Raises RequestError (INVALID for bad
        input, BUSY when shed in degraded mode), the slot then given back."""
        try:
            req = parse_entry(inputs, self.limits, params, request_id)
            degraded = self.degrader.update(self.slots.live - 1, self.queued())
            if degraded and req.priority == Priority.BATCH:
                raise RequestError("server busy: the server is overloaded and sheds batch-priority requests until "
                                   "the load falls; retry later", ErrorKind.BUSY)
        except RequestError:
            slot.release()
            raise
        schedule = self.schedule
        if degraded:  # how the audio is made changes; how much of the text is spoken never does
            # cost first: chunk_scale x larger doubling chunks, none cut smaller to stay gapless
            scale = self.profile.degrade.chunk_scale
            req = replace(req, vocoder=VocoderPath.CODES, refine=None)
            schedule = replace(schedule, first_chunk_tokens=schedule.first_chunk_tokens * scale,
                               max_chunk_tokens=schedule.max_chunk_tokens * scale, rate_planned=False,
                               growth=max(schedule.growth, DEGRADED_GROWTH), growth_basis="chunk")
        return SynthesisJob(req=req, schedule=schedule, emit_tokens=emit_tokens, arrival_s=arrival_s,
                            segments=self.segments, degraded=degraded, slot=slot)

    def record_ttfa(self, seconds: float) -> None:
        """A request's load TTFA (its time to first audio less the work it asked for), for the
        degraded mode's TTFA criterion."""
        self.degrader.record_ttfa(seconds)

    def tick(self) -> None:
        """Re-evaluate the degraded mode without a new request (an idle server recovers)."""
        self.degrader.update(self.slots.live, self.queued())
