"""Staying up under load and faults: a circuit breaker per stage and a degradation switch.

Both are plain objects driven by the entry models and unit-tested without a server.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ErrorKind, RequestError, StageDown

log = logging.getLogger(__name__)


class CircuitOpen(RuntimeError):
    """A stage failed repeatedly; calls fail fast until its cool-down ends."""


class CircuitBreaker:
    """Classic three-state breaker around one downstream stage.

    closed: calls pass; ``failure_threshold`` consecutive failures open it.
    open: calls raise :class:`CircuitOpen` at once for ``cooldown_s`` seconds.
    half-open: after the cool-down one trial call passes; success closes, failure re-opens.
    """

    def __init__(self, name: str, failure_threshold: int = 5, cooldown_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.trial_in_flight = False
        self.opened_total = 0
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.cooldown_s else "open"

    def before(self) -> BreakerCall:
        """Call before using the stage; every call so begun must end in exactly one of the
        returned object's ``success()``, ``failure()`` or ``release()``. Raises
        :class:`CircuitOpen` while open, and while half-open with its one trial in flight."""
        with self._lock:
            st = self._state()
            if st == "open" or (st == "half-open" and self.trial_in_flight):
                left = self.cooldown_s - (self.clock() - (self.opened_at or 0.0))
                raise CircuitOpen(f"{self.name} is failing; not accepting work for {max(left, 0.0):.1f} s more")
            trial = st == "half-open"
            if trial:
                self.trial_in_flight = True
        return BreakerCall(self, trial)

    def success(self) -> None:
        """The stage worked: close."""
        with self._lock:
            if self.opened_at is not None:
                log.info("circuit %s closed", self.name)
            self.failures, self.opened_at, self.trial_in_flight = 0, None, False

    def failure(self) -> None:
        """The stage failed: count it; open (again) at the threshold or after a failed trial."""
        with self._lock:
            self.failures += 1
            self.trial_in_flight = False
            if self.opened_at is not None or self.failures >= self.failure_threshold:
                if self.opened_at is None:
                    self.opened_total += 1
                    log.warning("circuit %s opened after %d failures", self.name, self.failures)
                self.opened_at = self.clock()

    def release(self, trial: bool) -> None:
        """A call ended without telling whether the stage works (the client cancelled, its
        deadline passed, its input was refused): nothing is counted, and if it was the
        half-open trial (``trial``) the next call becomes the trial."""
        if trial:
            with self._lock:
                self.trial_in_flight = False


class BreakerCall:
    """One call through a :class:`CircuitBreaker`: the first of :meth:`success`,
    :meth:`failure` and :meth:`release` counts, later ones do nothing, so every path of a call
    (normal end, error, cancel, abandoned iteration) can settle it safely."""

    def __init__(self, breaker: CircuitBreaker, trial: bool) -> None:
        self.breaker, self.trial = breaker, trial
        self.settled = False
        self._lock = threading.Lock()

    def _settle(self) -> bool:
        with self._lock:
            first, self.settled = not self.settled, True
            return first

    def success(self) -> None:
        if self._settle():
            self.breaker.success()

    def failure(self) -> None:
        if self._settle():
            self.breaker.failure()

    def release(self) -> None:
        if self._settle():
            self.breaker.release(self.trial)


@dataclass(frozen=True)
class DegradeThresholds:
    """When to degrade and when to recover, from signals that rise with load and not with what
    one request asked for.

    Degrade when any of: live streams >= ``live_high`` (occupancy); accepted requests still
    waiting for their first audio >= ``queued_high`` (queueing: they wait for an engine row or
    the vocoder); the p95 of recent *load* TTFAs >= ``ttfa_p95_high_s``. Recover when all of:
    live <= ``live_low``, queued <= ``queued_low``, that p95 <= ``ttfa_p95_low_s`` (hysteresis),
    at most every ``min_dwell_s``.

    A load TTFA is a request's time to first audio less the work it asked for before its audio
    could start (refine-text, ChatTTS' first-piece reference pass, encoding a reference
    recording: :attr:`~chattts_serving.serving.job.StreamResult.asked_work_s`), so that a
    request slow by design says nothing about the load. The p95 is taken over the last
    ``window`` requests recorded within ``max_age_s`` seconds (older samples no longer describe
    the load: an idle server recovers), and only once there are ``min_samples`` of them; it is
    the nearest-rank p95, so with ``min_samples`` >= 20 no single request decides it.
    """

    live_high: int = 48
    live_low: int = 24
    ttfa_p95_high_s: float = 2.0
    ttfa_p95_low_s: float = 1.0
    window: int = 50
    min_dwell_s: float = 5.0
    max_age_s: float = 60.0
    min_samples: int = 20
    queued_high: int = 16
    queued_low: int = 4


def nearest_rank(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``sorted_values`` (ascending, not
    empty): the smallest value with at least ``q`` of the values at or below it."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class Degrader:
    """Switches the service into a cheaper mode under load and back when load falls.

    In degraded mode the entry model uses the codes -> DVAE vocoder path, larger chunks, skips
    refine-text and sheds batch-priority requests (see the entry model); it never speaks less
    of a request's text than asked. Each switch is logged and counted; ``on_switch(degraded)``
    lets the caller publish it (metrics).
    """

    def __init__(self, thresholds: DegradeThresholds, on_switch: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.t = thresholds
        self.clock = clock
        self.on_switch = on_switch or (lambda _d: None)
        self.degraded = False
        self.switches = 0
        self._ttfa: deque[tuple[float, float]] = deque(maxlen=thresholds.window)  # (clock s, load TTFA s)
        self._last_switch = -1e18
        self._lock = threading.Lock()

    def record_ttfa(self, seconds: float) -> None:
        """Record one request's load TTFA (s): its time to first audio less the work it asked
        for (see :class:`DegradeThresholds`). A request that arrived before the last switch
        describes the load of the mode before it and is not counted: a burst's last requests,
        getting their first audio after the mode went off, would otherwise switch an idle
        server back on (and its next users onto the cheaper path) until their samples age out."""
        now = self.clock()
        seconds = max(0.0, seconds)
        with self._lock:
            if now - seconds < self._last_switch:
                return
            self._ttfa.append((now, seconds))

    def recent_ttfa_s(self) -> list[float]:
        """The load TTFA samples (s) recorded, oldest first (at most ``window``)."""
        with self._lock:
            return [t for _, t in self._ttfa]

    def ttfa_p95_s(self) -> float:
        """Nearest-rank p95 of the load TTFA samples (s) of the last ``window`` requests
        recorded within ``max_age_s``; 0 while fewer than ``min_samples``."""
        oldest = self.clock() - self.t.max_age_s
        with self._lock:
            data = sorted(t for at, t in self._ttfa if at >= oldest)
        if not data or len(data) < self.t.min_samples:
            return 0.0
        return nearest_rank(data, 0.95)

    def update(self, live: int, queued: int = 0) -> bool:
        """Re-evaluate with ``live`` streams in flight, ``queued`` of the accepted requests still
        without audio; returns the (possibly new) mode."""
        p95 = self.ttfa_p95_s()
        now = self.clock()
        t = self.t
        with self._lock:
            if now - self._last_switch < t.min_dwell_s:
                return self.degraded
            want = self.degraded
            if not self.degraded and (live >= t.live_high or queued >= t.queued_high or p95 >= t.ttfa_p95_high_s):
                want = True
            elif self.degraded and live <= t.live_low and queued <= t.queued_low and p95 <= t.ttfa_p95_low_s:
                want = False
            if want == self.degraded:
                return self.degraded
            self.degraded = want
            self.switches += 1
            self._last_switch = now
            if not want:
                self._ttfa.clear()
        log.warning("degraded mode %s (live streams %d, queued %d, load TTFA p95 %.3f s)", "on" if want else "off",
                    live, queued, p95)
        self.on_switch(want)
        return want


def enter(breaker: CircuitBreaker) -> BreakerCall:
    """Begin a call through ``breaker``. Raises :class:`~chattts_serving.errors.RequestError`
    (UNAVAILABLE, "server unavailable: <stage> is failing; ...") while it is open."""
    try:
        return breaker.before()
    except CircuitOpen as exc:
        raise RequestError(f"server unavailable: {exc}", ErrorKind.UNAVAILABLE) from None


def settle(call: BreakerCall, error: RequestError | None) -> None:
    """End ``call`` by how the stage answered: no error is a success, and so is a refusal of
    the request's input (INVALID: the stage works); INTERNAL and a stage that is down
    (:class:`~chattts_serving.errors.StageDown`) are failures; anything else (busy, deadline,
    cancel, another stage's unavailability) says nothing about the stage's health: released."""
    if error is None or error.kind == ErrorKind.INVALID:
        call.success()
    elif error.kind == ErrorKind.INTERNAL or isinstance(error, StageDown):
        call.failure()
    else:
        call.release()
