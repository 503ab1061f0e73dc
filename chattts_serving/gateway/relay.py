"""The speech service: one ``POST /v1/audio/speech`` from its validated request to the end of
its response (:func:`synthesise`).

The request was admitted at the door (:class:`.middleware.AdmissionDoor`, which holds its slot
until the response ends); here a saved voice is resolved, the request built, the Triton stream
opened on the shared client and its first audio awaited (so that refusals get their HTTP
status), then the audio is relayed as chunked bytes or OpenAI's ``speech.audio.delta`` events
(:class:`Relay`), or as one JSON body with ``sentence_timings``. Only the lossy encoders (mp3,
aac, opus) run in worker threads.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..audio import formats as audio_format
from ..client import ClientError
from ..errors import ErrorKind
from .drain import Drain, shutting_down
from .errors import REQUEST_ID_HEADER, SERVER_ERROR, ApiError, client_request_id, from_client_error
from .metrics import GatewayMetrics
from .speech import (
    EncodedStream,
    SpeechRequest,
    build_request,
    delta_event,
    done_event,
    error_event,
    output_format,
    reference_recording,
    sentence_event,
)
from .state import GatewayState

log = logging.getLogger("chattts_serving.gateway")

SAMPLE_RATE_HEADER: Final = "X-Sample-Rate"
"""Response header stating the sample rate of the audio, in Hz."""
DROPPED_HEADER: Final = "X-Unspoken-Text"
"""JSON list (ASCII, \\u escapes) of the characters the front end could not speak; absent when none."""
DEGRADED_HEADER: Final = "X-Degraded"
"""``true`` on a response the server made in its degraded mode (under overload: the codes
vocoder, larger chunks, no refine-text; never less of the text); absent otherwise."""
IGNORED_FIELDS_HEADER: Final = "X-Ignored-Fields"
"""The request body's fields this server does not know and ignored (comma-separated, ASCII,
\\u escapes); absent when none."""
EXPOSED_HEADERS: Final = (REQUEST_ID_HEADER, SAMPLE_RATE_HEADER, DROPPED_HEADER, DEGRADED_HEADER,
                          IGNORED_FIELDS_HEADER, "X-Audio-Format", "Retry-After")
"""Response headers a browser script may read on a cross-origin response (CORS)."""


class StreamCut(Exception):
    """Raised inside a chunked audio body after a mid-stream failure and caught by the response,
    which returns unfinished: the server closes the connection without the terminating chunk,
    so the client sees a truncated response (not one that looks complete)."""


async def synthesise(state: GatewayState, body: SpeechRequest, http_request: Request) -> Response:
    """Synthesise ``input`` and stream it: chunked bytes of ``response_format``
    (``stream_format`` 'audio') or ``speech.audio.delta`` events ('sse'), or one JSON body
    (:func:`timed_response`). Raises ApiError for a request refused before its audio began."""
    cfg, saved, metrics, drain = state.settings, state.saved, state.metrics, state.drain
    t0 = time.perf_counter()
    request_id = client_request_id(http_request.headers) or uuid.uuid4().hex
    http_request.state.request_id = request_id  # an error answer after this point carries it too
    ignored = body.ignored_fields
    if ignored:
        log.warning("request %s: ignored unknown fields %s", request_id, ignored)
    fields = body.model_dump(exclude_none=True)
    if (resolved := await saved.resolve(fields)) is not fields:  # a saved voice's name
        body = SpeechRequest.model_validate(resolved)
    if body.reference_audio is not None:  # decoded off the event loop (and kept for build_request)
        await anyio.to_thread.run_sync(reference_recording, body.reference_audio)
    request = dataclasses.replace(build_request(body, cfg.models, cfg.max_input_chars), request_id=request_id)
    info = output_format(body)
    stream = EncodedStream(state.client.stream(request, idle_timeout_s=cfg.stream_idle_timeout_s,
                                               max_duration_s=cfg.stream_max_s),
                           body.response_format, body.sample_rate, body.container)
    try:  # wait for the first audio, so that refusals get their HTTP status
        with drain.active() as waiting:
            first = await stream.next_bytes()
        if waiting.cancelled_caught:
            raise shutting_down()
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
        if isinstance(exc, ClientError):
            raise await saved.explain(from_client_error(exc, cfg.triton_url)) from None
        if not isinstance(exc, Exception):
            metrics.requests.labels(status="cancelled").inc()
        raise
    if first is not None:
        metrics.ttfa.observe(time.perf_counter() - t0)
    headers = {SAMPLE_RATE_HEADER: str(info.sample_rate_hz), "X-Audio-Format": info.name,
               "Cache-Control": "no-store", REQUEST_ID_HEADER: request_id}
    if stream.info.get("dropped"):
        headers[DROPPED_HEADER] = json.dumps(stream.info["dropped"])
    if ignored:
        headers[IGNORED_FIELDS_HEADER] = ", ".join(json.dumps(f)[1:-1] for f in ignored)
    if stream.info.get("degraded"):
        headers[DEGRADED_HEADER] = "true"
        metrics.degraded.labels(door="speech").inc()
    relay = Relay(stream, first, body.stream_format == "sse", len(body.input), request_id, t0, cfg.triton_url,
                  metrics, timings=bool(body.sentence_timings), drain=drain)
    if body.sentence_timings and not relay.sse:
        return await timed_response(relay, info, headers)
    return RelayResponse(relay, cfg.send_timeout_s, media_type="text/event-stream" if relay.sse else info.media_type,
                         headers=headers)


class Relay:
    """The body of one speech response, and the release of what its stream holds (the Triton
    stream, the request's metrics) exactly once, however it ends (its slot is the door's)."""

    def __init__(self, stream: EncodedStream, first: bytes | None, sse: bool, input_chars: int, request_id: str,
                 t0: float, url: str, metrics: GatewayMetrics, timings: bool = False,
                 drain: Drain | None = None) -> None:
        self.stream, self.first, self.sse, self.input_chars = stream, first, sse, input_chars
        self.drain = drain if drain is not None else Drain()
        """Ends the stream when the gateway's drain expires (:mod:`.drain`)."""
        self.timings = timings
        """Send a ``speech.sentence`` event as each sentence's audio is complete (SSE)."""
        self.request_id, self.t0, self.url, self.metrics = request_id, t0, url, metrics
        self.status = "cancelled"
        """ok, error, or cancelled (the client went away first)."""
        self.cut_error: ApiError | None = None
        """The error that cut an audio body (:class:`StreamCut`)."""
        self._released = False

    async def body(self) -> AsyncIterator[bytes]:
        """Encoded audio (or SSE events) until the stream ends; a failure after the first
        audio ends SSE with an ``error`` event and cuts an audio body (:class:`StreamCut`), and
        so does the drain's expiry (its SSE event with ``retryable: true``)."""
        try:
            data = self.first
            while data is not None:
                if self.sse and self.timings:  # sentences that ended before this data's audio
                    for timing in self.stream.take_sentences():
                        yield sentence_event(timing)
                if data:
                    yield delta_event(data) if self.sse else data
                drained = False
                try:
                    with self.drain.active() as waiting:
                        data = await self.stream.next_bytes()
                    if not waiting.cancelled_caught:
                        continue
                    error, drained = shutting_down(), True
                except ClientError as exc:
                    error = from_client_error(exc, self.url)
                self.status = "error"
                self.metrics.error(error.kind, "mid_stream")
                log.warning("request %s: stream %s after audio started: [%s] %s", self.request_id,
                            "ended by the drain" if drained else "failed", error.kind.value, error.message)
                if self.sse:
                    yield error_event(error)  # the drain's shutting_down() is a 503: retryable
                    return
                self.cut_error = error
                raise StreamCut(error.message)
            if self.sse:
                if self.timings:
                    for timing in self.stream.take_sentences():
                        yield sentence_event(timing)
                yield done_event(self.input_chars, self.stream.audio_tokens, self.capped_segments)
            if self.capped_segments:
                log.warning("request %s: sentences %s ended at max_new_tokens, not at their end", self.request_id,
                            self.capped_segments)
            self.status = "ok"
        finally:
            with anyio.CancelScope(shield=True):
                await self.release()

    @property
    def capped_segments(self) -> list[int]:
        """The sentences (segment indices) whose audio ended at ``max_new_tokens``: the server's
        final ``info``, known once the stream has ended."""
        return [int(i) for i in self.stream.info.get("capped_segments") or []]

    async def release(self) -> None:
        """Close the Triton stream (cancelling it if it still runs) and record the request's
        outcome; later calls do nothing."""
        if self._released:
            return
        self._released = True
        try:
            await self.stream.aclose()
        finally:
            m = self.metrics
            m.audio.inc(self.stream.audio_s)
            if self.status != "error":
                m.requests.labels(status=self.status).inc()
            if self.status == "ok":
                m.duration.observe(time.perf_counter() - self.t0)


