"""Final responses only inside ``execute`` (chattts_serving/triton/compat/finals.py, the
workaround for Triton 2.51's Python-backend race between a final response and the start of an
``execute``) and the pings that bring one (chattts_serving/triton/compat/pings.py)."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.triton.compat.finals import DeferredFinals, DeferredFinalSender
from chattts_serving.triton.compat.hooks import ModelHooks
from chattts_serving.triton.compat.pings import answer_ping, is_ping, ping_inputs
from tests.support.fake_triton import FINAL, FakePb, Request, Sender


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A pb response sender that records, for every send, whether execute was running."""

    def __init__(self, finals: DeferredFinals | None = None) -> None:
        self.finals = finals
        self.sent: list[tuple[Any, int, bool]] = []
        self.asked = 0

    def send(self, response: Any = None, flags: int = 0) -> None:
        inside = bool(self.finals is not None and self.finals._executing)
        self.sent.append((response, flags, inside))

    def is_cancelled(self) -> bool:
        self.asked += 1
        return False


def _never_ping() -> None:
    pass


def test_a_final_sent_outside_execute_waits_for_the_next_execute() -> None:
    finals = DeferredFinals(_never_ping, max_hold_s=3600)
    rec = Recorder(finals)
    sender = DeferredFinalSender(rec, finals, FINAL)
    sender.send("chunk")          # not final: at once
    sender.send("last", flags=FINAL)
    assert [(r, f) for r, f, _ in rec.sent] == [("chunk", 0)]
    assert finals.pending() == 1 and finals.deferred == 1
    with finals.executing():
        pass
    assert [(r, f, inside) for r, f, inside in rec.sent] == [("chunk", 0, False), ("last", FINAL, True)]
    assert finals.pending() == 0
    finals.close()


def test_a_final_sent_while_execute_runs_goes_out_at_once_and_execute_waits_for_it() -> None:
    finals = DeferredFinals(_never_ping, max_hold_s=3600)
    started, release = threading.Event(), threading.Event()

    class Slow(Recorder):
        def send(self, response: Any = None, flags: int = 0) -> None:
            started.set()
            release.wait(10)
            self.sent.append((response, flags, not exited.is_set()))  # sent before execute returned

    rec = Slow(finals)
    sender = DeferredFinalSender(rec, finals, FINAL)
    exited = threading.Event()

    def run_execute() -> None:
        with finals.executing():
            t = threading.Thread(target=sender.send, args=(None, FINAL))
            t.start()
            assert started.wait(10)
        exited.set()

    ex = threading.Thread(target=run_execute)
    ex.start()
    assert started.wait(10)
    assert not exited.wait(0.05), "execute returned while a final it let through was still being sent"
    release.set()
    ex.join(10)
    assert exited.is_set()
    assert rec.sent == [(None, FINAL, True)]
    finals.close()


def test_queued_finals_ping_for_an_execute() -> None:
    pings: list[int] = []
    box: dict[str, DeferredFinals] = {}

    def ping() -> None:  # what the model's ping does: Triton runs execute, which sends the queued finals
        pings.append(1)
        with box["w"].executing():
            pass

    finals = DeferredFinals(ping, max_hold_s=3600)
    box["w"] = finals
    rec = Recorder(finals)
    DeferredFinalSender(rec, finals, FINAL).send("end", flags=FINAL)
    for _ in range(200):
        if rec.sent:
            break
        threading.Event().wait(0.01)
    assert rec.sent == [("end", FINAL, True)] and pings
    finals.close()


def test_a_final_held_past_max_hold_because_pings_fail_is_sent_anyway() -> None:
    clock = Clock()
    calls: list[int] = []

    def failing_ping() -> None:
        calls.append(1)
        clock.now += 0.6  # each failed ping costs time
        raise RuntimeError("Server not ready")

    finals = DeferredFinals(failing_ping, max_hold_s=1.0, retry_s=0.001, clock=clock)
    rec = Recorder(finals)
    DeferredFinalSender(rec, finals, FINAL).send("end", flags=FINAL)
    for _ in range(500):
        if rec.sent:
            break
        threading.Event().wait(0.01)
    assert rec.sent == [("end", FINAL, False)], "a client must hear its stream end even when pings fail"
    assert finals.forced == 1 and len(calls) >= 2
    finals.close()


