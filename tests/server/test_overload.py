"""Overload, cancellation, priorities, deadlines and degradation against a real tritonserver
whose profile has small limits (small generated model)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from chattts_serving import contract
from chattts_serving.deploy.server import TritonServer
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.admission import DEGRADED_GROWTH
from tests.support.servers import serve_profile
from tests.support.streams import Stream

MAX_STREAMS = 4
ENGINE_BATCH = 2
OFFLINE_THREADS = 2
DEGRADED_ASKED_TOKENS = 300
STREAM_TOKENS = 1000


def _info(srv: TritonServer) -> dict[str, Any]:
    return {"grpc": f"127.0.0.1:{srv.grpc_port}", "metrics": srv.metrics_port, "log": srv.log_path, "server": srv}


@pytest.fixture(scope="module")
def tight(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose entry model admits 4 streams, whose one chattts_offline instance runs 2
    requests at once, and whose engine decodes 2 at a time."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("tight"),
                 entry={"max_concurrent_streams": MAX_STREAMS, "offline_threads": OFFLINE_THREADS},
                 engine={"max_batch_size": ENGINE_BATCH, "batch_rows": ENGINE_BATCH})
    try:
        yield _info(srv)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def degrading(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose degradation thresholds are forced low: on at 3 live streams, off at 1
    (TTFA never decides here: tests/unit/test_lifecycle.py covers that criterion)."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("degrading"),
                 degrade={"live_high": 3, "live_low": 1, "ttfa_p95_high_s": 1000.0, "ttfa_p95_low_s": 999.0,
                          "min_dwell_s": 0.0})
    try:
        yield _info(srv)
    finally:
        srv.stop()


STALL_S = 2.0
HOG_TOKENS = 2000
TWO_ROWS_WAITING = 5


@pytest.fixture(scope="module")
def two_rows(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose engine decodes two sequences at a time, one of them at most of batch
    priority, and queues TWO_ROWS_WAITING requests (what its entry admits: 3 streams, 2
    offline requests); whose streams are taken for stalled (the engine dead) after STALL_S
    without a response; a queued one hears from the engine every STALL_S / 4."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("two-rows"),
                 entry={"stall_timeout_s": STALL_S, "offline_threads": 2,
                        "max_concurrent_streams": 3},
                 engine={"max_batch_size": 2, "batch_rows": 1, "waiting_heartbeat_s": STALL_S / 4,
                         "max_waiting": TWO_ROWS_WAITING})
    try:
        yield _info(srv)
    finally:
        srv.stop()




def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tts_") or line.startswith("nv_inference_count"):
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
    return out


def gauge(port: int, name: str) -> float:
    return sum(v for k, v in metrics(port).items() if k.startswith(name + "{"))


def wait_for(pred, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def tree_rss(server: TritonServer) -> int:
    assert server.proc is not None
    root = psutil.Process(server.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def _rejected_ids(log: Path, tag: str) -> set[str]:
    """Request ids of the ``request_rejected`` lines for ``chattts`` in the server log whose id
    holds ``tag`` (each line once: a repeated id fails the caller's comparison by count)."""
    ids: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if '"request_rejected"' in line and tag in line:
            event = json.loads(line[line.index("{"):])
            if event.get("model") == contract.MODEL_STREAM and event.get("reason") == "busy":
                ids.append(event["request_id"])
    return set(ids) if len(ids) == len(set(ids)) else set()


def _rejected_busy(port: int, model: str) -> float:
    return sum(v for k, v in metrics(port).items()
               if k.startswith("tts_rejected_total") and 'reason="busy"' in k and f'model="{model}"' in k)


def test_overload_rejects_the_excess_at_once_and_completes_the_accepted(tight) -> None:
    """3 x MAX_STREAMS requests at once: MAX_STREAMS are accepted and complete, the rest get
    "busy" before any accepted stream ends. The accepted streams are long (STREAM_TOKENS
    decode steps, seconds on the small model) so that none can end, and free its slot for a
    late request of the burst, while the burst is still arriving on a loaded machine."""
    n = 3 * MAX_STREAMS
    rejected_before = _rejected_busy(tight["metrics"], contract.MODEL_STREAM)
    solo = Stream(tight["grpc"], "过载测试的句子。", 100, STREAM_TOKENS).start()
    solo.done.wait(60)
    solo.close()
    assert solo.error is None
    streams = [Stream(tight["grpc"], "过载测试的句子。", 100, STREAM_TOKENS) for _ in range(n)]
    for s in streams:  # connect first, then send all requests together
        s.client.start_stream(callback=lambda result, error, q=s.q: q.put((result, error)))
    tag = uuid.uuid4().hex[:8]
    for i, s in enumerate(streams):
        s.t0 = time.perf_counter()
        s.client.async_stream_infer(contract.MODEL_STREAM, s.inputs(), enable_empty_final_response=True,
                                    request_id=f"burst-{tag}-{i}")
        threading.Thread(target=s._read, daemon=True).start()
    for s in streams:
        assert s.done.wait(120)
        s.close()
    busy = [s for s in streams if s.error]
    ok = [s for s in streams if not s.error]
    assert len(ok) == MAX_STREAMS and len(busy) == n - MAX_STREAMS
    assert all("server busy" in (s.error or "") for s in busy), [s.error for s in busy]
    # every accepted stream completes with its solo audio; a rejection never waits for a slot
    # to free, i.e. every busy error arrives before the first accepted stream has finished
    for s in ok:
        np.testing.assert_allclose(s.audio, solo.audio, atol=1e-3)
    first_audio = min(s.first_audio_s for s in ok if s.first_audio_s is not None)
    first_end = min(s.end_s for s in ok if s.end_s is not None)
    slowest_reject = max(s.end_s for s in busy if s.end_s is not None)
    print(f"\nbusy errors after at most {slowest_reject * 1000:.1f} ms; first audio after {first_audio * 1000:.1f} ms,"
          f" first accepted stream done after {first_end * 1000:.1f} ms")
    assert slowest_reject < first_end
    assert gauge(tight["metrics"], "tts_engine_active_sequences") == 0
    assert wait_for(lambda: _rejected_busy(tight["metrics"], contract.MODEL_STREAM) - rejected_before == len(busy))
    # each refusal logged once (by the admission gate, after the burst settled), under its request id
    busy_ids = {f"burst-{tag}-{i}" for i, s in enumerate(streams) if s.error}
    assert wait_for(lambda: _rejected_ids(tight["log"], tag) == busy_ids, 10), _rejected_ids(tight["log"], tag)


def test_offline_refuses_at_once_when_its_instance_is_full(tight) -> None:
    """chattts_offline runs entry.offline_threads requests at once; more get 503 at
    once instead of waiting in Triton's queue behind utterances that take seconds."""
    import tritonclient.http as httpclient

    url = tight["grpc"].replace(str(tight["server"].grpc_port), str(tight["server"].http_port))
    before = _rejected_busy(tight["metrics"], contract.MODEL_OFFLINE)
    results: list[tuple[float, str | None]] = []

    def one(tokens: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=120)
        inputs = []
        for name, value, dtype in (("text", np.array(["离线。".encode()], np.object_), "BYTES"),
                                   ("max_new_tokens", np.array([tokens], np.int32), "INT32"),
                                   ("min_new_tokens", np.array([tokens], np.int32), "INT32")):
            inp = httpclient.InferInput(name, list(value.shape), dtype)
            inp.set_data_from_numpy(value)
            inputs.append(inp)
        t0 = time.perf_counter()
        try:
            client.infer(contract.MODEL_OFFLINE, inputs)
            results.append((time.perf_counter() - t0, None))
        except Exception as exc:  # the refusal is what is measured
            results.append((time.perf_counter() - t0, str(exc)))
        finally:
            client.close()

    long_ones = [threading.Thread(target=one, args=(1500,)) for _ in range(OFFLINE_THREADS)]
    for t in long_ones:
        t.start()
    # both long requests hold their slots (one engine sequence each) before the extra ones come
    assert wait_for(lambda: gauge(tight["metrics"], "tts_engine_active_sequences") >= OFFLINE_THREADS)
    extra = [threading.Thread(target=one, args=(10,)) for _ in range(3)]
    for t in extra:
        t.start()
    for t in long_ones + extra:
        t.join(180)
    refused = [(t, e) for t, e in results if e]
    done = [t for t, e in results if not e]
    assert len(done) == OFFLINE_THREADS and len(refused) == 3, results
    assert all("[busy] server busy: 2 requests already running" in e for _, e in refused), refused
    assert max(t for t, _ in refused) < min(done)  # refused while the accepted ones still ran
    assert wait_for(lambda: _rejected_busy(tight["metrics"], contract.MODEL_OFFLINE) - before == 3)


def test_cancelled_streams_leave_the_engine_and_leak_nothing(tight) -> None:
    port = tight["metrics"]
    s = Stream(tight["grpc"], "取消测试。", 7, 1500).start()
    assert s.first_chunk.wait(60) and s.error is None, s.error
    assert gauge(port, "tts_engine_active_sequences") == 1
    steps_at_cancel = gauge(port, "tts_engine_decode_steps_total")
    s.cancel()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == 0)
    steps_after = gauge(port, "tts_engine_decode_steps_total")
    # The cancel travels client -> Triton -> the BLS watcher (polls every 5 ms) -> a control
    # request -> the engine, which drops the sequence at its next step: a few ms, i.e. within
    # one step of the full-size model (~25 ms) but a few steps of this small one (~1 ms; 5
    # measured here). The bound leaves room for a loaded CI machine and still proves that the
    # sequence left long before its 1500 tokens.
    print(f"\ndecode steps between the client's cancel and the sequence leaving: {steps_after - steps_at_cancel:.0f}")
    assert steps_after - steps_at_cancel <= 64, "the engine kept decoding a cancelled stream"
    s.close()

    def burst(k: int) -> None:
        for i in range(k):
            st = Stream(tight["grpc"], "取消测试。", i, 400).start()
            st.first_chunk.wait(60)
            st.close()

    burst(20)  # warm-up: allocator high-water marks
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == 0)
    rss_before = tree_rss(tight["server"])
    burst(200)
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == 0)
    rss_after = tree_rss(tight["server"])
    growth_mb = (rss_after - rss_before) / 2**20
    print(f"\nRSS of the server tree: {rss_before / 2**20:.0f} MB -> {rss_after / 2**20:.0f} MB after 200 cancels")
    assert growth_mb < 0.05 * rss_before / 2**20, f"RSS grew by {growth_mb:.1f} MB"


