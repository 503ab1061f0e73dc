"""The overload burst's offline door without a server: an in-process gRPC server stands in for
Triton's ``ModelInfer`` and ``ServerLive``. The request the door sends is the one tritonclient's
``infer`` sends, its clock starts after the start signal and no later than the server has the
request, refusals keep their kind, accepted utterances their audio, and ``run_burst`` sends the
offline door's requests on channels of their own. The bursts against a real tritonserver:
tests/server/test_bench_smoke.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from bench import burst, burst_send
from chattts_serving import contract
from chattts_serving.client import SynthesisRequest
from chattts_serving.errors import ErrorKind, encode

BUSY = encode(ErrorKind.BUSY, "server busy: 16 requests already running")
AUDIO = np.arange(5, dtype=np.float32)


class FakeInfer:
    """``ModelInfer``: refuses "busy" (UNAVAILABLE, the gate's tagged message) every request
    whose id starts with ``busy`` (Triton's untagged queue refusal for ``queue``, a bare
    UNAVAILABLE for ``drop``), answers those starting with ``slow`` after 5 s and the others
    at once with :data:`AUDIO`; keeps each request and when it arrived (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived: list[float] = []
        self.lives = 0

    async def infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.arrived.append(time.perf_counter())
        self.requests.append(request)
        if request.id.startswith("busy"):
            await context.abort(grpc.StatusCode.UNAVAILABLE, BUSY)
        if request.id.startswith("queue"):  # Triton's own queue refusal: untagged
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Exceeds maximum queue size")
        if request.id.startswith("drop"):  # what a connection that went away looks like
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        if request.id.startswith("slow"):
            await asyncio.sleep(5.0)
        out = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        out.outputs.add(name=contract.OUT_AUDIO.name, datatype="FP32", shape=[AUDIO.size])
        out.raw_output_contents.append(AUDIO.tobytes())
        return out

    async def live(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.lives += 1
        return service_pb2.ServerLiveResponse(live=True)


@contextlib.asynccontextmanager
async def fake_triton() -> AsyncIterator[tuple[str, FakeInfer]]:
    """A gRPC server on a free port with :class:`FakeInfer`'s two methods: (url, servicer)."""
    servicer = FakeInfer()
    server = grpc.aio.server()
    handlers = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            servicer.infer, request_deserializer=service_pb2.ModelInferRequest.FromString,
            response_serializer=service_pb2.ModelInferResponse.SerializeToString),
        "ServerLive": grpc.unary_unary_rpc_method_handler(
            servicer.live, request_deserializer=service_pb2.ServerLiveRequest.FromString,
            response_serializer=service_pb2.ServerLiveResponse.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService",
                                                                          handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


REQUEST = SynthesisRequest("今天天气很好。", voice="3", seed=7, max_new_tokens=16, min_new_tokens=16, temperature=0.3)


def _with_id(request_id: str) -> SynthesisRequest:
    return dataclasses.replace(REQUEST, request_id=request_id)


def test_the_offline_door_sends_what_tritonclient_infer_sends() -> None:
    import tritonclient.grpc.aio as aio

    async def main() -> list[Any]:
        async with fake_triton() as (url, servicer):
            client, channel = aio.InferenceServerClient(url), burst_send.infer_channel(url)
            try:
                await client.infer(contract.MODEL_OFFLINE, burst_send._inputs(REQUEST), request_id="ok-1")
                go = asyncio.Event()
                go.set()
                await burst_send.send_offline(channel, _with_id("ok-1"), go, 10.0)
            finally:
                await client.close()
                await channel.close()
            return servicer.requests

    theirs, ours = asyncio.run(main())
    assert ours == theirs and ours.model_name == contract.MODEL_OFFLINE and ours.id == "ok-1"


def test_the_clock_starts_after_the_signal_and_when_grpc_takes_the_request() -> None:
    """A request accepted, three refused: each clock starts after the start signal and no
    later than the server has the request (built before the signal, nothing sent before it)."""

    async def main() -> tuple[float, list[burst_send.BurstResult], FakeInfer, bool]:
        async with fake_triton() as (url, servicer):
            channels = [burst_send.infer_channel(url) for _ in range(4)]
            try:
                await asyncio.gather(*(burst_send.connect_channel(c) for c in channels))
                start = asyncio.Event()
                ids = ["ok-0"] + [f"busy-{i}" for i in range(1, 4)]
                tasks = [asyncio.create_task(burst_send.send_offline(c, _with_id(i), start, 10.0))
                         for c, i in zip(channels, ids)]
                await asyncio.sleep(0.05)
                quiet = not servicer.requests
                start_at = time.perf_counter()
                start.set()
                return start_at, list(await asyncio.gather(*tasks)), servicer, quiet
            finally:
                await asyncio.gather(*(c.close() for c in channels))

    start_at, outs, servicer, quiet = asyncio.run(main())
    assert quiet and servicer.lives == 4  # nothing sent before the signal; every channel connected first
    arrived = {r.id: t for r, t in zip(servicer.requests, servicer.arrived)}
    ok, *busy = outs
    assert ok.kind is None and ok.audio_samples == AUDIO.size and ok.first_s == ok.end_s
    for o in busy:
        assert o.kind == ErrorKind.BUSY and o.message == "server busy: 16 requests already running"
        assert o.first_s is not None and o.first_s == o.end_s
    for o, request_id in zip(outs, ["ok-0"] + [f"busy-{i}" for i in range(1, 4)]):
        assert start_at <= o.sent_at <= arrived[request_id]
    assert burst.summarize(outs)["outcomes"] == {"ok": 1, "busy": 3}


def test_the_client_deadline_ends_a_call_the_server_does_not_answer() -> None:
    """A request the server sits on: the call ends at the client's deadline, kind "deadline"."""

    async def main() -> burst_send.BurstResult:
        async with fake_triton() as (url, _):
            channel = burst_send.infer_channel(url)
            go = asyncio.Event()
            go.set()
            try:
                return await burst_send.send_offline(channel, _with_id("slow-1"), go, 0.2)
            finally:
                await channel.close()

    out = asyncio.run(main())
    assert out.kind == ErrorKind.DEADLINE and out.end_s is not None and out.sent_at > 0


def test_run_burst_sends_the_offline_door_on_channels_of_its_own() -> None:
    """The fake accepts ids that do not start with "busy": every request answered, and the ids
    say which door and round sent it."""

    async def main() -> tuple[dict[str, Any], FakeInfer]:
        async with fake_triton() as (url, servicer):
            return await burst.run_burst(url, 3, 4, rounds=2, doors=("offline",), pause_s=0.0), servicer

    summary, servicer = asyncio.run(main())
    assert summary["outcomes"] == {"ok": 6} and summary["door"] == "offline" and len(summary["round_busy_p99_s"]) == 2
    assert sorted(r.id for r in servicer.requests) == sorted(f"offline-{r}-{i}" for r in range(2) for i in range(3))
    assert servicer.lives == 6  # the tritonclient clients and the offline door's channels, each connected first


def test_only_the_server_saying_busy_counts_as_busy() -> None:
    """A refusal is "busy" when the server says so (our tag, or Triton's queue); an untagged
    UNAVAILABLE (a connection that went away) or no server at all is a transport failure,
    never counted as a refusal the server made in time."""
    async def main() -> list[str | None]:
        async with fake_triton() as (url, _):
            channel = burst_send.infer_channel(url)
            kinds = []
            for rid in ("busy-1", "queue-1", "drop-1"):
                start = asyncio.Event()
                start.set()
                kinds.append((await burst_send.send_offline(channel, _with_id(rid), start, 10.0)).kind)
            await channel.close()
        closed = burst_send.infer_channel(url)  # the server has stopped: nothing listens there now
        start = asyncio.Event()
        start.set()
        kinds.append((await burst_send.send_offline(closed, _with_id("busy-2"), start, 10.0)).kind)
        await closed.close()
        return kinds

    assert asyncio.run(main()) == ["busy", "busy", "transport", "transport"]


def test_a_round_runs_without_the_client_s_garbage_collector() -> None:
    """The client's own full collection, when it landed inside a round, delayed every answer
    of that round by 150 to 210 ms (the one slow round in five of the saturated bursts): the
    collector is off from the start line to the round's end and on again after it, also when a
    send fails."""
    seen: list[bool] = []

    async def send(_target: Any, _request: SynthesisRequest, start: asyncio.Event, _timeout_s: float,
                   out: burst_send.BurstResult) -> None:
        await start.wait()
        seen.append(gc.isenabled())
        out.sent_at, out.first_s, out.kind = time.perf_counter(), 0.001, ErrorKind.BUSY

    async def failing(_target: Any, _request: SynthesisRequest, start: asyncio.Event, _timeout_s: float,
                      _out: burst_send.BurstResult) -> None:
        await start.wait()
        raise RuntimeError("the connection broke")

    assert gc.isenabled()
    outs = asyncio.run(burst._round(send, [None] * 3, 16, "x", 5.0, tag="gc"))
    assert seen == [False, False, False] and gc.isenabled()
    assert [o.kind for o in outs] == [ErrorKind.BUSY] * 3 and all(o.sent_after_start_s is not None for o in outs)
    with pytest.raises(RuntimeError, match="broke"):
        asyncio.run(burst._round(failing, [None], 16, "x", 5.0, tag="gc"))
    assert gc.isenabled()
