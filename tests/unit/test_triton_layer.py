"""The Triton layer in process: every model of the rendered repository initialised with a
stand-in ``triton_python_backend_utils`` (tests/support/fake_triton.py), BLS calls between them as
function calls. Checks what the adapters own: error codes and kind tags, the final flag on
every path, the engine's control requests, and the circuit breaker's trial (it always ends:
success, failure or release)."""

from __future__ import annotations

import gc
import json
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.deploy.render import render_repository
from chattts_serving.errors import decode, decode_tagged
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile
from tests.support.fake_triton import FINAL, FakePb, Host, InferenceResponse, MetricFamily, Request, Tensor, TritonError
from tests.support.servers import wait_until

COOLDOWN_S = 0.3


@pytest.fixture(scope="module")
def host(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    base = load_profile("cpu")
    # No admission gate (C++, in tritonserver only): chattts is the Python entry model, which
    # then refuses "busy" itself (tests/server/test_gate.py covers the gate against a real server).
    # And engine nice 0: the engine runs in this test process, whose every thread it would renice.
    profile = base.model_copy(update={"entry": base.entry.model_copy(update={
        "breaker_failures": 2, "breaker_cooldown_s": COOLDOWN_S, "max_concurrent_streams": 4, "gate": False}),
        "engine": base.engine.model_copy(update={"nice": 0})})
    repo = tmp_path_factory.mktemp("fake-triton") / "model_repository"
    render_repository(profile, small_artifacts.root, repo)
    h = Host(repo, FakePb())
    yield h
    h.close()


def _entry(text: str = "你好，欢迎。", request_id: str = "", **values: int | float | str) -> Request:
    tensors = [Tensor("text", np.array([text.encode()], np.object_))]
    specs = {s.name: s.tensor() for s in contract.SAMPLING_PARAMS}
    for name, v in values.items():
        tensors.append(Tensor(name, np.array([v.encode()], np.object_) if isinstance(v, str)
                              else np.array([v], specs[name].np_dtype)))
    return Request(tensors, request_id)


def _stream(host: Host, req: Request, timeout_s: float = 30.0) -> list[InferenceResponse]:
    assert host.models["chattts"].execute([req]) is None  # type: ignore[attr-defined]
    assert req.sender.closed.wait(timeout_s)
    runtime = host.models["chattts"].runtime  # type: ignore[attr-defined]
    assert wait_until(lambda: runtime.running() == 0, timeout_s)  # its worker is done: nothing more is sent
    assert req.sender.violations == []
    return req.sender.responses


def _audio(responses: list[InferenceResponse]) -> np.ndarray:
    parts = [t.as_numpy() for r in responses for t in r.output_tensors() if t.name() == contract.OUT_AUDIO.name]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def test_a_stream_through_the_models_ends_with_the_final_flag_and_info(host: Host) -> None:
    req = _entry(request_id="r1", max_new_tokens=30, min_new_tokens=30, seed=2)
    responses = _stream(host, req)
    assert _audio(responses).size == contract.samples_for_tokens(30)
    final_response, flags = req.sender.sent[-1]
    assert flags == FINAL and final_response is not None
    info = json.loads(final_response.output_tensors()[0].as_numpy()[0])
    assert info["request_id"] == "r1" and info["final"] is True and info["tokens"] == 30


@pytest.mark.parametrize("values, kind, code", [
    ({"temperature": 9.0}, "invalid", TritonError.INVALID_ARG),
    ({"vocoder": "wavenet"}, "invalid", TritonError.INVALID_ARG),
])
def test_a_refused_request_is_one_final_error_with_its_kind_and_code(host: Host, values: dict, kind: str,
                                                                     code: int) -> None:
    req = _entry(**values)
    responses = _stream(host, req)
    assert len(req.sender.sent) == 1 and req.sender.sent[0][1] == FINAL
    err = responses[0].error()
    assert err is not None and err.code() == code and decode(err.message())[0] == kind


def test_offline_answers_audio_or_an_error_response_with_its_code(host: Host) -> None:
    offline = host.models["chattts_offline"]
    ok, bad = _entry(max_new_tokens=20, min_new_tokens=20), _entry(top_k=0)
    assert offline.execute([ok, bad]) is None  # type: ignore[attr-defined]  # answered on the response senders
    for req in (ok, bad):
        assert req.sender.closed.wait(30) and len(req.sender.sent) == 1 and req.sender.sent[0][1] == FINAL
    good, refused = ok.sender.responses[0], bad.sender.responses[0]
    assert not good.has_error() and good.output_tensors()[0].as_numpy().size == contract.samples_for_tokens(20)
    assert refused.has_error() and refused.error().code() == TritonError.INVALID_ARG
    tagged = decode_tagged(refused.error().message())  # the kind and the input at fault travel in the tag
    assert (tagged.kind, tagged.param) == ("invalid", "top_k") and tagged.message.startswith("top_k=0 is out of range")


def test_engine_control_requests(host: Host) -> None:
    engine = host.models["chattts_gpt"]
    cancel = Request([Tensor("control", np.array([b"cancel"], np.object_)),
                      Tensor("stream_id", np.array([b"nobody"], np.object_))])
    engine.execute([cancel])  # type: ignore[attr-defined]
    assert cancel.sender.sent == [(None, FINAL)]
    unknown = Request([Tensor("control", np.array([b"pause"], np.object_)),
                       Tensor("stream_id", np.array([b"x"], np.object_))])
    engine.execute([unknown])  # type: ignore[attr-defined]
    (resp, _), (_, flags) = unknown.sender.sent
    stop = resp.output_tensors()[2].as_numpy()[0].decode()
    assert stop.startswith("error:invalid:") and "pause" in stop and flags == FINAL


def _dead_engine(request: Request, decoupled: bool) -> Iterator[InferenceResponse]:
    """What Triton 2.51 answers a BLS call to a model whose stub process died."""
    yield InferenceResponse(error=TritonError("Stub process 'chattts_gpt_0_0' is not healthy.",
                                              TritonError.INTERNAL))


def test_the_breakers_trial_ends_when_its_client_cancels_and_then_the_engine_is_used_again(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open the engine breaker with a dead engine's failures (unavailable to the client, a
    failure of the stage to its breaker); after the cool-down the one trial request
    is cancelled by its client before the engine answered: the trial must still end, so the
    next healthy request gets audio instead of "engine is failing" until a restart."""
    host.override["chattts_gpt"] = _dead_engine
    try:
        for _ in range(2):  # breaker_failures
            err = _stream(host, _entry())[0].error()
            assert err is not None and decode(err.message())[0] == "unavailable" and "not healthy" in err.message()
        err = _stream(host, _entry())[0].error()
        assert err is not None and decode(err.message())[0] == "unavailable" and "engine is failing" in err.message()
    finally:
        del host.override["chattts_gpt"]
    breaker = host.models["chattts"].service.stages.breakers["engine"]  # type: ignore[attr-defined]
    opened = breaker.clock()
    monkeypatch.setattr(breaker, "clock", lambda: opened + COOLDOWN_S)  # the cool-down has passed (its injected clock)
    trial = _entry(max_new_tokens=500, min_new_tokens=500)
    trial.sender.cancelled = True  # the client is gone before the engine's first answer
    _stream(host, trial)
    healthy = _stream(host, _entry(max_new_tokens=10, min_new_tokens=10))
    assert not any(r.has_error() for r in healthy), [r.error().message() for r in healthy if r.has_error()]
    assert _audio(healthy).size == contract.samples_for_tokens(10)
    assert MetricFamily.total("tts_request_total", model="chattts", status="cancelled") >= 1


def test_busy_is_decided_before_reading_the_request_and_sent_before_accepted_streams_end(host: Host) -> None:
    """Every stream slot taken: each further request is refused at once with the busy kind
    and Triton's UNAVAILABLE code, before any accepted stream has ended, and counted."""
    before = MetricFamily.total("tts_rejected_total", model="chattts", reason="busy")
    accepted = [_entry(max_new_tokens=300, min_new_tokens=300, request_id=f"a{i}") for i in range(4)]
    refused = [_entry(request_id=f"r{i}") for i in range(6)]
    stream = host.models["chattts"]
    for req in accepted + refused:
        stream.execute([req])  # type: ignore[attr-defined]  # one request per execute, as Triton calls it
    for req in refused:
        assert req.sender.closed.wait(10)
        err = req.sender.responses[0].error()
        assert err is not None and err.code() == TritonError.UNAVAILABLE
        assert decode(err.message()) == ("busy", "server busy: 4 streams already live")
    assert not any(req.sender.closed.is_set() for req in accepted)  # refusals did not wait for them
    for req in accepted:
        assert req.sender.closed.wait(60) and req.sender.violations == []
        assert not any(r.has_error() for r in req.sender.responses)
    wait_until(lambda: MetricFamily.total("tts_rejected_total", model="chattts", reason="busy") - before >= 6,
               30)  # counted once the burst has settled (RefusalRecorder)
    assert MetricFamily.total("tts_rejected_total", model="chattts", reason="busy") - before == 6


def test_an_accepted_request_the_dispatcher_cannot_hand_over_ends_with_an_error_and_frees_its_slot(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one dispatcher thread survives a failing hand-over: that request ends with an
    internal error (never a hang), its slot comes back, and the next request is served."""
    stream = host.models["chattts"]
    live = stream.service.admission.slots.live  # type: ignore[attr-defined]
    real_submit = stream.runtime.workers.submit  # type: ignore[attr-defined]
    calls = []

    def failing_once(fn: Any, *args: Any) -> Any:
        if not calls:
            calls.append(fn)
            raise ValueError("no worker")
        return real_submit(fn, *args)
    monkeypatch.setattr(stream.runtime.workers, "submit", failing_once)  # type: ignore[attr-defined]
    failed = _stream(host, _entry(request_id="lost-worker"))
    err = failed[0].error()
    assert len(failed) == 1 and err is not None and decode(err.message())[0] == "internal", err
    assert stream.service.admission.slots.live == live  # type: ignore[attr-defined]
    served = _stream(host, _entry(max_new_tokens=10, min_new_tokens=10))
    assert not any(r.has_error() for r in served) and _audio(served).size == contract.samples_for_tokens(10)


def test_finalized_models_are_freed_by_reference_counting_alone(small_artifacts: Artifacts, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the stub drops a finalized model, everything of it goes by reference counting: no
    reference cycle keeps the model (its response senders, BLS objects, metric families) for the
    cyclic garbage collector, which in a stub runs last at exit, after the shared memory is
    gone (Triton 2.51's stub then dies: "Fatal Python error: Segmentation fault ...
    Garbage-collecting"). Cycles seen here before: the deferred finals holding the model's
    bound method, an entry service holding its model's stall callback. (pytest's log capture
    keeps the records of logged exceptions, whose frames hold the models: not here.)"""
    monkeypatch.setattr(logging.getLogger("chattts_serving"), "propagate", False)
    base = load_profile("cpu")
    profile = base.model_copy(update={"entry": base.entry.model_copy(update={"gate": False}),
                                      "engine": base.engine.model_copy(update={"nice": 0})})
    repo = tmp_path / "model_repository"
    render_repository(profile, small_artifacts.root, repo)
    h = Host(repo, FakePb())
    served = _stream(h, _entry(max_new_tokens=10, min_new_tokens=10))
    assert not any(r.has_error() for r in served)
    h.close()
    refs = {name: weakref.ref(model) for name, model in h.models.items()}
    gc.collect()
    gc.disable()
    try:
        h.models.clear()
        del served
        alive = [name for name, ref in refs.items() if ref() is not None]
    finally:
        gc.enable()
    assert not alive, f"finalized models kept alive by reference cycles: {alive}"


@pytest.mark.parametrize(("header", "want"), [('{"request_id": "abc", "final": false}', "abc"), ("", ""),
                                              ("not json", ""), ("[1]", ""), ('{"request_id": 5}', ""), ("{}", "")])
def test_the_request_id_of_an_info_header(header: str, want: str) -> None:
    """The ensemble engine logs a stream under the id its front end put in the header."""
    from chattts_serving.triton.models import header_request_id

    assert header_request_id(header) == want