def test_close_sends_what_is_queued_and_then_sends_at_once() -> None:
    finals = DeferredFinals(_never_ping, max_hold_s=3600)
    rec = Recorder(finals)
    DeferredFinalSender(rec, finals, FINAL).send("a", flags=FINAL)
    finals.close()
    assert [r for r, _, _ in rec.sent] == ["a"]
    DeferredFinalSender(rec, finals, FINAL).send("b", flags=FINAL)
    assert [r for r, _, _ in rec.sent] == ["a", "b"]


def test_is_cancelled_is_not_asked_after_the_final_and_a_second_final_is_refused() -> None:
    finals = DeferredFinals(_never_ping, max_hold_s=3600)
    rec = Recorder(finals)
    sender = DeferredFinalSender(rec, finals, FINAL)
    assert sender.is_cancelled() is False and rec.asked == 1
    with finals.executing():
        sender.send(None, flags=FINAL)
    assert sender.is_cancelled() is False and rec.asked == 1
    with pytest.raises(RuntimeError, match="already sent"):
        sender.send(None, flags=FINAL)
    finals.close()


def test_ping_requests_are_recognised_by_their_parameter_only() -> None:
    pb = FakePb()
    assert is_ping(Request([], parameters={contract.PING_PARAMETER: True}))
    assert not is_ping(Request([], parameters={contract.PING_PARAMETER: "yes"}))
    assert not is_ping(Request([]))
    assert not is_ping(Request([], parameters={"other": 1}))
    tensors = {t.name(): t.as_numpy() for t in ping_inputs(pb, contract.ENTRY_INPUTS)}
    required = [s.name for s in contract.ENTRY_INPUTS if not s.optional]
    assert sorted(tensors) == sorted(required) and tensors[contract.IN_TEXT.name].tolist() == [b""]
    sender = Sender()
    answer_ping(pb, sender, decoupled=True)
    assert sender.sent == [(None, FINAL)]
    sender = Sender()
    answer_ping(pb, sender, decoupled=False)
    assert len(sender.sent) == 1 and sender.sent[0][1] == FINAL and sender.sent[0][0] is not None
    assert json.loads(Request([], parameters={contract.PING_PARAMETER: True}).parameters()) == {
        contract.PING_PARAMETER: True}
    assert isinstance(tensors[contract.IN_TEXT.name], np.ndarray)


def test_the_hooks_defer_finals_only_for_a_model_that_sends_from_its_threads_and_answer_pings() -> None:
    pb = FakePb()
    plain = ModelHooks(pb, "plain", True, None)
    own = Sender()
    assert plain.sender(Request([]), own) is own and plain.finals is None
    ping = Request([], parameters={contract.PING_PARAMETER: True})
    assert plain.answered(ping) and ping.sender.sent == [(None, FINAL)]
    assert not plain.answered(Request([]))
    plain.close()

    threaded = ModelHooks(pb, "threaded", True, contract.ENTRY_INPUTS)
    assert threaded.finals is not None
    wrapped = threaded.sender(Request([]), own)
    assert isinstance(wrapped, DeferredFinalSender)
    wrapped.send(None, flags=FINAL)  # outside execute: deferred
    assert own.sent == [] and threaded.finals.pending() == 1
    with threaded.executing():
        pass
    assert own.sent == [(None, FINAL)]
    assert threaded.answered(Request([], parameters={contract.PING_PARAMETER: True}))
    assert threaded.pinger.metrics is not None and threaded.pinger.metrics.pings.value == 1.0
    threaded.close()
    assert threaded.pinger.metrics is None
