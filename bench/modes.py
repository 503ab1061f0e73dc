"""Time to first audio of each segmentation mode and of a reference-recording voice, at
concurrency 1, against a running server (one part of ``python -m bench``).

Three request kinds, each a two-sentence text (two benchmark sentences joined) asking exactly
``tokens`` tokens per sentence, sent one after the other over the gRPC stream:

* ``streaming``: today's segmentation: the first sentence streams as soon as its first chunk
  is vocoded;
* ``chattts``: ChatTTS' segmentation: the first sentence is generated whole, vocoded and
  encoded (the reference pass) before it is generated again with that audio prompt and
  streamed; expected TTFA(streaming) + ``tokens`` decode steps + a vocoder window + the DVAE
  encoder;
* ``reference``: streaming segmentation with a 5 s reference recording and its transcript (234
  audio-prompt tokens more in every prefill; the recording is encoded on the first request and
  cached after, so that request is left out as warm-up).

Figures are measured, never asserted; ``make bench`` writes them to bench.json as
``ttfa_streaming_mode_c1``, ``ttfa_chattts_mode_c1`` and ``ttfa_reference_c1`` (p50, seconds)
and the details under ``modes``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.client.common import ClientError, SynthesisRequest
from chattts_serving.client.grpc_stream import synthesize_stream

from .stats import fmt, mean, percentile, phase_section

REFERENCE_S = 5.0
"""Length of the reference recording of the ``reference`` kind, in seconds."""
MODE_KEYS = {"streaming": "ttfa_streaming_mode_c1", "chattts": "ttfa_chattts_mode_c1",
             "reference": "ttfa_reference_c1"}
"""bench.json's top-level key of each kind's TTFA p50 at concurrency 1."""


def reference_recording(seconds: float = REFERENCE_S) -> np.ndarray:
    """A deterministic stand-in recording (N,) float32 at 24 kHz: a gliding tone with noise
    (its content does not matter for timing)."""
    rng = np.random.default_rng(17)
    t = np.arange(int(seconds * contract.SAMPLE_RATE_HZ)) / contract.SAMPLE_RATE_HZ
    tone = 0.3 * np.sin(2 * np.pi * (120 + 60 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (tone + rng.normal(0, 0.02, t.size)).astype(np.float32)


def _request(kind: str, text: str, tokens: int, voice: str, seed: int) -> SynthesisRequest:
    extra: dict[str, Any] = {}
    if kind == "chattts":
        extra = {"segmentation": "chattts"}
    elif kind == "reference":
        extra = {"segmentation": "streaming", "reference_audio": reference_recording(),
                 "reference_text": "这是一段五秒钟的参考录音。"}
    else:
        extra = {"segmentation": "streaming"}
    return SynthesisRequest(text=text, voice=voice, seed=seed, max_new_tokens=tokens, min_new_tokens=tokens,
                            **extra)


def measure_modes(grpc_url: str, sentences: Sequence[str], *, tokens: int, requests: int, voice: str,
                  timeout_s: float = 600.0, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Run ``requests`` measured requests of each kind (plus one unmeasured warm-up each) one
    at a time against the ``chattts`` model at ``grpc_url`` (``host:port``).

    Texts: sentence i and i+1 of ``sentences`` joined by a full stop, so that both
    segmentations see two sentences. Returns ``{kind: {"ttfa_p50_s", "ttfa_mean_s",
    "latency_p50_s", "audio_s", "requests", "ok", "errors", "reference"}}`` (``reference``:
    the server's ``info.reference``; :func:`mode_figures` makes bench.json's top-level figures
    of it).
    """
    out: dict[str, Any] = {}
    n = len(sentences)
    for kind in MODE_KEYS:
        ttfa: list[float] = []
        total: list[float] = []
        errors: list[str] = []
        audio_s = 0.0
        source = None
        progress(f"modes: {kind}, {requests} requests at concurrency 1")
        for i in range(requests + 1):
            a, b = sentences[i % n].rstrip("。.!！?？"), sentences[(i + 1) % n]
            req = _request(kind, f"{a}。{b}", tokens, voice, seed=500 + i)
            t0 = time.perf_counter()
            try:
                res = synthesize_stream(grpc_url, req, timeout_s=timeout_s)
            except ClientError as exc:
                errors.append(exc.message)
                continue
            if i == 0:
                continue  # warm-up: the first request of a kind (and the reference's encoding)
            ttfa.append(res.ttfa_s)
            total.append(time.perf_counter() - t0)
            audio_s = res.audio_s
            source = res.info.get("reference")
        out[kind] = {"ttfa_p50_s": percentile(ttfa, 50), "ttfa_mean_s": mean(ttfa),
                              "latency_p50_s": percentile(total, 50), "audio_s": audio_s, "requests": requests,
                              "ok": len(ttfa), "errors": errors[:3], "reference": source}
    return out


def mode_figures(modes: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The :data:`MODE_KEYS` figures (TTFA p50 in seconds at concurrency 1; None when the phase
    did not run or no request of that kind succeeded) of :func:`measure_modes`' result."""
    modes = modes or {}
    return {key: (modes.get(kind) or {}).get("ttfa_p50_s") for kind, key in MODE_KEYS.items()}


def modes_markdown(result: Mapping[str, Any]) -> list[str]:
    """The report's section on the segmentation modes and reference voices (empty when the
    phase did not run)."""
    modes, lines = phase_section(result, "modes",
                                 "Segmentation modes and reference voices (concurrency 1, one at a time)")
    if modes is None:
        return lines
    lines += ["Two sentences per request; `reference`: the streaming mode with a 5 s reference recording.", "",
             "| kind | ok | TTFA p50 s | TTFA mean s | latency p50 s | audio s | errors |",
             "|---|---|---|---|---|---|---|"]
    for kind, m in modes.items():
        lines.append(f"| {kind} | {m['ok']}/{m['requests']} | {fmt(m['ttfa_p50_s'])} | {fmt(m['ttfa_mean_s'])} | "
                     f"{fmt(m['latency_p50_s'])} | {fmt(m['audio_s'])} | {'; '.join(m['errors']) or '–'} |")
    return lines
