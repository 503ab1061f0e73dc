"""Circuit breaker, degradation switch, sentence segments and request parameters, without a server."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from chattts_serving.errors import Cancelled, DeadlineExceeded, ErrorKind, RequestError
from chattts_serving.serving.request import EntryLimits, parse_entry, refuse_request_params
from chattts_serving.serving.resilience import (
    CircuitBreaker,
    CircuitOpen,
    Degrader,
    DegradeThresholds,
    settle,
)
from chattts_serving.text.segments import SegmentRules, split_segments

LIMITS = EntryLimits(max_new_tokens_cap=1024)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_breaker_opens_after_consecutive_failures_and_recovers_after_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker("vocoder", failure_threshold=3, cooldown_s=10.0, clock=clock)
    for _ in range(2):
        b.before()
        b.failure()
    b.before()
    b.success()  # a success resets the count
    for _ in range(3):
        b.before()
        b.failure()
    assert b.state == "open"
    with pytest.raises(CircuitOpen, match="vocoder"):
        b.before()
    clock.t = 10.5
    assert b.state == "half-open"
    b.before()  # the one trial call
    with pytest.raises(CircuitOpen):
        b.before()  # others still fail fast while the trial runs
    b.failure()  # trial failed: open again for a full cool-down
    clock.t = 15.0
    with pytest.raises(CircuitOpen):
        b.before()
    clock.t = 21.0
    b.before()
    b.success()
    assert b.state == "closed" and b.opened_total == 1


def test_degrader_switches_on_load_and_back_with_hysteresis() -> None:
    clock = Clock()
    switches: list[bool] = []
    d = Degrader(DegradeThresholds(live_high=10, live_low=4, ttfa_p95_high_s=2.0, ttfa_p95_low_s=1.0,
                                   window=10, min_dwell_s=5.0), on_switch=switches.append, clock=clock)
    assert d.update(5) is False
    assert d.update(10) is True
    clock.t = 1.0
    assert d.update(0) is True  # dwell time not over
    clock.t = 6.0
    assert d.update(6) is True  # above the recover threshold
    assert d.update(4) is False
    clock.t = 20.0
    for _ in range(10):
        d.record_ttfa(3.0)
    assert d.update(0) is True  # slow first audio alone degrades
    assert switches == [True, False, True] and d.switches == 3
    clock.t = 60.0
    assert d.update(0) is True  # the slow samples still describe the last minute
    clock.t = 80.5
    assert d.ttfa_p95_s() == 0.0 and d.update(0) is False  # no new requests: the old samples age out
    assert switches == [True, False, True, False]


@pytest.mark.parametrize("text, expected", [
    ("你好。", ["你好。"]),
    ("第一句话比较长一些，对吧。第二句话也比较长一些，是的。第三句。", None),
    ("Hello there. How are you? Fine!", None),
    ("没有标点的一段很长的文字" * 30, None),
])
def test_segments_keep_every_character_in_order(text: str, expected: list[str] | None) -> None:
    segs = split_segments(text, SegmentRules(max_chars=40, merge_chars=10))
    assert "".join(segs) == text
    assert all(len(s) <= 40 for s in segs)
    if expected is not None:
        assert segs == expected


def test_short_sentences_are_merged_not_split_into_tiny_segments() -> None:
    assert len(split_segments("好。对。是。", SegmentRules(max_chars=120, merge_chars=30))) == 1


@pytest.mark.parametrize("inputs, error", [
    ({"priority": np.array([b"urgent"], np.object_)}, "priority"),
    ({"timeout_s": np.array([-1.0], np.float32)}, "timeout_s"),
    ({"timeout_s": np.array([np.inf], np.float32)}, "timeout_s"),
    ({"timeout_s": np.array([1.0], np.float64)}, "timeout_s"),
])
def test_bad_priority_or_timeout_is_refused(inputs: dict, error: str) -> None:
    with pytest.raises(RequestError, match=error):
        parse_entry({"text": np.array([b"hi"], np.object_), **inputs}, LIMITS)


def test_request_parameters_are_refused_but_triton_ones_pass() -> None:
    with pytest.raises(RequestError, match="unknown request parameter"):
        refuse_request_params({"priorty": "batch"})
    refuse_request_params({"triton_enable_empty_final_response": True})


def test_priority_and_timeout_are_parsed() -> None:
    req = parse_entry({"text": np.array([b"hi"], np.object_), "priority": np.array([b"batch"], np.object_),
                       "timeout_s": np.array([2.5], np.float32)}, LIMITS)
    assert (req.priority, req.timeout_s) == ("batch", 2.5)


def test_text_over_the_limit_is_refused_before_any_work() -> None:
    text = np.array(["好".encode() * 50], dtype=np.object_)
    with pytest.raises(RequestError, match="limit is 10"):
        parse_entry({"text": text}, EntryLimits(max_new_tokens_cap=1024, max_text_chars=10))


def _half_open(clock: Clock) -> CircuitBreaker:
    """A breaker opened by two failures at t=0 whose cool-down (10 s) has passed."""
    b = CircuitBreaker("engine", failure_threshold=2, cooldown_s=10.0, clock=clock)
    for _ in range(2):
        settle(b.before(), RequestError("engine step failed", ErrorKind.INTERNAL))
    assert b.state == "open"
    clock.t = 10.5
    assert b.state == "half-open"
    return b


@pytest.mark.parametrize("end", [DeadlineExceeded(2.0), Cancelled(), RequestError("server busy", ErrorKind.BUSY),
                                 RequestError("server unavailable", ErrorKind.UNAVAILABLE)],
                         ids=["deadline", "client-cancel", "busy", "unavailable"])
def test_a_trial_that_says_nothing_about_the_stage_lets_the_next_call_be_the_trial(end: RequestError) -> None:
    clock = Clock()
    b = _half_open(clock)
    trial = b.before()
    assert trial.trial and b.trial_in_flight
    with pytest.raises(CircuitOpen):
        b.before()  # one trial at a time
    settle(trial, end)
    assert not b.trial_in_flight and b.state == "half-open"  # released: nothing learnt, still half-open
    again = b.before()  # let through, as the new trial, not refused as "trial in flight"
    assert again.trial
    settle(again, None)
    assert b.state == "closed" and b.failures == 0
    b.before().success()  # healthy traffic flows


def test_a_trial_refused_for_its_input_closes_the_breaker() -> None:
    clock = Clock()
    b = _half_open(clock)
    settle(b.before(), RequestError("text is empty", param="text"))  # INVALID: the stage answered
    assert b.state == "closed" and not b.trial_in_flight
    b.before()
    b.before()  # closed: every call passes, no trial


def test_a_failed_trial_reopens_and_the_next_cooldown_gives_a_new_trial() -> None:
    clock = Clock()
    b = _half_open(clock)
    settle(b.before(), RequestError("engine step failed", ErrorKind.INTERNAL))
    assert b.state == "open" and not b.trial_in_flight
    clock.t = 21.0
    assert b.before().trial


@pytest.mark.parametrize("first", ["success", "failure", "release"])
def test_a_breaker_call_settles_exactly_once(first: str) -> None:
    clock = Clock()
    b = _half_open(clock)
    call = b.before()
    getattr(call, first)()
    assert call.settled
    state = (b.state, b.failures, b.trial_in_flight, b.opened_at, b.opened_total)
    for later in ("success", "failure", "release", "success", "failure"):
        getattr(call, later)()  # every other path of the call (finally blocks, error handlers) is a no-op
        assert (b.state, b.failures, b.trial_in_flight, b.opened_at, b.opened_total) == state
    settle(call, RequestError("engine step failed", ErrorKind.INTERNAL))
    assert (b.state, b.failures, b.trial_in_flight, b.opened_at, b.opened_total) == state


def test_a_breaker_call_settles_once_across_threads() -> None:
    b = CircuitBreaker("engine", failure_threshold=1000, cooldown_s=10.0)
    call = b.before()
    barrier = threading.Barrier(8)

    def fail() -> None:
        barrier.wait()
        call.failure()

    workers = [threading.Thread(target=fail) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert b.failures == 1
