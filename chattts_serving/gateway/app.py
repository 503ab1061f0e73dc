"""The FastAPI application: routes, authentication, CORS, error handlers, metrics and streaming.

One :class:`~chattts_serving.client.AioStreamClient` (one gRPC channel to Triton) is created
in the application's lifespan and shared by every request; streams are awaited in the event
loop, and only the lossy encoders (mp3, aac, opus) run in worker threads.

"Server busy" is decided before anything else where the gateway knows it already (its own
``max_streams``, or the server's admission watch reporting every stream slot taken:
:class:`~chattts_serving.client.admission_watch.AdmissionWatch`): :class:`_BusyDoor` answers such a
speech request with 503 and ``Retry-After`` before its body is read, parsed or forwarded.
So is every speech request while the gateway drains (:mod:`.drain`: after SIGTERM).
"""

from __future__ import annotations

import base64
import dataclasses
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import contract
from ..audio import formats as audio_format
from ..client import AioStreamClient, ClientError
from ..client.admission_watch import AdmissionWatch
from ..errors import ErrorKind
from ..text.voices import OPENAI_VOICES, VoiceBook
from .drain import Drain, shutting_down
from .errors import AUTHENTICATION, INVALID_REQUEST, SERVER_ERROR, ApiError, busy_refusal, from_client_error
from .metrics import CONTENT_TYPE, GatewayMetrics
from .omni_ws import serve_stream
from .saved_voices import SavedVoices, created, lookup, prepare_voice, read_upload, save, unavailable
from .settings import GatewaySettings
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
from .voice_store import NAME_PATTERN, StoreUnavailable, VoiceStore
from .ws import WS_PATH, Close, error_fields, event, page_html

log = logging.getLogger("chattts_serving.gateway")

SPEECH_PATH: Final = "/v1/audio/speech"
SAMPLE_RATE_HEADER: Final = "X-Sample-Rate"
"""Response header stating the sample rate of the audio, in Hz."""
REQUEST_ID_HEADER: Final = "X-Request-Id"
"""Taken from the client when it is a plain token (letters, digits, ``-_.:``, at most 128),
otherwise generated; passed to Triton as the request id and returned on the response."""
DROPPED_HEADER: Final = "X-Unspoken-Text"
"""JSON list (ASCII, \\u escapes) of the characters the front end could not speak; absent when none."""
DEGRADED_HEADER: Final = "X-Degraded"
"""``true`` on a response the server made in its degraded mode (under overload: the codes
vocoder, larger chunks, no refine-text; never less of the text); absent otherwise."""
EXPOSED_HEADERS: Final = (REQUEST_ID_HEADER, SAMPLE_RATE_HEADER, DROPPED_HEADER, DEGRADED_HEADER, "X-Audio-Format",
                          "Retry-After")
"""Response headers a browser script may read on a cross-origin response (CORS)."""
CORS_METHODS: Final = ("GET", "POST", "DELETE")
"""Methods a page on an allowed origin may use: every route's (DELETE removes a saved voice)."""
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class StreamCut(Exception):
    """Raised inside a chunked audio body after a mid-stream failure and caught by the response,
    which returns unfinished: the server closes the connection without the terminating chunk,
    so the client sees a truncated response (not one that looks complete)."""


