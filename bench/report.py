"""The benchmark's outputs: the headline figures (each naming its mode and baseline), the
Markdown report and the PNG plots."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .doors import doors_markdown
from .floor import over_floor
from .gatewayload import gateway_markdown
from .modes import modes_markdown
from .stats import REALTIME_MIN_FRACTION, REALTIME_TOLERANCE_S, cdf, fmt, ratio
from .wsload import ws_markdown

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
             "rtf_c1": ("<=", 0.5), "realtime_streams": (">=", 3.0), "ttfa_ratio_c1": ("<=", 0.05),
             "step_over_floor_b1": ("<=", 1.5), "step_over_floor_b4": ("<=", 1.5), "step_over_floor_b16": ("<=", 1.5)},
    "fp32": {"throughput_ratio_c16": (">=", 15.0), "realtime_streams": (">=", 1.0)},
}
"""Targets by the GPT precision a profile ran (issue #30), over :data:`TARGETS`."""
PROFILE_TARGETS: dict[str, dict[str, tuple[str, float]]] = {"cpu-int8": PRECISION_TARGETS["int8"],
                                                            "cpu-fp32": PRECISION_TARGETS["fp32"]}
"""Targets of a profile by name, for callers that do not know the precision it ran."""

PLOTS = {"throughput": "throughput_vs_concurrency.png", "latency_cdf": "latency_cdf.png",
         "ttfa": "ttfa_vs_concurrency.png"}


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


def _cpu_other(part: Mapping[str, Any] | None) -> float | None:
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
    other = _cpu_other(part)
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


def _profiles(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(n, p) for n, p in result.get("profiles", {}).items() if not p.get("skipped")]


def outside_load(result: Mapping[str, Any]) -> dict[str, float]:
    """Phases during which other processes used more than :data:`OUTSIDE_LOAD_WARN_PERCENT`
    percent of a core: {phase name: their CPU %}."""
    base = result.get("baseline", {})
    phases: dict[str, Any] = {"upstream one at a time": _cpu_other(base.get("offline")),
                              "upstream batched": _cpu_other(base.get("batched"))}
    for st in base.get("stream_settings") or []:
        phases[f"upstream stream_batch {st['stream_batch_tokens']}"] = _cpu_other(st)
    for name, prof in _profiles(result):
        phases[f"{name} raw step"] = _cpu_other(prof.get("raw_step"))
        phases[f"{name} minimal pipeline"] = _cpu_other(prof.get("pipeline"))
        for lv in prof.get("levels", []):
            phases[f"{name} c={lv['concurrency']}"] = lv.get("other_cpu_percent")
        phases[f"{name} open loop"] = _cpu_other(prof.get("open_loop"))
        for key, part in (prof.get("burst") or {}).items():
            phases[f"{name} burst ({key})"] = _cpu_other(part) if isinstance(part, Mapping) else None
        phases[f"{name} as deployed"] = _cpu_other(prof.get("as_deployed"))
    return {k: v for k, v in phases.items() if v is not None and v > OUTSIDE_LOAD_WARN_PERCENT}


# --- Markdown ------------------------------------------------------------------------------
def _header(result: Mapping[str, Any]) -> list[str]:
    cfg, mach = result["config"], result["machine"]
    return [
        "# ChatTTS serving benchmark", "",
        f"{result['started_at']} · {mach.get('cpu_model', '?')} "
        f"({', '.join(mach.get('cpu_flags') or []) or 'no AVX-512/VNNI/AMX flags read'}), "
        f"{mach.get('logical_cpus')} logical CPUs, "
        f"{fmt(mach.get('memory_gb'), 1)} GB · Triton {mach.get('tritonserver_version', '?')} · "
        f"onnxruntime {mach.get('onnxruntime')} · torch {mach.get('torch')} · chattts {mach.get('chattts')} · "
        f"commit {mach.get('git_commit')}{' (dirty)' if mach.get('git_dirty') else ''} · "
        f"{fmt(result.get('elapsed_s'), 0)} s in all", "",
        f"Artifacts `{cfg['artifacts']}` (sizes `{cfg['sizes']}`, {cfg['gpt_layers']} layers, hidden "
        f"{cfg['hidden_size']}), weights `{cfg['weights']}`; profiles {', '.join(f'`{p}`' for p in cfg['profiles'])} "
        f"(the first is the default). Every closed-loop request asks for exactly {cfg['tokens']} tokens "
        f"({fmt(cfg['audio_s_per_request'], 2)} s of audio; min = max new tokens), texts cycle through "
        f"{cfg['sentences']} Chinese sentences, voice seed {cfg['voice_seed']}. Levels {cfg['levels']}, requests "
        f"per level {cfg['requests_per_level']}, closed loop (each client sends its next request when its stream "
        "ends)." + (f" Note: {cfg['label']}" if cfg.get("label") else ""), "",
        f"**Modes.** Every server figure is measured on the *default path*: a copy of the profile whose degraded "
        f"mode is out of reach (degradation {result.get('degradation')}); each request's `info` (degraded, "
        "vocoder, generated tokens) is recorded, and a figure from a phase with a degraded request or with "
        f"outside load (other processes above {OUTSIDE_LOAD_WARN_PERCENT:g} % of a core) is null, with the "
        "reason. Throughput counts the tokens the server reports as generated. The profile as shipped, "
        "degraded mode live, is its own row: *under load, as deployed*.",
    ]


def _headline(result: Mapping[str, Any]) -> list[str]:
    profs = _profiles(result)
    lines = ["", "## Headline figures", "",
             "| figure | " + " | ".join(f"`{n}`" for n, _ in profs) + " | target | what it measures |",
             "|---|" + "---|" * len(profs) + "---|---|"]
    for name, fig in FIGURES.items():
        if not any(name in p for _, p in profs):
            continue
        cells = []
        for pname, p in profs:
            v = p.get(name)
            met = target_met(name, v, pname, p.get("precision"))
            mark = "" if met is None else (" ✓" if met else " ✗")
            cells.append("–" if name not in p else ("null" if v is None else fmt(v)) + mark)
        targets = sorted({f"{op} {bound:g}" + ("" if t == TARGETS.get(name) else f" ({pn})")
                          for pn, pp in profs for t in [targets_for(pn, pp.get("precision")).get(name)] if t
                          for op, bound in [t]})
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {', '.join(targets) or '–'} | {fig.text} |")
    nulls = [(pn, k, r) for pn, p in profs for k, r in (p.get("null_reasons") or {}).items()]
    if nulls:
        lines += ["", "Null figures:", ""] + [f"- `{pn}` `{k}`: {r}" for pn, k, r in nulls]
    return lines


def _baselines(result: Mapping[str, Any]) -> list[str]:
    base = result["baseline"]
    if base.get("skipped"):
        return ["", "## Baselines: upstream ChatTTS", "", "Skipped (`--skip-baseline`)."]
    off, bat = base["offline"], base.get("batched") or {}
    lines = ["", "## Baselines: upstream ChatTTS (torch eager), same weights, sentences and budget", "",
             "| serving | requests | latency p50 s | requests/s | audio s/s | RTF | other processes CPU % |",
             "|---|---|---|---|---|---|---|",
             f"| `Chat.infer([text])`, one request at a time | {off['ok']}/{off['requests']} | "
             f"{fmt(off['latency_p50_s'])} | {fmt(off['requests_per_s'])} | {fmt(off['audio_s_per_s'])} | "
             f"{fmt(off.get('rtf_p50'))} | {fmt(_cpu_other(off), 0)} |"]
    if bat:
        lines.append(f"| `Chat.infer(texts)`, {bat['texts']} texts in one batch (`split_text=False`), "
                     f"{bat['repeats']} call(s) | {bat['texts'] * bat['repeats']} | {fmt(bat['latency_p50_s'])} | "
                     f"{fmt(bat['requests_per_s'])} | {fmt(bat['audio_s_per_s'])} | – | {fmt(_cpu_other(bat), 0)} |")
    settings = base.get("stream_settings") or []
    if settings:
        smallest = base.get("stream_smallest") or {}
        lines += ["", f"Stream mode (`stream=True`; each yield re-decodes the whole prefix). Practical: total p50 "
                      f"at most {base.get('practical_total_factor')} x the one-at-a-time latency p50.", "",
                  "| stream_batch | passed batches | first audio after tokens | first chunk p50 s | total p50 s "
                  "| practical | other processes CPU % |", "|---|---|---|---|---|---|---|"]
        for st in settings:
            marks = [m for m, on in (("ChatTTS default", st is settings[0]),
                                     ("smallest practical", st.get("stream_batch_tokens")
                                      == smallest.get("stream_batch_tokens"))) if on]
            mark = f" ({', '.join(marks)})" if marks else ""
            lines.append(f"| {st['stream_batch_tokens']}{mark} | {st['pass_first_n_batches']} | "
                         f"{st['first_audio_after_tokens']} | {fmt(st['first_chunk_p50_s'])} | "
                         f"{fmt(st['total_p50_s'])} | {'yes' if st.get('practical') else 'no'} | "
                         f"{fmt(_cpu_other(st), 0)} |")
    return lines


def _levels_table(levels: Sequence[Mapping[str, Any]], label: str = "c") -> list[str]:
    lines = [f"| {label} | ok | degraded | vocoder | TTFA p50 s | TTFA p95 s | latency p50 s | p95 s | p99 s "
             "| audio s/s | tokens/s (generated) | RTF p50 | real-time streams | start buffer p95 s "
             "| mean decode batch | server CPU % | other CPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        eng = lv.get("engine") or {}
        vocoders = ", ".join(f"{k} {v}" for k, v in (lv.get("vocoders") or {}).items()) or "–"
        lines.append(
            f"| {lv.get('concurrency', '–')} | {lv['ok']}/{lv['requests']} | {lv.get('degraded_requests')} | "
            f"{vocoders} | {fmt(lv['ttfa_p50_s'])} | {fmt(lv['ttfa_p95_s'])} | {fmt(lv['latency_p50_s'])} | "
            f"{fmt(lv['latency_p95_s'])} | {fmt(lv['latency_p99_s'])} | {fmt(lv['audio_s_per_s'])} | "
            f"{fmt(lv['tokens_per_s'], 1)} | {fmt(lv.get('rtf_p50'))} | {fmt(lv.get('realtime_fraction'), 2)} | "
            f"{fmt(lv.get('start_buffer_p95_s'))} | {fmt(eng.get('mean_batch'), 2)} | {fmt(lv['cpu_percent'], 0)} | "
            f"{fmt(lv.get('other_cpu_percent'), 0)} |")
    return lines


def _where_it_goes(prof: Mapping[str, Any]) -> list[str]:
    """Server vs minimal pipeline at c=16: tokens/s and CPU seconds per 1000 generated tokens."""
    c16, pipe, raw = level(prof.get("levels", []), 16), prof.get("pipeline") or {}, prof.get("raw_step") or {}
    lines = ["", "#### Ceilings and where the rest goes", ""]
    raw_rows = [f"| {b} | {fmt(m['step_ms_p50'], 1)} | {', '.join(fmt(x, 1) for x in m.get('round_step_ms_p50', []))} "
                f"| {fmt(m['tokens_per_s'], 1)} |" for b, m in (raw.get("batches") or {}).items()]
    if raw_rows:
        lines += [f"Raw GPT decode step (no sampling, no audio; past {raw.get('past_tokens')}, "
                  f"{raw.get('rounds')} rounds of {raw.get('repeats')} steps, median of the rounds' medians; other "
                  f"processes {fmt(_cpu_other(raw), 0)} % CPU):", "",
                  "| batch | step ms p50 | per round | tokens/s |", "|---|---|---|---|", *raw_rows, ""]
    if pipe:
        runs = ", ".join(fmt(r["tokens_per_s"], 1) for r in pipe.get("runs", []))
        lines += [f"Minimal pipeline (batch {pipe.get('batch')}, {pipe.get('tokens')} tokens each, vocoder "
                  f"`{pipe.get('vocoder')}`, in process): **{fmt(pipe.get('tokens_per_s'), 1)} tokens/s** (median of "
                  f"runs {runs}); decode {fmt(pipe.get('decode_s'), 2)} s + vocoder {fmt(pipe.get('vocode_s'), 2)} s "
                  f"of {fmt(pipe.get('wall_s'), 2)} s.", ""]
    if c16 and pipe.get("tokens_per_s"):
        tokens = (c16.get("tokens_per_s") or 0.0) * (c16.get("wall_s") or 0.0)
        per_k = {k: 1000.0 * v / tokens for k, v in (c16.get("cpu_s_by_process") or {}).items()} if tokens else {}
        pipe_tokens = pipe["tokens_per_s"] * (pipe.get("wall_s") or 0.0)
        lines += [f"At c=16 the server generated {fmt(c16.get('tokens_per_s'), 1)} tokens/s: "
                  f"{fmt(ratio(c16.get('tokens_per_s'), pipe['tokens_per_s']), 2)} of the minimal pipeline. "
                  "CPU seconds per 1000 generated tokens:", "",
                  "| where | CPU s / 1000 tokens |", "|---|---|"]
        if pipe_tokens:
            lines += [f"| minimal pipeline: engine (prefill, decode steps, sampling) | "
                      f"{fmt(1000 * pipe['decode_cpu_s'] / pipe_tokens, 2)} |",
                      f"| minimal pipeline: vocoder | {fmt(1000 * pipe['vocode_cpu_s'] / pipe_tokens, 2)} |"]
        lines += [f"| server: {k} | {fmt(v, 2)} |" for k, v in per_k.items()]
        client = c16.get("client_cpu_percent")
        if client is not None and tokens:
            lines.append(f"| benchmark client (shares the cores) | "
                         f"{fmt(1000 * client / 100 * c16['wall_s'] / tokens, 2)} |")
    return lines


def _profile_sections(result: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, prof in result.get("profiles", {}).items():
        lines += ["", f"## Profile `{name}` ({prof.get('precision')}, vocoder `{prof.get('vocoder')}`)"]
        if prof.get("skipped"):
            lines += ["", f"Skipped: {prof['skipped']}"]
            continue
        lines += ["", f"Server started in {fmt(prof.get('server_start_s'), 1)} s. Degradation "
                      f"{prof.get('degradation')}.", "", "### Closed loop (default path)", "",
                  *_levels_table(prof.get("levels", []))]
        ol = prof.get("open_loop")
        if ol and not ol.get("skipped"):
            lines += ["", "### Open loop (default path)", "",
                      f"{ol['requests']} Poisson arrivals at {fmt(ol['rate_per_s'], 2)} requests/s "
                      f"({ol['load_factor']:g} x the measured {fmt(ol['capacity_tokens_per_s'], 1)} tokens/s), "
                      f"budgets {ol['budgets']} tokens, mixed texts. TTFA p95/p50 "
                      f"**{fmt(ol['ttfa_p95_over_p50'], 2)}**, RTF p95/p50 "
                      f"**{fmt(ol['rtf_p95_over_p50'], 2)}**, RTF p95 {fmt(ol.get('rtf_p95'))}, outcomes "
                      f"{ol.get('outcomes')}.", "", *_levels_table([ol], "open")]
        lines += _where_it_goes(prof)
        levels = prof.get("levels", [])
        labels: list[str] = []
        for lv in levels:
            labels += [k for k in lv.get("cpu_s_by_process", {}) if k not in labels]
        lines += ["", "#### CPU seconds per server process", "",
                  "| c | wall s | " + " | ".join(labels) + " | client CPU % | other processes CPU % |",
                  "|---|---|" + "---|" * len(labels) + "---|---|"]
        for lv in levels:
            by = lv.get("cpu_s_by_process", {})
            lines.append(f"| {lv['concurrency']} | {fmt(lv['wall_s'], 1)} | "
                         + " | ".join(fmt(by.get(k), 1) for k in labels)
                         + f" | {fmt(lv.get('client_cpu_percent'), 0)} | {fmt(lv.get('other_cpu_percent'), 0)} |")
        hist = [lv for lv in levels if lv.get("engine")]
        if hist:
            lines += ["", "Decode-step batch sizes (steps per `tts_engine_batch_size` bucket):", ""]
            lines += [f"- c={lv['concurrency']}: {lv['engine']['decode_steps']} steps, "
                      + ", ".join(f"{k}: {v}" for k, v in lv["engine"]["histogram"].items()) for lv in hist]
        failed = [lv for lv in [*levels, ol or {}] if lv.get("errors")]
        if failed:
            lines += ["", "#### Errors", ""]
            lines += [f"- {lv.get('concurrency', 'open loop')}: {lv['failed']} failed; " + "; ".join(lv["errors"])
                      for lv in failed]
        deployed = prof.get("as_deployed")
        if deployed:
            lines += ["", "### Under load, as deployed", "",
                      f"The profile as shipped (degraded mode live), after the same warm-up, at c="
                      f"{deployed['concurrency']}: {deployed.get('degraded_requests')} of {deployed['requests']} "
                      "requests ran degraded. Not a default-path figure.", "", *_levels_table([deployed])]
    return lines


def _burst(result: Mapping[str, Any]) -> list[str]:
    burst = result.get("burst")
    if not burst or burst.get("skipped"):
        return []
    lines = ["", "## Overload burst (default profile, default-path server)", "",
             "Every client connected and opened its stream first, then sent one 16-token stream request at the same "
             "moment (saturated: then the same to chattts_offline, and through the gateway, each client on a "
             "connection made first; every stream and offline slot held meanwhile); times from each request's "
             "send, the rounds pooled (from start: from the start signal, with "
             "the load generator's own sending of the whole burst; held streams from a process of their own; client "
             "nice: the measuring client's niceness during the bursts).", "",
             "| burst | rounds | requests | outcomes | busy p50 s | busy p99 s | busy max s | busy p99 s per round "
             "| busy p99 s from start | accepted TTFA p50 s | accepted TTFA p99 s | every slot held first "
             "| client nice | other CPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in ("burst", "saturated"):
        b = burst.get(key)
        if not b:
            continue
        held = (f"{b['hold']} x {b['hold_tokens']} tokens (all accepted: {b.get('hold_ready')})"
                if b.get("hold") else "no")
        if b.get("offline_hold"):
            held = f"{held[:-1]}; and {b['offline_hold']} chattts_offline x {b['offline_hold_tokens']} tokens)"
        rows = [(f"{key}: chattts" if b.get("offline_hold") else key, b)]
        rows += [(f"{key}: {DOOR_NAMES[d]}", b[d]) for d in DOOR_NAMES if isinstance(b.get(d), Mapping)]
        for label, row in rows:
            per_round = ", ".join(fmt(v) for v in row.get("round_busy_p99_s", []))
            retry = (f" (Retry-After on {row['busy_with_retry_after']})" if "busy_with_retry_after" in row else "")
            lines.append(f"| {label} | {row.get('rounds', 1)} | {row['requests']} | {row['outcomes']}{retry} | "
                         f"{fmt(row['busy_p50_s'])} | {fmt(row['busy_p99_s'])} | {fmt(row['busy_max_s'])} | "
                         f"{per_round or '–'} | {fmt(row.get('busy_p99_s_from_start'))} | "
                         f"{fmt(row['accepted_ttfa_p50_s'])} | {fmt(row['accepted_ttfa_p99_s'])} | {held} | "
                         f"{b.get('client_nice', '–')} | {fmt(b.get('other_cpu_percent'), 0)} |")
    return lines


def _frontend(result: Mapping[str, Any]) -> list[str]:
    fe = result.get("frontend")
    if not fe:
        return []
    share = result.get("frontend_share_of_ttfa_c1")
    fe_met = "–" if share is None else ("yes" if share <= FRONTEND_SHARE_TARGET else "no")
    lines = ["", "## Text front end (`FrontEnd.prepare` in process, per request)", "",
             f"Profile's `[frontend] wetext = {str(fe['wetext']).lower()}`; built in {fmt(fe.get('setup_s'), 2)} s. "
             f"Share of TTFA: front-end p50 over TTFA p50 at c=1, target <= {FRONTEND_SHARE_TARGET:g} (met: {fe_met}).",
             "", "| sentences | calls | mean chars | p50 ms | p99 ms | max ms | share of TTFA c=1 |",
             "|---|---|---|---|---|---|---|"]
    for key, label, share_key in (("bench", "benchmark sentences", "frontend_share_of_ttfa_c1"),
                                  ("numbers", "number-heavy sentences", "frontend_numbers_share_of_ttfa_c1")):
        m = fe.get(key, {})
        lines.append(f"| {label} | {m.get('calls')} | {fmt(m.get('chars_mean'), 1)} | {fmt(m.get('p50_ms'), 2)} | "
                     f"{fmt(m.get('p99_ms'), 2)} | {fmt(m.get('max_ms'), 2)} | {fmt(result.get(share_key), 4)} |")
    return lines


def _warnings(result: Mapping[str, Any]) -> list[str]:
    skewed = outside_load(result)
    if not skewed:
        return []
    return ["", "## Warning: outside load", "",
            f"Other processes used more than {OUTSIDE_LOAD_WARN_PERCENT:g} % of a core during: "
            + ", ".join(f"{k} ({v:.0f} %)" for k, v in skewed.items())
            + ". Figures from those phases are null; rerun on a quiet machine."]


def _plots(_result: Mapping[str, Any]) -> list[str]:
    return ["", "## Plots", ""] + [f"![{k}]({v})" for k, v in PLOTS.items()] + [""]


SECTIONS: list[Callable[[Mapping[str, Any]], list[str]]] = [
    _header, _headline, _baselines, _profile_sections, _burst, doors_markdown, gateway_markdown, ws_markdown,
    modes_markdown,
    _frontend, _warnings,
    _plots]
"""The report's sections in order; a new benchmark phase appends (or inserts) its own."""


def markdown(result: Mapping[str, Any]) -> str:
    """The report: :data:`SECTIONS` in order."""
    return "\n".join(line for section in SECTIONS for line in section(result))


def plot(result: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the three PNGs of :data:`PLOTS` into ``out_dir`` (matplotlib, Agg); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profs = _profiles(result)
    base = result["baseline"]
    paths = []

    def save(fig: Any, key: str) -> None:
        paths.append(out_dir / PLOTS[key])
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, prof in profs:
        levels = prof.get("levels", [])
        ax.plot([lv["concurrency"] for lv in levels], [lv["audio_s_per_s"] or 0.0 for lv in levels], "o-",
                label=f"this server, {name}")
    for part, label, style in ((base.get("offline"), "ChatTTS, one at a time", "--"),
                               (base.get("batched"), "ChatTTS, 16 texts batched", ":")):
        if part and part.get("audio_s_per_s") is not None:
            ax.axhline(part["audio_s_per_s"], color="gray", ls=style, label=label)
    ax.set_xlabel("concurrent streams (closed loop)")
    ax.set_ylabel("audio seconds per wall second")
    ax.set_title("Throughput vs concurrency (default path)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, "throughput")

    fig, ax = plt.subplots(figsize=(6, 4))
    if profs:
        for lv in profs[0][1].get("levels", []):
            x, y = cdf(r["total_s"] for r in lv["records"] if r["error"] is None)
            if x.size:
                ax.step(x, y, where="post", label=f"c={lv['concurrency']}")
    x, y = cdf(r["total_s"] for r in base["offline"]["records"] if r["error"] is None)
    if x.size:
        ax.step(x, y, where="post", color="gray", ls="--", label="ChatTTS, one at a time")
    ax.set_xlabel("request latency, s (send to end of stream)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Latency CDF per concurrency level ({profs[0][0] if profs else '-'})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    save(fig, "latency_cdf")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, prof in profs:
        levels = prof.get("levels", [])
        cs = [lv["concurrency"] for lv in levels]
        ax.plot(cs, [lv["ttfa_p50_s"] or float("nan") for lv in levels], "o-", label=f"TTFA p50, {name}")
        ax.plot(cs, [lv["ttfa_p95_s"] or float("nan") for lv in levels], "s--", label=f"TTFA p95, {name}")
    for part, label, style in ((base.get("stream"), "ChatTTS stream, default", "--"),
                               (base.get("stream_smallest"), "ChatTTS stream, smallest practical", ":")):
        if part and part.get("first_chunk_p50_s") is not None:
            ax.axhline(part["first_chunk_p50_s"], color="gray", ls=style, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams (closed loop)")
    ax.set_ylabel("time to first audio, s")
    ax.set_title("Time to first audio vs concurrency (default path)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    save(fig, "ttfa")
    return paths
