"""Deep health check of a running server: ``python -m chattts_serving.deploy.probe`` (``--help``).

Triton's own ``/v2/health/ready`` is not enough: in Triton 2.51 a Python-backend model whose
stub process died stays READY and the server stays ready (docs/triton-workarounds.md,
"stuck model, nobody says so"), while every request to it fails with "Stub process ...
is not healthy". :func:`probe` therefore checks, within one deadline:

1. ``live``: HTTP ``GET /v2/health/live`` answers 200;
2. ``ready``: HTTP ``GET /v2/health/ready`` answers 200;
3. ``models``: every model of the repository index (``POST /v2/repository/index``) is READY,
   and every model of :func:`chattts_serving.contract.models` (with or without the gate) is in it. The index is a
   restricted admin API: the probe sends the admin token (``$CHATTTS_ADMIN_TOKEN`` or the
   token file, :mod:`chattts_serving.deploy.admin`);
4. ``synthesis``: one real 2-token synthesis through the decoupled streaming entry model
   (``contract.MODEL_STREAM``) over gRPC ends with audio. A "server busy" answer counts as
   healthy: admission itself answered, the server is overloaded, not broken. With an inference
   key configured (``$CHATTTS_INFERENCE_KEY`` or its file) the synthesis carries it.

It prints one JSON line ``{"healthy", "reason", "checks", "duration_ms"}`` and exits 0 when
healthy, 1 when not, 2 on a usage error. The launcher's supervisor
(:class:`chattts_serving.deploy.supervisor.Supervisor`), the Kubernetes liveness probe and the Docker
HEALTHCHECK run it. Each probe is one real (counted, logged) request of about 43 ms of audio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

from .. import contract
from ..client.keys import inference_key_from_env
from .admin import TOKEN_ENV, http_headers, token_from_env

DEFAULT_HTTP_URL = "127.0.0.1:8000"
DEFAULT_GRPC_URL = "127.0.0.1:8001"
DEFAULT_TIMEOUT_S = 20.0
"""Default deadline of a whole probe in seconds (profile ``health.probe_timeout_s``)."""
PROBE_TEXT = "你好。"
PROBE_TOKENS = 2
"""Tokens the probe's synthesis generates (1 token = ``contract.SAMPLES_PER_TOKEN`` samples)."""
PROBE_REQUEST_PREFIX = "health-probe-"
"""Request ids of the probe's syntheses start with this (filter them out of request logs)."""


@dataclass
class ProbeResult:
    """The outcome of one :func:`probe`.

    healthy: every check passed. reason: "ok", or the first failed check and why (e.g.
    ``"synthesis: Stub process 'chattts_gpt_0_0' is not healthy."``). checks: one entry per
    check run (``live``, ``ready``, ``models``, ``synthesis``), each a dict with at least
    ``ok`` (bool). duration_ms: wall time of the whole probe in milliseconds.
    """

    healthy: bool
    reason: str
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    duration_ms: float = 0.0

    def to_json(self) -> str:
        """The result as one JSON line (no trailing newline)."""
        return json.dumps({"healthy": self.healthy, "reason": self.reason, "checks": self.checks,
                           "duration_ms": round(self.duration_ms, 1)}, ensure_ascii=False, separators=(",", ":"))


def _base(url: str) -> str:
    return url if "://" in url else f"http://{url}"


