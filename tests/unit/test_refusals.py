"""The refusal path's two helpers. The recorder: "busy" refusals are counted and logged after
their errors were sent, a burst with one metric update per reason (each update is a round trip
to the server in Triton), every refused request still counted and logged once. Refusals
first: an accepted request's work starts once its burst's refusals are sent and arrivals have
settled, or at the latest ``max_wait_s`` after its arrival. The real server's count of a
burst's refusals, and their order before the accepted streams' ends, are checked in
test_overload.py. One decision per door: the ensemble door's slots, and an entry model's
slots behind a gate as a safety limit of twice the door's."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from chattts_serving import contract
from chattts_serving.errors import ErrorKind, RequestError
from chattts_serving.serving.admission import (
    BEHIND_GATE_FACTOR,
    EnsembleDoor,
    RefusalsFirst,
    busy_error,
    door_limit,
    entry_slots,
)
from chattts_serving.serving.entry import RefusalRecorder
from chattts_serving.serving.logs import log_event
from chattts_serving.serving.profile import load_profile
from tests.support.servers import wait_until


class CallObserver:
    """Keeps every ``rejected(reason, count)`` call, and when it came (after how many adds)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.added_at_call: list[int] = []
        self.added = 0
        self.lock = threading.Lock()

    def rejected(self, reason: str, count: int = 1) -> None:
        with self.lock:
            self.calls.append((reason, count))
            self.added_at_call.append(self.added)

    def total(self, reason: str | None = None) -> int:
        with self.lock:
            return sum(n for r, n in self.calls if reason is None or r == reason)

    def finished(self, *args: object) -> None: ...
    def set_queue(self, waiting: int) -> None: ...
    def set_active(self, active: int) -> None: ...
    def set_degraded(self, on: bool) -> None: ...
    def degraded_request(self) -> None: ...


BUSY = RequestError("server busy: 4 streams already live", ErrorKind.BUSY)
INVALID = RequestError("temperature must be in (0, 2]", ErrorKind.INVALID, param="temperature")


def _wait_total(observer: CallObserver, n: int) -> None:
    wait_until(lambda: observer.total() >= n, 30)
    assert observer.total() == n, observer.calls


class EventLines(logging.Handler):
    """The ``request_rejected`` lines of one model written to the event log (a JSON object each)."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model  # each test's recorder has a model name of its own
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = json.loads(record.getMessage())
        if line.get("event") == "request_rejected" and line.get("model") == self.model:
            self.lines.append(line)


@pytest.fixture
def events(request: pytest.FixtureRequest) -> Iterator[EventLines]:
    log_event("test_start")  # the event logger is configured on first use
    handler = EventLines(request.node.name)
    logger = logging.getLogger("chattts_serving.events")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_burst_is_counted_with_one_update_per_reason_and_every_request_logged(events: EventLines) -> None:
    observer = CallObserver()
    # settle_s far above the gaps between adds in a loop: the whole burst is one update per reason
    recorder = RefusalRecorder(events.model, observer, settle_s=1.0, max_delay_s=10.0)
    for i in range(200):
        recorder.add(f"b{i}", INVALID if i % 50 == 0 else BUSY)
    _wait_total(observer, 200)
    assert sorted(observer.calls) == [("busy", 196), ("invalid", 4)]
    wait_until(lambda: len(events.lines) >= 200, 30)  # the lines follow the count
    lines = events.lines
    assert sorted(str(line["request_id"]) for line in lines) == sorted(f"b{i}" for i in range(200))
    assert {(line["reason"], line["status"]) for line in lines} == {("busy", "busy"), ("invalid", "invalid")}
    assert all(line["level"] == "warning" for line in lines)


def test_a_refusal_stream_that_never_settles_is_still_counted_while_it_goes_on() -> None:
    """``max_delay_s`` bounds the wait: refusals arriving without a pause (for 25 times
    ``max_delay_s``) are counted in several updates, the first before the last refusal."""
    observer = CallObserver()
    recorder = RefusalRecorder("chattts", observer, settle_s=1.0, max_delay_s=0.02)
    n = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        recorder.add(f"t{n}", BUSY)
        n += 1
        time.sleep(0.002)
    _wait_total(observer, n)
    assert len(observer.calls) >= 2 and observer.calls[0][1] < n, observer.calls


def test_record_counts_and_logs_at_once_on_the_callers_thread(events: EventLines) -> None:
    observer = CallObserver()
    recorder = RefusalRecorder(events.model, observer, settle_s=10.0, max_delay_s=10.0)
    recorder.record("x", INVALID)
    assert observer.calls == [("invalid", 1)]  # no wait: the admission path's refusals
    assert [(line["request_id"], line["reason"], line["message"]) for line in events.lines] == [
        ("x", "invalid", "temperature must be in (0, 2]")]


def test_closing_the_recorder_records_what_is_queued_and_stops_its_thread() -> None:
    """The model unloads mid-burst: the queued refusals are counted at once (not after
    settle_s), and the recorder's thread has ended when close returns."""
    observer = CallObserver()
    recorder = RefusalRecorder("chattts", observer, settle_s=10.0, max_delay_s=10.0)
    for i in range(5):
        recorder.add(f"c{i}", BUSY)
    recorder.close(time.monotonic() + 5.0)
    assert observer.calls == [("busy", 5)]
    assert not recorder._thread.is_alive()


