"""Error kinds, the one error type of a request, and the codec that carries a kind from the
model that raised it to the status the client sees.

Every way a request can fail is one :class:`ErrorKind`. A kind has one Triton error code,
one HTTP status and one gRPC status (:data:`STATUS`). On its way to the client the kind
travels inside the error message as a tag, ``[kind] message`` (:func:`encode` /
:func:`decode`), because neither of Triton 2.51's two carriers keeps the code
(docs/triton-workarounds.md, "error codes lost"). An error about
one input also names it: ``[kind:param] message`` (``param`` an input name such as ``voice``,
:attr:`RequestError.param`), so that clients (the gateway's OpenAI ``param`` field) know which
input was wrong without reading the message:

* a BLS caller receives every error of a model it called as INTERNAL, whatever its code;
* an error inside a gRPC stream (a decoupled model) reaches the client as the stream's last
  message with no status code at all, and over SSE Triton answers any first-response error
  with HTTP 400.

The GPT engine cannot use error responses at all (docs/triton-workarounds.md, "no error
responses from the engine"): it ends a failed sequence with the
stop reason ``error:<kind>:<message>`` (:func:`encode_stop` / :func:`decode_stop`).

Clients decode the tag (:func:`decode`), falling back to the transport's status
(:func:`kind_from_status`) for errors that Triton itself raised (queue full, queue timeout)
and therefore carry no tag. Nothing here imports Triton.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from .contract import WireEnum

NOTHING_SPEAKABLE: Final = "text has nothing speakable after normalisation"
"""How the INVALID error of a text with nothing to speak (only punctuation, symbols, emoji)
begins: the WebSocket stream reports such a sentence as dropped, not as an error."""


class ErrorKind(WireEnum):
    """Why a request failed; decides its status on every protocol (:data:`STATUS`)."""

    INVALID = "invalid"
    """The request is wrong (input, parameter, voice, length): fix it, don't retry."""
    BUSY = "busy"
    """The server is full (admission limit, engine queue, batch shed, Triton's queue): retry
    later or elsewhere."""
    UNAVAILABLE = "unavailable"
    """A stage is failing (circuit breaker open, engine stopped responding): retry elsewhere."""
    DEADLINE = "deadline"
    """The request's own deadline (``timeout_s``) passed."""
    CANCELLED = "cancelled"
    """The client cancelled."""
    INTERNAL = "internal"
    """A failure inside the pipeline."""


@dataclass(frozen=True)
class Status:
    """How one kind is reported: Triton's ``TritonError`` code name, the HTTP status and the
    gRPC status name. Triton 2.51 has no deadline code, so a deadline is UNAVAILABLE (503)."""

    triton: str
    http: int
    grpc: str


STATUS: Final[dict[ErrorKind, Status]] = {
    ErrorKind.INVALID: Status("INVALID_ARG", 400, "INVALID_ARGUMENT"),
    ErrorKind.BUSY: Status("UNAVAILABLE", 503, "UNAVAILABLE"),
    ErrorKind.UNAVAILABLE: Status("UNAVAILABLE", 503, "UNAVAILABLE"),
    ErrorKind.DEADLINE: Status("UNAVAILABLE", 503, "UNAVAILABLE"),
    ErrorKind.CANCELLED: Status("CANCELLED", 499, "CANCELLED"),
    ErrorKind.INTERNAL: Status("INTERNAL", 500, "INTERNAL"),
}
"""Each kind's Triton code, HTTP status and gRPC status (499: nginx's "client closed
request", the gateway's status for a cancelled request)."""