def test_realtime_requests_get_audio_before_batch_requests_under_saturation(tight) -> None:
    """Both engine slots are held by long jobs; a batch request arrives, then a realtime one.
    When one long job is cancelled and frees a slot, the realtime request takes it first."""
    port = tight["metrics"]
    hogs = [Stream(tight["grpc"], "长时间占用。", 9, 1500, priority="batch") for _ in range(ENGINE_BATCH)]
    for s in hogs:
        s.start()
    for s in hogs:
        assert s.first_chunk.wait(60) and s.error is None, s.error
    batch = Stream(tight["grpc"], "批量请求。", 1, 40, priority="batch").start()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == ENGINE_BATCH + 1)
    realtime = Stream(tight["grpc"], "实时请求。", 2, 40, priority="realtime").start()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == ENGINE_BATCH + 2)
    # both queued requests wait for a slot while the hogs still decode
    assert not hogs[0].done.is_set() and not hogs[1].done.is_set()
    assert batch.first_audio_s is None and realtime.first_audio_s is None
    hogs[0].cancel()
    for s in [batch, realtime]:
        assert s.done.wait(120)
    for s in [*hogs, batch, realtime]:
        s.close()
    assert realtime.error is None and batch.error is None
    assert realtime.first_audio_s is not None and batch.first_audio_s is not None
    rt_at = realtime.t0 + realtime.first_audio_s
    batch_at = batch.t0 + batch.first_audio_s
    print(f"\nfirst audio after the batch request: realtime {rt_at - batch.t0:.3f} s, "
          f"batch {batch_at - batch.t0:.3f} s")
    assert rt_at < batch_at


