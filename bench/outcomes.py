"""How a request ended, as a client sees it: one :class:`Outcome` per request, never two.

The benchmark's records, the overload burst and the soak script classify every request with
:func:`classify_error` (or as completed / cancelled), so that "nothing was lost" is a sum that
can fail: ``lost = sent - sum(outcomes)``. Errors are told apart by their
:class:`~chattts_serving.errors.ErrorKind` (the tag the server put on the message) and the
transport status, never by the wording of a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from chattts_serving.client.common import TIMEOUT, ClientError
from chattts_serving.contract import WireEnum
from chattts_serving.errors import ErrorKind


class Outcome(WireEnum):
    """The one way a request ended (see :func:`classify_error` for the error outcomes)."""

    COMPLETED = "completed"
    """The stream ended with its final response."""
    REFUSED_BUSY = "refused_busy"
    """The server said it is full (kind BUSY): an explicit, immediate refusal."""
    REFUSED_INVALID = "refused_invalid"
    """The server refused the request's input (kind INVALID)."""
    CANCELLED = "cancelled"
    """The client abandoned the stream and the server confirmed the cancel (soak only)."""
    SERVER_ERROR = "server_error"
    """The server ended the request with an error of its own (internal, unavailable,
    deadline, or a cancel the client did not ask for)."""
    CLIENT_TIMEOUT = "client_timeout"
    """The client stopped waiting: no end of the stream within its timeout."""
    TRANSPORT_ERROR = "transport_error"
    """The connection failed or broke, or the client itself failed."""


FAILURES: Final = (Outcome.SERVER_ERROR, Outcome.CLIENT_TIMEOUT, Outcome.TRANSPORT_ERROR)
"""Outcomes that must not happen at all for a soak to pass (refusals are answers, not failures)."""


def classify_error(exc: BaseException) -> Outcome:
    """The outcome of a request that raised ``exc`` (never COMPLETED or CANCELLED: a cancel
    the client made is confirmed separately).

    A :class:`~chattts_serving.client.common.ClientError` is, in this order: CLIENT_TIMEOUT
    when its status is the client's timeout; TRANSPORT_ERROR when the server could not be
    reached; REFUSED_BUSY / REFUSED_INVALID for the kinds BUSY / INVALID; TRANSPORT_ERROR for
    an untagged error that carries a gRPC status (the stream broke: the server's own errors
    inside a stream arrive without a status); SERVER_ERROR otherwise. Any other exception is
    the client's own failure: TRANSPORT_ERROR.
    """
    if not isinstance(exc, ClientError):
        return Outcome.TRANSPORT_ERROR
    if exc.status == TIMEOUT:
        return Outcome.CLIENT_TIMEOUT
    if exc.connection:
        return Outcome.TRANSPORT_ERROR
    if exc.kind == ErrorKind.BUSY:
        return Outcome.REFUSED_BUSY
    if exc.kind == ErrorKind.INVALID:
        return Outcome.REFUSED_INVALID
    if isinstance(exc.status, str) and exc.status.startswith("StatusCode."):
        return Outcome.TRANSPORT_ERROR
    return Outcome.SERVER_ERROR


def count_outcomes(outcomes: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every :class:`Outcome` as a key (0 when absent from ``outcomes``), in declaration order."""
    given = outcomes or {}
    return {str(o): int(given.get(str(o), 0)) for o in Outcome}
