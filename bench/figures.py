"""The benchmark's headline figures: what each measures (its mode and baseline) and its target,
computed from a profile's result, or null with the reason when a part they depend on ran a
degraded request or under outside load."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .floor import over_floor
from .stats import REALTIME_MIN_FRACTION, REALTIME_TOLERANCE_S, ratio

DEGRADATION_NOTE = "off for default-path levels"
"""How the default-path servers run: a copy of the profile whose degraded mode is out of reach
(``profiles.default_path_profile``); the profile as shipped runs only the "as deployed" row."""
OUTSIDE_LOAD_WARN_PERCENT = 20.0
"""Other processes' CPU (percent of one core) above which a phase counts as skewed: figures
that depend on it are null."""


@dataclass(frozen=True)
class Figure:
    """A headline figure of bench.json: what it measures (its mode and its baseline) and its
    target as (comparison, bound), None without one."""

    text: str
    target: tuple[str, float] | None = None


_C16 = "closed-loop c=16 (default path, identical jobs of the benchmark budget)"
DOOR_NAMES: Final = {"offline": "chattts_offline", "gateway": "gateway /v1/audio/speech"}
"""Report labels of the burst's other doors (:data:`bench.burst.DOORS`)."""


FIGURES: dict[str, Figure] = {
    "throughput_ratio_c16": Figure(
        f"audio s per wall s, {_C16}, over upstream `Chat.infer` serving one request at a time", (">=", 12.0)),
    "throughput_ratio_c16_vs_batched": Figure(
        f"audio s per wall s, {_C16}, over upstream `Chat.infer` over a list of 16 texts (one GPT batch)"),
    "ttfa_ratio_c1": Figure(
        "TTFA p50 at closed-loop c=1 (default path) over the first-chunk p50 of upstream's stream mode at its "
        "default settings (stream_batch 24 after 2 passed batches: first audio after 72 tokens)", ("<=", 0.1)),
    "ttfa_ratio_c1_vs_stream_smallest": Figure(
        "TTFA p50 at closed-loop c=1 (default path) over the first-chunk p50 of upstream's stream mode at its "
        "smallest practical stream_batch (baseline.stream_smallest)"),
    "p95_over_p50_c16": Figure(
        f"latency p95 over p50, {_C16}: near 1 by construction (jobs start in synchronised waves); the "
        "open-loop ratios show the tail", ("<=", 1.3)),
    "ttfa_p95_over_p50_open_loop": Figure(
        "TTFA p95 over p50, open loop (default path): Poisson arrivals at 0.8 x the c=16 capacity, mixed texts "
        "and budgets (0.5 to 2 x the benchmark budget)"),
    "rtf_p95_over_p50_open_loop": Figure(
        "real-time factor (latency per audio second) p95 over p50, open loop (default path), as above"),
    "pipeline_efficiency_c16": Figure(
        f"generated tokens per wall s in the server, {_C16}, over the minimal in-process pipeline's (batch-16 "
        "engine steps and batched vocoder over the same windows, no server; median of its runs)", (">=", 0.9)),
    "realtime_streams": Figure(
        f"largest closed-loop concurrency (default path) at which, as at every lower tested level, at least "
        f"{REALTIME_MIN_FRACTION:.0%} of streams play without a gap from their first chunk (needed start "
        f"buffer <= {REALTIME_TOLERANCE_S * 1000:g} ms); 0 when c=1 fails"),
    "rtf_c1": Figure("real-time factor (total s / audio s) p50 at closed-loop c=1 (default path)"),
    **{f"gpt_step_ms_b{b}": Figure(
        f"one GPT decode step at batch {b} over a past of raw_step.past_tokens positions (300 in a full run), ms, "
        "median of the raw step's rounds (the graph and ORT options of the profile, the cache bound in place)")
       for b in (1, 4, 16)},
    **{f"gpt_floor_ms_b{b}": Figure(
        f"the memory floor of that step at batch {b}, ms: bytes it must stream (every weight once + the KV cache "
        "of its rows) over this host's streaming bandwidth measured in the same run (floor.bandwidth_gbps: one "
        "large fp32 GEMV through ONNX Runtime)") for b in (1, 4, 16)},
    "vocoder_cpu_ms_per_token": Figure(
        "CPU ms the vocoder models' processes (chattts_vocoder, chattts_dvae_vocoder) spent per generated token at "
        "closed-loop c=16 (default path): window context and lookahead, batching and the per-call cost included"),
    "vocoder_cpu_ms_per_token_c1": Figure("the same at closed-loop c=1 (one stream: no batching, smallest chunks)"),
    "vocoded_tokens_per_token": Figure(
        "tokens the vocoder models vocoded (window lengths summed: chunk, lookahead, crossfade edges and, in the "
        "windowed mode, left context) per generated token at closed-loop c=16 (default path)", ("<=", 1.15)),
    "vocoded_tokens_per_token_c1": Figure("the same at closed-loop c=1", ("<=", 1.15)),
    "step_over_floor_b1": Figure("gpt_step_ms_b1 / gpt_floor_ms_b1: 1.0 = a step that only streams its bytes",
                                 ("<=", 1.3)),
    "step_over_floor_b4": Figure("gpt_step_ms_b4 / gpt_floor_ms_b4"),
    "step_over_floor_b16": Figure("gpt_step_ms_b16 / gpt_floor_ms_b16 (the KV cache of 16 rows a larger share of "
                                  "the bytes)"),
    "busy_p99_s_saturated": Figure(
        "p99 seconds from send to the 'busy' answer of burst requests (one 16-token stream request per client on "
        "its open stream, all at once; the burst's rounds pooled) while long streams hold every stream slot "
        "(default-path server)", ("<=", 0.1)),
    "busy_p99_s_offline_saturated": Figure(
        "p99 seconds from send to the 'busy' answer of a burst of chattts_offline infer calls (one 16-token request "
        "per client, built before the start signal, all at once; send: gRPC takes it to start the call, as a "
        "stream request's send is gRPC taking it from its stream; rounds pooled) while held requests take every "
        "offline slot and long streams every stream slot (default-path server)", ("<=", 0.1)),
    "busy_p99_s_gateway_saturated": Figure(
        "p99 seconds from send to the 503 answer (with Retry-After) of a burst of POST /v1/audio/speech through the "
        "gateway (one 16-token request per connection, all at once; rounds pooled), every slot held as above",
        ("<=", 0.1)),
    "busy_p99_s_burst": Figure(
        "p99 seconds from send to the 'busy' answer of the refused burst requests on an idle server "
        "(default-path server; the accepted ones' TTFA is in burst.burst)"),
    "throughput_ratio_c16_as_deployed": Figure(
        "audio s per wall s at closed-loop c=16 with the profile as shipped (degraded mode live: "
        "degraded_fraction_as_deployed of the requests ran degraded), over upstream one request at a time"),
    "degraded_fraction_as_deployed": Figure(
        "fraction of the as-deployed c=16 requests that the server ran in its degraded mode"),
}
"""Every headline figure: top level of bench.json for the default profile, and in
``profiles.<name>`` for each profile (the burst and as-deployed ones for the default only)."""
TARGETS: dict[str, tuple[str, float]] = {k: f.target for k, f in FIGURES.items() if f.target is not None}
"""The targets of the figures that have one, for every profile (see :data:`PROFILE_TARGETS`)."""
PRECISION_TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "int8": {"throughput_ratio_c16": (">=", 20.0), "throughput_ratio_c16_vs_batched": (">=", 2.0),
             "rtf_c1": ("<=", 0.5), "realtime_streams": (">=", 2.0), "ttfa_ratio_c1": ("<=", 0.05),
             "step_over_floor_b1": ("<=", 1.3), "step_over_floor_b4": ("<=", 1.3), "step_over_floor_b16": ("<=", 1.3)},
    "fp32": {"throughput_ratio_c16": (">=", 15.0), "realtime_streams": (">=", 1.0)},
}
"""Targets by the GPT precision a profile ran (issues #30 and #41), over :data:`TARGETS`."""
PROFILE_TARGETS: dict[str, dict[str, tuple[str, float]]] = {"cpu-int8": PRECISION_TARGETS["int8"],
                                                            "cpu-fp32": PRECISION_TARGETS["fp32"]}