def test_a_request_waiting_for_a_slot_leaves_the_engine_when_its_client_cancels(tight) -> None:
    """Both slots are held; a third request waits in the engine's queue. Its client cancels:
    it leaves the queue at once (the engine acknowledges every sequence when it arrives, so
    the BLS watches its client from then on), not when a slot frees."""
    port = tight["metrics"]
    hogs = [Stream(tight["grpc"], "长时间占用。", 9, 1500) for _ in range(ENGINE_BATCH)]
    for s in hogs:
        s.start()
    for s in hogs:
        assert s.first_chunk.wait(60) and s.error is None, s.error
    waiting = Stream(tight["grpc"], "排队的请求。", 1, 40).start()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == ENGINE_BATCH + 1)
    waiting.cancel()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == ENGINE_BATCH)
    assert not hogs[0].done.is_set() and not hogs[1].done.is_set()  # it left while the slots were still held
    assert waiting.first_audio_s is None
    for s in [*hogs, waiting]:
        s.close()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == 0)


def test_deadline_ends_the_stream_with_an_explicit_error(tight) -> None:
    s = Stream(tight["grpc"], "超时测试。", 3, 2000, timeout_s=0.3).start()
    assert s.done.wait(60)
    s.close()
    assert s.error is not None and "deadline exceeded" in s.error


