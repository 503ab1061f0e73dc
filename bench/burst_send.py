"""One burst request per door, sent at the burst's start signal and timed from its send: a
``chattts`` stream (:func:`send_stream`), a ``chattts_offline`` infer call (:func:`send_offline`)
or ``POST /v1/audio/speech`` through the gateway (:func:`send_gateway`); each fills a
:class:`BurstResult` with the time to its refusal or first audio, its end and its error kind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

from chattts_serving import contract
from chattts_serving.client.common import ClientError, SynthesisRequest
from chattts_serving.client.keys import grpc_metadata, resolve_key
from chattts_serving.errors import ErrorKind, decode


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


async def send_stream(client: Any, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
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
    :func:`send_offline`."""
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


async def send_offline(channel: Any, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
                       out: BurstResult | None = None) -> BurstResult:
    """Send ``request`` to ``chattts_offline`` (one unary infer call on ``channel``, made by
    :func:`infer_channel`) once ``start`` is set and wait for its answer: the whole utterance
    (first and end at once) or one error.

    The request is built and serialized before ``start``, and times count from the moment gRPC
    takes its bytes to start the call (its request serializer, which gRPC calls as the call
    begins), as the stream door's count from the moment gRPC takes its request message from the
    request iterator (:func:`send_stream`). Timed from the ``infer`` call instead, each of a burst's
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


async def send_gateway(base_url: str, request: SynthesisRequest, start: asyncio.Event, timeout_s: float,
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