"""Targets of a profile by name, for callers that do not know the precision it ran."""


def definitions() -> dict[str, str]:
    """{figure: what it measures}, for bench.json's ``definitions``."""
    return {k: f.text for k, f in FIGURES.items()}


def targets_for(profile: str, precision: str | None = None) -> dict[str, tuple[str, float]]:
    """The targets that apply to ``profile`` (which ran its GPT at ``precision``, if known)."""
    by_precision = PRECISION_TARGETS.get(precision, {}) if precision else PROFILE_TARGETS.get(profile, {})
    return {**TARGETS, **by_precision}


def target_met(name: str, value: float | None, profile: str = "", precision: str | None = None) -> bool | None:
    """Whether ``value`` meets ``profile``'s target for figure ``name``; None when unknown."""
    target = targets_for(profile, precision).get(name)
    if value is None or target is None:
        return None
    op, bound = target
    return value >= bound if op == ">=" else value <= bound


def level(levels: Sequence[Mapping[str, Any]], c: int) -> Mapping[str, Any] | None:
    """The level of concurrency ``c`` in ``levels``, None if it was not run."""
    return next((lv for lv in levels if lv["concurrency"] == c), None)


def cpu_other(part: Mapping[str, Any] | None) -> float | None:
    """The other-processes CPU % of a measured part (its own key, or its ``cpu`` window's)."""
    if not part:
        return None
    if part.get("other_cpu_percent") is not None:
        return float(part["other_cpu_percent"])
    cpu = part.get("cpu")
    return cpu.get("other_cpu_percent") if isinstance(cpu, Mapping) else None


