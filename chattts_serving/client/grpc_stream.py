"""Streaming client for the decoupled entry model over gRPC (``contract.MODEL_STREAM``), or the
ensemble door (``contract.MODEL_ENSEMBLE``, ``model=``), whose chunks are put in order by
their ``chunk_index`` (:class:`~chattts_serving.client.common.ChunkOrder`).

One bidirectional gRPC stream per request: the request is sent with
``enable_empty_final_response=True`` and audio chunks arrive as they are synthesised until
a response carries the ``triton_final_response`` parameter.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .. import contract
from .common import (
    LOST_CONNECTION,
    TIMEOUT,
    ChunkOrder,
    ClientError,
    StreamPart,
    SynthesisRequest,
    SynthesisResult,
    audio_only,
    collect_stream,
    connection_lost,
    parse_info,
)
from .keys import grpc_metadata, key_error, resolve_key

DEFAULT_TIMEOUT_S = 300.0
"""Default deadline of a whole stream, in seconds."""

_EARLY_ERROR_WAIT_S = 5.0


def grpc_error(status: str | None, message: str, url: str, key_sent: bool = False,
               streaming: bool = False) -> ClientError:
    """The :class:`ClientError` of a failed tritonclient gRPC call (sync or asyncio):
    ``status`` the gRPC status name (``"StatusCode.UNAVAILABLE"``; None for an error the model
    sent inside the stream), ``message`` its text.

    Triton's refusal for the inference key becomes "inference key required"
    (:func:`.keys.key_error`). A server that cannot be reached or went away
    (:func:`.common.connection_lost`) is ``connection=True``, kind UNAVAILABLE: the message
    begins with "cannot connect to" and the URL, or, when the error ended a stream that had begun
    (``streaming``), with :data:`.common.LOST_CONNECTION`. So is CANCELLED: both clients cancel
    only by closing their generator, which raises nothing, so a cancelled call is the server's
    doing (tritonserver cancels its open streams as it stops), retryable as UNAVAILABLE.
    """
    refused = key_error(message, url, key_sent, grpc=True)
    if refused is not None:
        return refused
    if connection_lost(status, message):
        what = LOST_CONNECTION if streaming else "cannot connect to"  # mid-stream: the server went away
        return ClientError(f"{what} {url}: {message}", status, connection=True)
    if status == "StatusCode.CANCELLED":
        return ClientError(f"{LOST_CONNECTION} {url}: the server cancelled the call ({message})", status,
                           connection=True)
    return ClientError(message, status)


def _client_error(exc: InferenceServerException, url: str, key_sent: bool = False,
                  streaming: bool = False) -> ClientError:
    """:func:`grpc_error` of a sync tritonclient exception."""
    return grpc_error(exc.status(), exc.message() or str(exc), url, key_sent, streaming)


def grpc_inputs(request: SynthesisRequest) -> list[grpcclient.InferInput]:
    """The request's input tensors for a tritonclient gRPC call (sync or asyncio)."""
    out = []
    for name, arr, dtype in request.tensors():
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


def response_part(result: Any) -> tuple[StreamPart, bool]:
    """One streamed ``InferResult`` as a :class:`StreamPart` (audio: (n,) float32, possibly
    empty; ``info`` when the response carries it), and whether it is the stream's final one.
    Raises ClientError when ``info`` is not a JSON object."""
    audio = result.as_numpy(contract.OUT_AUDIO.name)
    info = result.as_numpy(contract.OUT_INFO.name)
    index = result.as_numpy(contract.OUT_CHUNK_INDEX.name)
    params = result.get_response().parameters
    final = "triton_final_response" in params and bool(params["triton_final_response"].bool_param)
    return StreamPart(np.zeros(0, np.float32) if audio is None else np.asarray(audio, np.float32).reshape(-1),
                      parse_info(info) if info is not None else None,
                      int(index.reshape(-1)[0]) if index is not None and index.size else None), final