class ClientStalled(Exception):
    """The client took no audio for the send timeout: its stream is cancelled and the
    connection closed without the terminating chunk."""


class RelayResponse(StreamingResponse):
    """A streaming response that releases its :class:`Relay` even when the body was never
    iterated (a client gone before the first byte was sent), and cuts off a client that takes
    no audio for ``send_timeout_s``: the server's write waits while the client does not read,
    and such a client would hold its stream slot, its engine row and the audio Triton buffers
    for as long as it keeps the connection open."""

    def __init__(self, relay: Relay, send_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(relay.body(), **kwargs)
        self.relay = relay
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def timed_send(message: Any) -> None:
            try:
                with anyio.fail_after(self.send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise ClientStalled() from None

        try:
            await super().__call__(scope, receive, timed_send)
        except StreamCut:
            pass  # logged by the relay; returning unfinished makes the server close the connection
        except ClientStalled:
            self.relay.status = "cancelled"
            log.warning("request %s: the client took no audio for %g s: stream cancelled", self.relay.request_id,
                        self.send_timeout_s)
        finally:
            with anyio.CancelScope(shield=True):
                await self.relay.release()


async def timed_response(relay: Relay, info: audio_format.FormatInfo, headers: dict[str, str]) -> JSONResponse:
    """The whole synthesis as one JSON body (``sentence_timings`` without SSE): ``audio``
    (base64 of the complete file or stream of the format), ``response_format``, ``container``,
    ``sample_rate_hz``, ``samples`` and ``duration_s`` of the delivered audio, and
    ``sentences`` (:meth:`.timings.SentenceTiming.as_dict` each). Waits for the end of the
    synthesis, so that a failure has its status (nothing was sent yet)."""
    parts: list[bytes] = []
    try:
        async for data in relay.body():
            parts.append(data)
    except StreamCut:
        relay.status = "error"
        raise relay.cut_error or ApiError(500, "synthesis failed", SERVER_ERROR, code="internal_error",
                                          kind=ErrorKind.INTERNAL) from None
    sentences = [t.as_dict() for t in relay.stream.take_sentences()]
    samples = sum(t["duration_samples"] for t in sentences)
    rate = info.sample_rate_hz
    audio = b"".join(parts)
    if info.media_type == "audio/wav" and audio:  # whole now: its sizes can be told
        audio = audio_format.sealed_wav(audio)
    body = {"audio": base64.b64encode(audio).decode("ascii"), "response_format": info.name,
            "container": "wav" if info.media_type == "audio/wav" else "raw", "media_type": info.media_type,
            "sample_rate_hz": rate, "samples": samples, "duration_s": round(samples / rate, 4),
            "sentences": sentences, "capped_segments": relay.capped_segments}
    return JSONResponse(body, headers=headers)

