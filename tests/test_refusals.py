"""The refusal recorder: "busy" refusals are counted and logged after their errors were sent,
a burst with one metric update per reason (each update is a round trip to the server in
Triton), every refused request still counted and logged once. The real server's count of a
burst's refusals is checked in test_overload.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from chattts_serving.errors import ErrorKind, RequestError
from chattts_serving.serving.entry import RefusalRecorder
from chattts_serving.serving.logs import log_event


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
    def set_degraded(self, on: bool) -> None: ...


BUSY = RequestError("server busy: 4 streams already live", ErrorKind.BUSY)
INVALID = RequestError("temperature must be in (0, 2]", ErrorKind.INVALID, param="temperature")


def _wait_total(observer: CallObserver, n: int) -> None:
    end = time.monotonic() + 30
    while observer.total() < n and time.monotonic() < end:
        time.sleep(0.01)
    assert observer.total() == n, observer.calls


class EventLines(logging.Handler):
    """The ``request_rejected`` lines written to the event log (a JSON object each)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = json.loads(record.getMessage())
        if line.get("event") == "request_rejected":
            self.lines.append(line)


@pytest.fixture
def events() -> Iterator[EventLines]:
    log_event("test_start")  # the event logger is configured on first use
    handler = EventLines()
    logger = logging.getLogger("chattts_serving.events")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_burst_is_counted_with_one_update_per_reason_and_every_request_logged(events: EventLines) -> None:
    observer = CallObserver()
    # settle_s far above the gaps between adds in a loop: the whole burst is one update per reason
    recorder = RefusalRecorder("chattts", observer, settle_s=1.0, max_delay_s=10.0)
    for i in range(200):
        recorder.add(f"b{i}", INVALID if i % 50 == 0 else BUSY)
    _wait_total(observer, 200)
    assert sorted(observer.calls) == [("busy", 196), ("invalid", 4)]
    end = time.monotonic() + 30  # the lines follow the count
    while len(events.lines) < 200 and time.monotonic() < end:
        time.sleep(0.01)
    lines = events.lines
    assert sorted(str(line["request_id"]) for line in lines) == sorted(f"b{i}" for i in range(200))
    assert {(line["reason"], line["status"]) for line in lines} == {("busy", "busy"), ("invalid", "invalid")}
    assert all(line["model"] == "chattts" and line["level"] == "warning" for line in lines)


def test_a_refusal_stream_that_never_settles_is_still_counted_while_it_goes_on() -> None:
    """``max_delay_s`` bounds the wait: refusals arriving without a pause are counted in
    several updates, the first of them long before the last refusal arrives."""
    observer = CallObserver()
    recorder = RefusalRecorder("chattts", observer, settle_s=1.0, max_delay_s=0.02)
    n = 0
    while observer.total() == 0 or n < 50:  # keep refusing until the first update has come
        with observer.lock:
            observer.added = n + 1
        recorder.add(f"t{n}", BUSY)
        n += 1
        time.sleep(0.002)
        assert n < 100_000, "never counted"
    first_at = observer.added_at_call[0]
    _wait_total(observer, n)
    assert first_at < n  # counted while refusals were still arriving
    assert len(observer.calls) >= 2


def test_record_counts_and_logs_at_once_on_the_callers_thread(events: EventLines) -> None:
    observer = CallObserver()
    recorder = RefusalRecorder("chattts_offline", observer, settle_s=10.0, max_delay_s=10.0)
    recorder.record("x", INVALID)
    assert observer.calls == [("invalid", 1)]  # no wait: the admission path's refusals
    assert [(line["request_id"], line["model"], line["reason"], line["message"]) for line in events.lines] == [
        ("x", "chattts_offline", "invalid", "temperature must be in (0, 2]")]
