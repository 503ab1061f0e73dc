"""The gateway's ASGI middleware: the speech door (:class:`AdmissionDoor`) and CORS whose
refusals speak OpenAI's error shape (:class:`OpenAICors`)."""

from __future__ import annotations

from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import INVALID_REQUEST, ApiError, client_request_id
from .speech import SPEECH_PATH
from .state import GatewayState


class AdmissionDoor:
    """In front of the application: every ``POST /v1/audio/speech`` asks
    :meth:`.state.GatewayState.admit` here, once, before anything reads, routes or validates
    its body, and a refusal is answered here (503 with ``Retry-After``). An unauthorized request
    asks nothing unless the gateway drains: it goes on unadmitted and gets its 401 from the
    route. An admitted request holds its slot until its response has ended, however it ends.
    Every other request passes through unchanged."""

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != SPEECH_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if not self.state.drain.draining and not self.state.authorized(Headers(scope=scope)):
            await self.app(scope, receive, send)  # unadmitted: the route answers 401
            return
        try:
            slot = self.state.admit()
        except ApiError as refusal:
            refused = self.state.error_response(SPEECH_PATH, refusal, client_request_id(Headers(scope=scope)))
            await refused(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            slot.release()


class BodyTooLarge(HTTPException):
    """A request body past the gateway's limit, found while it is read: an HTTPException so
    that FastAPI, which turns any other error inside body parsing into a 400, lets it through."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, body_too_large_message(max_bytes))


def body_too_large_message(max_bytes: int) -> str:
    return (f"the request body is larger than the gateway's limit of {max_bytes} bytes "
            "(--max-body-bytes; a recording goes in reference_audio, at most 16 MiB)")


class BodyLimit:
    """Every HTTP request's body at most ``max_bytes``: a larger Content-Length is answered 413
    before anything is read, and a body that grows past the limit as it is read (chunked, or a
    Content-Length that lied) ends with 413 there (:class:`BodyTooLarge`), so no request holds
    more than the limit in the gateway's memory."""

    def __init__(self, app: ASGIApp, state: GatewayState, max_bytes: int) -> None:
        self.app = app
        self.state = state
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length", "")
        encoding = headers.get("content-encoding", "identity").strip().lower()
        refusal = None
        if length.isdigit() and int(length) > self.max_bytes:
            refusal = ApiError(413, body_too_large_message(self.max_bytes), INVALID_REQUEST, code="body_too_large")
        elif encoding not in ("", "identity"):  # refused whether or not the body happens to parse
            refusal = ApiError(400, f"{scope['method']} {scope['path']}: Content-Encoding {encoding!r} is not "
                               "supported, send the body uncompressed", INVALID_REQUEST, code="invalid_body")
        if refusal is not None:
            await self.state.error_response(scope["path"], refusal, client_request_id(headers))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class OpenAICors(CORSMiddleware):
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
