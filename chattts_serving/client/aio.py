"""Asyncio streaming client for the decoupled entry model (``contract.MODEL_STREAM``) over gRPC.

One :class:`AioStreamClient` per process (per event loop) holds one
``tritonclient.grpc.aio.InferenceServerClient``: one gRPC channel, one HTTP/2 connection over
which every stream of the process is multiplexed. Streams are awaited in the event loop itself;
no thread waits for a chunk. Use::

    client = AioStreamClient("127.0.0.1:8001")          # inside the running event loop
    async with contextlib.aclosing(client.stream(request, idle_timeout_s=90)) as parts:
        async for part in parts:                          # StreamPart: audio (float32) and info
            ...
    await client.close()                                  # at shutdown

Leaving the ``async for`` early (an exception, a ``break``, the task being cancelled) and then
closing the generator cancels the request on the server: Triton's ``is_cancelled()`` turns
true and the engine drops the sequence. Errors raise :class:`ClientError` with the server's
kind (:attr:`ClientError.kind`, from the ``[kind]`` tag of the message).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from .. import contract
from .common import TIMEOUT, ClientError, StreamPart, SynthesisRequest
from .grpc_stream import grpc_error, grpc_inputs, response_part
from .keys import grpc_metadata, resolve_key

DEFAULT_IDLE_TIMEOUT_S: Final = 90.0
"""Default longest wait for the next response of a stream, in seconds: longer than the entry
model's own ``entry.stall_timeout_s`` (60 s in the profiles), so that a stalled engine is
reported by the server's clearer error first."""

RECONNECT_BACKOFF_MAX_MS: Final = 2000
"""Longest pause between reconnection attempts of the shared channel, in milliseconds (gRPC's
default grows to 120 s: a restarted Triton would stay unreachable for minutes)."""

CHANNEL_ARGS: Final = [
    # Every address the target resolves to gets a connection and streams take turns over them:
    # with ``dns:///<headless service>:8001`` one gateway spreads its streams over every Triton
    # replica (a plain ClusterIP resolves to one address: the same as pick_first).
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 2),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
]