def test_unknown_request_parameter_is_refused(tight) -> None:
    s = Stream(tight["grpc"], "参数测试。", 3, 20, {"priorty": "batch"}).start()
    assert s.done.wait(60)
    s.close()
    assert s.error is not None and "unknown request parameter" in s.error


def test_degradation_switches_on_under_load_makes_requests_cheaper_and_switches_back_off(
        degrading, small_artifacts: Artifacts) -> None:
    """Three long streams hold the server at live_high: the degraded gauge goes to 1. A request
    arriving then is made cheaper in every documented way, seen from the client: info says
    degraded, vocoder 'codes' and not refined (refine_text was asked for), its chunks are
    chunk_scale (2) times larger than the cpu profile's, and its audio is the codes vocoder's
    (the offline model, not degraded, gives the same samples with vocoder='codes'); it is never
    made shorter: it gets all the tokens it asked for; a batch-priority request is shed as busy.
    When the load has gone the gauge returns to 0 without any new request."""
    from chattts_serving.client import ClientError, SynthesisRequest, synthesize_offline, synthesize_stream
    from chattts_serving.serving.profile import load_profile

    port, grpc = degrading["metrics"], degrading["grpc"]
    srv: TritonServer = degrading["server"]
    http = f"127.0.0.1:{srv.http_port}"
    assert gauge(port, "tts_degraded_mode") == 0.0
    hogs = [Stream(grpc, "降级测试。", i, 2000) for i in range(3)]
    try:
        for h in hogs:
            h.start()
            assert h.first_chunk.wait(60) and h.error is None, h.error
        first_chunks = {h.chunks[0].size for h in hogs}  # admitted below live_high: normal chunks
        assert wait_for(lambda: gauge(port, "tts_degraded_mode") == 1.0, 30), "degraded mode never switched on"
        rf = small_artifacts.receptive_field_tokens("codes")
        cheap = synthesize_stream(grpc, SynthesisRequest(
            text="降级之后的请求。", seed=4, voice="4", max_new_tokens=DEGRADED_ASKED_TOKENS,
            min_new_tokens=DEGRADED_ASKED_TOKENS, vocoder="hidden",
            refine_text=True, lookahead_tokens=rf), timeout_s=120)
        with pytest.raises(ClientError) as shed:
            synthesize_stream(grpc, SynthesisRequest(text="批量请求。", max_new_tokens=8, priority="batch"),
                              timeout_s=60)
    finally:
        for h in hogs:
            h.close()
    info = cheap.info
    assert info["degraded"] is True and info["vocoder"] == "codes" and info["refined"] is False
    assert info["tokens"] == DEGRADED_ASKED_TOKENS  # every token asked for (min = max: the cap is reached)
    stream = load_profile("cpu").stream
    spt, half = contract.SAMPLES_PER_TOKEN, stream.crossfade_samples // 2
    assert first_chunks == {stream.first_chunk_tokens * spt - half}
    assert cheap.chunk_samples[:2] == [2 * stream.first_chunk_tokens * spt - half,  # chunk_scale 2, doubling
                                       int(2 * stream.first_chunk_tokens * DEGRADED_GROWTH) * spt]
    assert shed.value.kind == "busy" and "shed" in shed.value.message, shed.value.message
    reference = synthesize_offline(http, SynthesisRequest(text="降级之后的请求。", seed=4, voice="4",
                                                          max_new_tokens=DEGRADED_ASKED_TOKENS,
                                                          min_new_tokens=DEGRADED_ASKED_TOKENS, vocoder="codes"),
                                   timeout_s=120)
    assert reference.info["degraded"] is False and reference.info["vocoder"] == "codes"
    assert cheap.audio.size == reference.audio.size == contract.samples_for_tokens(DEGRADED_ASKED_TOKENS)
    np.testing.assert_allclose(cheap.audio, reference.audio, rtol=0, atol=1e-4)
    # no further request arrives: the server re-evaluates on its own once load has gone
    assert wait_for(lambda: gauge(port, "tts_degraded_mode") == 0.0, 30)
    events = [json.loads(line[line.index("{"):]) for line in Path(degrading["log"]).read_text().splitlines()
              if '"event":"degraded_mode"' in line]
    assert [e["degraded"] for e in events][-2:] == [True, False]


