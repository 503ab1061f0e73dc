"""Pure helpers of the benchmark: percentiles, per-request records, Prometheus text diffs.

Nothing here talks to a server or loads a model; everything is unit-testable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from chattts_serving import contract

from .outcomes import Outcome


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100, linear interpolation) of ``values``; None if empty."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean of ``values``; None if empty."""
    return float(np.mean(np.asarray(values, dtype=np.float64))) if values else None


def fmt(v: object, digits: int = 3) -> str:
    """``v`` for a progress line or a report cell: floats with ``digits`` decimals, None as '–'."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def phase_section(result: Mapping[str, Any], key: str, title: str) -> tuple[Mapping[str, Any] | None, list[str]]:
    """The opening of a report section on the server phase stored under ``key``: (the phase's
    result, or None when its section is complete already, and the lines so far). No lines when
    the phase did not run; a heading and why when it was skipped or failed; else the heading."""
    phase = result.get(key)
    if not phase:
        return None, []
    lines = ["", f"## {title}", ""]
    if phase.get("error") or phase.get("skipped"):
        return None, [*lines, f"Not measured: {phase.get('error') or phase.get('skipped')}"]
    return phase, lines


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or None when either is unknown or ``den`` is zero."""
    if num is None or den is None or den == 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


@dataclass(frozen=True)
class RequestRecord:
    """One benchmark request as the client saw it.

    start_s: seconds from the phase's start to sending. ttfa_s: seconds from sending to the
    first non-empty audio chunk (None if none came). total_s: seconds from sending to the end
    of the response. audio_s: seconds of audio received. chunks: non-empty audio chunks.
    tokens: GPT tokens generated, as the server's final ``info.tokens`` reports them (the
    upstream baseline, which reports none, records the tokens it was made to generate).
    error: the failure's message, None on success. tokens_requested: the token budget asked
    for (min = max new tokens). degraded, vocoder: the server's ``info`` (None when it sent
    none): whether the request ran in the degraded mode, and on which vocoder path.
    outcome: an :class:`~bench.outcomes.Outcome` value. chunk_times_s: for each
    non-empty chunk, seconds from sending to its arrival; chunk_samples: its samples at
    ``contract.SAMPLE_RATE_HZ`` (both empty where not measured).
    """

    index: int
    text: str
    start_s: float
    ttfa_s: float | None
    total_s: float
    audio_s: float
    chunks: int
    tokens: int
    error: str | None = None
    tokens_requested: int = 0
    degraded: bool | None = None
    vocoder: str | None = None
    outcome: str = Outcome.COMPLETED.value
    chunk_times_s: tuple[float, ...] = ()
    chunk_samples: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


REALTIME_TOLERANCE_S = 0.010
"""A stream is real time when the start buffer it needs is at most this (s): 10 ms, below a
typical audio output buffer (20 ms or more) and above this client's own timing jitter (one
thread receives each chunk and reads the clock)."""
REALTIME_MIN_FRACTION = 0.95
"""A concurrency level counts as real time when at least this fraction of its streams is."""


def needed_buffer_s(chunk_times_s: Sequence[float], chunk_samples: Sequence[int],
                    sample_rate_hz: int = contract.SAMPLE_RATE_HZ) -> float | None:
    """The start buffer (s) a client needs to play a stream without a gap, when playback
    starts at the first chunk: ``max_i (t_i - t_0 - sum_{j<i} d_j)`` clipped at 0, with
    ``t_i`` the arrival of chunk i (s) and ``d_j`` the duration of chunk j
    (``samples / sample_rate_hz``). None for a stream without audio."""
    if not chunk_times_s:
        return None
    t0 = chunk_times_s[0]
    played = 0.0
    need = 0.0
    for t, n in zip(chunk_times_s, chunk_samples, strict=True):
        need = max(need, t - t0 - played)
        played += n / sample_rate_hz
    return need