def _voice_list(book: VoiceBook) -> list[dict[str, str]]:
    """``{"id", "name"}`` for every named voice; the built-in OpenAI names first, in OpenAI's
    order, then the voices file's in alphabetical order."""
    names = [n for n in OPENAI_VOICES if book.get(n) is not None]
    names += [n for n in book.names() if n not in OPENAI_VOICES]
    return [{"id": n, "name": n} for n in names]


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway application for ``settings`` (default: :meth:`GatewaySettings.from_env`).

    Routes: ``POST /v1/audio/speech``, ``GET /v1/audio/voices`` (and ``/v1/voices``),
    ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` (Triton ready),
    ``GET /health/live`` (the process answers), ``GET /metrics`` (Prometheus), the WebSocket
    ``/v1/audio/speech/stream`` (:mod:`.ws`: text in deltas, audio frames back) and ``GET /``
    (a page that plays that stream). With an API key set, ``/v1/*`` requires
    ``Authorization: Bearer <key>`` (the WebSocket also takes a ``bearer.<key>`` subprotocol);
    health, metrics, the page and CORS preflights never do.

    Raises :class:`~chattts_serving.text.voices.VoiceError` when the voices file is malformed.
    """
    cfg = settings if settings is not None else GatewaySettings.from_env()
    book = VoiceBook.load(cfg.voices_file) if cfg.voices_file is not None else VoiceBook()
    voices = _voice_list(book)
    saved = SavedVoices(VoiceStore(cfg.voice_store), book)
    metrics = GatewayMetrics()
    live = {"streams": 0}
    drain = Drain(live)
    clients: dict[str, AioStreamClient] = {}
    watches: dict[str, AdmissionWatch] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clients["triton"] = AioStreamClient(cfg.triton_url, inference_key=cfg.triton_inference_key or "")
        if cfg.admission_watch:
            watches["triton"] = AdmissionWatch(cfg.triton_url, shared=clients["triton"].grpc_client,
                                               inference_key=cfg.triton_inference_key or "")
            watches["triton"].start()
        try:
            yield
        finally:
            if "triton" in watches:
                await watches.pop("triton").close()
            await clients.pop("triton").close()
            saved.store.close()

    def busy() -> ApiError | None:
        """The 503 this gateway answers itself now, if any: it drains (:mod:`.drain`), or is
        busy (:func:`.errors.busy_refusal`)."""
        if drain.draining:
            return shutting_down()
        return busy_refusal(live["streams"], cfg.max_streams, watches.get("triton"))

    app = FastAPI(title="ChatTTS speech gateway", version="1", lifespan=lifespan,
                  summary="OpenAI-compatible text-to-speech over Triton")
    app.state.settings = cfg
    app.state.drain = drain

    def refuse_early(scope: Scope) -> Response | None:
        """For :class:`_BusyDoor`: the 503 of an authorized speech request the gateway knows is
        refused busy (or any while the gateway drains); None otherwise (an unauthorized one
        gets its 401 the usual way)."""
        exc = busy()
        if exc is None or (not drain.draining and not authorized(Headers(scope=scope))):
            return None
        return error_response(SPEECH_PATH, exc)

    app.add_middleware(_BusyDoor, refuse=refuse_early)  # added first: CORS (below) wraps its answers too
    if cfg.cors_origins:
        app.add_middleware(_OpenAICors, allow_origins=list(cfg.cors_origins), allow_methods=list(CORS_METHODS),
                           allow_headers=["Authorization", "Content-Type", REQUEST_ID_HEADER],
                           expose_headers=list(EXPOSED_HEADERS), max_age=600)

    def error_response(path: str, exc: ApiError) -> JSONResponse:
        if path == SPEECH_PATH:
            metrics.error(exc.kind, "before_audio")
        headers = {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if exc.status == 503:
            headers["Retry-After"] = str(cfg.retry_after_s)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request.url.path, _validation_api_error(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(request.url.path, ApiError(500, f"internal error: {type(exc).__name__}",
                                                         SERVER_ERROR, code="internal_error", kind=ErrorKind.INTERNAL))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(request.url.path, ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                                         f"{exc.detail}", INVALID_REQUEST, code=code))

    def authorized(headers: Headers) -> bool:
        """Whether ``headers`` carry the API key (always, when none is set)."""
        if cfg.api_key is None:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), cfg.api_key.encode())

    async def authorize(request: Request) -> None:
        if not authorized(request.headers):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           AUTHENTICATION, code="invalid_api_key")

    @app.get("/health")
    async def health() -> JSONResponse:
        """Readiness: 200 when Triton and its streaming door (``chattts``, which may be unloaded
        while the server stays ready) answer ready within ``health_timeout_s``, else 503; 503
        ``draining`` at once while the gateway drains (a load balancer stops routing to it)."""
        if drain.draining:
            return JSONResponse({"status": "draining", "streams_in_flight": live["streams"]}, status_code=503,
                                headers={"Retry-After": str(cfg.retry_after_s)})
        ready = await clients["triton"].ready(cfg.health_timeout_s, model=contract.MODEL_STREAM)
        body: dict[str, Any] = {"status": "ok" if ready else "unavailable",
                                "triton": "ready" if ready else "not ready", "triton_url": cfg.triton_url,
                                "streams_in_flight": live["streams"]}
        if "triton" in watches:
            body["admission"] = watches["triton"].describe()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/health/live")
    async def health_live() -> dict[str, str]:
        """Liveness: 200 while the process serves requests, whatever Triton's state."""
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """The gateway's metrics in Prometheus' text format (:mod:`.metrics`)."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(m) for m in cfg.models]}

    @app.get("/v1/models/{model_id}", dependencies=[Depends(authorize)])
    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in cfg.models:
            raise ApiError(404, f"The model '{model_id}' does not exist", INVALID_REQUEST, param="model",
                           code="model_not_found")
        return _model_card(model_id)

    @app.get("/v1/audio/voices", dependencies=[Depends(authorize)])
    @app.get("/v1/voices", dependencies=[Depends(authorize)], include_in_schema=False)
    async def list_voices() -> dict[str, Any]:
        """Every voice name ``voice`` accepts (``{"voices": [{"id", "name"}]}``, the shape Open
        WebUI reads): the built-in names, the voices file's, then the saved ones, which
        ``saved_voices`` describes (:meth:`.voice_store.SavedVoice.describe`). Integer seeds and
        ChatTTS ``spk_emb`` strings are accepted too and not listed. 503 when the store of
        saved voices is unavailable."""
        try:
            stored = await anyio.to_thread.run_sync(saved.store.list)
        except StoreUnavailable as exc:
            raise unavailable(exc) from None
        return {"voices": voices + [{"id": v.name, "name": v.name} for v in stored],
                "saved_voices": [v.describe() for v in stored]}

    @app.post("/v1/audio/voices", dependencies=[Depends(authorize)], status_code=201)
    async def save_voice(request: Request) -> dict[str, Any]:
        """Save a voice under a name (:mod:`.saved_voices`), from a multipart form (the
        recording as a file: OpenAI's ``audio.voices.create``, vLLM-Omni's form, ``curl -F``)
        or a JSON object (base64): 201 with OpenAI's ``Voice`` fields and ``voice``, its
        description; 400 for a bad upload, 409 for a name taken, 503 when Triton or the store
        is unavailable."""
        upload, recording, field = await read_upload(request)
        voice = await prepare_voice(upload, book, clients["triton"], cfg.triton_url, recording, field)
        return created(await save(saved.store, voice))

    @app.get("/v1/audio/voices/{name}", dependencies=[Depends(authorize)])
    async def get_voice(name: str) -> dict[str, Any]:
        """A saved voice with the Triton inputs it stands for (``inputs``: ``voice``, and
        ``spk_smp`` with ``reference_text`` for an audio prompt), for clients of the Triton door."""
        voice = await lookup(saved.store, name) if NAME_PATTERN.fullmatch(name) else None
        if voice is None:
            raise ApiError(404, f"no saved voice named '{name}'", INVALID_REQUEST, param="name",
                           code="voice_not_found")
        return {**voice.describe(), "inputs": voice.request_fields()}

    @app.delete("/v1/audio/voices/{name}", dependencies=[Depends(authorize)])
    async def delete_voice(name: str) -> dict[str, Any]:
        """Remove a saved voice: 200, or 404 when there is none of that name; requests already
        speaking with it finish with it."""
        try:
            gone = NAME_PATTERN.fullmatch(name) is not None and await anyio.to_thread.run_sync(saved.store.delete,
                                                                                               name)
        except StoreUnavailable as exc:
            raise unavailable(exc) from None
        if not gone:
            raise ApiError(404, f"no saved voice named '{name}'", INVALID_REQUEST, param="name",
                           code="voice_not_found")
        return {"id": name.lower(), "object": "audio.voice.deleted", "deleted": True, "name": name.lower()}

    @app.websocket(WS_PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        """Text deltas in, sentence by sentence audio out: this gateway's dialect (:mod:`.ws`) or
        vLLM-Omni's (:mod:`.omni_ws`), told apart by the first message. While the gateway
        drains, the handshake is refused with 503 and ``Retry-After``."""
        if drain.draining:
            await refuse_handshake(websocket, shutting_down())
            return
        with drain.connection():
            await serve_stream(websocket, cfg, clients["triton"], metrics, live, busy, saved, drain)

    async def refuse_handshake(websocket: WebSocket, exc: ApiError) -> None:
        """Answer a WebSocket handshake with the HTTP error ``exc`` (OpenAI's body, ``Retry-After``
        on a 503); a server without the denial extension gets the ``error`` event and close 1012."""
        metrics.error(exc.kind, "before_audio")
        response = error_response(WS_PATH, exc)
        try:
            await websocket.send_denial_response(response)
        except RuntimeError:  # no "websocket.http.response" extension
            await websocket.accept()
            await websocket.send_text(event("error", **error_fields(exc, True)))
            await websocket.close(int(Close.SERVICE_RESTART), reason="service_restart")

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        """The demo page: type text, pick a voice, hear it stream (``gateway/static/index.html``)."""
        return HTMLResponse(page_html(cfg.api_key is not None), headers={"Cache-Control": "no-store"})

    @app.post(SPEECH_PATH, dependencies=[Depends(authorize)], response_model=None)
    async def speech(body: SpeechRequest, http_request: Request) -> Response:
        """Synthesise ``input`` and stream it: chunked bytes of ``response_format``
        (``stream_format`` 'audio') or ``speech.audio.delta`` events ('sse')."""
        t0 = time.perf_counter()
        request_id = http_request.headers.get(REQUEST_ID_HEADER, "")
        if not _REQUEST_ID.fullmatch(request_id):
            request_id = uuid.uuid4().hex
        fields = body.model_dump(exclude_none=True)
        if (resolved := await saved.resolve(fields)) is not fields:  # a saved voice's name
            body = SpeechRequest.model_validate(resolved)
        if body.reference_audio is not None:  # decoded off the event loop (and kept for build_request)
            await anyio.to_thread.run_sync(reference_recording, body.reference_audio)
        request = dataclasses.replace(build_request(body, cfg.models, cfg.max_input_chars), request_id=request_id)
        info = output_format(body)
        if (refusal := busy()) is not None:  # again: other requests may have filled it since _BusyDoor
            raise refusal
        live["streams"] += 1
        metrics.in_flight.inc()
        stream = EncodedStream(clients["triton"].stream(request, idle_timeout_s=cfg.stream_idle_timeout_s,
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
            live["streams"] -= 1
            metrics.in_flight.dec()
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
        if stream.info.get("degraded"):
            headers[DEGRADED_HEADER] = "true"
            metrics.degraded.labels(door="speech").inc()
        relay = _Relay(stream, first, body.stream_format == "sse", len(body.input), request_id, t0, cfg.triton_url,
                       metrics, live, timings=bool(body.sentence_timings), drain=drain)
        if body.sentence_timings and not relay.sse:
            return await _timed_response(relay, info, headers)
        return _RelayResponse(relay, media_type="text/event-stream" if relay.sse else info.media_type,
                              headers=headers)

    return app


class _OpenAICors(CORSMiddleware):
    """Starlette's CORS middleware whose preflight refusals carry the OpenAI error object every
    other refusal of the gateway carries (Starlette answers them in plain text): 400,
    ``{"error": {"message": "CORS preflight refused: origin ... is not allowed", "type":
    "invalid_request_error", "param": null, "code": "cors_not_allowed"}}``."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        problems = []
        if not self.is_allowed_origin(origin=request_headers["origin"]):
            problems.append(f"origin {request_headers['origin']!r} is not allowed")
        if request_headers["access-control-request-method"] not in self.allow_methods:
            problems.append(f"method {request_headers['access-control-request-method']!r} is not allowed "
                            f"(allowed: {', '.join(sorted(self.allow_methods))})")
        asked = [h.strip().lower() for h in request_headers.get("access-control-request-headers", "").split(",")
                 if h.strip()]
        if not self.allow_all_headers and (refused := [h for h in asked if h not in self.allow_headers]):
            problems.append(f"header(s) {', '.join(refused)} not allowed")
        if not problems:
            problems.append(bytes(response.body).decode(errors="replace"))  # e.g. private network access
        error = ApiError(response.status_code, "CORS preflight refused: " + "; ".join(problems), INVALID_REQUEST,
                         code="cors_not_allowed")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(error.body(), status_code=response.status_code, headers=headers)


class _BusyDoor:
    """ASGI middleware in front of the application: a ``POST /v1/audio/speech`` that ``refuse``
    answers (a 503 the gateway decides itself) is answered before anything reads its body,
    routes it or validates it; every other request passes through unchanged."""

    def __init__(self, app: ASGIApp, refuse: Any) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == SPEECH_PATH and scope["method"] == "POST":
            response = self.refuse(scope)
            if response is not None:
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Relay:
    """The body of one speech response, and the release of what its stream holds (the Triton
    stream, the in-flight count, the request's metrics) exactly once, however it ends."""

    def __init__(self, stream: EncodedStream, first: bytes | None, sse: bool, input_chars: int, request_id: str,
                 t0: float, url: str, metrics: GatewayMetrics, live: dict[str, int], timings: bool = False,
                 drain: Drain | None = None) -> None:
        self.stream, self.first, self.sse, self.input_chars = stream, first, sse, input_chars
        self.drain = drain if drain is not None else Drain()
        """Ends the stream when the gateway's drain expires (:mod:`.drain`)."""
        self.timings = timings
        """Send a ``speech.sentence`` event as each sentence's audio is complete (SSE)."""
        self.request_id, self.t0, self.url, self.metrics, self.live = request_id, t0, url, metrics, live
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
                yield done_event(self.input_chars, self.stream.audio_tokens)
            self.status = "ok"
        finally:
            with anyio.CancelScope(shield=True):
                await self.release()

    async def release(self) -> None:
        """Close the Triton stream (cancelling it if it still runs) and record the request's
        outcome; later calls do nothing."""
        if self._released:
            return
        self._released = True
        try:
            await self.stream.aclose()
        finally:
            self.live["streams"] -= 1
            m = self.metrics
            m.in_flight.dec()
            m.audio.inc(self.stream.audio_s)
            if self.status != "error":
                m.requests.labels(status=self.status).inc()
            if self.status == "ok":
                m.duration.observe(time.perf_counter() - self.t0)


class _RelayResponse(StreamingResponse):
    """A streaming response that releases its :class:`_Relay` even when the body was never
    iterated (a client gone before the first byte was sent)."""

    def __init__(self, relay: _Relay, **kwargs: Any) -> None:
        super().__init__(relay.body(), **kwargs)
        self.relay = relay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except StreamCut:
            pass  # logged by the relay; returning unfinished makes the server close the connection
        finally:
            with anyio.CancelScope(shield=True):
                await self.relay.release()


async def _timed_response(relay: _Relay, info: audio_format.FormatInfo, headers: dict[str, str]) -> JSONResponse:
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
    body = {"audio": base64.b64encode(b"".join(parts)).decode("ascii"), "response_format": info.name,
            "container": "wav" if info.media_type == "audio/wav" else "raw", "media_type": info.media_type,
            "sample_rate_hz": rate, "samples": samples, "duration_s": round(samples / rate, 4),
            "sentences": sentences}
    return JSONResponse(body, headers=headers)


def _validation_api_error(exc: RequestValidationError) -> ApiError:
    """The 400 for a body that is not JSON or does not match :class:`SpeechRequest` (its first
    problem; ``param`` is the field)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return ApiError(400, f"the body is not valid JSON{': ' + str(reason) if reason else ''}", INVALID_REQUEST,
                        code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None  # the request field (deeper parts name pydantic's union branches)
    msg = str(first.get("msg", "invalid request"))
    return ApiError(400, f"{param or 'body'}: {msg}", INVALID_REQUEST, param=param, code="invalid_value")


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "chattts-serving"}

