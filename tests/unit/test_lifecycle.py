"""A request's whole life in the entry service, in process: the real front end, engine
(driven step by step) and vocoders behind :class:`inprocess.InProcessStages`, and a recording
response channel in place of Triton's sender.

Covers the final-response rule (audio, then exactly one final response or one error, nothing
after), admission (busy at once, nothing run), a client cancel (the engine's sequence ends),
the request deadline, the stall watchdog, a failing stage, and offline synthesis. Real-server
tests (test_server.py, test_overload.py, test_faults.py) keep what only Triton shows.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.engine.request import SequenceRequest
from chattts_serving.errors import ErrorKind, RequestError
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.boundary import TokenBatch
from chattts_serving.serving.entry import EntryService
from chattts_serving.serving.job import StreamResult
from chattts_serving.serving.pipeline import stream_audio
from chattts_serving.serving.profile import Profile, load_profile
from tests.support.inprocess import InProcessStages, RecordingChannel, RecordingObserver, run_offline
from tests.support.servers import wait_until

TEXT = "今天天气很好。"


def _profile(**entry: Any) -> Profile:
    base = load_profile("cpu")
    return base.model_copy(update={"entry": base.entry.model_copy(update=entry)})


def _tensors(text: str = TEXT, **values: Any) -> dict[str, np.ndarray]:
    """Entry-model input tensors as Triton hands them over (numpy arrays of one value)."""
    out = {"text": np.array([text.encode()], np.object_)}
    dtypes = {s.name: s.tensor().np_dtype for s in contract.SAMPLING_PARAMS}
    dtypes["timeout_s"] = np.dtype(np.float32)
    for name, v in values.items():
        if isinstance(v, str):
            out[name] = np.array([v.encode()], np.object_)
        elif isinstance(v, bool):
            out[name] = np.array([v], np.bool_)
        else:
            out[name] = np.array([v], dtypes.get(name, np.int32))
    return out


@pytest.fixture(scope="module")
def stages(small_artifacts: Artifacts) -> InProcessStages:
    return InProcessStages(small_artifacts)


def _service(stages: InProcessStages, profile: Profile | None = None) -> tuple[EntryService, RecordingObserver]:
    observer = RecordingObserver()
    profile = profile or _profile()
    return EntryService(contract.MODEL_STREAM, profile, stages, observer), observer


def test_a_stream_is_audio_then_exactly_one_final_response_with_info(stages: InProcessStages) -> None:
    service, observer = _service(stages)
    job = service.admit(_tensors(max_new_tokens=40, min_new_tokens=40, seed=1), {}, "req-1")
    channel = RecordingChannel()
    service.stream(job, channel)
    assert [e[0] for e in channel.events] == ["audio"] * len(channel.chunks) + ["final"]
    header = json.loads(channel.events[0][2])
    assert set(header) == set(contract.INFO_HEADER_KEYS) and header["final"] is False
    assert header["request_id"] == "req-1" and header["normalized_text"] == ["今天天气很好。"]
    assert all(e[2] is None for e in channel.events[1:-1])  # info only on the first chunk
    final = json.loads(channel.events[-1][1])
    assert set(final) == set(contract.INFO_FINAL_KEYS) and final["final"] is True
    samples = sum(c.size for c in channel.chunks)
    assert samples == contract.samples_for_tokens(40) and final["tokens"] == 40
    assert final["audio_s"] == round(samples / contract.SAMPLE_RATE_HZ, 6)
    assert channel.violations == []
    assert [f[0] for f in observer.finishes] == ["ok"] and service.admission.slots.live == 0
    assert observer.queue[-1] == 0
    assert observer.active == [1, 0]  # in flight from admission to the end (what a drain waits for)


def test_every_slot_taken_means_busy_at_once_and_no_work(stages: InProcessStages) -> None:
    service, observer = _service(stages, _profile(max_concurrent_streams=1))
    held = service.admit(_tensors(max_new_tokens=4), {}, "a")
    before = dict(stages.calls)
    with pytest.raises(RequestError) as err:
        service.admit(_tensors(max_new_tokens=4), {}, "b")
    assert err.value.kind == ErrorKind.BUSY and str(err.value) == "server busy: 1 stream already live"
    assert observer.rejections == ["busy"] and stages.calls == before
    service.stream(held, RecordingChannel())
    service.admit(_tensors(max_new_tokens=4), {}, "c")  # the slot came back


def test_bad_input_is_refused_at_admission_and_counted(stages: InProcessStages) -> None:
    service, observer = _service(stages)
    before = dict(stages.calls)
    with pytest.raises(RequestError) as err:
        service.admit(_tensors(temperature=9.0), {}, "x")
    assert err.value.kind == ErrorKind.INVALID and "temperature" in str(err.value)
    with pytest.raises(RequestError):
        service.admit(_tensors(), {"priority": "batch"}, "y")  # a Triton request parameter
    assert observer.rejections == ["invalid", "invalid"] and stages.calls == before
    assert service.admission.slots.live == 0


def test_text_the_front_end_refuses_ends_the_stream_with_one_invalid_error(stages: InProcessStages) -> None:
    service, observer = _service(stages)
    channel = RecordingChannel()
    service.stream(service.admit(_tensors("。。！"), {}, "p"), channel)
    assert [e[0] for e in channel.events] == ["error"]
    assert channel.events[0][1].kind == ErrorKind.INVALID and "nothing speakable" in str(channel.events[0][1])
    assert channel.events[0][1].param == contract.IN_TEXT.name  # the OpenAI gateway's param "input"
    assert [f[0] for f in observer.finishes] == ["invalid"] and observer.rejections == ["invalid"]


@pytest.mark.parametrize("values, param", [({"voice": "nobody"}, "voice"), ({"voice": "~not a spk_emb~"}, "voice"),
                                           ({"voice": "99999999999"}, "voice"), ({}, "text")])
def test_the_front_end_names_the_input_it_refuses(stages: InProcessStages, values: dict[str, Any],
                                                  param: str) -> None:
    service, _ = _service(stages)
    channel = RecordingChannel()
    text = "你好[break_9]" if param == "text" else TEXT  # a control token out of range
    service.stream(service.admit(_tensors(text, **values), {}, "v"), channel)
    assert [e[0] for e in channel.events] == ["error"]
    exc = channel.events[0][1]
    assert (exc.kind, exc.param) == (ErrorKind.INVALID, param), str(exc)
    assert exc.wire().startswith(f"[invalid:{param}] ")


def test_a_client_cancel_ends_the_engine_sequence(stages: InProcessStages) -> None:
    service, observer = _service(stages)
    job = service.admit(_tensors(max_new_tokens=600, min_new_tokens=600), {}, "c")
    channel = RecordingChannel(cancel_after_chunks=1)
    service.stream(job, channel)
    final = json.loads(channel.events[-1][1])
    assert final["stop_reason"] == "cancelled" and final["tokens"] < 600
    assert stages.engine.live_count() == 0
    assert [f[0] for f in observer.finishes] == ["cancelled"] and channel.violations == []


def test_a_passed_deadline_ends_the_stream_with_one_deadline_error(stages: InProcessStages) -> None:
    service, observer = _service(stages)
    job = service.admit(_tensors(max_new_tokens=2000, min_new_tokens=2000, timeout_s=0.2), {}, "d")
    channel = RecordingChannel()
    service.stream(job, channel)
    assert channel.ends and len(channel.ends) == 1 and channel.ends[0][0] == "error"
    exc = channel.ends[0][1]
    assert exc.kind == ErrorKind.DEADLINE and str(exc).startswith("deadline exceeded")  # the pipeline's or the engine's
    assert stages.engine.live_count() == 0 and channel.violations == []
    assert [f[0] for f in observer.finishes] == ["error"]


class _Stuck:
    """A token stream that yields nothing until ``release`` is set (a dead engine process),
    then ends normally."""

    def __init__(self, release: threading.Event, hidden: int) -> None:
        self.release, self.hidden = release, hidden

    def __iter__(self) -> Iterator[TokenBatch]:
        self.release.wait(10)
        yield TokenBatch(np.zeros((4, contract.NUM_VQ), np.int32), np.zeros((4, self.hidden), np.float32),
                         contract.StopReason.EOS)

    def request_cancel(self) -> None:
        pass

    def cancel(self) -> None:
        pass


class _StuckStages:
    def __init__(self, inner: InProcessStages, release: threading.Event) -> None:
        self.inner, self.release = inner, release

    def frontend(self, call: Any) -> Any:
        return self.inner.frontend(call)

    def generate(self, call: SequenceRequest) -> _Stuck:
        return _Stuck(self.release, call.spk_emb.size if call.spk_emb is not None else 0)

    def vocode(self, path: Any, window: np.ndarray, request_id: str = "") -> np.ndarray:
        return self.inner.vocode(path, window, request_id)

    def vocode_carried(self, path: Any, window: np.ndarray, request_id: str, carried: Any) -> np.ndarray:
        return self.inner.vocode_carried(path, window, request_id, carried)


def test_a_stalled_stream_ends_with_one_error_and_nothing_after(stages: InProcessStages) -> None:
    release = threading.Event()
    profile = _profile(stall_timeout_s=0.2)
    observer = RecordingObserver()
    service = EntryService(contract.MODEL_STREAM, profile, _StuckStages(stages, release), observer)
    channel = RecordingChannel()
    worker = threading.Thread(target=service.stream, args=(service.admit(_tensors(), {}, "s"), channel))
    worker.start()
    assert channel.ended.wait(5)
    assert [e[0] for e in channel.events] == ["error"]
    assert channel.events[0][1].kind == ErrorKind.UNAVAILABLE and "stopped responding" in str(channel.events[0][1])
    assert service.admission.slots.live == 0  # the slot is free while the stuck thread still waits
    release.set()  # the stage wakes up: its audio must not reach the closed stream
    worker.join(10)
    assert not worker.is_alive() and [e[0] for e in channel.events] == ["error"]
    assert channel.violations == [] and [f[0] for f in observer.finishes] == ["error"]


@pytest.mark.parametrize("offline", [False, True])
def test_a_stalled_request_ends_unavailable_and_reports_the_stuck_stage(stages: InProcessStages,
                                                                         offline: bool) -> None:
    """Streams and offline requests alike: a stuck engine ends the request with UNAVAILABLE
    within the stall timeout (an offline request used to wait for ever), and the service tells
    its owner which stage is stuck (the Triton layer then stops the server: health.stop_on_stall)."""
    release = threading.Event()
    stalls: list[str] = []
    model = contract.MODEL_OFFLINE if offline else contract.MODEL_STREAM
    service = EntryService(model, _profile(stall_timeout_s=0.2), _StuckStages(stages, release), RecordingObserver(),
                           offline=offline, on_stall=stalls.append)
    channel = RecordingChannel()
    run = service.offline if offline else service.stream
    worker = threading.Thread(target=run, args=(service.admit(_tensors(), {}, "s"), channel))
    worker.start()
    try:
        assert channel.ended.wait(5), "the request hung behind a stuck engine"
        assert [e[0] for e in channel.events] == ["error"]
        assert channel.events[0][1].kind == ErrorKind.UNAVAILABLE and "stopped responding" in str(channel.events[0][1])
        assert wait_until(lambda: stalls == ["GPT engine"], 5), stalls  # told right after the error went out
        assert service.admission.slots.live == 0
    finally:
        release.set()
        worker.join(10)
    assert [e[0] for e in channel.events] == ["error"] and channel.violations == []


def test_closing_the_service_ends_live_streams_as_unavailable_and_their_engine_sequences(
        stages: InProcessStages) -> None:
    """The model unloads with a stream in flight: the stream ends at once with UNAVAILABLE
    "the model is unloading", its engine sequence is cancelled, its thread returns, and
    nothing is sent after the error."""
    service, observer = _service(stages)
    channel = RecordingChannel()
    job = service.admit(_tensors(max_new_tokens=2000, min_new_tokens=2000), {}, "unload")
    worker = threading.Thread(target=service.stream, args=(job, channel))
    worker.start()
    try:
        assert wait_until(lambda: len(channel.chunks) > 0)
        assert service.close(time.monotonic() + 5.0) == 1
        assert [e[0] for e in channel.ends] == ["error"]
        exc = channel.ends[0][1]
        assert exc.kind == ErrorKind.UNAVAILABLE and "unloading" in str(exc)
        worker.join(10)
        assert not worker.is_alive()
        assert wait_until(lambda: stages.engine.live_count() == 0)
    finally:
        for t in list(stages.token_streams):
            t.cancel()
    assert channel.violations == [] and [f[0] for f in observer.finishes] == ["error"]


def test_a_stream_that_starts_after_the_service_closed_ends_at_once_as_unavailable(
        stages: InProcessStages) -> None:
    """A worker that started its stream just as the model unloaded: the stream is ended as
    it registers, and its engine sequence as it starts; its thread returns without generating
    the rest of its text."""
    service, observer = _service(stages)
    assert service.close(time.monotonic() + 5.0) == 0
    channel = RecordingChannel()
    service.stream(service.admit(_tensors(max_new_tokens=2000, min_new_tokens=2000), {}, "late"), channel)
    assert [e[0] for e in channel.events] == ["error"] and "unloading" in str(channel.events[0][1])
    assert wait_until(lambda: stages.engine.live_count() == 0)
    assert channel.violations == [] and [f[0] for f in observer.finishes] == ["error"]


class _SlowVocoder(InProcessStages):
    """A vocoder whose every call waits ``release`` for up to ``wait_s`` (a call queued behind
    long offline windows, or, never released, a vocoder that hangs)."""

    def __init__(self, inner: InProcessStages, wait_s: float, release: threading.Event) -> None:
        self.__dict__.update(inner.__dict__)
        self.wait_s, self.release = wait_s, release

    def vocode(self, path: Any, window: np.ndarray, request_id: str = "") -> np.ndarray:
        self.release.wait(self.wait_s)
        return super().vocode(path, window, request_id)

    def vocode_carried(self, path: Any, window: np.ndarray, request_id: str, carried: Any) -> np.ndarray:
        self.release.wait(self.wait_s)
        return super().vocode_carried(path, window, request_id, carried)


def test_a_slow_vocoder_call_is_not_a_stalled_engine(stages: InProcessStages) -> None:
    """Each vocoder call takes 1.2 stall timeouts: the stream's own work, not the engine's
    silence. The stream completes with its audio (before the watchdog counted only the waits
    for the engine, it ended as "the GPT engine stopped responding")."""
    profile = _profile(stall_timeout_s=0.5)
    observer = RecordingObserver()
    service = EntryService(contract.MODEL_STREAM, profile, _SlowVocoder(stages, 0.6, threading.Event()), observer)
    channel = RecordingChannel()
    service.stream(service.admit(_tensors(max_new_tokens=12, min_new_tokens=12), {}, "slow"), channel)
    assert channel.chunks and [e[0] for e in channel.ends] == ["final"], channel.events
    assert channel.violations == [] and [f[0] for f in observer.finishes] == ["ok"]


def test_a_vocoder_that_never_answers_ends_the_stream_after_twice_the_stall_timeout(
        stages: InProcessStages) -> None:
    release = threading.Event()
    profile = _profile(stall_timeout_s=0.2)
    service = EntryService(contract.MODEL_STREAM, profile, _SlowVocoder(stages, 30.0, release), RecordingObserver())
    channel = RecordingChannel()
    worker = threading.Thread(target=service.stream, args=(service.admit(_tensors(), {}, "hung"), channel))
    worker.start()
    try:
        assert channel.ended.wait(10)
        assert [e[0] for e in channel.events] == ["error"]
        exc = channel.events[0][1]
        assert exc.kind == ErrorKind.UNAVAILABLE and "the vocoder stopped responding" in str(exc), exc
    finally:
        release.set()
        worker.join(10)
    assert channel.violations == []


def test_the_watchdog_counts_a_working_streams_time_less_one_stall_timeout() -> None:
    from chattts_serving.serving.lifecycle import CancelWatcher, StreamGuard

    stalled: list[str] = []
    watcher = CancelWatcher(interval_s=3600.0, stall_s=10.0, on_stall=lambda g, name: stalled.append(name))
    guard = StreamGuard(RecordingChannel())
    watcher.guard(guard, "vocoding")
    guard.touch(working=True)
    guard.last_activity -= 15.0  # in its vocoder call for 1.5 stall timeouts
    watcher.poll()
    assert stalled == []
    guard.last_activity -= 6.0  # 2.1 stall timeouts
    watcher.poll()
    assert stalled == ["vocoding"]


class _FailingVocoder(InProcessStages):
    def __init__(self, inner: InProcessStages) -> None:
        self.__dict__.update(inner.__dict__)

    def vocode(self, path: Any, window: np.ndarray, request_id: str = "") -> np.ndarray:
        raise RuntimeError("vocoder crashed")

    def vocode_carried(self, path: Any, window: np.ndarray, request_id: str, carried: Any) -> np.ndarray:
        raise RuntimeError("vocoder crashed")


def test_an_unexpected_failure_is_one_internal_error_without_a_traceback(stages: InProcessStages) -> None:
    service, observer = _service(_FailingVocoder(stages))
    channel = RecordingChannel()
    service.stream(service.admit(_tensors(max_new_tokens=30), {}, "f"), channel)
    assert [e[0] for e in channel.events] == ["error"]
    exc = channel.events[0][1]
    assert exc.kind == ErrorKind.INTERNAL and str(exc) == "internal error: RuntimeError"
    assert stages.engine.live_count() == 0 and [f[0] for f in observer.finishes] == ["error"]


@pytest.mark.parametrize("end", ["completed", "cancelled", "deadline", "internal", "offline"])
def test_a_finished_request_frees_its_engine_streams_without_the_cyclic_gc(stages: InProcessStages, end: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """However a request ends, its engine streams (in the server: BLS response iterators and
    responses) are freed when it ends, by reference counting alone (the cyclic garbage
    collector is off here). Nothing of them may wait in a reference cycle, typically through
    an exception's traceback, for the collector to free later on another thread: Triton
    2.51's stub dies of a segmentation fault when that frees BLS responses."""
    # pytest's log capture keeps the records of logged exceptions, tracebacks included (the
    # server's log handler writes them and lets go): the entry service's own logger keeps none here
    monkeypatch.setattr(logging.getLogger("chattts_serving.serving.entry"), "handlers", [logging.NullHandler()])
    monkeypatch.setattr(logging.getLogger("chattts_serving.serving.entry"), "propagate", False)
    service, _ = _service(_FailingVocoder(stages) if end == "internal" else stages)
    tensors = {"completed": _tensors(max_new_tokens=30, min_new_tokens=30),
               "cancelled": _tensors(max_new_tokens=600, min_new_tokens=600),
               "deadline": _tensors(max_new_tokens=2000, min_new_tokens=2000, timeout_s=0.2),
               "internal": _tensors(max_new_tokens=30),
               "offline": _tensors(max_new_tokens=30, min_new_tokens=30)}[end]
    channel = RecordingChannel(cancel_after_chunks=1 if end == "cancelled" else None)
    generated = stages.calls["generate"]
    gc.collect()
    gc.disable()
    try:
        if end == "offline":
            offline = EntryService(contract.MODEL_OFFLINE, _profile(), stages, RecordingObserver(), offline=True)
            offline.offline(offline.admit(tensors, {}, end), channel)
        else:
            service.stream(service.admit(tensors, {}, end), channel)
        alive = len(stages.token_streams)
    finally:
        gc.enable()
    assert stages.calls["generate"] > generated
    expected = {"completed": "final", "cancelled": "final", "deadline": "error", "internal": "error",
                "offline": "final"}
    assert [e[0] for e in channel.events][-1] == expected[end]
    assert alive == 0, f"{alive} engine stream(s) of a finished request wait for the cyclic GC"


