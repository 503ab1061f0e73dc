"""The overload burst: many clients send one stream request at the same moment.

``clients`` gRPC clients (one channel each, connected and warmed first) each open a stream to
``chattts`` and then, all at one start signal, send one request on it; the server admits as
many as it has stream slots and must refuse the rest with an explicit "busy" error at once.
Measured from each request's send (the moment gRPC takes the request message to write it on its
open stream): the time to its refusal (busy) or to its first audio (accepted), every refusal's
kind, and whether every request ended (audio then final response, or one error); also from the
start signal (``busy_p99_s_from_start``: what one load-generating process adds by sending 200
requests itself). ``rounds`` bursts run one after another on the same server (with ``hold``,
the same held streams, opened by a process of their own: their audio is other users' work,
not the measuring client's) and are pooled. ``make bench`` runs it as a phase (``bench.run``):
on an idle server and with every stream slot held by long streams (the client then at niceness
:data:`CLIENT_NICE` where allowed: ``client_nice`` in the summary), written into ``bench.json`` as
``busy_p99_s_burst`` and ``busy_p99_s_saturated`` (issue: at most 0.1 s on 2 cores with every
slot taken by full-size streams), the whole summaries, accepted streams' TTFA and each round's
busy p99 included, under ``burst.burst`` and ``burst.saturated``.

The offline door (``chattts_offline``, one unary infer call per request, each client on a gRPC
channel of its own made and warmed first) is timed on the same footing: from the moment gRPC
takes the request's bytes to start the call (:func:`_offline_one`), the request built before the
start signal. gRPC's global subchannel pool carries a process's channels to one server, with
the same options, on one HTTP/2 connection: the 200 clients are 200 channels and 200 calls or
streams, not 200 TCP connections.

``python -m bench.burst --url 127.0.0.1:8001 --clients 200`` runs it against a
running server and prints the JSON summary (``--doors stream,offline,gateway --gateway-url ...
--offline-hold 16`` for the other doors, as ``make bench`` runs them saturated: the offline and
gateway rows of its report and ``busy_p99_s_offline_saturated``, ``busy_p99_s_gateway_saturated``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from chattts_serving import contract
from chattts_serving.client.common import ClientError, SynthesisRequest
from chattts_serving.client.keys import grpc_metadata, resolve_key
from chattts_serving.errors import ErrorKind, decode

from .stats import percentile

DEFAULT_TEXT = "今天天气很好，我们一起去公园散步吧。"


@dataclass
class BurstResult:
    """One burst request: seconds from its send to its first response (audio or error) and to
    its end, its error kind (None when it streamed audio to the end) and its message;
    ``sent_at`` is its send (``time.perf_counter()``; 0.0 until sent), ``sent_after_start_s``
    its send after the burst's start signal."""

    first_s: float | None = None
    end_s: float | None = None
    kind: str | None = None
    message: str = ""
    audio_samples: int = 0
    sent_at: float = 0.0
    sent_after_start_s: float | None = None
    retry_after: str | None = None
    """The gateway's ``Retry-After`` header (gateway bursts only; None when absent)."""


def _inputs(request: SynthesisRequest) -> list[Any]:
    import tritonclient.grpc.aio as aio

    out = []
    for name, arr, dtype in request.tensors():
        inp = aio.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


async def _one(client: Any, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
               out: BurstResult | None = None) -> BurstResult:
    """Open a stream now, send ``request`` on it once ``start`` is set and follow the stream
    to the end; ``out`` (optional) is filled as the stream goes, for a caller that watches it.
    Times count from the moment gRPC takes the request to write it (``out.sent_at``): the
    client's own work for the other requests of a burst before that is not the server's."""
    out = out if out is not None else BurstResult()
    inputs = _inputs(request)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        await start.wait()
        out.sent_at = time.perf_counter()
        yield {"model_name": contract.MODEL_STREAM, "inputs": inputs, "request_id": request.request_id or "",
               "enable_empty_final_response": True}

    try:
        async for result, error in client.stream_infer(requests(), stream_timeout=timeout_s,
                                                       headers=grpc_metadata(resolve_key(None))):
            now = time.perf_counter() - out.sent_at  # a response follows its request: sent_at is set
            if error is not None:
                out.kind, out.message = _error_kind(error.message(), error.status())
                out.first_s = out.first_s if out.first_s is not None else now
                out.end_s = now
                return out
            audio = result.as_numpy(contract.OUT_AUDIO.name)
            if audio is not None and audio.size:
                out.audio_samples += int(audio.size)
                if out.first_s is None:
                    out.first_s = now
            params = result.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                out.end_s = now
                return out
    except Exception as exc:  # transport failure: counted, never hidden
        out.kind, out.message = "transport", f"{type(exc).__name__}: {exc}"
    return out


