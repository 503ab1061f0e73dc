"""Finished BLS response iterators are let go by a Python thread after a grace period
(:class:`chattts_serving.triton.compat.grave.IteratorGrave`), never dropped at once: Triton 2.51's
stub frees an iterator whose last Python reference is gone before its cleanup message was sent
on its own thread, without the GIL, and corrupts the interpreter's memory (seen as the entry
stub's segmentation faults under bursts of cancels).

The engine stream is driven here over a stand-in for ``triton_python_backend_utils`` that
records which response iterators it handed out; tests/server/test_overload.py covers the real stub.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np

from chattts_serving.contract import StopReason
from chattts_serving.engine.request import SequenceRequest
from chattts_serving.params import SamplingParams
from chattts_serving.serving.entry_runtime import SharedHelper
from chattts_serving.serving.resilience import CircuitBreaker, enter
from chattts_serving.triton.compat import grave as grave_module
from chattts_serving.triton.compat.grave import IteratorGrave
from chattts_serving.triton.stages import EngineStream
from tests.support.bls_fakes import FakeBlsPb
from tests.support.servers import wait_until


class _Held:
    """Something to hold (weak-referenceable)."""


def test_the_grave_holds_an_iterator_for_its_grace_then_its_thread_lets_go() -> None:
    grave = IteratorGrave(grace_s=3600.0)
    item = _Held()
    ref = weakref.ref(item)
    grave.keep(item)
    del item
    assert ref() is not None and grave.held() == 1
    assert grave.release_due() == 0 and ref() is not None  # within its grace: still held
    assert grave.release_due(now_s=float("inf")) == 1
    assert ref() is None, "the grave kept a reference after letting go"

    quick = IteratorGrave(grace_s=0.05).start()
    item = _Held()
    ref = weakref.ref(item)
    quick.keep(item)
    del item
    assert wait_until(lambda: ref() is None, 10.0), "the grave's thread never let go"
    assert quick.held() == 0










def test_an_engine_stream_hands_its_finished_iterator_to_the_grave(monkeypatch: Any) -> None:
    grave = IteratorGrave(grace_s=3600.0)
    held = SharedHelper("grave", lambda: grave, lambda g, deadline_s: None)
    held.acquire()
    monkeypatch.setattr(grave_module, "ITERATOR_GRAVE", held)
    pb = FakeBlsPb()
    call = SequenceRequest(input_ids=np.arange(4), spk_emb=np.zeros(8, np.float32), params=SamplingParams(),
                        emit_tokens=2)
    stream = EngineStream(pb, call, enter(CircuitBreaker("engine", 5, 10.0)), cancel_address="")
    batches = list(stream)
    assert [b.stop_reason for b in batches] == [None, None, StopReason.EOS] and stream.finished
    del stream, batches
    (ref,) = pb.iterators
    assert ref() is not None and grave.held() == 1, "the finished iterator was dropped at once"
    grave.release_due(now_s=float("inf"))
    assert ref() is None


def test_a_stopped_grave_lets_go_of_everything_and_its_thread_ends() -> None:
    grave = IteratorGrave(grace_s=3600.0).start()
    item = _Held()
    ref = weakref.ref(item)
    grave.keep(item)
    del item
    assert grave.stop(time.monotonic() + 5.0) == 1 and ref() is None
    assert grave._thread is not None and not grave._thread.is_alive()


def test_the_process_grave_is_started_by_its_first_user_and_stopped_by_its_last() -> None:
    made: list[IteratorGrave] = []

    def make() -> IteratorGrave:
        made.append(IteratorGrave().start())
        return made[-1]

    def stop(grave: IteratorGrave, deadline_s: float) -> None:
        grave.stop(deadline_s)
    helper = SharedHelper("grave", make, stop)
    assert helper.get() is None
    first = helper.acquire()
    assert helper.acquire() is first and len(made) == 1
    helper.release(time.monotonic() + 5.0)
    assert helper.get() is first and first._thread is not None and first._thread.is_alive()
    helper.release(time.monotonic() + 5.0)
    assert helper.get() is None and not first._thread.is_alive()
    helper.release(time.monotonic() + 5.0)  # one release too many does nothing
    assert helper.users == 0