# --- refusals first: accepted work waits for the burst's refusals ----------------------------
def _waiter(gate: RefusalsFirst, arrival_s: float, log: list[str]) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        gate.wait(arrival_s)
        log.append("admitted")
        done.set()
    threading.Thread(target=run, daemon=True).start()
    return done


def test_an_accepted_request_waits_until_the_refusals_of_its_burst_are_sent() -> None:
    gate = RefusalsFirst(settle_s=0.0, max_wait_s=60.0)
    log: list[str] = []
    now = time.monotonic()
    gate.arrived(False, now)  # the accepted request
    for _ in range(3):
        gate.arrived(True, now)  # three refusals behind it
    done = _waiter(gate, now, log)
    assert not done.wait(0.2) and gate.pending == 3
    for _ in range(3):
        log.append("sent")
        gate.sent()
    assert done.wait(30) and log == ["sent", "sent", "sent", "admitted"] and gate.pending == 0


def test_the_wait_ends_at_max_wait_even_if_a_refusal_is_never_sent() -> None:
    gate = RefusalsFirst(settle_s=0.0, max_wait_s=0.05)
    gate.arrived(True, time.monotonic())
    assert _waiter(gate, time.monotonic(), []).wait(30)
    assert gate.pending == 1


def test_arrivals_still_coming_hold_the_accepted_work_until_they_settle() -> None:
    gate = RefusalsFirst(settle_s=1.0, max_wait_s=60.0)
    log: list[str] = []
    gate.arrived(False, time.monotonic())
    done = _waiter(gate, time.monotonic(), log)
    for _ in range(10):  # a burst still arriving, every 10 ms: far under settle_s apart
        gate.arrived(False, time.monotonic())
        log.append("arrival")
        time.sleep(0.01)
    assert done.wait(30) and log[-1] == "admitted" and log.count("arrival") == 10


def test_a_request_alone_is_not_held_once_settled() -> None:
    gate = RefusalsFirst(settle_s=0.0, max_wait_s=60.0)
    gate.arrived(False, time.monotonic())
    assert _waiter(gate, time.monotonic(), []).wait(30)  # no refusal pending, nothing arriving


def test_the_ensemble_door_refuses_busy_when_full_and_admits_again_once_a_stream_ends() -> None:
    events = EventLines(contract.MODEL_ENSEMBLE)
    log_event("test_start")
    logger = logging.getLogger("chattts_serving.events")
    logger.addHandler(events)
    try:
        door = EnsembleDoor(2)
        first, second = door.admit("e1"), door.admit("e2")
        with pytest.raises(RequestError) as refused:
            door.admit("e3")
        assert refused.value.kind == ErrorKind.BUSY and str(refused.value) == str(busy_error(2))
        assert str(refused.value) == "server busy: 2 streams already live"
        assert [line["request_id"] for line in events.lines] == ["e3"]
        assert first.release() and not first.release()  # a stream ends once
        third = door.admit("e4")
        assert door.slots.live == 2
        second.release()
        third.release()
        assert door.slots.live == 0
    finally:
        logger.removeHandler(events)


def test_behind_a_gate_an_entry_model_holds_twice_its_doors_slots_and_alone_exactly_them() -> None:
    profile = load_profile("cpu")
    for offline in (False, True):
        limit = door_limit(profile, offline)
        assert limit == (profile.entry.offline_threads if offline else profile.entry.max_concurrent_streams)
        assert entry_slots(profile, offline, gated=False) == limit
        assert entry_slots(profile, offline, gated=True) == BEHIND_GATE_FACTOR * limit == 2 * limit