def test_offline_returns_the_whole_utterance_and_its_info(stages: InProcessStages) -> None:
    profile = _profile()
    observer = RecordingObserver()
    service = EntryService(contract.MODEL_OFFLINE, profile, stages, observer, offline=True)
    text = "今天天气很好，阳光明媚，我们都很开心。我们一起去公园散步吧，好不好，朋友们？"
    channel = RecordingChannel()
    service.offline(service.admit(_tensors(text, max_new_tokens=20, min_new_tokens=20), {}, "o"), channel)
    assert [e[0] for e in channel.events] == ["audio", "final"] and not channel.violations
    audio, info = channel.chunks[0], json.loads(channel.events[-1][1])
    assert info["segments"] == 2 and info["tokens"] == 40 and info["chunks"] == 1
    assert audio.dtype == np.float32 and audio.size == 2 * contract.samples_for_tokens(20)
    assert [f[0] for f in observer.finishes] == ["ok"] and service.admission.slots.live == 0


def _degrading_profile(**degrade: Any) -> Profile:
    base = load_profile("cpu")
    return base.model_copy(update={"degrade": base.degrade.model_copy(update={"min_dwell_s": 0.0, **degrade})})


def test_degraded_mode_takes_the_cheaper_path_and_sheds_batch_requests(stages: InProcessStages,
                                                                       small_artifacts: Artifacts) -> None:
    """While degraded a request is made cheaper in every documented way: the codes vocoder
    (its audio is the codes path's, not the hidden one's), chunks chunk_scale times larger
    and doubling (not cut smaller by rate planning), refine-text skipped; batch-priority
    requests are shed as busy. It is never made shorter: it gets every token it asked for (the
    cap the degraded mode once applied cut speech)."""
    profile = _degrading_profile(live_high=1, live_low=0)
    profile = profile.model_copy(update={"stream": profile.stream.model_copy(update={"rate_planned_chunks": True})})
    service, observer = _service(stages, profile)
    rf = small_artifacts.receptive_field_tokens("codes")
    held = service.admit(_tensors(max_new_tokens=50), {}, "first")  # one live stream: degrade at the next arrival
    job = service.admit(_tensors(max_new_tokens=50, min_new_tokens=50, vocoder="hidden", refine_text=True, seed=4,
                                 lookahead_tokens=rf), {}, "second")
    assert job.degraded and job.req.vocoder == "codes" and job.req.params.max_new_tokens == 50
    assert job.req.refine is None
    assert job.schedule.first_chunk_tokens == 2 * profile.stream.first_chunk_tokens
    assert profile.stream.rate_planned_chunks and not job.schedule.rate_planned
    assert profile.stream.growth_basis == "audio" and (job.schedule.growth_basis, job.schedule.growth) == ("chunk", 2.0)
    with pytest.raises(RequestError) as err:
        service.admit(_tensors(priority="batch"), {}, "third")
    assert err.value.kind == ErrorKind.BUSY and "shed" in str(err.value)
    channel = RecordingChannel()
    service.stream(job, channel)
    final = json.loads(channel.events[-1][1])
    assert final["degraded"] is True and final["vocoder"] == "codes" and final["refined"] is False
    assert final["tokens"] == 50 and final["capped_segments"] == [0]  # the 50 asked for (min = max)
    spt, half = contract.SAMPLES_PER_TOKEN, profile.stream.crossfade_samples // 2
    sizes = [c.size for c in channel.chunks]
    assert sizes[:2] == [8 * spt - half, 16 * spt]  # 2 x (4 tokens, then 8): cpu profile, chunk_scale 2
    assert observer.degraded == [True] and observer.degraded_requests == 1
    service.stream(held, RecordingChannel())
    # the audio is what the codes vocoder makes of those 50 tokens (full lookahead: exact)
    offline = EntryService(contract.MODEL_OFFLINE, _profile(), stages, RecordingObserver(), offline=True)
    ref, _ = run_offline(offline, offline.admit(
        _tensors(max_new_tokens=50, min_new_tokens=50, vocoder="codes", seed=4), {}, "ref"))
    hidden, _ = run_offline(offline, offline.admit(
        _tensors(max_new_tokens=50, min_new_tokens=50, seed=4), {}, "hidden"))
    streamed = np.concatenate(channel.chunks)
    assert streamed.size == ref.size == hidden.size
    np.testing.assert_allclose(streamed, ref, rtol=0, atol=1e-4)
    assert np.abs(streamed - hidden).max() > 1e-2


