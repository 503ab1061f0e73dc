"""Register rows "error codes lost" and "server not ready" (docs/triton-workarounds.md), the
Triton side: errors to and from ``pb_utils.TritonError``.

- symptom: a BLS caller receives every error of a model it called as INTERNAL, and a gRPC
  stream's error has no status code; streams in flight when the server stops get INTERNAL
  "Server not ready" from their next stage.
- cause: python_backend's BLS error path and core's stream frontends drop the code; Triton
  unloads every model at once on SIGINT without counting decoupled BLS streams as in flight.
- what we do: :func:`triton_error` tags the message with the error's kind
  (``RequestError.wire``; clients decode it) besides setting the
  code; :func:`error_from_triton` restores the kind of a BLS error from its tag, and reads
  Triton's own untagged unavailability as UNAVAILABLE (the *shutting-down mapping* for
  :data:`TRITON_SHUTTING_DOWN`). The tag codec itself is :mod:`chattts_serving.errors` (a
  protocol the clients share, which stays).
- shown by: ``tests/unit/test_errors.py``, ``tests/server/test_server.py``,
  ``tests/server/test_faults.py`` (a stop with live streams).
- delete when: errors keep their code through BLS and streams, and decoupled streams count as
  in flight at shutdown (the tag then only serves old clients).
"""

from __future__ import annotations

from typing import Any

from ...errors import ErrorKind, RequestError, StageDown, decode_tagged, from_message, untagged_kind


def triton_error(pb: Any, exc: RequestError) -> Any:
    """The ``pb_utils.TritonError`` for ``exc``: the code of its kind
    (:data:`chattts_serving.errors.STATUS`), the message tagged with the kind
    (:func:`chattts_serving.errors.encode`) so that BLS callers and gRPC stream clients, which
    never see the code, recover it."""
    code = getattr(pb.TritonError, exc.status.triton, None)
    return pb.TritonError(exc.wire(), code) if code is not None else pb.TritonError(exc.wire())


TRITON_SHUTTING_DOWN = "Server not ready"
"""What Triton 2.51 answers a BLS call with once the server is stopping."""


def error_from_triton(error: Any) -> RequestError:
    """The :class:`RequestError` behind a ``TritonError`` received from a BLS call: the kind
    its message carries; UNAVAILABLE for Triton's own unavailability (the server is stopping,
    a model is being loaded, a model's process died: :data:`chattts_serving.errors.TRITON_UNAVAILABLE`;
    the client should retry, here after the restart or on another server; a stage that is down is a
    :class:`~chattts_serving.errors.StageDown`); else INTERNAL."""
    message = str(error.message())
    if decode_tagged(message).kind is None and untagged_kind(message, None) == ErrorKind.UNAVAILABLE:
        if TRITON_SHUTTING_DOWN in message:
            return RequestError(f"server unavailable: the server is shutting down ({message})", ErrorKind.UNAVAILABLE)
        return StageDown(f"server unavailable: a model process is unavailable ({message})")
    return from_message(message)