class AioStreamClient:
    """Streams requests to ``contract.MODEL_STREAM`` at ``url`` (``host:port`` of Triton's
    gRPC endpoint, or any gRPC target such as ``dns:///triton-headless:8001``, whose addresses
    then share the streams round robin) over one shared channel.

    Create it inside the running event loop; it serves any number of concurrent streams of
    that loop (it is not thread-safe). Nothing connects until the first call; an unreachable
    server shows as a :class:`ClientError` with ``connection=True`` on the stream (or False
    from :meth:`ready`). ``inference_key``: sent with every request as the inference key
    (default: the configured one, :func:`.keys.resolve_key`; a server without a key ignores it)."""

    def __init__(self, url: str, inference_key: str | None = None) -> None:
        self.url = url
        self.inference_key = resolve_key(inference_key)
        self.metadata = grpc_metadata(self.inference_key)
        """gRPC metadata for inference requests (the inference key), None without a key."""
        self._client = grpcaio.InferenceServerClient(url, channel_args=CHANNEL_ARGS)

    @property
    def grpc_client(self) -> grpcaio.InferenceServerClient:
        """The shared tritonclient (its channel), for other calls that must take the same
        connection as the streams (the admission watch of a single-address target)."""
        return self._client

    async def close(self) -> None:
        """Close the channel; streams still open fail."""
        await self._client.close()

    async def ready(self, timeout_s: float, model: str | None = None) -> bool:
        """Whether Triton answers ready within ``timeout_s`` seconds, and so does ``model``
        when one is named (a model unloaded by the admin leaves the server ready); never raises."""
        try:
            if not await self._client.is_server_ready(client_timeout=timeout_s):
                return False
            return model is None or bool(await self._client.is_model_ready(model, client_timeout=timeout_s))
        except (InferenceServerException, grpc.RpcError, OSError):
            return False

    async def audio_prompt(self, *, voice: str = "", text: str = "", reference_audio: np.ndarray | None = None,
                           reference_rate_hz: int = contract.SAMPLE_RATE_HZ, reference_text: str | None = None,
                           no_speaker: bool = False, timeout_s: float = 60.0) -> np.ndarray:
        """Ask the front-end model (``chattts_frontend``) what it makes of a voice and a
        reference recording: the audio-prompt codes (P, 4) int32 of ``reference_audio`` (the
        DVAE encoder's; (0, 4) without one) after the front end checked the voice, the
        recording (limits, rate) and its transcript. ``text``: a sentence to prepare with
        them (default: the transcript, else a placeholder).

        Raises :class:`ClientError`: the front end refused something (kind INVALID, ``param``
        the input at fault), or Triton could not be reached (``connection=True``).
        """
        def tensor(name: str, arr: np.ndarray, dtype: str) -> grpcaio.InferInput:
            inp = grpcaio.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            return inp

        def string(name: str, value: str) -> grpcaio.InferInput:
            return tensor(name, np.array([value.encode("utf-8")], dtype=np.object_), "BYTES")

        inputs = [string(contract.IN_TEXT.name, text or reference_text or "好。"),
                  string(contract.IN_VOICE.name, voice),
                  tensor(contract.FE_NO_SPEAKER.name, np.array([no_speaker]), "BOOL")]
        if reference_text is not None:
            inputs.append(string(contract.IN_REFERENCE_TEXT.name, reference_text))
        if reference_audio is not None:
            inputs += [tensor(contract.IN_REFERENCE_AUDIO.name, np.ascontiguousarray(reference_audio, np.float32),
                              "FP32"),
                       tensor(contract.IN_REFERENCE_RATE.name, np.array([reference_rate_hz], np.int32), "INT32")]
        try:
            result = await self._client.infer(contract.MODEL_FRONTEND, inputs, client_timeout=timeout_s,
                                              headers=self.metadata,
                                              outputs=[grpcaio.InferRequestedOutput(contract.FE_PROMPT_CODES.name)])
        except (InferenceServerException, grpc.RpcError, OSError) as exc:
            raise self._error(exc) from None
        codes = result.as_numpy(contract.FE_PROMPT_CODES.name)
        return np.zeros((0, contract.NUM_VQ), np.int32) if codes is None else np.asarray(codes, np.int32)

    def _error(self, exc: BaseException, streaming: bool = False) -> ClientError:
        """The :class:`ClientError` of a failed call (:func:`.grpc_stream.grpc_error`, as the
        sync client maps it); ``streaming``: it ended a stream that had begun."""
        if isinstance(exc, grpc.aio.AioRpcError):
            status, message = str(exc.code()), exc.details() or str(exc.code())
        elif isinstance(exc, InferenceServerException):
            status, message = exc.status(), exc.message() or str(exc)
        else:
            status, message = None, str(exc)
        return grpc_error(status, message, self.url, bool(self.inference_key), streaming)

    async def stream(self, request: SynthesisRequest, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                     max_duration_s: float | None = None) -> AsyncGenerator[StreamPart, None]:
        """Send ``request`` and yield each response as a :class:`StreamPart` (its audio: (n,)
        float32 mono at ``contract.SAMPLE_RATE_HZ``, possibly empty; its ``info`` object on
        the first audio response and the final one). Responses with neither are skipped.

        ``idle_timeout_s``: longest wait for the next response, seconds (the stream fails only
        when the server goes quiet, however long it runs). ``max_duration_s``: optional cap
        on the whole stream, seconds (None: none).

        Raises :class:`ClientError`: the server's error for the request (its ``kind`` from the
        message's tag), an unreachable server (``connection=True``), or a timeout above
        (``status`` ``"timeout"``, kind DEADLINE). Closing the generator before the end
        (``aclose()``) cancels the request on the server.
        """
        if idle_timeout_s <= 0 or (max_duration_s is not None and max_duration_s <= 0):
            raise ValueError("idle_timeout_s and max_duration_s must be > 0 seconds")
        inputs = grpc_inputs(request)

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            # One request, then the request side closes: Triton ends the call once that
            # request's last response is sent.
            yield {"model_name": contract.MODEL_STREAM, "inputs": inputs, "request_id": request.request_id or ""}

        call = self._client.stream_infer(one_request(), headers=self.metadata)
        deadline = None if max_duration_s is None else time.monotonic() + max_duration_s
        finished = received = False
        try:
            while True:
                wait_s = idle_timeout_s
                # which bound this wait ends at, decided before it (the loop's timer may fire a
                # clock tick early, so the clock read after it cannot tell)
                capped = deadline is not None and deadline - time.monotonic() <= idle_timeout_s
                if deadline is not None:
                    wait_s = min(wait_s, deadline - time.monotonic())
                try:
                    result, error = await asyncio.wait_for(call.__anext__(), timeout=max(wait_s, 0.0))
                except StopAsyncIteration:
                    finished = True  # the server closed the call: the request is complete
                    return
                except asyncio.TimeoutError:
                    if capped:
                        raise ClientError(f"the stream did not finish within {max_duration_s:g} s",
                                          TIMEOUT) from None
                    raise ClientError(f"no response from {self.url} for {idle_timeout_s:g} s", TIMEOUT) from None
                except (grpc.aio.AioRpcError, InferenceServerException) as exc:
                    raise self._error(exc, streaming=received) from None
                if error is not None:
                    finished = True  # an error ends the request on the server
                    raise self._error(error, streaming=received)
                received = True
                part, final = response_part(result)
                if part.audio.size or part.info:
                    yield part
                if final:
                    finished = True
                    return
        finally:
            if not finished:
                call.cancel()