def test_slow_first_audio_alone_switches_degraded_mode_on(stages: InProcessStages) -> None:
    """The TTFA criterion, wired through the entry service: with one stream at a time (far
    below live_high) and a TTFA p95 threshold every real request exceeds, requests stay in
    normal mode until the Degrader has its 20 TTFA samples (min_samples), and the next one
    is degraded."""
    profile = _degrading_profile(live_high=1000, live_low=999, ttfa_p95_high_s=1e-9, ttfa_p95_low_s=1e-9,
                                 max_age_s=3600.0)
    assert profile.degrade.min_samples == 20
    service, observer = _service(stages, profile)
    for i in range(20):
        job = service.admit(_tensors(max_new_tokens=4, min_new_tokens=4, seed=i), {}, f"r{i}")
        assert not job.degraded, f"request {i} degraded with {i} TTFA samples"
        channel = RecordingChannel()
        service.stream(job, channel)
        assert channel.chunks and [f[0] for f in observer.finishes][-1] == "ok"
    assert all(f[4] is not None and f[4] > 1e-9 for f in observer.finishes)  # each had a TTFA
    job = service.admit(_tensors(max_new_tokens=4, min_new_tokens=4), {}, "after")
    assert job.degraded and job.req.vocoder == "codes" and observer.degraded == [True]
    service.stream(job, RecordingChannel())


