"""The admission gate (chattts_serving/gate/gate.cc) on a real tritonserver: forwarding requests,
responses, errors, request parameters and cancels unchanged to the Python entry model behind it,
counting and logging its refusals, the admission watch reporting doors as they fill and free,
and the profile's ``[entry] gate = false`` serving without it. Built and rendered without a
server: tests/unit/test_gate.py."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from chattts_serving import contract
from chattts_serving.deploy.admin import grpc_headers
from chattts_serving.deploy.server import TritonServer
from chattts_serving.runtime import Artifacts
from tests.support.servers import metric, serve_profile


# --- a real server ---------------------------------------------------------------------------------
def _inputs(text: str, seed: int, tokens: int, **extra: Any) -> list[grpcclient.InferInput]:
    values: list[tuple[str, np.ndarray, str]] = [
        ("text", np.array([text.encode()], np.object_), "BYTES"), ("seed", np.array([seed], np.int64), "INT64"),
        ("max_new_tokens", np.array([tokens], np.int32), "INT32"),
        ("min_new_tokens", np.array([tokens], np.int32), "INT32")]
    for name, value in extra.items():
        spec = {t.name: t for t in contract.ENTRY_INPUTS}[name]
        arr = (np.array([value.encode()], np.object_) if spec.triton_dtype == "TYPE_STRING"
               else np.array([value], spec.np_dtype))
        values.append((name, arr, spec.client_dtype))
    out = []
    for name, arr, dtype in values:
        i = grpcclient.InferInput(name, list(arr.shape), dtype)
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def _stream(url: str, model: str, inputs: list[grpcclient.InferInput], request_id: str = "",
            parameters: dict[str, Any] | None = None) -> tuple[list[Any], str | None]:
    """All responses of one stream on ``model`` (the final, empty one included) and its error."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    responses: list[Any] = []
    try:
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True,
                                  parameters=parameters)
        while True:
            result, error = q.get(timeout=120)
            if error is not None:
                return responses, str(error)
            responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses, None
    finally:
        client.stop_stream()
        client.close()


def _audio(responses: list[Any]) -> np.ndarray:
    parts = [a for r in responses if (a := r.as_numpy(contract.OUT_AUDIO.name)) is not None]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _infos(responses: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(i[0]) for r in responses if (i := r.as_numpy(contract.OUT_INFO.name)) is not None]


def test_a_stream_through_the_gate_is_the_stream_of_the_entry_model(triton_server: Any) -> None:
    """Same request to ``chattts`` (the gate) and to ``chattts_entry`` behind it: the same audio
    (to float noise), the same chunking, the same info apart from timings; the request id reaches
    the entry model."""
    url = triton_server.grpc_url
    via_gate, err_gate = _stream(url, contract.MODEL_STREAM, _inputs("网关转发测试。", 7, 48), request_id="gate-fwd-1")
    direct, err_direct = _stream(url, contract.MODEL_STREAM_ENTRY, _inputs("网关转发测试。", 7, 48),
                                 request_id="gate-fwd-2")
    assert err_gate is None and err_direct is None
    assert len(via_gate) == len(direct) >= 3  # first chunk, more chunks, final info
    np.testing.assert_allclose(_audio(via_gate), _audio(direct), rtol=0, atol=1e-4)  # servers.SAME_PCM16_LSB
    assert [r.as_numpy(contract.OUT_AUDIO.name).shape if r.as_numpy(contract.OUT_AUDIO.name) is not None else None
            for r in via_gate] == [r.as_numpy(contract.OUT_AUDIO.name).shape
                                   if r.as_numpy(contract.OUT_AUDIO.name) is not None else None for r in direct]
    info_gate, info_direct = _infos(via_gate), _infos(direct)
    assert [sorted(i) for i in info_gate] == [sorted(i) for i in info_direct]
    assert info_gate[0]["request_id"] == "gate-fwd-1" and info_direct[0]["request_id"] == "gate-fwd-2"
    assert via_gate[-1].get_response().parameters["triton_final_response"].bool_param