def _http(url: str, timeout_s: float, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(HTTP status, body). Raises OSError when the server cannot be reached in time."""
    req = urllib.request.Request(url, data=body, method=method, headers={
        **({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=max(timeout_s, 0.001)) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _check_status(base: str, path: str, timeout_s: float) -> dict[str, Any]:
    try:
        status, _ = _http(f"{base}{path}", timeout_s)
    except OSError as exc:
        return {"ok": False, "error": f"GET {path}: {exc}"}
    return {"ok": status == 200, "status": status,
            **({} if status == 200 else {"error": f"GET {path} answered {status}"})}


class IndexUnreadable(OSError):
    """The repository index could not be read: ``status`` is the HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def model_states(http_url: str, timeout_s: float, admin_token: str | None) -> dict[str, str]:
    """Each model of the repository index (``POST /v2/repository/index``, an admin API) and its
    state (``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``). Raises :class:`IndexUnreadable`
    when the index cannot be read (unreachable, refused, not a list)."""
    try:
        status, body = _http(f"{_base(http_url)}/v2/repository/index", timeout_s, "POST", b"{}",
                             http_headers(admin_token))
        index = json.loads(body) if status == 200 else None
    except (OSError, ValueError) as exc:
        raise IndexUnreadable(f"repository index: {exc}") from None
    if status == 403:
        hint = "the admin token is wrong" if admin_token else f"no admin token: set {TOKEN_ENV}"
        raise IndexUnreadable(f"repository index answered 403 ({hint})", status)
    if not isinstance(index, list):
        raise IndexUnreadable(f"repository index answered {status}", status)
    return {str(m.get("name")): str(m.get("state", "")) for m in index if isinstance(m, dict)}


def _check_models(base: str, timeout_s: float, admin_token: str | None) -> dict[str, Any]:
    try:
        states = model_states(base, timeout_s, admin_token)
    except IndexUnreadable as exc:
        return {"ok": False, "error": str(exc), **({"status": exc.status} if exc.status is not None else {})}
    not_ready = {name: st or "UNKNOWN" for name, st in states.items() if st != "READY"}
    # A repository with the gate lists chattts_entry (loaded or not); one without it does not.
    missing = [m for m in contract.models(gate=contract.MODEL_STREAM_ENTRY in states) if m not in states]
    out: dict[str, Any] = {"ok": not not_ready and not missing, "models": len(states)}
    if not_ready:
        out["not_ready"] = not_ready
        out["error"] = "not READY: " + ", ".join(f"{n} ({s})" for n, s in sorted(not_ready.items()))
    if missing:
        out["missing"] = missing
        out.setdefault("error", "not in the repository: " + ", ".join(missing))
    return out


def _check_synthesis(grpc_url: str, timeout_s: float, text: str, inference_key: str | None = None) -> dict[str, Any]:
    from ..client import ClientError, SynthesisRequest, iter_chunks
    from ..errors import ErrorKind

    # the server's own deadline for the request; the entry models accept (0, 3600] s. The
    # request id marks probes in the server's logs.
    request = SynthesisRequest(text=text, max_new_tokens=PROBE_TOKENS, min_new_tokens=PROBE_TOKENS,
                               priority="realtime", timeout_s=min(timeout_s, 3600.0),
                               request_id=f"{PROBE_REQUEST_PREFIX}{uuid.uuid4().hex[:12]}")
    chunks = samples = 0
    try:
        # without a key the client finds none configured either (probe() looked already)
        for chunk in iter_chunks(grpc_url, request, timeout_s=timeout_s,
                                 **({"inference_key": inference_key} if inference_key else {})):
            chunks += 1
            samples += int(chunk.size)
    except ClientError as exc:
        if exc.kind == ErrorKind.BUSY and not exc.connection:
            return {"ok": True, "busy": True, "message": exc.message}
        return {"ok": False, "error": exc.message, "status": exc.status}
    if samples == 0:
        return {"ok": False, "error": "the stream ended without audio"}
    return {"ok": True, "busy": False, "chunks": chunks, "samples": samples}


def probe(http_url: str = DEFAULT_HTTP_URL, grpc_url: str = DEFAULT_GRPC_URL, timeout_s: float = DEFAULT_TIMEOUT_S,
          synthesis: bool = True, text: str = PROBE_TEXT, admin_token: str | None = None,
          inference_key: str | None = None) -> ProbeResult:
    """Run the deep health check against the server at ``http_url`` (``host:port`` of Triton's
    HTTP endpoint, or a full ``http://`` URL) and ``grpc_url`` (``host:port`` of its gRPC
    endpoint), all checks within ``timeout_s`` seconds in total. ``admin_token`` is sent with
    the repository index (default: :func:`chattts_serving.deploy.admin.token_from_env`),
    ``inference_key`` with the synthesis (default: the configured one,
    :func:`chattts_serving.client.keys.inference_key_from_env`).

    ``synthesis=False`` skips the synthesis (live, ready and model states only). Never raises
    for a server fault: unreachable ports, error statuses and failed or timed-out syntheses
    become an unhealthy :class:`ProbeResult` whose ``reason`` names the first failed check.
    Raises ValueError when ``timeout_s`` is not positive, AdminTokenError (a ValueError) when
    the configured token is unusable and OSError when its file cannot be read.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    token = admin_token or token_from_env()
    key = inference_key or inference_key_from_env()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    base = _base(http_url).rstrip("/")
    checks: dict[str, dict[str, Any]] = {}
    steps: list[tuple[str, Any]] = [
        ("live", lambda left: _check_status(base, "/v2/health/live", left)),
        ("ready", lambda left: _check_status(base, "/v2/health/ready", left)),
        ("models", lambda left: _check_models(base, left, token)),
    ]
    if synthesis:
        steps.append(("synthesis", lambda left: _check_synthesis(grpc_url, left, text, key)))
    for name, run in steps:
        left = deadline - time.monotonic()
        if left <= 0:
            checks[name] = {"ok": False, "error": f"probe deadline of {timeout_s:g} s passed before this check"}
            continue
        started = time.monotonic()
        checks[name] = run(left)
        checks[name]["ms"] = round((time.monotonic() - started) * 1000, 1)
    failed = [(name, c) for name, c in checks.items() if not c["ok"]]
    reason = f"{failed[0][0]}: {failed[0][1].get('error', 'failed')}" if failed else "ok"
    return ProbeResult(not failed, reason, checks, (time.monotonic() - t0) * 1000)


def main(argv: list[str] | None = None) -> int:
    """CLI: print one JSON line; exit 0 healthy, 1 unhealthy, 2 usage error."""
    ap = argparse.ArgumentParser(
        prog="python -m chattts_serving.deploy.probe",
        description="Deep health check of a running ChatTTS Triton server: live, ready, every model READY "
                    "and one 2-token streamed synthesis, within a deadline. Prints one JSON line; exit code 0 "
                    "healthy, 1 unhealthy, 2 usage error. 'server busy' counts as healthy. The repository index "
                    "is an admin API: the token comes from $CHATTTS_ADMIN_TOKEN, else the file "
                    "$CHATTTS_ADMIN_TOKEN_FILE (default ~/.config/chattts/admin-token). The synthesis sends the "
                    "inference key of $CHATTTS_INFERENCE_KEY or the file $CHATTTS_INFERENCE_KEY_FILE, when set.")
    ap.add_argument("--http-url", default=DEFAULT_HTTP_URL,
                    help="Triton HTTP endpoint, host:port (default %(default)s)")
    ap.add_argument("--grpc-url", default=DEFAULT_GRPC_URL,
                    help="Triton gRPC endpoint, host:port (default %(default)s)")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help="deadline of the whole probe in seconds (default %(default)s)")
    ap.add_argument("--no-synthesis", action="store_true",
                    help="skip the synthesis: only live, ready and model states (cheap, but blind to dead stubs)")
    ap.add_argument("--text", default=PROBE_TEXT, help="text the probe synthesises (default %(default)s)")
    args = ap.parse_args(argv)
    if not args.timeout_s > 0:
        ap.error(f"--timeout-s must be > 0, got {args.timeout_s}")
    if not args.text.strip():
        ap.error("--text must not be empty")
    try:
        result = probe(args.http_url, args.grpc_url, args.timeout_s, synthesis=not args.no_synthesis, text=args.text)
    except (ValueError, OSError) as exc:  # AdminTokenError, InferenceKeyError
        ap.error(str(exc))
    print(result.to_json(), flush=True)
    return 0 if result.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