@pytest.mark.parametrize("kind", ["plain", "refine_text", "chattts_first_piece", "reference_recording"])
def test_the_degraded_mode_measures_first_audio_without_the_work_a_request_asked_for(
        stages: InProcessStages, kind: str) -> None:
    """What a request asked for before its audio can start (refine-text, ChatTTS' first-piece
    reference pass, encoding its reference recording) is its own choice, not the load's: the
    degraded mode's TTFA sample is the request's time to first audio less that work (the issue:
    one ``segmentation: "chattts"`` request switched a lightly used server into degraded mode).
    A plain request's sample is its whole TTFA."""
    service, observer = _service(stages)
    text = "今天天气很好。我们去公园散步吧。"
    extra: dict[str, Any] = {"plain": {}, "refine_text": {"refine_text": True, "refine_max_new_tokens": 20},
                             "chattts_first_piece": {"segmentation": "chattts"}, "reference_recording": {}}[kind]
    tensors = _tensors(text, max_new_tokens=30, min_new_tokens=30, seed=2, **extra)
    if kind == "reference_recording":
        rng = np.random.default_rng(3)
        tensors["reference_audio"] = (0.1 * rng.standard_normal(contract.SAMPLE_RATE_HZ)).astype(np.float32)
        tensors["reference_text"] = np.array(["参考录音。".encode()], np.object_)
    job = service.admit(tensors, {}, kind)
    service.stream(job, RecordingChannel())
    ttfa = observer.finishes[-1][4]
    assert observer.finishes[-1][0] == "ok" and ttfa is not None
    (sample,) = service.admission.degrader.recent_ttfa_s()
    if kind == "plain":
        assert sample == pytest.approx(ttfa, abs=1e-6)
    else:
        assert sample < ttfa, "the asked-for work was counted as waiting for the load"
        assert sample >= 0.0