LONG_TOKENS = 700
"""The issue's long request: 14.93 s of audio, of which a degraded server once returned 10.91 s."""


def test_a_degraded_response_says_so_at_every_door_and_is_never_shorter(degrading) -> None:
    """While the server is degraded (three hogs at live_high), a 700-token request through the
    gateway is spoken whole (every token it asked for, where the degraded mode once capped it
    at 512 with 200 OK and nothing said), and says that it was degraded: ``X-Degraded: true``
    on ``POST /v1/audio/speech``, ``degraded: true`` on the WebSocket's sentence events and in
    ``done``; each door counts its degraded requests (the gateway per door, the server per
    model). A response made in normal mode has no such header."""
    import httpx2 as httpx
    import websockets.sync.client as ws_client

    from chattts_serving.gateway import GatewaySettings
    from tests.support.servers import running_gateway

    port, grpc = degrading["metrics"], degrading["grpc"]
    body = {"model": "tts-1", "voice": "alloy", "input": "今天天气很好，我们去公园散步吧。", "response_format": "pcm",
            "max_new_tokens": LONG_TOKENS, "min_new_tokens": LONG_TOKENS, "seed": 7}
    with running_gateway(GatewaySettings(triton_url=grpc, admission_watch=False)) as url:
        assert wait_for(lambda: gauge(port, "tts_degraded_mode") == 0.0, 30)
        normal = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)
        assert normal.status_code == 200 and "x-degraded" not in normal.headers
        hogs = [Stream(grpc, "降级测试。", i, 2000) for i in range(3)]
        try:
            for h in hogs:
                h.start()
                assert h.first_chunk.wait(60) and h.error is None, h.error
            assert wait_for(lambda: gauge(port, "tts_degraded_mode") == 1.0, 30), "degraded mode never switched on"
            before = gauge(port, "tts_degraded_requests_total")
            r = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)
            with ws_client.connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", max_size=None) as ws:
                ws.send(json.dumps({"type": "start", "voice": "alloy", "max_new_tokens": 12, "min_new_tokens": 12}))
                ws.send(json.dumps({"type": "text", "text": "降级时的一句话。"}))
                ws.send(json.dumps({"type": "end"}))
                events = []
                while True:
                    msg = ws.recv(timeout=120)
                    if isinstance(msg, str):
                        events.append(json.loads(msg))
                        if events[-1]["type"] in ("done", "error"):
                            break
            scraped = httpx.get(url + "/metrics", timeout=10).text
            after = gauge(port, "tts_degraded_requests_total")
        finally:
            for h in hogs:
                h.close()
    assert r.status_code == 200 and r.headers["x-degraded"] == "true", r.headers
    assert len(r.content) == 2 * contract.samples_for_tokens(LONG_TOKENS) == len(normal.content)  # 14.93 s both
    start = next(e for e in events if e["type"] == "sentence_start")
    assert start["degraded"] is True and events[-1]["type"] == "done" and events[-1]["degraded_sentences"] == 1
    assert 'tts_gateway_degraded_requests_total{door="speech"} 1.0' in scraped
    assert 'tts_gateway_degraded_requests_total{door="ws"} 1.0' in scraped
    assert after - before == 2  # the speech request and the WebSocket's sentence (not its start check)


