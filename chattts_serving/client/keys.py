"""Triton's inference key: its names, which key to send, and a refusal said in plain words.

A server started with an inference key (``chattts-serve`` or ``chattts-tritonserver`` with
``$CHATTTS_INFERENCE_KEY`` set: :mod:`chattts_serving.deploy.admin`) serves inference only to
requests that carry it: HTTP header :data:`INFERENCE_HEADER`, gRPC metadata
:data:`GRPC_INFERENCE_HEADER` (Triton 2.51 expects a restricted gRPC protocol's header behind
the prefix ``triton-grpc-protocol-``). Every client here sends the key it is given, else the
configured one (``$CHATTTS_INFERENCE_KEY``, else the file ``$CHATTTS_INFERENCE_KEY_FILE``).
Health, metadata and model configuration need no key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from .common import ClientError

INFERENCE_HEADER = "chattts-inference-key"
"""HTTP header that carries the inference key."""
GRPC_INFERENCE_HEADER = "triton-grpc-protocol-" + INFERENCE_HEADER
"""gRPC metadata key that carries the inference key."""
INFERENCE_KEY_ENV = "CHATTTS_INFERENCE_KEY"
"""Environment variable holding the inference key (empty counts as unset: no key)."""
INFERENCE_KEY_FILE_ENV = "CHATTTS_INFERENCE_KEY_FILE"
"""Environment variable naming a file that holds the inference key (no default file)."""
MIN_KEY_CHARS = 16
KEY_STATUS_GRPC = "StatusCode.PERMISSION_DENIED"
"""``ClientError.status`` of a gRPC request refused for its key (Triton itself answers
UNAVAILABLE, which would read as "server busy")."""
KEY_STATUS_HTTP = 403
"""``ClientError.status`` of an HTTP request refused for its key (Triton's own status)."""
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without space: valid in HTTP headers and gRPC metadata
_REFUSED = (f"expecting header '{INFERENCE_HEADER}'", f"expecting header '{GRPC_INFERENCE_HEADER}'")


class InferenceKeyError(ValueError):
    """The configured inference key is unusable (too short, or characters a header cannot carry)."""


def check_secret(value: str, what: str, source: str, error: type[ValueError] = ValueError) -> str:
    """``value`` when it can be a shared secret in a header (at least :data:`MIN_KEY_CHARS`
    printable ASCII characters without spaces: valid in HTTP headers and gRPC metadata);
    raises ``error`` naming ``source`` and ``what`` (e.g. "the inference key") otherwise."""
    if len(value) < MIN_KEY_CHARS:
        raise error(f"{source}: {what} must have at least {MIN_KEY_CHARS} characters, got {len(value)}")
    if not _KEY.fullmatch(value):
        raise error(f"{source}: {what} may hold only printable ASCII without spaces")
    return value


def check_key(key: str, source: str = INFERENCE_KEY_ENV) -> str:
    """``key`` when it is usable as a header value; raises InferenceKeyError naming ``source``."""
    return check_secret(key, "the inference key", source, InferenceKeyError)


def inference_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The configured inference key (``$CHATTTS_INFERENCE_KEY``, else the contents of the file
    ``$CHATTTS_INFERENCE_KEY_FILE``), or None: no key. Raises InferenceKeyError when the key is
    unusable or the named file is empty, OSError when that file cannot be read."""
    env = os.environ if environ is None else environ
    if env.get(INFERENCE_KEY_ENV):
        return check_key(env[INFERENCE_KEY_ENV])
    name = env.get(INFERENCE_KEY_FILE_ENV)
    if not name:
        return None
    path = Path(name).expanduser()
    text = path.read_text().strip()
    if not text:
        raise InferenceKeyError(f"{INFERENCE_KEY_FILE_ENV}: the inference key file {path} is empty")
    return check_key(text, f"inference key file {path}")


def resolve_key(key: str | None) -> str | None:
    """``key`` when given (``""``: send none), else the configured one, else None. Raises as
    :func:`inference_key_from_env` does."""
    return inference_key_from_env() if key is None else (key or None)


def http_headers(key: str | None) -> dict[str, str]:
    """HTTP headers carrying ``key`` (empty without one)."""
    return {INFERENCE_HEADER: key} if key else {}


def grpc_metadata(key: str | None) -> dict[str, str] | None:
    """gRPC metadata carrying ``key`` (tritonclient's ``headers=``; None without one)."""
    return {GRPC_INFERENCE_HEADER: key} if key else None


def key_refused(message: str) -> bool:
    """Whether a server's error message is Triton's refusal for a missing or wrong inference key."""
    return any(r in message for r in _REFUSED)


def key_error(message: str, url: str, sent: bool, grpc: bool) -> ClientError | None:
    """A :class:`ClientError` that says "inference key required" when ``message`` is Triton's
    refusal for a missing (``sent`` False) or wrong key; None for any other message."""
    if not key_refused(message):
        return None
    if sent:
        why = (f"the server at {url} refused the key this client sent (header '{INFERENCE_HEADER}'); "
               f"check ${INFERENCE_KEY_ENV}")
    else:
        why = (f"the server at {url} serves only requests that carry its key (header '{INFERENCE_HEADER}'); "
               f"set ${INFERENCE_KEY_ENV} or ${INFERENCE_KEY_FILE_ENV}")
    return ClientError(f"inference key required: {why}", KEY_STATUS_GRPC if grpc else KEY_STATUS_HTTP)
