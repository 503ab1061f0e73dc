"""The FastAPI application: the gateway's state, its middleware, its routers and how errors
are answered (:func:`create_app`).

The routes are thin (:mod:`.routers`); the services hold the logic (:mod:`.relay` the speech
response, :mod:`.dialects` with :mod:`.ws` and :mod:`.omni_ws` the WebSocket stream,
:mod:`.saved_voices` the voices); what they share is one :class:`~.state.GatewayState`, whose
:meth:`~.state.GatewayState.admit` is the gateway's one admission decision. "Server busy" is
decided before anything else where the gateway knows it already (its own ``max_streams``, or
the server's admission watch reporting every stream slot taken: the door,
:class:`~.middleware.AdmissionDoor`, answers a speech request 503 with ``Retry-After`` before
its body is read, parsed or forwarded), and so is every speech request while the gateway
drains (:mod:`.drain`: after SIGTERM).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ErrorKind
from .errors import INVALID_REQUEST, SERVER_ERROR, ApiError, client_request_id
from .middleware import AdmissionDoor, BodyLimit, OpenAICors
from .relay import EXPOSED_HEADERS, REQUEST_ID_HEADER
from .routers import ROUTERS
from .settings import GatewaySettings
from .speech import VoiceRef
from .state import GatewayState

log = logging.getLogger("chattts_serving.gateway")

CORS_METHODS: Final = ("GET", "POST", "DELETE")
"""Methods a page on an allowed origin may use: every route's (DELETE removes a saved voice)."""


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
    state = GatewayState(settings if settings is not None else GatewaySettings.from_env())
    cfg = state.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.open()
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(title="ChatTTS speech gateway", version="1", lifespan=lifespan,
                  summary="OpenAI-compatible text-to-speech over Triton")
    app.state.gateway = state
    app.add_middleware(AdmissionDoor, state=state)  # added first: CORS (below) wraps its answers too
    app.add_middleware(BodyLimit, state=state, max_bytes=cfg.max_body_bytes)  # around the door: no slot for it
    if cfg.cors_origins:
        app.add_middleware(OpenAICors, allow_origins=list(cfg.cors_origins), allow_methods=list(CORS_METHODS),
                           allow_headers=["Authorization", "Content-Type", REQUEST_ID_HEADER],
                           expose_headers=list(EXPOSED_HEADERS), max_age=600)
    for router in ROUTERS:
        app.include_router(router)

    def request_id(request: Request) -> str | None:
        """The id the speech route gave the request, else the client's valid X-Request-Id."""
        return getattr(request.state, "request_id", None) or client_request_id(request.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return state.error_response(request.url.path, exc, request_id(request))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return state.error_response(request.url.path, _validation_api_error(exc, request.headers.get("content-type")),
                                    request_id(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return state.error_response(request.url.path, ApiError(
            500, f"internal error: {type(exc).__name__}", SERVER_ERROR, code="internal_error", kind=ErrorKind.INTERNAL),
            request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed",
                413: "body_too_large"}.get(exc.status_code)
        detail = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:  # FastAPI's words for a body it could not read
            detail += (f": Content-Encoding {request.headers['content-encoding']!r} is not supported, send the body "
                       "uncompressed" if request.headers.get("content-encoding")
                       else ": a JSON object in UTF-8 (or a multipart form for a voice upload) is expected")
        return state.error_response(request.url.path, ApiError(
            exc.status_code, f"{request.method} {request.url.path}: {detail}", INVALID_REQUEST, code=code),
            request_id(request))

    return app


def _validation_api_error(exc: RequestValidationError, content_type: str | None = None) -> ApiError:
    """The 400 for a body that is not JSON or does not match :class:`SpeechRequest` (its first
    problem; ``param`` is the field). A whole body that is no object under a ``content_type``
    other than JSON (``curl -d`` sends form data's) says that the body must be sent as JSON."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    media = (content_type or "").split(";")[0].strip().lower()
    if tuple(first.get("loc", ())) == ("body",) and media != "application/json" and not media.endswith("+json"):
        return ApiError(400, f"the body must be a JSON object sent with Content-Type: application/json "
                             f"(got {media or 'no Content-Type'})", INVALID_REQUEST, code="invalid_json")
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return ApiError(400, f"the body is not valid JSON{': ' + str(reason) if reason else ''}", INVALID_REQUEST,
                        code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None  # the request field (deeper parts name pydantic's union branches)
    msg = str(first.get("msg", "invalid request"))
    branches = [e for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == [param]]
    if param is not None and len(branches) > 1:  # a union field (voice): every form it takes, and what came
        forms = list(dict.fromkeys(_expected_form(e) for e in branches))
        msg = f"expected {', '.join(forms[:-1])} or {forms[-1]}, got {_json_type(first.get('input'))}"
    return ApiError(400, f"{param or 'body'}: {msg}", INVALID_REQUEST, param=param, code="invalid_value")


_FORMS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}


def _expected_form(error: Any) -> str:
    """What one branch of a union field takes, from pydantic's error for it: a scalar type, or
    an object with the field the branch missed (``{"id": ...}``)."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    if len(loc) > 1 and loc[1] == VoiceRef.__name__:  # the object branch, whatever it missed
        return "an object " + "{" + ", ".join(f'"{name}": "..."' for name in VoiceRef.model_fields) + "}"
    return _FORMS.get(str(error.get("type")), "another type")


def _json_type(value: Any) -> str:
    """The JSON type of ``value`` as a reader of the request knows it."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(type(value), "another type")