TRITON_QUEUE_REFUSALS: Final = ("Exceeds maximum queue size", "Request timeout expired")
"""What Triton itself says when its queue refuses a request (UNAVAILABLE): a "busy" answer
that carries no tag of ours."""


def _error_kind(message: str, status: Any) -> tuple[str, str]:
    """(kind, message without its tag) of a Triton error: the server's tag, else the kind its
    transport status implies (:class:`ClientError`), except that an untagged UNAVAILABLE counts
    as "busy" only when Triton's queue said so (:data:`TRITON_QUEUE_REFUSALS`): a connection
    that failed or reset is a "transport" failure here, never a refusal the server made."""
    kind, text = decode(message)
    if kind is not None:
        return str(kind), text
    implied = ClientError(message, status).kind
    if implied == ErrorKind.BUSY and not any(m in message for m in TRITON_QUEUE_REFUSALS):
        return "transport", text
    return str(implied or ErrorKind.INTERNAL), text


MODEL_INFER_METHOD: Final = "/inference.GRPCInferenceService/ModelInfer"
"""The gRPC method of a unary infer call (KServe v2 protocol, Triton's ``ModelInfer``)."""


def _infer_request(model: str, request: SynthesisRequest) -> Any:
    """``request`` as the ``ModelInferRequest`` to ``model`` that tritonclient's ``infer``
    sends: every input as raw contents (BYTES length-prefixed), ``request_id`` as its id."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    msg = service_pb2.ModelInferRequest(model_name=model, id=request.request_id or "")
    for name, arr, dtype in request.tensors():
        msg.inputs.add(name=name, datatype=dtype, shape=list(arr.shape))
        msg.raw_input_contents.append(serialize_byte_tensor(arr).item() if dtype == "BYTES" else arr.tobytes())
    return msg


def infer_channel(url: str) -> Any:
    """A gRPC channel to Triton at ``url`` (host:port) with tritonclient's default channel
    options (so that it shares the transport tritonclient's clients of this process use), for
    :func:`_offline_one`."""
    import grpc
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

    ka = KeepAliveOptions()
    return grpc.aio.insecure_channel(url, options=[
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", ka.keepalive_time_ms), ("grpc.keepalive_timeout_ms", ka.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", ka.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", ka.http2_max_pings_without_data)])


async def connect_channel(channel: Any) -> None:
    """Connect ``channel`` and make one call on it (``ServerLive``, as tritonclient's
    ``is_server_live``), so that a burst's first infer call pays no connection setup."""
    from tritonclient.grpc import service_pb2

    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                               request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
                               response_deserializer=service_pb2.ServerLiveResponse.FromString)
    await live(service_pb2.ServerLiveRequest())