def realtime_summary(records: Sequence[RequestRecord],
                     tolerance_s: float = REALTIME_TOLERANCE_S) -> dict[str, float | int | None]:
    """The capacity figures of one level: realtime_fraction (streams whose needed start
    buffer is at most ``tolerance_s``, over every request: a failed request is not real
    time), start_buffer_p50_s / start_buffer_p95_s / start_buffer_max_s (needed start buffer
    of the streams that sent audio, s); None where no record has chunk times."""
    buffers = [b for r in records if r.ok
               for b in [needed_buffer_s(r.chunk_times_s, r.chunk_samples)] if b is not None]
    if not records or not buffers:
        return {"realtime_fraction": None, "start_buffer_p50_s": None, "start_buffer_p95_s": None,
                "start_buffer_max_s": None}
    return {"realtime_fraction": sum(1 for b in buffers if b <= tolerance_s) / len(records),
            "start_buffer_p50_s": percentile(buffers, 50), "start_buffer_p95_s": percentile(buffers, 95),
            "start_buffer_max_s": max(buffers)}


def summarize(records: Sequence[RequestRecord], wall_s: float) -> dict[str, object]:
    """Latency, throughput, RTF and capacity of one run of ``wall_s`` seconds.

    Keys: requests, ok, failed, wall_s; outcomes ({outcome: requests}); ttfa_p50_s,
    ttfa_p95_s, ttfa_mean_s; latency_p50_s, latency_p95_s, latency_p99_s, latency_mean_s;
    requests_per_s (successful requests per wall second); audio_s_total; audio_s_per_s (audio
    seconds per wall second); rtf_mean, rtf_p50, rtf_p95 (total_s / audio_s per request;
    < 1 is faster than real time); tokens_per_s (tokens generated by successful requests, as
    the server reported them, per wall second); tokens_requested_per_s (their budgets);
    degraded_requests (requests the server ran in its degraded mode); vocoders ({path:
    requests}); and the :func:`realtime_summary` keys. Latency and TTFA figures cover the
    successful requests.
    """
    ok = [r for r in records if r.ok]
    ttfa = [r.ttfa_s for r in ok if r.ttfa_s is not None]
    lat = [r.total_s for r in ok]
    audio = sum(r.audio_s for r in ok)
    rtfs = [r.total_s / r.audio_s for r in ok if r.audio_s > 0]
    outcomes: dict[str, int] = {}
    vocoders: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        if r.vocoder is not None:
            vocoders[r.vocoder] = vocoders.get(r.vocoder, 0) + 1
    return {
        "requests": len(records), "ok": len(ok), "failed": len(records) - len(ok), "wall_s": wall_s,
        "outcomes": outcomes,
        "ttfa_p50_s": percentile(ttfa, 50), "ttfa_p95_s": percentile(ttfa, 95), "ttfa_mean_s": mean(ttfa),
        "latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
        "latency_p99_s": percentile(lat, 99), "latency_mean_s": mean(lat),
        "requests_per_s": ratio(len(ok), wall_s), "audio_s_total": audio,
        "audio_s_per_s": ratio(audio, wall_s), "rtf_mean": mean(rtfs), "rtf_p50": percentile(rtfs, 50),
        "rtf_p95": percentile(rtfs, 95),
        "tokens_per_s": ratio(sum(r.tokens for r in ok), wall_s),
        "tokens_requested_per_s": ratio(sum(r.tokens_requested for r in ok), wall_s),
        "degraded_requests": sum(1 for r in records if r.degraded), "vocoders": vocoders,
        **realtime_summary(records),
    }


# --- Prometheus text exposition ------------------------------------------------------------
MetricKey = tuple[str, tuple[tuple[str, str], ...]]
"""(metric name, sorted (label, value) pairs)."""


