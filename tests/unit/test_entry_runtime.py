"""The entry runtime owns the stub: after ``finalize`` no thread of an entry stub is left and
every admission slot is free, whatever was in flight (live streams, accepted requests still
queued for a worker, refusals), and every request has had exactly one final response.

In process (tests/support/fake_triton.py): every model of a rendered repository, BLS calls as function
calls, the entry models' runtimes, the process-wide receipt board and iterator grave."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from chattts_serving.deploy.render import render_repository
from chattts_serving.errors import decode
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.entry_runtime import SharedHelper
from chattts_serving.serving.profile import load_profile
from chattts_serving.serving.slots import StreamSlots
from chattts_serving.triton.compat.grave import ITERATOR_GRAVE
from chattts_serving.triton.compat.receipts import RECEIPT_BOARD
from tests.support.fake_triton import FINAL, FakePb, Host, Request, Tensor
from tests.support.servers import wait_until

STUB_THREADS = ("entry_", "refuse_", "entry-dispatch", "refusal-record", "degrade-tick", "cancel-watch",
                "unload-cancels", "deferred-finals", "receipts-accept", "receipts-read", "bls-iterator-grave")
"""The names (or name prefixes) of every thread an entry stub runs (the runtime's map)."""


_BEFORE: set[threading.Thread] = set()
"""Threads alive before the host started (other tests' standalone services keep theirs)."""


def _stub_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(STUB_THREADS) and t not in _BEFORE)


@pytest.fixture
def host(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    base = load_profile("cpu")
    profile = base.model_copy(update={
        "entry": base.entry.model_copy(update={"max_concurrent_streams": 4, "gate": False, "refusal_threads": 2}),
        "engine": base.engine.model_copy(update={"nice": 0})})
    repo = tmp_path_factory.mktemp("runtime") / "model_repository"
    render_repository(profile, small_artifacts.root, repo)
    _BEFORE.clear()
    _BEFORE.update(threading.enumerate())
    h = Host(repo, FakePb())
    yield h
    h.close()


LONG_TEXT = "".join(f"这是第{i}句话，我们一起去公园散步，看看湖边的风景吧。" for i in range(1, 9))
"""Eight sentences: a stream of 2000 tokens each lives for many seconds even on the small model."""


def _entry(request_id: str, tokens: int, text: str = "你好，欢迎。") -> Request:
    return Request([Tensor("text", np.array([text.encode()], np.object_)),
                    Tensor("max_new_tokens", np.array([tokens], np.int32)),
                    Tensor("min_new_tokens", np.array([tokens], np.int32))], request_id)


def _audio_sent(req: Request) -> bool:
    return any(r.output_tensors() for r in req.sender.responses)


def test_after_finalize_no_stub_thread_is_left_and_every_slot_is_free(host: Host) -> None:
    stream = host.models["chattts"]
    runtime = stream.runtime  # type: ignore[attr-defined]
    slots = stream.service.admission.slots  # type: ignore[attr-defined]
    assert RECEIPT_BOARD.get() is not None and ITERATOR_GRAVE.get() is not None  # started by the runtimes

    live = [_entry(f"live{i}", 2000, LONG_TEXT) for i in range(2)]
    for req in live:
        stream.execute([req])  # type: ignore[attr-defined]
    assert wait_until(lambda: all(_audio_sent(r) for r in live), 60), "the live streams never started"

    runtime.refusals_first.settle_s = runtime.refusals_first.max_wait_s = 3600.0  # hold the next ones queued
    queued = [_entry(f"queued{i}", 10) for i in range(2)]
    refused = [_entry(f"refused{i}", 10) for i in range(12)]
    for req in queued + refused:
        stream.execute([req])  # type: ignore[attr-defined]
    assert slots.live == 4 and not any(r.sender.closed.is_set() for r in live + queued)
    assert {t.name for t in runtime.live_threads()} >= {"entry-dispatch", "refusal-record", "degrade-tick",
                                                        "cancel-watch", "deferred-finals"}

    for name in ("chattts", "chattts_offline"):  # Triton unloads the entry models with the rest
        host.models[name].finalize()
    assert slots.live == 0 and host.models["chattts_offline"].service.admission.slots.live == 0  # type: ignore[attr-defined]
    for req in live + queued + refused:
        assert req.sender.closed.is_set(), f"{req.request_id()} never ended"
        assert req.sender.violations == [] and req.sender.sent[-1][1] == FINAL
    for req in live + queued:
        err = req.sender.sent[-1][0].error()  # type: ignore[union-attr]
        unloading = ("unavailable", "server unavailable: the model is unloading")
        assert err is not None and decode(err.message()) == unloading
    for req in refused:
        err = req.sender.responses[0].error()
        assert err is not None and decode(err.message())[0] == "busy" and len(req.sender.sent) == 1

    host.close()  # the other models; the engine's release stops the process-wide grave
    assert RECEIPT_BOARD.get() is None and ITERATOR_GRAVE.get() is None
    assert wait_until(lambda: _stub_threads() == [], 10), _stub_threads()


def test_a_slot_token_is_released_exactly_once() -> None:
    slots = StreamSlots(1)
    token = slots.acquire()
    assert token is not None and slots.acquire() is None and slots.live == 1
    assert token.release() is True and slots.live == 0
    assert token.release() is False and slots.live == 0  # a second end of the same request frees nothing
    again = slots.acquire()
    assert again is not None and slots.live == 1


def test_a_shared_helper_that_cannot_start_is_none_and_is_tried_again_by_a_later_first_user() -> None:
    attempts: list[float] = []

    def make() -> str:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise OSError("address in use")
        return "board"

    helper: SharedHelper[str] = SharedHelper("test board", make, lambda h, deadline_s: None)
    assert helper.acquire() is None and helper.get() is None
    helper.release(time.monotonic())
    assert helper.acquire() == "board" and len(attempts) == 2
    helper.release(time.monotonic())