async def _offline_one(channel: Any, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
                       out: BurstResult | None = None) -> BurstResult:
    """Send ``request`` to ``chattts_offline`` (one unary infer call on ``channel``, made by
    :func:`infer_channel`) once ``start`` is set and wait for its answer: the whole utterance
    (first and end at once) or one error.

    The request is built and serialized before ``start``, and times count from the moment gRPC
    takes its bytes to start the call (its request serializer, which gRPC calls as the call
    begins), as the stream door's count from the moment gRPC takes its request message from the
    request iterator (:func:`_one`). Timed from the ``infer`` call instead, each of a burst's
    200 calls counted the client's own work for all 200: building every request, then starting
    every call (asyncio runs a unary call's start as a task of its own, queued behind the
    other calls' building), 10 to 100 ms on 2 shared cores that are not the server's."""
    import grpc
    from tritonclient.grpc import InferResult, service_pb2

    out = out if out is not None else BurstResult()
    data = _infer_request(contract.MODEL_OFFLINE, request).SerializeToString()

    def take(_: object) -> bytes:  # gRPC's serializer: called as the call starts, i.e. the send
        out.sent_at = time.perf_counter()
        return data

    infer = channel.unary_unary(MODEL_INFER_METHOD, request_serializer=take,
                                response_deserializer=service_pb2.ModelInferResponse.FromString)
    await start.wait()
    try:
        response = await infer(data, timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        out.first_s = out.end_s = time.perf_counter() - out.sent_at
        out.kind, out.message = _error_kind(exc.details() or "", str(exc.code()))
    except Exception as exc:  # transport failure: counted, never hidden
        out.kind, out.message = "transport", f"{type(exc).__name__}: {exc}"
    else:
        out.first_s = out.end_s = time.perf_counter() - out.sent_at
        audio = InferResult(response).as_numpy(contract.OUT_AUDIO.name)
        out.audio_samples = 0 if audio is None else int(audio.size)
    return out


GATEWAY_PATH = "/v1/audio/speech"


def _gateway_kind(status: int, body: bytes) -> tuple[str, str]:
    """(kind, message) of a gateway answer other than 200: "busy" for a 503 whose message says
    "server busy" (the server's refusal or the gateway's own), else the kind the status means."""
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode(errors="replace")
    if status == 503 and message.startswith("server busy"):
        return str(ErrorKind.BUSY), message
    kind = (ErrorKind.UNAVAILABLE if status == 503 else ErrorKind.INVALID if 400 <= status < 500
            else ErrorKind.INTERNAL)
    return str(kind), f"HTTP {status}: {message}"


async def _gateway_one(base_url: str, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
                       out: BurstResult | None = None) -> BurstResult:
    """Connect to the gateway at ``base_url`` now, send one ``POST /v1/audio/speech`` (pcm) once
    ``start`` is set and read its answer: a 200 stream (first audio bytes, then to its end) or
    an error status, whose ``Retry-After`` is kept. Times count from writing the request."""
    out = out if out is not None else BurstResult()
    host, _, port = base_url.removeprefix("http://").partition(":")
    body = json.dumps({"model": "tts-1", "input": request.text, "voice": request.voice or "2",
                       "response_format": "pcm", "max_new_tokens": request.max_new_tokens,
                       "min_new_tokens": request.min_new_tokens}).encode()
    head = (f"POST {GATEWAY_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, int(port or 80))
        await start.wait()
        out.sent_at = time.perf_counter()
        writer.write(head + body)
        await writer.drain()
        lines = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        out.retry_after = headers.get("retry-after")
        if status != 200:
            out.first_s = out.end_s = time.perf_counter() - out.sent_at
            out.kind, out.message = _gateway_kind(status, await asyncio.wait_for(reader.read(), timeout_s))
            return out
        received = 0
        while data := await asyncio.wait_for(reader.read(1 << 16), timeout_s):
            if out.first_s is None:
                out.first_s = time.perf_counter() - out.sent_at
            received += len(data)
        out.end_s = time.perf_counter() - out.sent_at
        out.audio_samples = received // 2  # PCM16 (the chunked framing's few bytes included)
    except Exception as exc:  # transport failure: counted, never hidden
        out.kind, out.message = "transport", f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    return out


QUEUED_GAUGE = "tts_request_queue_size"
"""The entry model's gauge of accepted streams that have not produced audio yet."""


def _accepted_waiting(metrics_url: str) -> int:
    """Accepted streams of ``contract.MODEL_STREAM`` without audio yet, from Triton's metrics."""
    from .serverload import scrape

    return round(sum(v for (name, labels), v in scrape(metrics_url).items()
                     if name == QUEUED_GAUGE and dict(labels).get("model") == contract.MODEL_STREAM))


CLIENT_NICE = -10
"""Niceness the burst client asks for while it measures a saturated server (``make bench``;
granted to root only, else it keeps its own)."""


OFFLINE_HOLD_TOKENS = 1024
"""Tokens of each held chattts_offline request: enough for it to hold its offline slot through
every burst (the engine admits it ahead of the waiting streams and decodes it in about 2
minutes of full-size steps on 2 cores; a held request that ended would leave a gap a burst
request could take). chattts_offline has no client cancel, so it runs to its end after the
bursts too."""

HOLD_TIMEOUT_S = 3600.0
"""Client deadline of the held streams and offline requests: they are meant to last until the
bursts end (then they are cancelled), however long a slow host makes the phase. With the
bench's 600 s they ended before the last bursts on 2 slow cores (make bench at f18910e), and
the phase no longer measured a saturated server."""

OFFLINE_RETRY_S = 0.5
"""Pause before a keeper sends again after its held request was refused (Triton picked a full
instance) or ended."""

OFFLINE_ACCEPTED_AFTER_S = 0.5
"""A held chattts_offline request still unanswered this long after its send counts as holding
its slot: a refusal comes in milliseconds, and an accepted one sends nothing until it ends
(the entry's queue gauge cannot tell: each instance's stub sets the same series)."""


async def _keep_offline_slot(channel: Any, text: str, index: int, timeout_s: float, go: asyncio.Event,
                             in_flight: dict[int, float]) -> None:
    """Keep one chattts_offline slot taken (on ``channel``, :func:`infer_channel`): send a long
    request and send again whenever it ends (refused "busy" by an instance that is full while
    the other has room: Triton picks the instance; or done), until cancelled.
    ``in_flight[index]`` is the send time of the unanswered request (perf_counter seconds)."""
    n = 0
    while True:
        n += 1
        in_flight[index] = time.perf_counter()
        try:
            await _offline_one(channel, SynthesisRequest(text=text, max_new_tokens=OFFLINE_HOLD_TOKENS,
                                                        min_new_tokens=OFFLINE_HOLD_TOKENS,
                                                        request_id=f"hold-offline-{index}-{n}"), go, timeout_s)
        finally:
            in_flight.pop(index, None)
        await asyncio.sleep(OFFLINE_RETRY_S)


def _hold_main(url: str, hold: int, hold_tokens: int, text: str, timeout_s: float, streaming: Any,
               running: Any, stop: Any, offline_hold: int = 0, offline_held: Any = None) -> None:
    """The held streams, in their own process: ``hold`` long streams and ``offline_hold``
    chattts_offline requests kept running (:func:`_keep_offline_slot`); ``streaming`` (shared
    int) counts the streams that have sent audio or ended, ``running`` those not ended,
    ``offline_held`` the offline requests unanswered for :data:`OFFLINE_ACCEPTED_AFTER_S`; all
    are cancelled once ``stop`` (a multiprocessing event) is set."""
    import tritonclient.grpc.aio as aio

    async def main() -> None:
        conns = [aio.InferenceServerClient(url) for _ in range(hold)]
        offline_conns = [infer_channel(url) for _ in range(offline_hold)]
        go = asyncio.Event()
        go.set()
        outs = [BurstResult() for _ in range(hold)]
        in_flight: dict[int, float] = {}
        tasks = [asyncio.create_task(_one(c, SynthesisRequest(text=text, max_new_tokens=hold_tokens,
                                                              min_new_tokens=hold_tokens, request_id=f"hold-{i}"),
                                          go, timeout_s, outs[i]))
                 for i, c in enumerate(conns)]
        keepers = [asyncio.create_task(_keep_offline_slot(c, text, i, timeout_s, go, in_flight))
                   for i, c in enumerate(offline_conns)]
        try:
            while not stop.is_set():
                streaming.value = sum(1 for o in outs if o.first_s is not None or o.kind)
                running.value = sum(1 for t in tasks if not t.done())
                if offline_held is not None:
                    now = time.perf_counter()
                    offline_held.value = sum(1 for t in list(in_flight.values()) if now - t >= OFFLINE_ACCEPTED_AFTER_S)
                await asyncio.sleep(0.05)
            running.value = sum(1 for t in tasks if not t.done())
        finally:
            for t in tasks + keepers:
                t.cancel()
            await asyncio.gather(*tasks, *keepers, return_exceptions=True)
            await asyncio.gather(*(c.close() for c in conns + offline_conns), return_exceptions=True)

    asyncio.run(main())


def _set_nice(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux keeps one per thread); raises
    OSError where the OS refuses (lowering it needs root)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


@contextlib.contextmanager
def _priority(nice: int | None) -> Iterator[int]:
    """Run the block at niceness ``nice`` (None: unchanged) if the OS allows it (root), else at
    the current one; yields the niceness in effect and restores the old one after."""
    old = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):  # an unprivileged process cannot lower its niceness
        if nice is not None:
            _set_nice(nice)
    try:
        yield os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        with contextlib.suppress(OSError):
            _set_nice(old)


DOORS: Final = ("stream", "offline", "gateway")
"""Where a burst's requests go: ``chattts`` streams over gRPC, ``chattts_offline`` infer calls
over gRPC, or ``POST /v1/audio/speech`` through the OpenAI gateway (HTTP)."""


async def run_burst(url: str, clients: int, tokens: int, text: str = DEFAULT_TEXT, timeout_s: float = 600.0,
                    hold: int = 0, hold_tokens: int = 2048, metrics_url: str | None = None,
                    hold_wait_s: float = 120.0, rounds: int = 1, pause_s: float = 1.0,
                    client_nice: int | None = None, offline_hold: int = 0, doors: Sequence[str] = ("stream",),
                    gateway_url: str | None = None) -> dict[str, Any]:
    """Connect ``clients`` clients, then send one request each at the same moment (``tokens`` new
    tokens each), ``rounds`` times, ``pause_s`` seconds apart (each round waits until all its
    requests have ended); the summary pools the rounds. With ``hold``, first start that many
    long streams (``hold_tokens`` each) in another process (their clients are other users: their
    audio is not this client's work) and wait until each has been accepted, so that the bursts
    meet a server already saturated; they are cancelled after the last. A held stream counts as
    accepted once it has sent audio or, with ``metrics_url`` (Triton's ``/metrics``), as soon as
    the server counts it among its accepted streams waiting for audio (the engine decodes at
    most its batch size at once: the rest of the held streams wait there without audio). With
    ``offline_hold``, that process also keeps that many chattts_offline requests running (every
    offline slot: ``entry.offline_threads``) and the bursts
    wait until all are unanswered for :data:`OFFLINE_ACCEPTED_AFTER_S`.
    Waits at most ``hold_wait_s`` seconds (``hold_ready`` in the summary says whether every one
    was accepted).

    ``doors`` (of :data:`DOORS`) says where the bursts go; the doors take turns, round by round
    (a door's rounds all after another's met another stretch of the saturated phase: the
    held requests' progress, the host's other load), the first door's summary is the top level
    of the result, every other's is under its name
    (``gateway`` needs ``gateway_url``, the gateway's base URL; its summary adds
    ``busy_with_retry_after``, the refusals that carried a ``Retry-After`` header).

    The client stands for 200 machines but shares the server's cores. With ``client_nice``
    (``make bench`` passes :data:`CLIENT_NICE` for the saturated bursts) it runs the bursts at
    that niceness where the OS grants it (``client_nice`` in the summary is the one in effect),
    so that what it measures is the server's delay rather than its own wait for a core that a
    saturated server keeps busy. Where bursts are accepted, it also receives their audio:
    raised, it would take the cores from the streams whose TTFA it measures. Returns the
    summary (see the module docstring). Raises ValueError for rounds below 1, an unknown door,
    or a gateway door without ``gateway_url``."""
    import multiprocessing as mp

    import tritonclient.grpc.aio as aio

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not doors or set(doors) - set(DOORS):
        raise ValueError(f"doors must be some of {DOORS}, got {tuple(doors)}")
    if "gateway" in doors and not gateway_url:
        raise ValueError("the gateway door needs gateway_url")
    conns = [aio.InferenceServerClient(url) for _ in range(clients)]
    channels = [infer_channel(url) for _ in range(clients)] if "offline" in doors else []
    hold_ready: bool | None = None
    pooled: dict[str, list[BurstResult]] = {d: [] for d in doors}
    round_p99: dict[str, list[float | None]] = {d: [] for d in doors}
    round_order: list[bool | None] = []
    ctx = mp.get_context("spawn")
    streaming, running, offline_held, stop = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event()
    holder = (ctx.Process(target=_hold_main, args=(url, hold, hold_tokens, text, max(timeout_s, HOLD_TIMEOUT_S),
                                                   streaming, running, stop, offline_hold, offline_held),
                          name="burst-hold", daemon=True) if hold or offline_hold else None)
    try:
        await asyncio.gather(*(c.is_server_live() for c in conns),  # every channel connected
                             *(connect_channel(c) for c in channels))
        if holder is not None:
            holder.start()  # before the priority changes: the held streams keep the default one
            give_up = time.perf_counter() + hold_wait_s
            while not (hold_ready := _held_accepted(streaming.value, hold, metrics_url)
                       and offline_held.value >= offline_hold) \
                    and time.perf_counter() < give_up and holder.is_alive():
                await asyncio.sleep(0.1)
        with _priority(client_nice) as nice_in_effect:
            for r in range(rounds):  # the doors take turns, so that the phase's drift meets each alike
                for door in doors:
                    if r or door != doors[0]:
                        await asyncio.sleep(pause_s)
                    targets: list[Any] = ([gateway_url] * clients if door == "gateway" else
                                          channels if door == "offline" else conns)
                    outcomes = await _round(_SENDERS[door], targets, tokens, text, timeout_s, tag=f"{door}-{r}")
                    pooled[door].extend(outcomes)
                    one = summarize(outcomes)
                    round_p99[door].append(one["busy_p99_s"])
                    if door == doors[0]:
                        round_order.append(one["busy_before_first_accepted_end"])
    finally:
        if holder is not None and holder.pid is not None:
            stop.set()
            await asyncio.to_thread(holder.join, 30.0)
            if holder.is_alive():
                holder.terminate()
        await asyncio.gather(*(c.close() for c in conns + channels), return_exceptions=True)
    summary = summarize(pooled[doors[0]])
    known = [v for v in round_order if v is not None]  # each round's refusals against its own accepted ends
    summary.update({"door": doors[0], "rounds": rounds, "round_busy_p99_s": round_p99[doors[0]],
                    "busy_before_first_accepted_end": all(known) if known else None, "client_nice": nice_in_effect})
    for door in doors[1:]:
        summary[door] = {**summarize(pooled[door]), "rounds": rounds, "round_busy_p99_s": round_p99[door]}
    if "gateway" in doors:
        gw = summary if doors[0] == "gateway" else summary["gateway"]
        busy = [o for o in pooled["gateway"] if o.kind == ErrorKind.BUSY]
        gw["busy_with_retry_after"] = sum(1 for o in busy if o.retry_after is not None)
    if hold or offline_hold:
        summary.update({"hold": hold, "hold_tokens": hold_tokens, "hold_ready": hold_ready,
                        "held_running_at_end": running.value})
    if offline_hold:
        summary.update({"offline_hold": offline_hold, "offline_hold_tokens": OFFLINE_HOLD_TOKENS,
                        "offline_held_at_end": offline_held.value})
    return summary


async def _round(send: Any, targets: list[Any], tokens: int, text: str, timeout_s: float,
                 tag: str) -> list[BurstResult]:
    """One burst: each of ``targets`` (a tritonclient gRPC client for the stream door, a gRPC
    channel of :func:`infer_channel` for the offline door, or the gateway's URL) gets ready to send
    (``send``: :func:`_one`, :func:`_offline_one` or :func:`_gateway_one`), then one request
    is sent on each at once."""
    start = asyncio.Event()
    outs = [BurstResult() for _ in targets]
    tasks = [asyncio.create_task(send(t, SynthesisRequest(text=text, max_new_tokens=tokens, min_new_tokens=tokens,
                                                          request_id=f"{tag}-{i}"), start, timeout_s, outs[i]))
             for i, t in enumerate(targets)]
    await asyncio.sleep(0.2)  # every stream open (every gateway connection made), waiting at the start line
    start_at = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    for o in outs:
        o.sent_after_start_s = o.sent_at - start_at if o.sent_at else None
    return outs


_SENDERS: Final = {"stream": _one, "offline": _offline_one, "gateway": _gateway_one}


def _held_accepted(streaming: int, hold: int, metrics_url: str | None) -> bool:
    """Every one of ``hold`` held streams has sent audio or ended (``streaming`` of them) or,
    with ``metrics_url``, is accepted and waiting."""
    if streaming >= hold:
        return True
    return metrics_url is not None and streaming + _accepted_waiting(metrics_url) >= hold


def summarize(outcomes: list[BurstResult]) -> dict[str, Any]:
    """Counts by outcome, busy-refusal latency and accepted streams' TTFA (s): p50, p99, max."""
    busy = [o.first_s for o in outcomes if o.kind == ErrorKind.BUSY and o.first_s is not None]
    busy_from_start = [o.first_s + o.sent_after_start_s for o in outcomes
                       if o.kind == ErrorKind.BUSY and o.first_s is not None and o.sent_after_start_s is not None]
    ok = [o for o in outcomes if o.kind is None and o.end_s is not None]
    ttfa = [o.first_s for o in ok if o.first_s is not None]
    kinds: dict[str, int] = {}
    for o in outcomes:
        kinds[o.kind or "ok"] = kinds.get(o.kind or "ok", 0) + 1
    first_final = min((o.end_s for o in ok if o.end_s is not None), default=None)
    return {
        "requests": len(outcomes), "outcomes": kinds,
        "lost": sum(1 for o in outcomes if o.end_s is None and o.kind is None),
        "busy_p50_s": percentile(busy, 50) if busy else None, "busy_p99_s": percentile(busy, 99) if busy else None,
        "busy_max_s": max(busy) if busy else None,
        "busy_p99_s_from_start": percentile(busy_from_start, 99) if busy_from_start else None,
        "busy_before_first_accepted_end": (all(b <= first_final for b in busy)
                                           if busy and first_final is not None else None),
        "accepted_ttfa_p50_s": percentile(ttfa, 50) if ttfa else None,
        "accepted_ttfa_p99_s": percentile(ttfa, 99) if ttfa else None,
        "messages": sorted({o.message for o in outcomes if o.kind and o.kind != ErrorKind.BUSY})[:5],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--hold", type=int, default=0, help="long streams started (and accepted) before the burst")
    ap.add_argument("--rounds", type=int, default=1, choices=range(1, 1001), metavar="N",
                    help="bursts one after another (1 to 1000), pooled in the summary")
    ap.add_argument("--metrics-url", default=None,
                    help="Triton's metrics, e.g. http://127.0.0.1:8002/metrics: held streams count as accepted "
                         "while they wait for the engine (else only once they send audio)")
    ap.add_argument("--client-nice", type=int, default=None,
                    help=f"niceness of the client during the bursts (root only below 0; make bench: {CLIENT_NICE} "
                         "with --hold)")
    ap.add_argument("--offline-hold", type=int, default=0,
                    help="chattts_offline requests kept running meanwhile (needs --metrics-url; make bench: every "
                         "offline slot)")
    ap.add_argument("--doors", default="stream",
                    help=f"comma-separated, of {','.join(DOORS)}: where the bursts go, one door after the other")
    ap.add_argument("--gateway-url", default=None, help="the gateway's base URL (door gateway), e.g. http://127.0.0.1:8080")
    args = ap.parse_args(argv)
    try:
        summary = asyncio.run(run_burst(args.url, args.clients, args.tokens, args.text, hold=args.hold,
                                        metrics_url=args.metrics_url, rounds=args.rounds, client_nice=args.client_nice,
                                        offline_hold=args.offline_hold, doors=tuple(args.doors.split(",")),
                                        gateway_url=args.gateway_url))
    except ValueError as exc:
        ap.error(str(exc))
    json.dump(summary, sys.stdout, indent=1, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