def test_one_request_slow_by_design_on_a_light_load_leaves_the_degraded_mode_off(
        small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The issue's reproduction, on a server whose TTFA threshold (0.5 s) the slow request's
    own first audio far exceeds: ten short requests, then one ``segmentation: "chattts"``
    request whose first piece (600 tokens) is generated and decoded whole before anything
    streams. The degraded mode stays off (a real percentile needs 20 samples, and the
    reference pass is the request's own work, not the load's), and a 700-token request after
    it is spoken whole and not degraded."""
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("light-load"),
                 degrade={"ttfa_p95_high_s": 0.5, "ttfa_p95_low_s": 0.25, "min_dwell_s": 0.0})
    try:
        grpc, port = f"127.0.0.1:{srv.grpc_port}", srv.metrics_port
        for i in range(10):
            short = synthesize_stream(grpc, SynthesisRequest(text=f"Short {i}.", voice="alloy", max_new_tokens=4),
                                      timeout_s=60)
            assert short.info["degraded"] is False
        slow = synthesize_stream(grpc, SynthesisRequest(
            text="今天天气很好。我们去公园散步吧。", voice="alloy", segmentation="chattts", max_new_tokens=600,
            min_new_tokens=600), timeout_s=300)
        assert slow.info["reference"] == "first_piece" and slow.ttfa_s > 0.5  # slow by design, far over the mark
        # the mode is re-evaluated at each arrival: this one's admission decides with every sample in
        long = synthesize_stream(grpc, SynthesisRequest(text="今天天气很好，我们去公园散步吧。", voice="alloy",
                                                        max_new_tokens=LONG_TOKENS, min_new_tokens=LONG_TOKENS),
                                 timeout_s=300)
        assert long.info["degraded"] is False and long.info["tokens"] == LONG_TOKENS
        assert long.audio.size == contract.samples_for_tokens(LONG_TOKENS)
        assert gauge(port, "tts_degraded_mode") == 0.0
        assert '"event":"degraded_mode"' not in Path(srv.log_path).read_text()
    finally:
        srv.stop()


def test_a_request_with_more_sequences_than_the_engine_queue_holds_completes(two_rows) -> None:
    """refine-text starts one engine sequence per sentence at once: 10 here, with 2 rows and
    a queue of TWO_ROWS_WAITING requests. The queue counts requests, so the request the entry
    admitted is not refused halfway by the engine: it streams every sentence."""
    sentences = [f"这是第{n}句比较长的测试句子，用来检查排队的计数。" for n in "一二三四五六七八九十"]
    refine = (("refine_text", np.array([True]), "BOOL"), ("refine_max_new_tokens", np.array([8], np.int32), "INT32"))
    request_id = f"refine-{uuid.uuid4().hex[:8]}"
    s = Stream(two_rows["grpc"], "".join(sentences), 3, 8, extra=refine, request_id=request_id).start()
    try:
        assert s.done.wait(300)
        assert s.error is None and s.audio.size > 0, s.error
    finally:
        s.close()
    mine = _logged(two_rows["log"], "request_finished", [request_id])  # logged just after the final response
    assert mine[request_id]["status"] == "ok" and mine[request_id]["segments"] == len(sentences), mine


def _logged(log: Path, event: str, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The server's ``event`` log line of each of ``request_ids``, waited for (a line may be
    written just after the response the client saw)."""
    found: dict[str, dict[str, Any]] = {}

    def read() -> bool:
        for line in log.read_text(encoding="utf-8").splitlines():
            if line.startswith("{") and f'"{event}"' in line:
                e = json.loads(line)
                if e.get("request_id") in request_ids:
                    found[e["request_id"]] = e
        return len(found) == len(request_ids)
    assert wait_for(read), (event, request_ids, found)
    return found


def _offline(http_url: str, text: str, tokens: int, out: list[str | None], request_id: str = "") -> None:
    """One chattts_offline request over HTTP; appends None (audio came) or the error."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url, network_timeout=300)
    inputs = []
    for name, value, dtype in (("text", np.array([text.encode()], np.object_), "BYTES"),
                               ("max_new_tokens", np.array([tokens], np.int32), "INT32"),
                               ("min_new_tokens", np.array([tokens], np.int32), "INT32")):
        inp = httpclient.InferInput(name, list(value.shape), dtype)
        inp.set_data_from_numpy(value)
        inputs.append(inp)
    try:
        client.infer(contract.MODEL_OFFLINE, inputs, request_id=request_id)
        out.append(None)
    except Exception as exc:  # the outcome is what the test checks
        out.append(str(exc))
    finally:
        client.close()


def test_a_stream_queued_behind_offline_requests_longer_than_the_stall_timeout_gets_its_audio(two_rows) -> None:
    """Both engine rows are taken by long chattts_offline requests (their progress is not a
    stream's, so the entry's watchdog does not see it). A stream queued behind them for longer
    than entry.stall_timeout_s is not ended as "the GPT engine stopped responding": the engine
    sends queued sequences a heartbeat (engine.waiting_heartbeat_s). It gets its audio once a
    row frees."""
    srv = two_rows["server"]
    hogs: list[str | None] = []
    url, tag = f"127.0.0.1:{srv.http_port}", uuid.uuid4().hex[:8]
    threads = [threading.Thread(target=_offline, args=(url, "长的离线请求。", HOG_TOKENS, hogs, f"hog-{tag}-{i}"))
               for i in range(2)]
    for t in threads:
        t.start()
    assert wait_for(lambda: gauge(two_rows["metrics"], "tts_engine_active_sequences") >= 2)
    s = Stream(two_rows["grpc"], "排队的流。", 5, 8, request_id=f"queued-{tag}").start()
    try:
        assert s.done.wait(300)
        assert s.error is None and s.audio.size > 0, s.error
    finally:
        s.close()
    for t in threads:
        t.join(300)
    assert hogs == [None, None]
    finished = _logged(two_rows["log"], "sequence_finished", [f"hog-{tag}-0", f"hog-{tag}-1", f"queued-{tag}"])
    assert finished[f"hog-{tag}-0"]["tokens"] == finished[f"hog-{tag}-1"]["tokens"] == HOG_TOKENS
    # the stream waited for a row longer than the stall timeout (else this test would not test it)
    assert finished[f"queued-{tag}"]["tokens"] == 8 and finished[f"queued-{tag}"]["first_token_ms"] > 1000 * STALL_S


def test_a_realtime_stream_gets_the_row_that_batch_requests_may_not_take(two_rows) -> None:
    """engine.batch_rows = 1 of 2: a long batch-priority stream holds the batch row and a
    second batch stream waits, though a row is free; a realtime stream that comes after them
    takes that row and streams to its end while the first still runs and the second has no
    audio yet. Once the long one ends (cancelled), the waiting batch stream gets its audio."""
    port = two_rows["metrics"]
    hog = Stream(two_rows["grpc"], "长时间占用。", 9, HOG_TOKENS, priority="batch").start()
    assert hog.first_chunk.wait(60) and hog.error is None, hog.error
    queued = Stream(two_rows["grpc"], "批量请求。", 1, 40, priority="batch").start()
    assert wait_for(lambda: gauge(port, "tts_engine_active_sequences") == 2)
    realtime = Stream(two_rows["grpc"], "实时请求。", 2, 40, priority="realtime").start()
    try:
        assert realtime.done.wait(120)
        assert realtime.error is None and realtime.audio.size > 0, realtime.error
        assert not hog.done.is_set() and queued.first_audio_s is None
        hog.cancel()
        assert queued.done.wait(120)
        assert queued.error is None and queued.audio.size > 0, queued.error
    finally:
        for s in (hog, queued, realtime):
            s.close()

