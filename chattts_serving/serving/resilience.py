"""Staying up under load and faults: a circuit breaker per stage and a degradation switch.

Both are plain objects driven by the entry models and unit-tested without a server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ErrorKind, RequestError

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
    """When to degrade and when to recover.

    Degrade when live streams >= ``live_high`` or the recent TTFA p95 >= ``ttfa_p95_high_s``;
    recover when live streams <= ``live_low`` and TTFA p95 <= ``ttfa_p95_low_s`` (hysteresis),
    judged over the last ``window`` requests that produced audio within ``max_age_s`` seconds
    (older samples no longer describe the load: an idle server recovers), at most every
    ``min_dwell_s``.
    """

    live_high: int = 48
    live_low: int = 24
    ttfa_p95_high_s: float = 2.0
    ttfa_p95_low_s: float = 1.0
    window: int = 50
    min_dwell_s: float = 5.0
    max_age_s: float = 60.0
    min_samples: int = 10
    """TTFA samples needed before the TTFA criterion counts (one cold request must not
    switch the service into degraded mode)."""


class Degrader:
    """Switches the service into a cheaper mode under load and back when load falls.

    In degraded mode the entry model uses the codes -> DVAE vocoder path, larger chunks, a
    lower cap on new tokens and sheds batch-priority requests (see the entry model). Each switch
    is logged and counted; ``on_switch(degraded)`` lets the caller publish it (metrics).
    """

    def __init__(self, thresholds: DegradeThresholds, on_switch: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.t = thresholds
        self.clock = clock
        self.on_switch = on_switch or (lambda _d: None)
        self.degraded = False
        self.switches = 0
        self._ttfa: deque[tuple[float, float]] = deque(maxlen=thresholds.window)  # (clock s, TTFA s)
        self._last_switch = -1e18
        self._lock = threading.Lock()

    def record_ttfa(self, seconds: float) -> None:
        """Record one request's time to first audio (s)."""
        now = self.clock()
        with self._lock:
            self._ttfa.append((now, seconds))

    def ttfa_p95_s(self) -> float:
        """p95 of the TTFA samples (s) of the last ``window`` requests recorded within
        ``max_age_s``; 0 while fewer than ``min_samples``."""
        oldest = self.clock() - self.t.max_age_s
        with self._lock:
            data = sorted(t for at, t in self._ttfa if at >= oldest)
        if len(data) < self.t.min_samples:
            return 0.0
        return data[min(len(data) - 1, int(0.95 * len(data)))]

    def update(self, live: int) -> bool:
        """Re-evaluate with ``live`` streams in flight; returns the (possibly new) mode."""
        p95 = self.ttfa_p95_s()
        now = self.clock()
        with self._lock:
            if now - self._last_switch < self.t.min_dwell_s:
                return self.degraded
            want = self.degraded
            if not self.degraded and (live >= self.t.live_high or p95 >= self.t.ttfa_p95_high_s):
                want = True
            elif self.degraded and live <= self.t.live_low and p95 <= self.t.ttfa_p95_low_s:
                want = False
            if want == self.degraded:
                return self.degraded
            self.degraded = want
            self.switches += 1
            self._last_switch = now
            if not want:
                self._ttfa.clear()
        log.warning("degraded mode %s (live streams %d, TTFA p95 %.3f s)", "on" if want else "off", live, p95)
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
    the request's input (INVALID: the stage works); INTERNAL is a failure; anything else (busy,
    deadline, cancel) says nothing about the stage's health: released."""
    if error is None or error.kind == ErrorKind.INVALID:
        call.success()
    elif error.kind == ErrorKind.INTERNAL:
        call.failure()
    else:
        call.release()