class RequestError(Exception):
    """A request that ends with an error of ``kind``; ``str(exc)`` is the message for the
    client (without the tag, which :func:`encode` adds on the wire). ``param``: the name of
    the input (a ``contract`` tensor name, e.g. ``"voice"``) the error is about, None when it
    is about no one input. Raises ValueError for an unknown kind or a ``param`` that is not an
    identifier (it must fit the tag, :func:`encode`)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID, *, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)
        if param is not None and not _PARAM.fullmatch(param):
            raise ValueError(f"param must be an input name (an identifier), got {param!r}")
        self.param = param

    @property
    def status(self) -> Status:
        return STATUS[self.kind]

    def wire(self) -> str:
        """The message as models send it: ``[kind] message``, or ``[kind:param] message``."""
        return encode(self.kind, str(self), self.param)


class DeadlineExceeded(RequestError):
    """The request's ``timeout_s`` passed (kind DEADLINE)."""

    def __init__(self, timeout_s: float | None = None, detail: str = "") -> None:
        limit = f" within timeout_s={timeout_s:g}" if timeout_s is not None else ""
        super().__init__(f"deadline exceeded: the request did not finish{limit}{detail}", ErrorKind.DEADLINE)


class StageDown(RequestError):
    """A stage's model is not there to answer (kind UNAVAILABLE): its process died, or it is
    being (re)loaded. Retryable for the client; a failure of that stage for its circuit
    breaker (:func:`chattts_serving.serving.resilience.settle`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorKind.UNAVAILABLE)


class Cancelled(RequestError):
    """The client cancelled (kind CANCELLED)."""

    def __init__(self, detail: str = "cancelled by the client") -> None:
        super().__init__(detail, ErrorKind.CANCELLED)


def drop_tracebacks(exc: BaseException | None) -> None:
    """Forget the traceback of ``exc`` and of every exception chained to it (``__cause__``,
    ``__context__``), once it has been logged and a request's outcome no longer needs it.

    Why: an exception kept in a frame closes a reference cycle, whose BLS objects the cyclic GC
    may free after the stub's shared memory is gone (docs/triton-workarounds.md, "tracebacks").
    Dropping the tracebacks frees them by reference counting, on the request's own thread."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


_PARAM: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What a ``param`` may be: an input name."""
_TAG: Final = re.compile(r"^(?:in ensemble '[^']*', )?\[(" + "|".join(k.value for k in ErrorKind) + r")(?::("
                         + _PARAM.pattern + r"))?\] ")
"""The tag at the start of a message; Triton puts "in ensemble '<name>', " before the message of
an error that a step of an ensemble raised (the ensemble door, ``chattts_ensemble``)."""
STOP_ERROR_PREFIX: Final = "error:"
"""Start of the GPT engine's stop reason for a failed sequence: ``error:<kind>:<message>``."""


MAX_MESSAGE_CHARS: Final = 2000
"""The longest error message a model sends (:func:`encode` cuts the rest): a gRPC status
message travels in a trailer, and past gRPC's 16 KB metadata limit the client gets
RESOURCE_EXHAUSTED ("Stream removed") instead of the error."""


def quoted(value: str, limit: int = 64) -> str:
    """``value`` quoted for an error message, at most ``limit`` characters of it and its length
    beyond that: a client's 300 KB voice string is not echoed back, nor logged whole."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def encode(kind: ErrorKind, message: str, param: str | None = None) -> str:
    """``[kind] message``, or ``[kind:param] message`` for an error about input ``param``:
    the form in which every model of ours sends an error, the message cut at
    :data:`MAX_MESSAGE_CHARS`."""
    tag = ErrorKind(kind).value if param is None else f"{ErrorKind(kind).value}:{param}"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "... (cut)"
    return f"[{tag}] {message}"


@dataclass(frozen=True)
class Tagged:
    """An error message taken apart (:func:`decode_tagged`): its kind and input name (None
    when the tag says none, or there is no tag) and the message without the tag."""

    kind: ErrorKind | None
    param: str | None
    message: str


def decode_tagged(text: str) -> Tagged:
    """The kind, input name and message of an error message (:func:`encode`); kind and param
    None when it carries no tag (an error raised by Triton itself, or by a server that is not
    ours), the text then left as it is."""
    m = _TAG.match(text)
    if not m:
        return Tagged(None, None, text)
    return Tagged(ErrorKind(m.group(1)), m.group(2), text[m.end():])


def decode(text: str) -> tuple[ErrorKind | None, str]:
    """(kind, message) of an error message; (None, text) when it carries no tag (an error
    raised by Triton itself, or by a server that is not ours). The input name, if any, is
    dropped: :func:`decode_tagged` keeps it."""
    t = decode_tagged(text)
    return t.kind, t.message


def from_message(text: str, default: ErrorKind = ErrorKind.INTERNAL) -> RequestError:
    """The :class:`RequestError` an error message describes (kind, ``param`` and message);
    ``default`` kind without a tag."""
    t = decode_tagged(text)
    return RequestError(t.message, t.kind or default, param=t.param)


def encode_stop(exc: RequestError) -> str:
    """The GPT engine's stop reason for a sequence that failed with ``exc`` (its ``param`` is
    not carried: the engine's inputs are the pipeline's, never a client's)."""
    return f"{STOP_ERROR_PREFIX}{exc.kind.value}:{exc}"


