"""A served server's log has no error line on start or stop (issue 39, item 7).

Streams leave decoupled BLS iterators behind in the entry and engine stubs (their pings to
themselves); python_backend r24.10 deadlocked unloading a stub that still held several, and
the server then waited out its exit timeout ("Exit timeout expired", stubs left behind). On a
CPU host Triton's GPU build also logs two CUDA errors at every start, re-levelled by the
launcher (docs/triton-workarounds.md, "ping iterators", "CUDA errors on a CPU host").
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from chattts_serving import contract
from chattts_serving.client import SynthesisRequest, synthesize_stream
from chattts_serving.client.admission_watch import AdmissionWatch
from chattts_serving.deploy.loglevels import cuda_driver_present
from chattts_serving.runtime import Artifacts
from chattts_serving.triton.compat.grave import ITERATOR_GRACE_S
from tests.support.servers import log_events, metric, serve_profile, wait_until

TRITON_ERROR = re.compile(r"^E\d{4} ", re.MULTILINE)
"""A Triton log line at error level (``E<mmdd> hh:mm:ss...``)."""
SEQUENTIAL, CONCURRENT = 24, 4
"""Streams one after another, then at once: each leaves a ping iterator or more in the entry and
engine stubs. The old deadlock needed two or more in one stub whose last reference was the
stub's own (past the grave's grace), and a race; more made it likely."""
STOP_BOUND_S = 120.0
"""How long the test lets a stop take before it calls the server hung (a bound, not a measure)."""


@contextmanager
def _subscribed(url: str) -> Iterator[AdmissionWatch]:
    """An admission watch following ``url`` in an event loop of its own thread (as a gateway
    follows its server), subscribed before this yields; closed afterwards."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="admission-watch", daemon=True)
    thread.start()

    async def started() -> AdmissionWatch:
        watch = AdmissionWatch(url, retry_s=0.2)
        watch.start()
        return watch

    watch = asyncio.run_coroutine_threadsafe(started(), loop).result(10)
    try:
        assert wait_until(lambda: watch.describe()["watched"] == 1, 60), watch.describe()
        yield watch
    finally:
        asyncio.run_coroutine_threadsafe(watch.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _stream(url: str, i: int) -> float:
    request = SynthesisRequest(text=f"安静的日志，第{i}句。", seed=i, max_new_tokens=24)
    return synthesize_stream(url, request, timeout_s=60).audio_s


def test_a_server_that_streamed_stops_within_its_exit_timeout_and_logs_no_error(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """Streams (one after another, then several at once) with a watch subscriber connected, then
    SIGINT: every model unloads, the server exits on its own (no "Exit timeout expired"), and
    its log from start to stop holds no error-level line, Triton's or ours. On a host without a
    CUDA driver the two CUDA errors of every start are there, at info level."""
    srv = serve_profile(small_artifacts, tmp_path)
    try:
        url = f"127.0.0.1:{srv.grpc_port}"
        with _subscribed(url) as watch:
            assert all(_stream(url, i) > 0 for i in range(SEQUENTIAL))
            with ThreadPoolExecutor(CONCURRENT) as pool:
                assert all(s > 0 for s in pool.map(lambda i: _stream(url, i), range(CONCURRENT)))
            time.sleep(ITERATOR_GRACE_S + 1.0)  # idle a while, as a server before its stop: the grave lets go
            for model in (contract.MODEL_STREAM_ENTRY, contract.MODEL_ENGINE):  # what the stop is to survive
                assert metric(srv.metrics_port, "tts_pings_total", model=model) >= 2
            srv.stop(STOP_BOUND_S)
            assert wait_until(lambda: watch.describe()["watched"] == 0, 30)  # the server ended it
    finally:
        srv.stop()
    log = Path(tmp_path / "tritonserver.log").read_text(errors="replace")
    assert "Signal (2) received" in log
    assert "Exit timeout expired" not in log, log[-4000:]
    unloaded = set(re.findall(r"successfully unloaded '(\w+)'", log))
    assert unloaded == set(contract.ALL_MODELS), sorted(set(contract.ALL_MODELS) - unloaded)
    assert not TRITON_ERROR.findall(log), [ln for ln in log.splitlines() if TRITON_ERROR.match(ln)]
    errors = [e for e in log_events(tmp_path / "tritonserver.log") if e.get("level") == "error"]
    assert not errors, errors
    assert '"level":"error"' not in log
    if not cuda_driver_present():
        assert re.search(r'^I\d{4} .*"CudaDriverHelper has not been initialized\."$', log, re.MULTILINE)
        assert re.search(rf'^I\d{{4}} .*"unable to create stream for {contract.MODEL_ENSEMBLE}: ', log, re.MULTILINE)
        assert "Unable to allocate pinned system memory" not in log
