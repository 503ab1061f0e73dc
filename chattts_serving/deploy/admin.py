"""Triton's admin APIs behind a secret header: the token, the server flags, the client headers.

Anyone who reaches Triton's HTTP or gRPC port can otherwise change its log verbosity, its
trace settings, register shared memory and load or unload models. Triton 2.51 restricts an
API group to requests that carry a given header (``--http-restricted-api`` and
``--grpc-restricted-protocol``, format ``<apis>:<header>=<value>``). Every server this
project starts restricts :data:`RESTRICTED_APIS` to the header :data:`ADMIN_HEADER`;
health, metadata and model configuration stay open, inference too unless an inference key is
configured (below).

What Triton 2.51 answers without the header (measured): HTTP 403 with ``{"error": "This API
is restricted, expecting header 'chattts-admin-token'"}``; gRPC ``UNAVAILABLE`` "This
protocol is restricted, expecting header 'triton-grpc-protocol-chattts-admin-token'": over
gRPC the metadata key is the header name with the prefix :data:`GRPC_HEADER_PREFIX`. HTTP
header names are matched case-insensitively; gRPC metadata keys must be lowercase.

The token: ``$CHATTTS_ADMIN_TOKEN``; else the contents of the token file,
``$CHATTTS_ADMIN_TOKEN_FILE`` or by default ``~/.config/chattts/admin-token`` (a Docker or
Kubernetes secret file fits too); else the server launchers (``chattts-serve``,
``chattts-tritonserver``) generate one (:func:`secrets.token_urlsafe`), print it once on
stderr and write it to the token file (mode 0600), where clients of the same user (the probe
in the container's health check, an operator's probe) find it. Triton takes the value on its
command line, so local users who can read the server's ``/proc/<pid>/cmdline`` can read the
token: it guards the network ports, not the host.

Inference can be restricted the same way (Triton 2.51's ``inference`` group: ``/infer``,
``/generate``, ``/generate_stream``, gRPC ``ModelInfer`` and ``ModelStreamInfer``; health,
metadata and model configuration stay open): with an inference key configured
(``$CHATTTS_INFERENCE_KEY``, else the file named by ``$CHATTTS_INFERENCE_KEY_FILE``, e.g. a
Kubernetes secret), requests need the header ``chattts-inference-key`` (gRPC metadata
``triton-grpc-protocol-chattts-inference-key``). Off when neither is set: nothing is generated, since every client
(gateway, probe, load tools) must be given the same key. Triton refuses an API group named in two
restrictions, so the key has a group of its own; two groups may use the same header name.

``chattts-tritonserver [tritonserver arguments]`` (:mod:`.container`, the Docker image's
command) runs ``tritonserver`` (``$CHATTTS_TRITONSERVER``, default the one on PATH) with the
restriction flags added.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from ..client.keys import INFERENCE_HEADER, check_secret

ADMIN_HEADER = "chattts-admin-token"
"""HTTP header that carries the admin token (lowercase: also the base of the gRPC key)."""
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
"""Triton 2.51 expects a restricted gRPC protocol's header under this prefix."""
GRPC_ADMIN_HEADER = GRPC_HEADER_PREFIX + ADMIN_HEADER
"""gRPC metadata key that carries the admin token."""
RESTRICTED_APIS = ("logging", "trace", "shared-memory", "model-repository", "statistics")
"""Triton API groups that need the header. Open: health, metadata, model-config, and inference
unless an inference key is configured (:func:`inference_restriction_args`).
Nothing here reads ``statistics`` openly: the benchmark and Prometheus read the metrics port."""
TOKEN_ENV = "CHATTTS_ADMIN_TOKEN"
"""Environment variable holding the admin token (empty counts as unset)."""
TOKEN_FILE_ENV = "CHATTTS_ADMIN_TOKEN_FILE"
"""Environment variable naming the token file (default :data:`DEFAULT_TOKEN_FILE`)."""
DEFAULT_TOKEN_FILE = Path("~/.config/chattts/admin-token")
"""Where the token is read from when ``TOKEN_ENV`` is unset, and where a generated one is kept."""
TRITONSERVER_ENV = "CHATTTS_TRITONSERVER"
"""Environment variable naming the ``tritonserver`` binary ``chattts-tritonserver`` runs."""


class AdminTokenError(ValueError):
    """The configured admin token is unusable (too short, or characters a header cannot carry)."""


def check_token(token: str, source: str = TOKEN_ENV) -> str:
    """``token`` when it is usable as a header value; raises AdminTokenError naming ``source``."""
    return check_secret(token, "the admin token", source, AdminTokenError)


def token_file(environ: Mapping[str, str] | None = None) -> Path:
    """The token file: ``$CHATTTS_ADMIN_TOKEN_FILE``, else :data:`DEFAULT_TOKEN_FILE` (``~`` expanded)."""
    env = os.environ if environ is None else environ
    return Path(env.get(TOKEN_FILE_ENV) or DEFAULT_TOKEN_FILE).expanduser()


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The configured admin token (``$CHATTTS_ADMIN_TOKEN``, else the token file's contents
    when it exists and is not empty), or None. Raises AdminTokenError when the token found is
    unusable, OSError when the file exists but cannot be read."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        return check_token(env[TOKEN_ENV])
    path = token_file(env)
    if path.is_file():
        text = path.read_text().strip()
        if text:
            return check_token(text, f"token file {path}")
    return None


def inference_restriction_args(key: str | None) -> list[str]:
    """The tritonserver flags that put inference behind :data:`INFERENCE_HEADER` (none without a key)."""
    if not key:
        return []
    spec = f"inference:{INFERENCE_HEADER}={key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


def new_token() -> str:
    """A fresh random admin token (256 bits, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def publish(prog: str, token: str, environ: Mapping[str, str] | None = None) -> None:
    """Tell the operator, once, on stderr, the token generated for this run and how to send it,
    and keep it in the token file (mode 0600) for clients of the same user; a file that cannot
    be written is reported, not fatal."""
    path = token_file(environ)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        kept = f"kept in {path}"
    except OSError as exc:
        kept = f"not kept: cannot write {path}: {exc.strerror or exc}"
    print(f"{prog}: {TOKEN_ENV} is unset; admin token generated for this run ({kept}): {token}\n"
          f"{prog}: the {', '.join(RESTRICTED_APIS)} APIs need the header '{ADMIN_HEADER}: <token>' "
          f"(gRPC metadata '{GRPC_ADMIN_HEADER}'); set {TOKEN_ENV} to choose the token", file=sys.stderr, flush=True)


def restriction_args(token: str) -> list[str]:
    """The tritonserver flags that put :data:`RESTRICTED_APIS` behind the header, HTTP and gRPC."""
    spec = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={check_token(token, 'admin token')}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


def http_headers(token: str | None) -> dict[str, str]:
    """Headers for an admin call over HTTP (none without a token)."""
    return {ADMIN_HEADER: token} if token else {}


def grpc_headers(token: str | None) -> dict[str, str]:
    """Metadata for an admin call over gRPC (``tritonclient.grpc``'s ``headers=``; none without a token)."""
    return {GRPC_ADMIN_HEADER: token} if token else {}