def decode_stop(stop_reason: str) -> RequestError | None:
    """The error a stop reason carries (:func:`encode_stop`), None for a normal stop reason.
    An unknown kind decodes as INTERNAL."""
    if not stop_reason.startswith(STOP_ERROR_PREFIX):
        return None
    kind, _, message = stop_reason[len(STOP_ERROR_PREFIX):].partition(":")
    try:
        return RequestError(message, ErrorKind(kind))
    except ValueError:
        return RequestError(stop_reason[len(STOP_ERROR_PREFIX):], ErrorKind.INTERNAL)


_BY_HTTP: Final = {400: ErrorKind.INVALID, 429: ErrorKind.BUSY, 499: ErrorKind.CANCELLED,
                   503: ErrorKind.BUSY, 504: ErrorKind.DEADLINE}
_BY_GRPC: Final = {"INVALID_ARGUMENT": ErrorKind.INVALID, "UNAVAILABLE": ErrorKind.BUSY,
                   "RESOURCE_EXHAUSTED": ErrorKind.BUSY, "DEADLINE_EXCEEDED": ErrorKind.DEADLINE,
                   "CANCELLED": ErrorKind.CANCELLED, "INTERNAL": ErrorKind.INTERNAL}


TRITON_UNAVAILABLE: Final = ("Server not ready", "Server is stopping", "has no available versions", "is not ready",
                             "is not healthy")
"""Parts of the untagged messages with which Triton 2.51 itself answers while a server stops
("Server not ready"; "Server is stopping, scheduler for model has stopped accepting new
inference requests"), while a model is (re)loaded or unloaded ("Request for unknown model:
'chattts' has no available versions"; a BLS call to it: "Model 'chattts_vocoder' is not
ready.") and when a model's process died ("Stub process 'chattts_gpt_0_0' is not healthy."):
each passes once the server (or its supervisor's restart, or the admin's load) is done, so
each is UNAVAILABLE, retryable, whatever transport status it came with (INTERNAL or NOT_FOUND
in 2.51)."""


def untagged_kind(message: str, status: int | str | None) -> ErrorKind | None:
    """The kind of an error message without our tag: UNAVAILABLE for Triton's own
    unavailability (:data:`TRITON_UNAVAILABLE`), else the one its transport status implies
    (:func:`kind_from_status`)."""
    if any(sign in message for sign in TRITON_UNAVAILABLE):
        return ErrorKind.UNAVAILABLE
    return kind_from_status(status)


def kind_from_status(status: int | str | None) -> ErrorKind | None:
    """The kind of an untagged error from its transport status: an HTTP status (int) or a
    gRPC status name (``"UNAVAILABLE"`` or ``"StatusCode.UNAVAILABLE"``). Triton raises
    UNAVAILABLE/503 itself only for its queue (full, or its timeout passed): BUSY. Other
    4xx are INVALID, other 5xx INTERNAL; None when the status says nothing."""
    if isinstance(status, int):
        if status in _BY_HTTP:
            return _BY_HTTP[status]
        if 400 <= status < 500:
            return ErrorKind.INVALID
        return ErrorKind.INTERNAL if status >= 500 else None
    if isinstance(status, str):
        return _BY_GRPC.get(status.removeprefix("StatusCode."), ErrorKind.INTERNAL)
    return None