def _offline(url: str, model: str, inputs: list[grpcclient.InferInput], request_id: str = "",
             parameters: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(result, None) or (None, the InferenceServerException) of one infer call on ``model``."""
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, inputs, request_id=request_id, parameters=parameters), None
    except grpcclient.InferenceServerException as exc:
        return None, exc
    finally:
        client.close()


def test_an_utterance_through_the_offline_gate_is_the_offline_entry_models(triton_server: Any) -> None:
    """``chattts_offline`` (the gate, not decoupled) and ``chattts_offline_entry`` behind it:
    the same whole-utterance audio (to float noise) and info, the request id passed on; errors
    come through with the same status and message."""
    url = triton_server.grpc_url
    via_gate, err_gate = _offline(url, contract.MODEL_OFFLINE, _inputs("离线网关。", 5, 40), "off-gate-1")
    direct, err_direct = _offline(url, contract.MODEL_OFFLINE_ENTRY, _inputs("离线网关。", 5, 40), "off-gate-2")
    assert err_gate is None and err_direct is None, (err_gate, err_direct)
    a, b = via_gate.as_numpy(contract.OUT_AUDIO.name), direct.as_numpy(contract.OUT_AUDIO.name)
    assert a.shape == b.shape and a.size > 0
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)  # servers.SAME_PCM16_LSB
    info_gate, info_direct = (json.loads(r.as_numpy(contract.OUT_INFO.name)[0]) for r in (via_gate, direct))
    assert sorted(info_gate) == sorted(info_direct) and info_gate["final"] is True
    assert info_gate["request_id"] == "off-gate-1"
    for inputs, parameters in ((_inputs("参数。", 1, 20, temperature=9.0), None),
                               (_inputs("参数。", 1, 20), {"priorty": "batch"})):
        _, e_gate = _offline(url, contract.MODEL_OFFLINE, inputs, parameters=parameters)
        _, e_direct = _offline(url, contract.MODEL_OFFLINE_ENTRY, inputs, parameters=parameters)
        assert e_gate is not None and e_direct is not None
        assert (e_gate.status(), e_gate.message()) == (e_direct.status(), e_direct.message())
        assert e_gate.message().startswith("[invalid"), e_gate.message()


@pytest.mark.parametrize(("inputs", "parameters", "expect"), [
    (lambda: _inputs("参数。", 1, 20, temperature=9.0), None, "[invalid:temperature]"),
    (lambda: _inputs("参数。", 1, 20), {"priorty": "batch"}, "unknown request parameter"),
    (lambda: _inputs("", 1, 20), None, "[invalid"),
], ids=["bad-input", "unknown-parameter", "empty-text"])
def test_errors_come_through_the_gate_as_the_entry_model_sends_them(triton_server: Any, inputs: Any,
                                                                     parameters: Any, expect: str) -> None:
    """A refused request: the same error (tag, message) through the gate as straight from the
    entry model, and the stream ends; request parameters are forwarded (the misspelt one is
    refused by the entry model, behind the gate)."""
    url = triton_server.grpc_url
    _, err_gate = _stream(url, contract.MODEL_STREAM, inputs(), parameters=parameters)
    _, err_direct = _stream(url, contract.MODEL_STREAM_ENTRY, inputs(), parameters=parameters)
    assert err_gate is not None and expect in err_gate, err_gate
    assert err_gate == err_direct


def test_a_client_cancel_passes_through_the_gate(triton_server: Any) -> None:
    """A client that cancels its stream mid-way: the entry model behind the gate sees the
    cancel (its request ends 'cancelled' in the log) and the engine lets the sequence go."""
    url, port = triton_server.grpc_url, triton_server.metrics_port
    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer(contract.MODEL_STREAM, _inputs("一直说下去，不要停。", 3, 2000),
                              request_id="gate-cancel-1", enable_empty_final_response=True)
    result, error = got.get(timeout=60)
    assert error is None and result.as_numpy(contract.OUT_AUDIO.name) is not None
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 30
    finished: dict[str, Any] = {}
    while time.monotonic() < deadline and not finished:
        for line in triton_server.log_path.read_text(errors="replace").splitlines():
            if '"gate-cancel-1"' in line and '"request_finished"' in line:
                finished = json.loads(line[line.index("{"):])
        time.sleep(0.1)
    assert finished.get("status") == "cancelled" and finished.get("model") == contract.MODEL_STREAM, finished
    while time.monotonic() < deadline and metric(port, "tts_engine_active_sequences") > 0:
        time.sleep(0.05)
    assert metric(port, "tts_engine_active_sequences") == 0


# --- without the gate ------------------------------------------------------------------------------
def _serve(artifacts: Artifacts, work: Path, **entry: Any) -> Iterator[TritonServer]:
    """A started server over ``artifacts`` with the cpu profile's ``[entry]`` changed; stopped after."""
    srv = serve_profile(artifacts, work, entry=entry)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def ungated(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A server rendered with ``[entry] gate = false`` and 2 stream slots."""
    yield from _serve(small_artifacts, tmp_path_factory.mktemp("ungated"), gate=False, max_concurrent_streams=2)


def test_without_the_gate_the_python_entry_model_refuses_first_and_counts(ungated: TritonServer) -> None:
    """``gate = false``: no gate library is built, ``chattts`` is the Python model, and a burst
    of 6 long requests on 2 slots gets 4 refusals, each before the first accepted stream ends,
    counted in tts_rejected_total."""
    assert not (ungated.build_dir / "backends" / contract.GATE_BACKEND).exists()
    url = f"127.0.0.1:{ungated.grpc_port}"
    index = grpcclient.InferenceServerClient(url).get_model_repository_index(headers=grpc_headers(ungated.admin_token))
    assert {m.name for m in index.models} == set(contract.models(gate=False))
    before = metric(ungated.metrics_port, "tts_rejected_total", model=contract.MODEL_STREAM, reason="busy")
    outcome: dict[int, tuple[float, str | None]] = {}
    t0 = time.perf_counter()

    def one(i: int) -> None:
        _, err = _stream(url, contract.MODEL_STREAM, _inputs("没有网关。", 5, 400), request_id=f"ungated-{i}")
        outcome[i] = (time.perf_counter() - t0, err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    busy = [(t, e) for t, e in outcome.values() if e is not None]
    ok = [t for t, e in outcome.values() if e is None]
    assert len(ok) == 2 and len(busy) == 4 and all("server busy: 2 streams" in e for _, e in busy), outcome
    assert max(t for t, _ in busy) < min(ok)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(ungated.metrics_port, "tts_rejected_total",
                                                  model=contract.MODEL_STREAM, reason="busy") - before < 4:
        time.sleep(0.05)
    assert metric(ungated.metrics_port, "tts_rejected_total", model=contract.MODEL_STREAM, reason="busy") - before == 4


# --- the gate's refusals -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_slot(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A server with the gate and 1 stream slot."""
    yield from _serve(small_artifacts, tmp_path_factory.mktemp("one-slot"), max_concurrent_streams=1)


def test_the_gates_refusals_are_counted_and_logged_with_their_request_ids(one_slot: TritonServer) -> None:
    """The one slot held by a long stream: requests whose ids hold quotes, backslashes, Chinese
    and an emoji are refused "busy" by the gate, counted under stage="gate", and logged once
    each as request_rejected JSON lines that give the ids back exactly."""
    url, port = f"127.0.0.1:{one_slot.grpc_port}", one_slot.metrics_port
    holder = grpcclient.InferenceServerClient(url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    holder.start_stream(callback=lambda result, error: got.put((result, error)))
    holder.async_stream_infer(contract.MODEL_STREAM, _inputs("占住唯一的位置。", 3, 2000), request_id="holder",
                              enable_empty_final_response=True)
    try:
        first, error = got.get(timeout=60)  # audio: the slot is taken
        assert error is None and first.as_numpy(contract.OUT_AUDIO.name) is not None
        before = metric(port, "tts_rejected_total", model=contract.MODEL_STREAM, reason="busy", stage="gate")
        ids = ['q"uote\\back', "中文请求", "emoji-\U0001f600", "tab\there"]
        for rid in ids:
            _, err = _stream(url, contract.MODEL_STREAM, _inputs("被拒绝。", 1, 8), request_id=rid)
            assert err is not None and "[busy] server busy: 1 stream already live" in err, err
        deadline = time.monotonic() + 10
        logged: list[str] = []
        while time.monotonic() < deadline:
            lines = one_slot.log_path.read_text(errors="replace").splitlines()
            events = [json.loads(line[line.index("{"):]) for line in lines if '"request_rejected"' in line]
            logged = [e["request_id"] for e in events if e.get("stage") == "gate"]
            if len(logged) >= len(ids):
                break
            time.sleep(0.05)
        assert logged == ids
        assert metric(port, "tts_rejected_total", model=contract.MODEL_STREAM, reason="busy", stage="gate") \
            - before == len(ids)
    finally:
        holder.stop_stream(cancel_requests=True)
        holder.close()


# --- the admission watch -----------------------------------------------------------------------------
def _subscribe(url: str) -> tuple[grpcclient.InferenceServerClient, queue.Queue[tuple[Any, Any]]]:
    """A subscription to the admission watch; its reports (``full`` per door) arrive on the queue."""
    client = grpcclient.InferenceServerClient(url)
    reports: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: reports.put((result, error)))
    client.async_stream_infer(contract.MODEL_ADMISSION, [])
    return client, reports


def _next_report(reports: queue.Queue[tuple[Any, Any]]) -> list[bool]:
    result, error = reports.get(timeout=30)
    assert error is None, error
    return [bool(x) for x in result.as_numpy(contract.ADM_FULL.name)]


def _until_report(reports: queue.Queue[tuple[Any, Any]], want: list[bool]) -> list[list[bool]]:
    """Reports up to and including the first that is ``want`` (30 s at most each); the
    heartbeat repeats reports, so one that changed nothing may come in between."""
    seen = [_next_report(reports)]
    while seen[-1] != want:
        seen.append(_next_report(reports))
    return seen


def _queued(reports: queue.Queue[tuple[Any, Any]]) -> list[list[bool]]:
    """The reports that have arrived and not been read (heartbeats among them)."""
    out = []
    while not reports.empty():
        out.append(_next_report(reports))
    return out


def _follow(url: str, steps: Any, **kwargs: Any) -> Any:
    """``await steps(watch)`` with a started :class:`AdmissionWatch` on ``url`` (closed after),
    in an event loop of its own; its result."""
    import asyncio

    from chattts_serving.client.admission_watch import AdmissionWatch

    async def main() -> Any:
        watch = AdmissionWatch(url, **kwargs)
        watch.start()
        try:
            return await steps(watch)
        finally:
            await watch.close()

    return asyncio.run(main())


async def _until(pred: Any, timeout_s: float = 60.0) -> bool:
    """Poll ``pred`` in the event loop until it is true (True) or ``timeout_s`` passed."""
    import asyncio

    for _ in range(int(timeout_s / 0.05)):
        if pred():
            return True
        await asyncio.sleep(0.05)
    return bool(pred())


def test_the_admission_watch_reports_a_door_filling_and_freeing(one_slot: TritonServer) -> None:
    """A subscriber gets the doors' state at once ([chattts, chattts_offline] not full), a report
    as the one stream slot is taken and another as it is given back, and in between only that
    state again (the heartbeat); a second subscriber gets the current state at once; the
    Python follower (:class:`AdmissionWatch`) reads the same; cancelled subscriptions leave the
    server serving."""
    url = f"127.0.0.1:{one_slot.grpc_port}"
    watcher, reports = _subscribe(url)
    try:
        _until_report(reports, [False, False])  # a slot an earlier test held may still be going back
        holder = grpcclient.InferenceServerClient(url)
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        holder.start_stream(callback=lambda result, error: got.put((result, error)))
        holder.async_stream_infer(contract.MODEL_STREAM, _inputs("占住位置。", 3, 2000),
                                  enable_empty_final_response=True)
        assert set(map(tuple, _until_report(reports, [True, False])[:-1])) <= {(False, False)}  # heartbeats
        second, second_reports = _subscribe(url)
        assert _next_report(second_reports) == [True, False]

        async def until_full(watch: Any) -> dict[str, Any]:
            await _until(watch.full)
            return dict(watch.describe())

        assert _follow(url, until_full) == {"addresses": 1, "watched": 1, "unreachable": 0,
                                            "full": {contract.MODEL_STREAM: True, contract.MODEL_OFFLINE: False}}
        result, error = got.get(timeout=60)
        assert error is None and result.as_numpy(contract.OUT_AUDIO.name) is not None  # the holder streams
        assert set(map(tuple, _queued(reports))) <= {(True, False)}  # audio flowing is no change of the door
        holder.stop_stream(cancel_requests=True)
        holder.close()
        assert set(map(tuple, _until_report(reports, [False, False])[:-1])) <= {(True, False)}
        assert set(map(tuple, _until_report(second_reports, [False, False])[:-1])) <= {(True, False)}
        second.stop_stream(cancel_requests=True)
        second.close()
    finally:
        watcher.stop_stream(cancel_requests=True)
        watcher.close()
    _, err = _stream(url, contract.MODEL_STREAM, _inputs("还在服务。", 2, 8))
    assert err is None


def test_the_watch_repeats_its_report_and_a_follower_forgets_a_silent_subscription(
        one_slot: TritonServer, caplog: pytest.LogCaptureFixture) -> None:
    """Without any change the watch sends its report again every ADMISSION_HEARTBEAT_S; a
    follower that hears nothing for its ``stale_after_s`` (here shorter than the heartbeat)
    says so, forgets the report and subscribes again."""
    import asyncio
    import logging

    url = f"127.0.0.1:{one_slot.grpc_port}"
    watcher, reports = _subscribe(url)
    try:
        first = _until_report(reports, [False, False])
        assert _next_report(reports) == first[-1]  # nothing changed: the heartbeat
    finally:
        watcher.stop_stream(cancel_requests=True)
        watcher.close()
    caplog.set_level(logging.WARNING, logger="chattts_serving.client.admission")

    async def watched_over_time(watch: Any) -> list[int]:
        seen = []
        for _ in range(60):
            seen.append(int(watch.describe()["watched"]))
            await asyncio.sleep(0.05)
        return seen

    seen = _follow(url, watched_over_time, retry_s=0.05, stale_after_s=0.5)
    assert 1 in seen and caplog.text.count(f"no report from {url} for 0.5 s") >= 2, (seen, caplog.text)


def test_without_the_gate_the_watch_reads_nothing_full(ungated: TritonServer, caplog: pytest.LogCaptureFixture) -> None:
    """``gate = false`` has no admission watch model: the follower finds none, says so once,
    reports no live subscription and never full, so a gateway sends every request on to Triton."""
    import logging

    caplog.set_level(logging.INFO, logger="chattts_serving.client.admission")
    said = f"has no {contract.MODEL_ADMISSION} model"

    async def until_told(watch: Any) -> dict[str, Any]:
        await _until(lambda: said in caplog.text)
        return dict(watch.describe())

    assert _follow(f"127.0.0.1:{ungated.grpc_port}", until_told, missing_retry_s=60) == {
        "addresses": 1, "watched": 0, "unreachable": 0,
        "full": {contract.MODEL_STREAM: False, contract.MODEL_OFFLINE: False}}
    assert caplog.text.count(said) == 1, caplog.text


def test_a_watched_server_stops_without_its_exit_timeout_and_is_watched_again_after_restart(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """A follower subscribed (as every gateway is) does not hold the server at shutdown: the
    watch ends its subscriptions as the gates unload, so the watch model unloads and Triton
    stops without "Exit timeout expired" (an open subscription would hold the model to the
    timeout). The follower reads nothing full meanwhile and subscribes again once the server
    is back on the same port."""
    import asyncio

    server = _serve(small_artifacts, tmp_path, max_concurrent_streams=1)
    srv = next(server)

    async def stop_and_restart(watch: Any) -> list[dict[str, Any]]:
        states = []
        await _until(lambda: watch.describe()["watched"] == 1)
        states.append(watch.describe())
        await asyncio.to_thread(srv.stop)
        states.append(watch.describe())
        await asyncio.to_thread(srv.start)
        await _until(lambda: watch.describe()["watched"] == 1)
        states.append(watch.describe())
        return states

    try:
        states = _follow(f"127.0.0.1:{srv.grpc_port}", stop_and_restart, retry_s=0.2)
        log = srv.log_path.read_text(errors="replace")
    finally:
        next(server, None)  # stops the restarted server
    assert "Signal (2) received" in log and f"successfully unloaded '{contract.MODEL_ADMISSION}'" in log
    assert "Exit timeout expired" not in log, log[-3000:]
    assert [s["watched"] for s in states] == [1, 0, 1] and not any(s["full"][contract.MODEL_STREAM] for s in states)
