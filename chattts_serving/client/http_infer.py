"""Offline client: the whole utterance in one HTTP ``/infer`` call to ``contract.MODEL_OFFLINE``."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .. import contract
from .common import TIMEOUT, ClientError, SynthesisRequest, SynthesisResult, parse_info
from .keys import http_headers, key_error, resolve_key

DEFAULT_TIMEOUT_S = 300.0
"""Default network timeout of the call, in seconds."""


def _status(exc: InferenceServerException) -> int | str | None:
    status = exc.status()
    if status is None:
        return None
    try:
        return int(status)
    except ValueError:
        return status


def synthesize_offline(url: str, request: SynthesisRequest,
                       timeout_s: float = DEFAULT_TIMEOUT_S, inference_key: str | None = None) -> SynthesisResult:
    """Synthesise ``request`` with ``contract.MODEL_OFFLINE`` at ``url`` (``host:port`` of
    Triton's HTTP endpoint) and return the whole waveform.

    The result's audio is (N,) float32 mono at ``contract.SAMPLE_RATE_HZ``; ``ttfa_s`` equals
    ``total_s`` (nothing is heard before the single response) and ``chunks`` is 1.
    ``lookahead_tokens`` is sent if set (the model accepts and ignores it).

    Raises :class:`ClientError`: with the HTTP status (int) and the server's message when the
    server refuses or fails the request; with ``connection=True`` when it cannot be reached;
    status ``"timeout"`` when no answer comes within ``timeout_s`` seconds; "inference key
    required" (403) when the server refuses the inference key (``inference_key``, default
    the configured one: :func:`.keys.resolve_key`).
    """
    key = resolve_key(inference_key)
    inputs = []
    for name, arr, dtype in request.tensors():
        inp = httpclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput(contract.OUT_AUDIO.name, binary_data=True),
               httpclient.InferRequestedOutput(contract.OUT_INFO.name, binary_data=False)]
    t0 = time.perf_counter()
    try:
        client = httpclient.InferenceServerClient(url, connection_timeout=timeout_s,
                                                  network_timeout=timeout_s)
    except Exception as exc:  # malformed URL and the like
        raise ClientError(f"cannot create an HTTP client for {url!r}: {exc}") from None
    try:
        result = client.infer(contract.MODEL_OFFLINE, inputs, outputs=outputs, request_id=request.request_id or "",
                              headers=http_headers(key) or None)
    except InferenceServerException as exc:
        message = exc.message() or str(exc)
        raise key_error(message, url, bool(key), grpc=False) or ClientError(message, _status(exc)) from None
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, TimeoutError):
            raise ClientError(f"no response from {url} within {timeout_s:g} s", TIMEOUT) from None
        raise ClientError(f"cannot connect to {url}: {exc}", connection=True) from None
    finally:
        client.close()
    total = time.perf_counter() - t0
    audio = result.as_numpy(contract.OUT_AUDIO.name)
    if audio is None:
        raise ClientError(f"the response of {contract.MODEL_OFFLINE} has no "
                          f"'{contract.OUT_AUDIO.name}' output")
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    raw_info = result.as_numpy(contract.OUT_INFO.name)
    info = parse_info(raw_info) if raw_info is not None else {}
    return SynthesisResult(audio=audio, sample_rate_hz=int(info.get("sample_rate_hz", contract.SAMPLE_RATE_HZ)),
                           ttfa_s=total, total_s=total, chunks=1, chunk_samples=[audio.size], info=info)
