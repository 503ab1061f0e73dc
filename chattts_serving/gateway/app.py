"""The FastAPI application: routes, authentication, error handlers and streaming."""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..audio import formats as audio_format
from ..client import ClientError
from .errors import AUTHENTICATION, INVALID_REQUEST, ApiError, from_client_error
from .settings import GatewaySettings
from .speech import EncodedStream, SpeechRequest, build_request, delta_event, done_event, error_event

log = logging.getLogger("chattts_serving.gateway")

SAMPLE_RATE_HEADER = "X-Sample-Rate"
REQUEST_ID_HEADER = "X-Request-Id"
"""Taken from the client when it is a plain token (letters, digits, ``-_.:``, at most 128),
otherwise generated; passed to Triton as the request id and returned on the response."""
DROPPED_HEADER = "X-Unspoken-Text"
"""JSON list (ASCII, \\u escapes) of the characters the front end could not speak; absent when none."""
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""Response header stating the sample rate of the audio, in Hz."""


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway application for ``settings`` (default: :meth:`GatewaySettings.from_env`).

    Routes: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/models/{id}``,
    ``GET /health``. With an API key set, ``/v1/*`` requires ``Authorization: Bearer <key>``.
    """
    cfg = settings if settings is not None else GatewaySettings.from_env()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["limiter"] = anyio.CapacityLimiter(cfg.max_streams)
        yield

    app = FastAPI(title="ChatTTS speech gateway", version="1", lifespan=lifespan,
                  summary="OpenAI-compatible text-to-speech over Triton")
    app.state.settings = cfg

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = loc[0] if loc else None
        msg = str(first.get("msg", "invalid request"))
        return JSONResponse(ApiError(400, f"{'.'.join(loc) or 'body'}: {msg}", INVALID_REQUEST, param=param,
                                     code="invalid_value").body(), status_code=400)

    def authorize(request: Request) -> None:
        if cfg.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), cfg.api_key.encode()):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           AUTHENTICATION, code="invalid_api_key")

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 when Triton answers ready within ``health_timeout_s``, else 503."""
        ready = await anyio.to_thread.run_sync(_triton_ready, cfg.triton_url, cfg.health_timeout_s)
        body = {"status": "ok" if ready else "unavailable", "triton": "ready" if ready else "not ready",
                "triton_url": cfg.triton_url}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(m) for m in cfg.models]}

    @app.get("/v1/models/{model_id}", dependencies=[Depends(authorize)])
    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in cfg.models:
            raise ApiError(404, f"The model '{model_id}' does not exist", INVALID_REQUEST, param="model",
                           code="model_not_found")
        return _model_card(model_id)

    @app.post("/v1/audio/speech", dependencies=[Depends(authorize)], response_model=None)
    async def speech(body: SpeechRequest, http_request: Request) -> Response:
        """Synthesise ``input`` and stream it: chunked bytes of ``response_format``
        (``stream_format`` 'audio') or ``speech.audio.delta`` events ('sse')."""
        request_id = http_request.headers.get(REQUEST_ID_HEADER, "")
        if not _REQUEST_ID.fullmatch(request_id):
            request_id = uuid.uuid4().hex
        request = dataclasses.replace(build_request(body, cfg.models, cfg.max_input_chars), request_id=request_id)
        info = audio_format.format_info(body.response_format)
        limiter = state["limiter"]
        stream = await anyio.to_thread.run_sync(EncodedStream, cfg.triton_url, request, info.name,
                                                cfg.stream_timeout_s, limiter=limiter)
        try:  # wait for the first audio, so that refusals get their HTTP status
            first = await anyio.to_thread.run_sync(stream.next_bytes, limiter=limiter)
        except ClientError as exc:
            await anyio.to_thread.run_sync(stream.close)
            raise from_client_error(exc, cfg.triton_url) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stream.close)
            raise
        headers = {SAMPLE_RATE_HEADER: str(info.sample_rate_hz), "X-Audio-Format": info.name,
                   "Cache-Control": "no-store", REQUEST_ID_HEADER: request_id}
        if stream.info.get("dropped"):
            headers[DROPPED_HEADER] = json.dumps(stream.info["dropped"])
        sse = body.stream_format == "sse"
        return StreamingResponse(_relay(stream, first, sse, len(body.input), limiter, cfg.triton_url),
                                 media_type="text/event-stream" if sse else info.media_type, headers=headers)

    return app


async def _relay(stream: EncodedStream, first: bytes | None, sse: bool, input_chars: int,
                 limiter: anyio.CapacityLimiter, url: str) -> AsyncIterator[bytes]:
    """Body of a speech response; closes (cancels) the Triton stream however it ends."""
    try:
        data = first
        while data is not None:
            if data:
                yield delta_event(data) if sse else data
            try:
                data = await anyio.to_thread.run_sync(stream.next_bytes, limiter=limiter)
            except ClientError as exc:
                error = from_client_error(exc, url)
                log.warning("stream failed after it started: %s", error.message)
                if sse:
                    yield error_event(error)
                    return
                raise  # aborts the chunked response: the client sees a truncated body
        if sse:
            yield done_event(input_chars, stream.audio_tokens)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stream.close)


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "chattts-serving"}


def _triton_ready(url: str, timeout_s: float) -> bool:
    import tritonclient.grpc as grpcclient

    try:
        client = grpcclient.InferenceServerClient(url)
    except Exception:  # malformed URL
        return False
    try:
        return bool(client.is_server_ready(client_timeout=timeout_s))
    except Exception:  # unreachable or timed out: not ready
        return False
    finally:
        client.close()
