"""OpenAI-style errors and the mapping from Triton errors to HTTP statuses.

Every error the gateway returns has OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": "..."}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from .. import contract
from ..client import ClientError
from ..client.admission_watch import AdmissionWatch
from ..client.common import LOST_CONNECTION
from ..errors import STATUS, ErrorKind, kind_from_status

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
SERVER_ERROR: Final = "server_error"

_CODE: Final = {ErrorKind.BUSY: "server_busy", ErrorKind.UNAVAILABLE: "backend_unavailable",
                 ErrorKind.DEADLINE: "server_busy", ErrorKind.CANCELLED: "cancelled",
                 ErrorKind.INTERNAL: "internal_error"}
"""OpenAI error ``code`` per kind (every 503 says: retry later or elsewhere; "backend_unavailable"
when the speech server is stopping, restarting or failing rather than full)."""


class ApiError(Exception):
    """An error answered to the client: HTTP ``status``, OpenAI's error fields and the
    :class:`~chattts_serving.errors.ErrorKind` it counts as in the metrics (default: the one
    the status implies, e.g. every 4xx is INVALID)."""

    def __init__(self, status: int, message: str, type_: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.kind = kind or kind_from_status(status) or ErrorKind.INTERNAL

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_client_error(exc: ClientError, url: str) -> ApiError:
    """Map a Triton client error to an :class:`ApiError` by its kind (the server's tag, or the
    transport status for Triton's own errors: :attr:`ClientError.kind`), with the kind's HTTP
    status (:data:`chattts_serving.errors.STATUS`): invalid input 400; busy, unavailable and
    deadline 503; cancelled 499; failures 500. An unreachable server is 503, an error of no
    known kind 500. An invalid request's ``param`` is the field of the entry input the server
    named (:func:`request_field`), None when it named none."""
    message = exc.message.strip() or "synthesis failed"
    if exc.connection:
        what = ("the speech backend went away during the stream (it stops or restarts)"
                if exc.message.startswith(LOST_CONNECTION) else "the speech backend is unreachable")
        return ApiError(503, f"{what} ({url})", SERVER_ERROR, code="backend_unavailable", kind=ErrorKind.UNAVAILABLE)
    kind = exc.kind or ErrorKind.INTERNAL
    status = STATUS[kind].http
    if kind == ErrorKind.INVALID:
        return ApiError(status, message, INVALID_REQUEST, param=request_field(exc.param), code="invalid_value",
                        kind=kind)
    return ApiError(status, message, SERVER_ERROR, code=_CODE[kind], kind=kind)


_GATEWAY_FIELD: Final = {contract.IN_TEXT.name: "input", contract.IN_REFERENCE_RATE.name: "reference_audio"}
"""The request field (:class:`~chattts_serving.gateway.speech.SpeechRequest`) of each entry
input whose name differs from it; every other input has its field's name."""


def request_field(param: str | None) -> str | None:
    """The request field an error about entry input ``param`` (:attr:`ClientError.param`) is
    about: ``text`` is ``input``, the sample rate is part of ``reference_audio`` (the gateway
    reads it from the WAV file); None stays None."""
    return None if param is None else _GATEWAY_FIELD.get(param, param)


def busy_refusal(streams: int, max_streams: int, watch: AdmissionWatch | None) -> ApiError | None:
    """The 503 the gateway answers itself, before reading or forwarding a speech request, when
    it already knows the request would be refused busy: it relays ``max_streams`` streams
    (``streams`` now), or the admission watch reports ``chattts`` full on every server behind
    the target. None when the request may go on."""
    if streams >= max_streams:
        streams_text = "1 stream" if max_streams == 1 else f"{max_streams} streams"
        return ApiError(503, f"server busy: the gateway relays {streams_text} already", SERVER_ERROR,
                        code="server_busy", kind=ErrorKind.BUSY)
    if watch is not None and watch.full(contract.MODEL_STREAM):
        return ApiError(503, "server busy: every stream slot of the speech server is taken", SERVER_ERROR,
                        code="server_busy", kind=ErrorKind.BUSY)
    return None


REQUEST_ID_HEADER: Final = "X-Request-Id"
"""Taken from the client when it is a plain token (letters, digits, ``-_.:``, at most 128),
otherwise generated; passed to Triton as the request id and returned on the response, an
error's included."""
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``X-Request-Id`` where it is a valid one, else None (the gateway then makes
    its own for a speech request)."""
    value = headers.get(REQUEST_ID_HEADER, "")
    return value if _REQUEST_ID.fullmatch(value) else None