def iter_chunks(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
                model: str = contract.MODEL_STREAM, inference_key: str | None = None
                ) -> Generator[np.ndarray, None, None]:
    """Stream ``request`` to ``model`` (``chattts`` or ``chattts_ensemble``) at ``url``
    (``host:port`` of Triton's gRPC endpoint) and yield each audio chunk in stream order:
    (n,) float32 mono samples at ``contract.SAMPLE_RATE_HZ``, empty responses skipped. Closing
    the generator early cancels the request on the server. Raises :class:`ClientError` as
    :func:`iter_parts` does."""
    yield from audio_only(iter_parts(url, request, timeout_s, model, inference_key=inference_key))


def iter_parts(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
               model: str = contract.MODEL_STREAM, order: ChunkOrder | None = None,
               inference_key: str | None = None) -> Generator[StreamPart, None, None]:
    """Stream ``request`` to ``model`` (``chattts``, or the ensemble door ``chattts_ensemble``)
    at ``url`` (``host:port`` of Triton's gRPC endpoint) and yield each response as a
    :class:`StreamPart`, in stream order (an ensemble's parts by their ``chunk_index``, through
    ``order``, a fresh :class:`ChunkOrder` by default): its audio ((n,) float32 mono at
    ``contract.SAMPLE_RATE_HZ``, possibly empty) and its ``info`` JSON object (on the first
    audio response and the final one). Closing the generator early cancels the request on
    the server (``stop_stream(cancel_requests=True)``). ``inference_key``: sent as the
    inference key (default: the configured one, :func:`.keys.resolve_key`).

    Raises :class:`ClientError` when the server returns an error for the request (the
    server's message, status None), cannot be reached (``connection=True``), refuses the
    inference key ("inference key required"), the stream does not finish within
    ``timeout_s`` seconds, or an ensemble chunk is missing.
    """
    order = order if order is not None else ChunkOrder()
    key = resolve_key(inference_key)
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()

    def callback(result: Any = None, error: InferenceServerException | None = None) -> None:
        responses.put((result, error))

    finished = False
    try:
        try:
            client.start_stream(callback=callback, stream_timeout=timeout_s, headers=grpc_metadata(key))
        except InferenceServerException as exc:
            finished = True
            raise _client_error(exc, url, bool(key)) from None
        try:
            client.async_stream_infer(model, grpc_inputs(request), request_id=request.request_id or "",
                                      enable_empty_final_response=True)
        except InferenceServerException as exc:
            # A stream that failed at once (server unreachable) refuses new requests; the
            # reason itself is handed to the callback, usually a moment later.
            finished = True
            try:
                _, early = responses.get(timeout=_EARLY_ERROR_WAIT_S)
            except queue.Empty:
                early = None
            raise _client_error(early if early is not None else exc, url, bool(key)) from None
        deadline = time.monotonic() + timeout_s
        received = False
        while True:
            try:
                result, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ClientError(f"no response from {url} within {timeout_s:g} s", TIMEOUT) from None
            if error is not None:
                finished = True  # the server has ended this request
                raise _client_error(error, url, bool(key), streaming=received)
            received = True
            part, final = response_part(result)
            for p in order.add(part):
                if p.audio.size or p.info:
                    yield p
            if final:
                finished = True
                order.check_complete()
                return
    finally:
        try:
            client.stop_stream(cancel_requests=not finished)
        finally:
            client.close()


def synthesize_stream(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
                      model: str = contract.MODEL_STREAM, inference_key: str | None = None) -> SynthesisResult:
    """Run one streamed synthesis over gRPC on ``model`` (``chattts`` or ``chattts_ensemble``)
    and collect it.

    ``ttfa_s`` is the time from sending to the first non-empty chunk, ``total_s`` to the
    final response (both ``time.perf_counter`` seconds, including connection setup).
    Raises :class:`ClientError` as :func:`iter_chunks` does.
    """
    t0 = time.perf_counter()
    return collect_stream(iter_parts(url, request, timeout_s=timeout_s, model=model, inference_key=inference_key), t0)