def _invalid(label: str, part: Mapping[str, Any] | None, *, allow_degraded: bool = False) -> str | None:
    """Why figures from ``part`` cannot be trusted: not measured, degraded requests (not the
    default path), or outside load; None when they can."""
    if not part or part.get("skipped"):
        return f"{label}: not measured" + (f" ({part['skipped']})" if part and part.get("skipped") else "")
    degraded = part.get("degraded_requests") or 0
    if degraded and not allow_degraded:
        return f"{label}: {degraded} request(s) ran in the degraded mode (not the default path)"
    other = cpu_other(part)
    if other is not None and other > OUTSIDE_LOAD_WARN_PERCENT:
        return f"{label}: other processes used {other:.0f} % of a core meanwhile (outside load)"
    return None


def _figure(figures: dict[str, Any], nulls: dict[str, str], name: str, value: float | None,
            *parts: tuple[str, Mapping[str, Any] | None]) -> None:
    """Set ``figures[name]`` to ``value``, or to None with the reason in ``nulls`` when a part
    it depends on is invalid (:func:`_invalid`) or the value could not be computed."""
    for label, part in parts:
        reason = _invalid(label, part)
        if reason:
            figures[name], nulls[name] = None, reason
            return
    figures[name] = value
    if value is None:
        nulls[name] = "a measurement it divides is missing or zero"


def realtime_streams(levels: Sequence[Mapping[str, Any]]) -> tuple[int | None, str | None]:
    """(largest tested concurrency at which, as at every lower tested level, at least
    :data:`REALTIME_MIN_FRACTION` of the streams are real time; None and the reason when a
    level it depends on is invalid). 0 when the lowest level fails."""
    best = 0
    for lv in sorted(levels, key=lambda x: x["concurrency"]):
        reason = _invalid(f"closed loop c={lv['concurrency']}", lv)
        if reason:
            return None, reason
        frac = lv.get("realtime_fraction")
        if frac is None or frac < REALTIME_MIN_FRACTION:
            break
        best = lv["concurrency"]
    return best, None