def test_validate_only_checks_the_request_and_generates_nothing(stages: InProcessStages) -> None:
    """``validate_only`` (the WebSocket's check of its start): a request that passes ends with
    its final info and no audio, without an engine sequence, and is not counted as a request;
    one the front end refuses (an unknown voice) is refused INVALID naming the voice."""
    service, observer = _service(stages)
    generated = stages.calls["generate"]
    channel = RecordingChannel()
    service.stream(service.admit(_tensors("-", voice="alloy", validate_only=True), {}, "check"), channel)
    assert [e[0] for e in channel.events] == ["final"] and not channel.chunks
    assert json.loads(channel.events[-1][1])["audio_s"] == 0.0
    assert stages.calls["generate"] == generated and observer.finishes == []
    assert service.admission.slots.live == 0
    bad = RecordingChannel()
    service.stream(service.admit(_tensors("-", voice="no-such-voice", validate_only=True), {}, "bad"), bad)
    assert [e[0] for e in bad.events] == ["error"] and stages.calls["generate"] == generated
    error = bad.events[-1][1]
    assert error.kind == ErrorKind.INVALID and error.param == "voice", error


def test_the_watchdog_leaves_queued_streams_alone_while_others_progress() -> None:
    """Streams waiting behind full engine batches make no progress for minutes: only when no
    stream at all progresses for stall_s is the engine taken for dead."""
    from chattts_serving.serving.lifecycle import CancelWatcher, StreamGuard

    stalled: list[str] = []
    watcher = CancelWatcher(interval_s=3600.0, stall_s=10.0, on_stall=lambda g, name: stalled.append(name))
    waiting, running = StreamGuard(RecordingChannel()), StreamGuard(RecordingChannel())
    watcher.guard(waiting, "waiting")
    watcher.guard(running, "running")
    waiting.last_activity -= 60.0  # queued for a minute
    watcher.poll()
    assert stalled == []  # the other stream progresses: the engine is alive
    running.last_activity -= 11.0  # now nothing has moved for longer than stall_s
    watcher.poll()
    assert sorted(stalled) == ["running", "waiting"]


