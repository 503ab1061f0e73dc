"""OpenAI-style errors and the mapping from Triton errors to HTTP statuses.

Every error the gateway returns has OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": "..."}}
"""

from __future__ import annotations

import re
from typing import Any, Final

from ..client import ClientError

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
SERVER_ERROR: Final = "server_error"

_KIND_STATUS: Final = {"invalid": 400, "unavailable": 503, "internal": 500, "cancelled": 499}
_KIND_TAG: Final = re.compile(r"^\[(invalid|unavailable|internal|cancelled)\] ")
_GRPC_STATUS: Final = {"StatusCode.INVALID_ARGUMENT": 400, "StatusCode.UNAVAILABLE": 503,
                       "StatusCode.RESOURCE_EXHAUSTED": 503, "StatusCode.DEADLINE_EXCEEDED": 503,
                       "StatusCode.CANCELLED": 499, "StatusCode.INTERNAL": 500, "timeout": 503}
_BUSY: Final = re.compile(r"^server (busy|unavailable)|exceeds maximum queue size|request timeout expired"
                          r"|deadline|timed out", re.IGNORECASE)
_INTERNAL: Final = re.compile(r"^internal error|engine ended the stream|no audio", re.IGNORECASE)


class ApiError(Exception):
    """An error answered to the client: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type_: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_client_error(exc: ClientError, url: str) -> ApiError:
    """Map a Triton client error to an :class:`ApiError`.

    Unreachable server, full queue, admission limit, timeouts: 503. Refused input: 400.
    Failures inside the pipeline: 500. Errors sent inside a gRPC stream carry no status code,
    only the model's message: a ``[kind] `` prefix (the project's BLS tag) decides when present,
    else the message's wording (``server busy ...`` is 503, ``internal error ...`` is 500, and
    the entry models' other in-stream errors are input validation, 400).
    """
    message = exc.message.strip() or "synthesis failed"
    if exc.connection:
        return ApiError(503, f"the speech backend is unreachable ({url})", SERVER_ERROR, code="backend_unavailable")
    status: int | None = None
    m = _KIND_TAG.match(message)
    if m:
        status = _KIND_STATUS[m.group(1)]
        message = message[m.end():]
    elif isinstance(exc.status, int):
        status = exc.status
    elif isinstance(exc.status, str) and exc.status in _GRPC_STATUS:
        status = _GRPC_STATUS[exc.status]
    elif exc.status is not None:
        status = 500
    if status is None:
        status = 503 if _BUSY.search(message) else 500 if _INTERNAL.search(message) else 400
    if status == 400:
        return ApiError(400, message, INVALID_REQUEST, param=_param_of(message), code="invalid_value")
    if status in (429, 503):
        return ApiError(503, message, SERVER_ERROR, code="server_busy")
    if status == 499:
        return ApiError(499, message, SERVER_ERROR, code="cancelled")
    return ApiError(500, message, SERVER_ERROR, code="internal_error")


def _param_of(message: str) -> str | None:
    """The request field a backend validation message is about, when it says."""
    low = message.lower()
    if "voice" in low:
        return "voice"
    if "text" in low or "control token" in low:
        return "input"
    return None