def parse_prometheus(text: str) -> dict[MetricKey, float]:
    """Samples of a Prometheus text exposition: {(sample name, sorted labels): value}, parsed
    by ``prometheus_client.parser``, which names samples as OpenMetrics does: a counter's
    samples end in ``_total`` (Triton's ``# TYPE nv_inference_count counter`` gives
    ``nv_inference_count_total``), histograms keep ``_bucket``, ``_sum``, ``_count``. Raises
    ValueError on text that is not a valid exposition."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples}


def diff_samples(before: Mapping[MetricKey, float],
                 after: Mapping[MetricKey, float]) -> dict[MetricKey, float]:
    """``after - before`` per sample (a sample absent before counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _by_label(delta: Mapping[MetricKey, float], name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in delta.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def model_stats(delta: Mapping[MetricKey, float]) -> dict[str, dict[str, float | None]]:
    """Per Triton model, from a diff of Triton's built-in metrics over one level.

    Per model: requests (``nv_inference_count``), executions (``nv_inference_exec_count``),
    mean_batch (requests per execution), compute_s (``nv_inference_compute_infer_duration_us``
    in seconds; for decoupled models it stops when ``execute`` returns, not at stream end),
    queue_s (``nv_inference_queue_duration_us`` in seconds); vocoded_tokens for the vocoder
    models (``tts_vocoder_tokens_total``: window lengths summed). Models with no request are left
    out. These Triton counters' samples are named with ``_total`` (:func:`parse_prometheus`).
    """
    vocoded = _by_label(delta, "tts_vocoder_tokens_total", "model")
    count = _by_label(delta, "nv_inference_count_total", "model")
    execs = _by_label(delta, "nv_inference_exec_count_total", "model")
    compute = _by_label(delta, "nv_inference_compute_infer_duration_us_total", "model")
    queue = _by_label(delta, "nv_inference_queue_duration_us_total", "model")
    out: dict[str, dict[str, float | None]] = {}
    for model, n in sorted(count.items()):
        if n <= 0:
            continue
        out[model] = {"requests": n, "executions": execs.get(model, 0.0),
                      "mean_batch": ratio(n, execs.get(model)), "compute_s": compute.get(model, 0.0) / 1e6,
                      "queue_s": queue.get(model, 0.0) / 1e6}
        if model in vocoded:
            out[model]["vocoded_tokens"] = vocoded[model]
    return out


def engine_batches(delta: Mapping[MetricKey, float]) -> dict[str, object] | None:
    """The GPT engine's decode-step batch sizes over one level, from the ``tts_engine_batch_size``
    histogram and ``tts_engine_decode_steps_total`` counter (chattts_serving.triton.metrics); None if
    the server does not export them.

    Keys: decode_steps, rows (sequences decoded, summed over steps), mean_batch (rows per
    step), histogram ({"<=le": steps whose batch size falls in (previous le, le]}).
    """
    count = sum(v for (n, _), v in delta.items() if n == "tts_engine_batch_size_count")
    total = sum(v for (n, _), v in delta.items() if n == "tts_engine_batch_size_sum")
    steps = sum(v for (n, _), v in delta.items() if n == "tts_engine_decode_steps_total")
    buckets: dict[float, float] = {}
    for (n, labels), v in delta.items():
        if n == "tts_engine_batch_size_bucket":
            le = dict(labels).get("le", "+Inf")
            bound = math.inf if le in ("+Inf", "Inf") else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + v
    if not buckets and not steps:
        return None
    hist: dict[str, int] = {}
    prev = 0.0
    for bound in sorted(buckets):
        in_bucket = buckets[bound] - prev
        prev = buckets[bound]
        if in_bucket > 0:
            hist["<=inf" if math.isinf(bound) else f"<={bound:g}"] = round(in_bucket)
    return {"decode_steps": round(steps or count), "rows": round(total), "mean_batch": ratio(total, count),
            "histogram": hist}


def cdf(values: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted values, cumulative fraction in (0, 1]) for an empirical CDF plot."""
    v = np.sort(np.asarray(list(values), dtype=np.float64))
    return v, np.arange(1, v.size + 1, dtype=np.float64) / max(1, v.size)


PROJECTION_OPS = ("MatMulNBits", "Int8BlockMatMul", "MatMul")
"""The op types of the step's projections: ONNX Runtime's 8-bit kernel, ours
(:mod:`chattts_serving.int8_kernel`), fp32."""


def projections_ms(ops: Mapping[str, float]) -> float:
    """The projections' ms in an op-type breakdown (:data:`PROJECTION_OPS` summed)."""
    return sum(ops.get(op, 0.0) for op in PROJECTION_OPS)


ATTENTION_OPS = ("GroupQueryAttention", "Int8KvAttention")
"""The op types of the step's attention: ONNX Runtime's, ours over the int8 cache
(:mod:`chattts_serving.int8_kernel`)."""


def attention_ms(ops: Mapping[str, float]) -> float:
    """The attention's ms in an op-type breakdown (:data:`ATTENTION_OPS` summed)."""
    return sum(ops.get(op, 0.0) for op in ATTENTION_OPS)
