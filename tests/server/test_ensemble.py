"""The ensemble door, ``chattts_ensemble`` (``platform: "ensemble"``), against a real tritonserver:
the same audio as ``chattts`` at full lookahead (greedy, Chinese and English) and as the offline
decode, 16 concurrent streams each complete, in order and equal to its solo run, refusals that
name the ``chattts`` door, the BLS door's errors for bad input, HTTP ``generate_stream``, and
on a server with one ensemble slot: busy at once, a cancel that frees the engine sequence, a
deadline that ends the stream with an explicit error."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from chattts_serving import contract
from chattts_serving.audio.reference import encode_spk_smp
from chattts_serving.client import ChunkOrder, SynthesisRequest, synthesize_stream
from chattts_serving.client.common import StreamPart
from chattts_serving.errors import ErrorKind, decode_tagged
from chattts_serving.runtime import Artifacts
from tests.support.requests import BAD_INPUTS, GREEDY, entry_input
from tests.support.requests import stream as bls_stream
from tests.support.servers import log_events, metric, serve_profile, wait_until


@dataclass
class Run:
    """One ensemble stream as it arrived: chunk indices in arrival order, audio by index, the
    info objects, the error (None when it completed)."""

    arrival: list[int] = field(default_factory=list)
    chunks: dict[int, np.ndarray] = field(default_factory=dict)
    infos: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def audio(self) -> np.ndarray:
        assert sorted(self.chunks) == list(range(len(self.chunks))), f"gaps in {sorted(self.chunks)}"
        return np.concatenate([self.chunks[i] for i in range(len(self.chunks))]) if self.chunks else np.zeros(0)


def ensemble(url: str, inputs: list[grpcclient.InferInput], timeout_s: float = 120.0, request_id: str = "",
             cancel_after: int | None = None) -> Run:
    """One stream on chattts_ensemble; ``cancel_after``: cancel once this many chunks arrived."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    run = Run()
    cancelled = False
    try:
        client.async_stream_infer(contract.MODEL_ENSEMBLE, inputs, enable_empty_final_response=True,
                                  request_id=request_id)
        while True:
            result, error = q.get(timeout=timeout_s)
            if error is not None:
                run.error = str(error)
                break
            names = {o.name for o in result.get_response().outputs}
            if contract.OUT_CHUNK_INDEX.name in names:
                index = int(result.as_numpy(contract.OUT_CHUNK_INDEX.name).reshape(-1)[0])
                assert index not in run.chunks, f"chunk {index} twice"
                run.arrival.append(index)
                run.chunks[index] = result.as_numpy(contract.OUT_AUDIO.name).reshape(-1)
            if contract.OUT_INFO.name in names:
                run.infos.append(json.loads(result.as_numpy(contract.OUT_INFO.name).reshape(-1)[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            if cancel_after is not None and len(run.chunks) >= cancel_after:
                client.stop_stream(cancel_requests=True)
                cancelled = True
                break
    finally:
        if not cancelled:
            client.stop_stream()
        client.close()
    return run


def _request(text: str, seed: int, tokens: int, lookahead: int | None = None,
             greedy: bool = False) -> list[grpcclient.InferInput]:
    out = [entry_input("text", text), entry_input("seed", seed), entry_input("voice", str(seed)),
           entry_input("max_new_tokens", tokens), entry_input("min_new_tokens", tokens)]
    if lookahead is not None:
        out.append(entry_input("lookahead_tokens", lookahead))
    if greedy:
        out.append(entry_input("temperature", GREEDY))
    return out


def _offline(url: str, inputs: list[grpcclient.InferInput]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(contract.MODEL_OFFLINE, inputs).as_numpy(contract.OUT_AUDIO.name).reshape(-1)
    finally:
        client.close()


@pytest.mark.parametrize("text", ["你好，欢迎使用流式语音合成服务。", "Streaming speech from one ensemble, in order."],
                         ids=["zh", "en"])
def test_full_lookahead_stream_equals_the_bls_stream_and_the_offline_decode(triton_server, text: str) -> None:
    """Greedy, at a lookahead of the vocoder's receptive field: the ensemble's chunks, in index
    order, are the BLS door's stream and the offline decode of the same request."""
    rf = triton_server.artifacts.receptive_field_tokens("hidden")
    req = _request(text, 5, 150, lookahead=rf, greedy=True)
    run = ensemble(triton_server.grpc_url, req)
    assert run.error is None, run.error
    bls, err = bls_stream(triton_server.grpc_url, req)
    assert err is None, err
    bls_audio = np.concatenate(bls)
    offline = _offline(triton_server.grpc_url, req)
    assert len(run.chunks) > 2
    assert run.audio.shape == bls_audio.shape == offline.shape == (contract.samples_for_tokens(150),)
    assert np.abs(run.audio - bls_audio).max() <= 1e-4
    assert np.abs(run.audio - offline).max() <= 1e-4
    header, final = run.infos[0], run.infos[-1]
    assert header["final"] is False and header["segments"] == 1 and header["vocoder"] == "hidden"
    assert final["final"] is True and final["tokens"] == 150 and final["stop_reason"] == "max_new_tokens"
    assert final["audio_s"] == pytest.approx(run.audio.size / contract.SAMPLE_RATE_HZ, abs=1e-5)
    assert header["normalized_text"] == final["normalized_text"] and len(header["normalized_text"]) == 1


def test_sixteen_concurrent_streams_each_complete_in_order_and_equal_their_solo_run(triton_server) -> None:
    """16 streams at once (as many as the ensemble admits on the cpu profile), different texts,
    seeds and lengths, default lookahead: each stream's chunks have the indices 0..n-1 once, in
    order of arrival, and the stream equals its solo run. Arrival order is recorded (Triton 2.51
    keeps it with one vocoder instance; the index is what a client relies on)."""
    texts = ["并发测试的第一句话。", "第二个并发流。", "Third concurrent stream.", "语音合成需要低延迟。"]
    reqs = [(texts[i % 4], 20 + i, 40 + 7 * i) for i in range(16)]
    solo = []
    for text, seed, n in reqs:
        run = ensemble(triton_server.grpc_url, _request(text, seed, n))
        assert run.error is None, run.error
        solo.append(run.audio)
    runs: list[Run | None] = [None] * len(reqs)

    def one(i: int) -> None:
        runs[i] = ensemble(triton_server.grpc_url, _request(*reqs[i]), timeout_s=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for i, r in enumerate(runs):
        assert r is not None and r.error is None, (i, r and r.error)
        assert sorted(r.arrival) == list(range(len(r.arrival)))
        assert r.arrival == sorted(r.arrival), f"stream {i} arrived out of order: {r.arrival}"
        assert r.audio.shape == solo[i].shape, (i, r.audio.shape, solo[i].shape)
        np.testing.assert_allclose(r.audio, solo[i], atol=1e-3, err_msg=f"stream {i} differs from its solo run")
        assert r.audio.size == contract.samples_for_tokens(reqs[i][2])


def test_the_client_library_puts_chunks_in_index_order(triton_server) -> None:
    """chattts_serving.client streams the ensemble with model=; ChunkOrder holds a chunk until
    the ones before it came and refuses a stream with a gap."""
    req = SynthesisRequest(text="客户端按序号播放。", voice="4", seed=4, max_new_tokens=80, min_new_tokens=80)
    res = synthesize_stream(triton_server.grpc_url, req, model=contract.MODEL_ENSEMBLE)
    assert res.audio.size == contract.samples_for_tokens(80) and res.info["final"] is True
    order = ChunkOrder()
    parts = [StreamPart(np.full(2, i, np.float32), None, i) for i in (1, 0, 3, 2)]
    assert [p.index for part in parts for p in order.add(part)] == [0, 1, 2, 3]
    assert order.out_of_order == 2
    order.check_complete()
    gap = ChunkOrder()
    gap.add(StreamPart(np.zeros(1, np.float32), None, 1))
    with pytest.raises(Exception, match="without chunk 0"):
        gap.check_complete()


def test_the_cli_streams_from_the_ensemble(triton_server, tmp_path: Path) -> None:
    from chattts_serving.client.cli import main
    from chattts_serving.client.common import read_wav

    out, sse = tmp_path / "ensemble.wav", tmp_path / "ensemble-sse.wav"
    args = ["--model", contract.MODEL_ENSEMBLE, "--text", "命令行。", "--max-new-tokens", "30",
            "--min-new-tokens", "30"]
    assert main(["--url", triton_server.grpc_url, *args, "--out", str(out)]) == 0
    audio, rate = read_wav(out)
    assert rate == contract.SAMPLE_RATE_HZ and audio.size == contract.samples_for_tokens(30)
    # the same request over HTTP generate_stream: the same audio, its chunks put in order by index
    assert main(["--url", triton_server.http_url, "--protocol", "sse", *args, "--out", str(sse)]) == 0
    assert np.array_equal(read_wav(sse)[0], audio)
    # the one-call HTTP door is chattts_offline's: the ensemble only streams
    assert main(["--protocol", "http", "--model", contract.MODEL_ENSEMBLE, "--text", "x", "--out", str(out)]) == 2


REFUSED = [
    ("refine_text", [entry_input("refine_text", True)], "refine_text"),
    ("segmentation chattts", [entry_input("segmentation", "chattts")], "segmentation"),
    ("codes vocoder", [entry_input("vocoder", "codes")], "vocoder"),
    ("reference recording", [entry_input("reference_audio", np.zeros(24000, np.float32) + 0.01, "FP32"),
                             entry_input("reference_text", "这是参考录音。")], "reference_audio"),
    ("spk_smp", [entry_input("spk_smp", encode_spk_smp(np.ones((30, contract.NUM_VQ), np.int32))),
                 entry_input("reference_text", "参考。")], "spk_smp"),
    ("several sentence segments", [], "text"),
]


@pytest.mark.parametrize("case, extra, param", REFUSED, ids=[c[0] for c in REFUSED])
def test_what_only_chattts_does_is_refused_naming_the_chattts_door(triton_server, case: str, extra: list,
                                                                  param: str) -> None:
    text = "今天天气很好。" if extra else "。".join(["这是一句足够长的句子，用来让文本被切成好几个分段"] * 8) + "。"
    request_id = f"refused-{uuid.uuid4().hex[:8]}"
    run = ensemble(triton_server.grpc_url, [entry_input("text", text), *extra], request_id=request_id)
    assert run.error is not None and not run.chunks, case
    tag = decode_tagged(run.error)
    assert tag.kind == ErrorKind.INVALID, run.error
    assert tag.param == param and f"send this request to {contract.MODEL_STREAM}" in tag.message, run.error

    def logged() -> bool:  # one request_rejected line under the client's request id
        lines = Path(triton_server.log_path).read_text(errors="replace").splitlines()
        return any(request_id in line and '"request_rejected"' in line and contract.MODEL_ENSEMBLE in line
                   for line in lines)
    assert wait_until(logged, 10)


@pytest.mark.parametrize("case, inputs, fragment", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_the_errors_of_the_bls_door(triton_server, case: str, inputs: list, fragment: str) -> None:
    """The ensemble's first step parses a request with chattts' own parser: the same kind,
    input and message (Triton's own checks of dtype and shape word theirs alike)."""
    try:
        run = ensemble(triton_server.grpc_url, inputs, timeout_s=60)
        ours = run.error
        assert not run.chunks
    except grpcclient.InferenceServerException as exc:
        ours = str(exc)
    try:
        _, theirs = bls_stream(triton_server.grpc_url, inputs, timeout_s=60)
    except grpcclient.InferenceServerException as exc:
        theirs = str(exc)
    assert ours and theirs
    assert "Traceback" not in ours and fragment.lower() in ours.lower(), ours
    a, b = decode_tagged(ours), decode_tagged(theirs)
    assert (a.kind, a.param) == (b.kind, b.param), (ours, theirs)
    if a.kind is not None:
        assert a.message == b.message


def test_a_stream_without_a_request_id_is_logged_under_the_generated_one(triton_server) -> None:
    """The front end generates the id (it is in ``info``); the engine's and the vocoder step's
    lines of that stream carry it too, not the empty id Triton gives the steps."""
    run = ensemble(triton_server.grpc_url, _request("日志里的编号。", 6, 30))
    assert run.error is None
    rid = run.infos[0]["request_id"]
    assert rid

    def lines() -> set[tuple[str, str]]:
        return {(e["event"], e["model"]) for e in log_events(triton_server.log_path) if e.get("request_id") == rid
                or rid in e.get("request_ids", [])}

    want = {("request_accepted", contract.MODEL_ENSEMBLE), ("sequence_finished", contract.MODEL_ENGINE),
            ("vocoder_batch", contract.MODEL_ENSEMBLE_VOCODER)}
    assert wait_until(lambda: want <= lines(), 10), lines()


def test_http_generate_stream_serves_the_ensemble(triton_server) -> None:
    body = json.dumps({"text": "网页流式输出。", "seed": 2, "max_new_tokens": 60, "min_new_tokens": 60}).encode()
    req = urllib.request.Request(f"http://{triton_server.http_url}/v2/models/{contract.MODEL_ENSEMBLE}/generate_stream",
                                 data=body, headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    indices = [int(np.reshape(e[contract.OUT_CHUNK_INDEX.name], -1)[0]) for e in events
               if contract.OUT_CHUNK_INDEX.name in e]
    assert indices == list(range(len(indices))) and len(indices) >= 2
    assert sum(len(e[contract.OUT_AUDIO.name]) for e in events) == contract.samples_for_tokens(60)


# --- one ensemble slot ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_slot(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server whose ensemble door admits one stream."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("ensemble-one"),
                        ensemble={"max_concurrent_streams": 1})
    try:
        yield srv
    finally:
        srv.stop()


def _gauge(port: int, name: str) -> float:
    """The sum of ``name``'s series; a scrape without the series fails (the engine publishes it
    from its start), rather than reading as 0."""
    return metric(port, name, require=True)


def test_a_full_ensemble_door_answers_busy_at_once_and_serves_again_after(one_slot) -> None:
    url = f"127.0.0.1:{one_slot.grpc_port}"
    held: dict[str, Run] = {}

    def hold() -> None:  # a long stream that reports its first chunk
        held["run"] = ensemble(url, _request("长时间占用的流。", 3, 1500), timeout_s=300)

    t = threading.Thread(target=hold)
    t.start()
    assert wait_until(lambda: _gauge(one_slot.metrics_port, "tts_engine_active_sequences") == 1, 60)
    refused = ensemble(url, _request("被拒绝的请求。", 4, 20))
    still_live = _gauge(one_slot.metrics_port, "tts_engine_active_sequences") == 1
    t.join(300)
    assert still_live  # refused while the held stream was generating, not after it
    assert refused.error is not None and not refused.chunks
    tag = decode_tagged(refused.error)
    assert tag.kind == ErrorKind.BUSY and tag.message == "server busy: 1 stream already live", refused.error
    assert held["run"].error is None and held["run"].audio.size == contract.samples_for_tokens(1500)
    after = ensemble(url, _request("之后又能服务。", 4, 20))
    assert after.error is None and after.audio.size == contract.samples_for_tokens(20)


CANCELS = 16
"""Cancels in a row: one that lands while a window is between two steps must be seen too (with
the vocoder as a dynamically batched step of its own, about 1 cancel in 13 was lost there)."""


def test_a_cancel_frees_the_engine_sequence_and_the_slot(one_slot) -> None:
    """A client's cancel reaches the engine through the ensemble's vocoder step (the next
    progress tick or window after it, every stream.emit_tokens = 4 tokens), not at the
    sequence's end, for every one of :data:`CANCELS` streams cancelled at their second chunk."""
    url, port = f"127.0.0.1:{one_slot.grpc_port}", one_slot.metrics_port
    late = []
    for i in range(CANCELS):
        run = ensemble(url, _request("取消测试的句子。", 7 + i, 2000), cancel_after=2)
        assert run.error is None and len(run.chunks) >= 2
        steps_at_cancel = _gauge(port, "tts_engine_decode_steps_total")
        assert wait_until(lambda: _gauge(port, "tts_engine_active_sequences") == 0, 30)
        late.append(_gauge(port, "tts_engine_decode_steps_total") - steps_at_cancel)
    # A tick every 4 steps; the hop to the vocoder step takes a few ms, i.e. a few steps of this
    # small model (~1 ms each; 0 to 5 measured here), under one of the full one. The bound leaves
    # room for a loaded machine and still proves each sequence left long before its 2000 tokens.
    print(f"\ndecode steps between each client's cancel and its sequence leaving: {late}")
    assert max(late) < 200, f"{late}: decode steps after each cancel (each sequence had 2000 tokens to go)"
    events = log_events(one_slot.log_path)
    assert sum(e["event"] == "ensemble_cancelled" for e in events) >= CANCELS  # the vocoder step saw each
    ended = [e for e in events if e["event"] == "sequence_finished" and e["status"] == "cancelled"]
    assert len(ended) == CANCELS and all(e["tokens"] < 2000 for e in ended)  # the engine ended each early
    after = ensemble(url, _request("取消之后。", 8, 20))  # the slot is free again
    assert after.error is None and after.audio.size == contract.samples_for_tokens(20)


def test_closing_an_http_stream_frees_the_engine_sequence(one_slot) -> None:
    """The same for HTTP ``generate_stream``: a client that closes its connection after the
    first event is a cancel (Triton marks the request when a write to the connection fails),
    and the engine's sequence leaves long before its 2000 tokens."""
    port = one_slot.metrics_port
    body = json.dumps({"text": "网页流式取消。", "seed": 5, "voice": "5", "max_new_tokens": 2000,
                       "min_new_tokens": 2000}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{one_slot.http_port}/v2/models/{contract.MODEL_ENSEMBLE}"
                                 "/generate_stream", data=body, headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=120)
    first = resp.readline()
    steps_at_close = _gauge(port, "tts_engine_decode_steps_total")
    resp.close()
    assert first.startswith(b"data: ") and contract.OUT_AUDIO.name.encode() in first
    assert wait_until(lambda: _gauge(port, "tts_engine_active_sequences") == 0, 30)
    steps = _gauge(port, "tts_engine_decode_steps_total") - steps_at_close
    print(f"\ndecode steps between the connection's close and the sequence leaving: {steps:.0f}")
    assert steps < 400, f"{steps} decode steps after the close (the sequence had 2000 tokens to go)"
    after = ensemble(f"127.0.0.1:{one_slot.grpc_port}", _request("关闭之后。", 8, 20))
    assert after.error is None and after.audio.size == contract.samples_for_tokens(20)


def test_a_deadline_ends_the_stream_with_an_explicit_error(one_slot) -> None:
    url, port = f"127.0.0.1:{one_slot.grpc_port}", one_slot.metrics_port
    t0 = time.monotonic()
    run = ensemble(url, [*_request("超时测试。", 9, 2000), entry_input("timeout_s", 0.5)])
    assert run.error is not None, "a 2000-token stream ended within its 0.5 s deadline"
    assert decode_tagged(run.error).kind == ErrorKind.DEADLINE, run.error
    assert time.monotonic() - t0 < 60
    assert wait_until(lambda: _gauge(port, "tts_engine_active_sequences") == 0, 30)
    after = ensemble(url, _request("超时之后。", 8, 20))
    assert after.error is None
