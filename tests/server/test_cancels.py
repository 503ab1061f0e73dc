"""Cancels from the entry models to the engine over the engine's cancel socket
(chattts_serving/triton/compat/cancels.py) on a real tritonserver under a cancel storm: every closed
stream leaves the engine without a control request to the engine model, and the server serves
on. The socket in process: tests/unit/test_cancels.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from chattts_serving import contract
from tests.support.servers import wait_until


def _metric(port: int, name: str, model: str | None = None) -> float:
    """Sum of ``name``'s series on the server's metrics port (of ``model`` only, if given)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if (line.startswith(name + "{") or line.startswith(name + " "))
               and (model is None or f'model="{model}"' in line))


def _engine_requests(port: int) -> float:
    """Requests the engine model completed, less its pings (its own, for its final responses,
    counted in tts_pings_total), once the two counters read the same twice in a row (a ping
    in flight between the two reads would count on one side only)."""
    seen: list[float] = []

    def settled() -> bool:
        seen.append(_metric(port, "nv_inference_request_success", contract.MODEL_ENGINE)
                    - _metric(port, "tts_pings_total", contract.MODEL_ENGINE))
        return len(seen) > 1 and seen[-1] == seen[-2]
    assert wait_until(settled, 30), seen
    return seen[-1]


async def _storm(url: str, streams: int, metrics_url: str) -> int:
    """Open ``streams`` streams of 2048 tokens, wait until the server has accepted each (audio
    sent, or queued for the engine), then close them all at once. Returns how many were still
    running when closed."""
    import tritonclient.grpc.aio as aio

    from bench.burst_hold import held_accepted
    from bench.burst_send import BurstResult, send_stream
    from chattts_serving.client import SynthesisRequest

    conns = [aio.InferenceServerClient(url) for _ in range(streams)]
    tag = uuid.uuid4().hex[:8]  # request ids stay unique in the shared server's log
    go = asyncio.Event()
    go.set()
    outs = [BurstResult() for _ in range(streams)]
    tasks = [asyncio.create_task(send_stream(c, SynthesisRequest(text="一直说下去。", max_new_tokens=2048,
                                                                  min_new_tokens=2048, request_id=f"storm-{tag}-{i}"),
                                             go, 600.0, outs[i]))
             for i, c in enumerate(conns)]
    try:
        end = time.monotonic() + 120
        while not (accepted := held_accepted(sum(1 for o in outs if o.first_s is not None or o.kind), streams,
                                             metrics_url)) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert accepted, "the streams were not all accepted"
        assert not any(o.kind for o in outs), [o.message for o in outs if o.kind]
        running = sum(1 for t in tasks if not t.done())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return running


@pytest.fixture(scope="module")
def storm_server(small_artifacts: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server of its own (the storm would switch a shared one into its degraded mode) whose
    degraded mode is out of reach."""
    from tests.support.servers import Server, serve_profile

    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("storm"),
                        degrade={"live_high": 10**6, "live_low": 10**6 - 1, "queued_high": 10**6,
                                 "queued_low": 10**6 - 1, "ttfa_p95_high_s": 1e9, "ttfa_p95_low_s": 1e9 - 1})
    try:
        yield Server(srv.http_port, srv.grpc_port, srv.metrics_port, server=srv, artifacts=small_artifacts,
                     log_path=srv.log_path)
    finally:
        srv.stop()


def test_many_streams_closed_at_once_leave_the_engine_and_the_server_serves_on(storm_server: Any) -> None:
    """A cancel storm: 48 long streams (16 decoding, 32 queued for the engine) are closed by
    their clients at the same moment, three times over. Every sequence leaves the engine, the
    engine's socket took the cancels (no control request reached the engine model), and the
    server still streams. (With control requests, Triton 2.51's Python backend deadlocked the
    entry stub under such a storm on the full-size model: see chattts_serving/triton/compat/cancels.py.)"""
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    triton_server = storm_server
    port = triton_server.metrics_port
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    engine_requests = _engine_requests(port)
    for _ in range(3):
        assert asyncio.run(_storm(triton_server.grpc_url, 48, metrics_url)) == 48
        end = time.monotonic() + 120
        while _metric(port, "tts_engine_active_sequences") and time.monotonic() < end:
            time.sleep(0.1)
        assert _metric(port, "tts_engine_active_sequences") == 0, "cancelled sequences stayed in the engine"
    # one engine request per stream: the 144 cancels sent no control request to the engine model
    # (the engine's pings to itself, for its final responses, are counted apart)
    assert _engine_requests(port) - engine_requests == 3 * 48
    result = synthesize_stream(triton_server.grpc_url, SynthesisRequest(text="还在。", max_new_tokens=4,
                                                                        min_new_tokens=4), timeout_s=120)
    assert result.info["tokens"] == 4 and result.audio.size == contract.samples_for_tokens(4)