def profile_figures(prof: Mapping[str, Any], baseline: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The headline figures of one profile's result (see :data:`FIGURES`) and, for each that
    is None, why."""
    levels = prof.get("levels", [])
    c1, c16 = level(levels, 1), level(levels, 16)
    off, batched = baseline.get("offline"), baseline.get("batched")
    stream, smallest = baseline.get("stream"), baseline.get("stream_smallest")
    pipe, openl = prof.get("pipeline"), prof.get("open_loop")
    f: dict[str, Any] = {}
    nulls: dict[str, str] = {}

    def get(part: Mapping[str, Any] | None, key: str) -> Any:
        return part.get(key) if part else None

    L16, L1 = ("closed loop c=16", c16), ("closed loop c=1", c1)
    _figure(f, nulls, "throughput_ratio_c16", ratio(get(c16, "audio_s_per_s"), get(off, "audio_s_per_s")),
            L16, ("upstream one at a time", off))
    _figure(f, nulls, "throughput_ratio_c16_vs_batched",
            ratio(get(c16, "audio_s_per_s"), get(batched, "audio_s_per_s")), L16, ("upstream batched", batched))
    _figure(f, nulls, "ttfa_ratio_c1", ratio(get(c1, "ttfa_p50_s"), get(stream, "first_chunk_p50_s")),
            L1, ("upstream stream mode (default settings)", stream))
    _figure(f, nulls, "ttfa_ratio_c1_vs_stream_smallest",
            ratio(get(c1, "ttfa_p50_s"), get(smallest, "first_chunk_p50_s")),
            L1, ("upstream stream mode (smallest practical stream_batch)", smallest))
    _figure(f, nulls, "p95_over_p50_c16", ratio(get(c16, "latency_p95_s"), get(c16, "latency_p50_s")), L16)
    _figure(f, nulls, "ttfa_p95_over_p50_open_loop", get(openl, "ttfa_p95_over_p50"), ("open loop", openl))
    _figure(f, nulls, "rtf_p95_over_p50_open_loop", get(openl, "rtf_p95_over_p50"), ("open loop", openl))
    _figure(f, nulls, "pipeline_efficiency_c16", ratio(get(c16, "tokens_per_s"), get(pipe, "tokens_per_s")),
            L16, ("minimal pipeline", pipe))
    rt, reason = realtime_streams(levels)
    f["realtime_streams"] = rt
    if reason:
        nulls["realtime_streams"] = reason
    _figure(f, nulls, "rtf_c1", get(c1, "rtf_p50"), L1)
    for name, (label, lv) in (("vocoder_cpu_ms_per_token", L16), ("vocoder_cpu_ms_per_token_c1", L1)):
        _figure(f, nulls, name, vocoder_cpu_ms_per_token(lv), (label, lv))
    for name, (label, lv) in (("vocoded_tokens_per_token", L16), ("vocoded_tokens_per_token_c1", L1)):
        # a count, not a time: outside load does not void it, the degraded mode's other chunks do
        degraded = (lv or {}).get("degraded_requests") or 0
        if degraded:
            f[name] = None
            nulls[name] = f"{label}: {degraded} request(s) ran in the degraded mode (not the default path)"
        else:
            _figure(f, nulls, name, vocoded_tokens_per_token(lv))
    raw, floor = prof.get("raw_step"), prof.get("floor")
    raw_part = ("raw step", raw)
    for b in (1, 4, 16):
        step = (raw or {}).get("batches", {}).get(str(b), {}).get("step_ms_p50")
        _figure(f, nulls, f"gpt_step_ms_b{b}", step, raw_part)
        _figure(f, nulls, f"gpt_floor_ms_b{b}", (floor or {}).get("floor_ms", {}).get(str(b)))
    for b in (1, 4, 16):
        _figure(f, nulls, f"step_over_floor_b{b}", over_floor(raw, floor, b), raw_part)
    f["gpt_step_ms"] = {str(b): f[f"gpt_step_ms_b{b}"] for b in (1, 4, 16)}
    burst = prof.get("burst")
    if burst is not None:
        for name, key in (("busy_p99_s_saturated", "saturated"), ("busy_p99_s_burst", "burst")):
            part = burst.get(key)
            _figure(f, nulls, name, get(part, "busy_p99_s"), (f"burst ({key})", part))
        saturated = burst.get("saturated")
        for door in DOOR_NAMES:
            part = get(saturated, door)
            _figure(f, nulls, f"busy_p99_s_{door}_saturated", get(part, "busy_p99_s"), ("burst (saturated)", saturated),
                    (f"burst (saturated, {door})", part))
    deployed = prof.get("as_deployed")
    if deployed is not None:
        reason = _invalid("as deployed c=16", deployed, allow_degraded=True) or _invalid("upstream one at a time", off)
        value = ratio(deployed.get("audio_s_per_s"), get(off, "audio_s_per_s"))
        f["throughput_ratio_c16_as_deployed"] = None if reason else value
        f["degraded_fraction_as_deployed"] = ratio(deployed.get("degraded_requests"), deployed.get("requests"))
        if reason or value is None:
            nulls["throughput_ratio_c16_as_deployed"] = reason or "a measurement it divides is missing or zero"
    return f, nulls


VOCODER_PROCESSES = ("chattts_vocoder", "chattts_dvae_vocoder")
"""Process labels (model names of the Python stubs) of the vocoder models."""


def vocoder_cpu_ms_per_token(lv: Mapping[str, Any] | None) -> float | None:
    """CPU ms of the vocoder processes per token generated at level ``lv`` (None when either
    is missing or no token was generated)."""
    if not lv or not lv.get("cpu_s_by_process"):
        return None
    tokens = (lv.get("tokens_per_s") or 0.0) * (lv.get("wall_s") or 0.0)
    cpu_s = sum(v for k, v in lv["cpu_s_by_process"].items() if k in VOCODER_PROCESSES)
    return 1000.0 * cpu_s / tokens if tokens else None


def vocoded_tokens_per_token(lv: Mapping[str, Any] | None) -> float | None:
    """Tokens the vocoder models vocoded per token generated at level ``lv`` (None when the
    server exports no ``tts_vocoder_tokens_total`` or no token was generated)."""
    models = (lv or {}).get("models") or {}
    counts = [m["vocoded_tokens"] for k, m in models.items() if k in VOCODER_PROCESSES and "vocoded_tokens" in m]
    tokens = ((lv or {}).get("tokens_per_s") or 0.0) * ((lv or {}).get("wall_s") or 0.0)
    return sum(counts) / tokens if counts and tokens else None


FRONTEND_SHARE_TARGET = 0.05
"""Issue #11: the front end's time per request stays under 5 % of TTFA at concurrency 1."""
FRONTEND_FIGURES = ("frontend_p99_ms", "frontend_share_of_ttfa_c1")


def frontend_figures(frontend: Mapping[str, Any], levels: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """frontend_p99_ms: p99 of ``FrontEnd.prepare`` per request over the benchmark sentences;
    frontend_share_of_ttfa_c1: its p50 over the TTFA p50 at concurrency 1 (both per request);
    frontend_numbers_*: the same over number-heavy sentences."""
    ttfa_ms = (level(levels, 1) or {}).get("ttfa_p50_s")
    ttfa_ms = ttfa_ms * 1000.0 if ttfa_ms is not None else None
    bench, numbers = frontend.get("bench", {}), frontend.get("numbers", {})
    return {"frontend_p99_ms": bench.get("p99_ms"),
            "frontend_share_of_ttfa_c1": ratio(bench.get("p50_ms"), ttfa_ms),
            "frontend_numbers_p99_ms": numbers.get("p99_ms"),
            "frontend_numbers_share_of_ttfa_c1": ratio(numbers.get("p50_ms"), ttfa_ms)}


def ran_profiles(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, result) of each profile of ``result`` that ran (not skipped), in run order."""
    return [(n, p) for n, p in result.get("profiles", {}).items() if not p.get("skipped")]


def outside_load(result: Mapping[str, Any]) -> dict[str, float]:
    """Phases during which other processes used more than :data:`OUTSIDE_LOAD_WARN_PERCENT`
    percent of a core: {phase name: their CPU %}."""
    base = result.get("baseline", {})
    phases: dict[str, Any] = {"upstream one at a time": cpu_other(base.get("offline")),
                              "upstream batched": cpu_other(base.get("batched"))}
    for st in base.get("stream_settings") or []:
        phases[f"upstream stream_batch {st['stream_batch_tokens']}"] = cpu_other(st)
    for name, prof in ran_profiles(result):
        phases[f"{name} raw step"] = cpu_other(prof.get("raw_step"))
        phases[f"{name} minimal pipeline"] = cpu_other(prof.get("pipeline"))
        for lv in prof.get("levels", []):
            phases[f"{name} c={lv['concurrency']}"] = lv.get("other_cpu_percent")
        phases[f"{name} open loop"] = cpu_other(prof.get("open_loop"))
        for key, part in (prof.get("burst") or {}).items():
            phases[f"{name} burst ({key})"] = cpu_other(part) if isinstance(part, Mapping) else None
        phases[f"{name} as deployed"] = cpu_other(prof.get("as_deployed"))
    return {k: v for k, v in phases.items() if v is not None and v > OUTSIDE_LOAD_WARN_PERCENT}