class _WatchFails:
    """A :class:`~chattts_serving.serving.pipeline.StreamOutput` whose cancel watcher cannot
    be set up (in the server: the watcher thread refuses a new stream)."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []

    def audio(self, chunk: np.ndarray, result: StreamResult) -> None:
        self.chunks.append(chunk)

    def cancelled(self) -> bool:
        return False

    def progress(self, working: bool) -> None:
        pass

    def watch(self, on_cancel: Any) -> Any:
        raise RuntimeError("cannot watch this stream")


def test_a_stream_whose_cancel_watch_fails_still_ends_its_engine_sequence(stages: InProcessStages) -> None:
    service, _ = _service(stages)
    job = service.admit(_tensors(max_new_tokens=600, min_new_tokens=600), {}, "w")
    generated = stages.calls["generate"]
    try:
        with pytest.raises(RuntimeError, match="cannot watch"):
            stream_audio(job, stages, _WatchFails())
        assert stages.calls["generate"] == generated + 1  # the sequence was started, then the watch failed
        assert stages.engine.live_count() == 0, "the engine sequence was left running"
        assert all(t.sink.done for t in stages.token_streams)
    finally:
        for t in list(stages.token_streams):
            t.cancel()  # leave the shared engine clean whatever happened


def test_busy_refusal_counts_in_words() -> None:
    """One stream is singular, any other count plural, for both doors' wording."""
    from chattts_serving.serving.admission import OFFLINE_BUSY_DETAIL, busy_error
    assert str(busy_error(1)) == "server busy: 1 stream already live"
    assert str(busy_error(4)) == "server busy: 4 streams already live"
    assert str(busy_error(1, OFFLINE_BUSY_DETAIL)) == "server busy: 1 request already running"
    assert str(busy_error(0, OFFLINE_BUSY_DETAIL)) == "server busy: 0 requests already running"


class _RecordingStages:
    """The in-process stages, recording each sequence the pipeline asks the engine for."""

    def __init__(self, inner: InProcessStages) -> None:
        self.inner = inner
        self.calls: list[SequenceRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, call: SequenceRequest) -> Any:
        self.calls.append(call)
        return self.inner.generate(call)


def test_a_streamed_segment_asks_the_engine_to_answer_where_its_windows_become_complete(
        stages: InProcessStages) -> None:
    """A streamed request's sequence carries its windows' ready points (``emit_at``: the engine
    answers there besides every ``emit_tokens``, so no window waits for a group to fill); an
    offline one's carries none (nothing is vocoded before its end)."""
    from chattts_serving.audio.chunking import ready_points
    from chattts_serving.engine.request import MAX_EMIT_POINTS

    recording = _RecordingStages(stages)
    service = EntryService(contract.MODEL_STREAM, _profile(), recording, RecordingObserver())
    job = service.admit(_tensors(max_new_tokens=40, min_new_tokens=40, seed=1), {}, "req-points")
    service.stream(job, RecordingChannel())
    (streamed,) = recording.calls
    assert streamed.emit_at == ready_points(job.schedule, 40, MAX_EMIT_POINTS) != ()
    assert streamed.emit_at[0] == job.schedule.tokens_before_first_chunk()
    offline = EntryService(contract.MODEL_OFFLINE_ENTRY, _profile(), recording, RecordingObserver())
    run_offline(offline, offline.admit(_tensors(max_new_tokens=40, min_new_tokens=40, seed=1), {}, "req-offline"))
    assert [c.emit_at for c in recording.calls[1:]] == [()]
