"""The benchmark's outputs: headline ratios, the Markdown report and the PNG plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .stats import cdf, ratio

TARGETS: dict[str, tuple[str, float]] = {
    "throughput_ratio_c16": (">=", 12.0),
    "ttfa_ratio_c1": ("<=", 0.1),
    "p95_over_p50_c16": ("<=", 1.3),
    "engine_efficiency_c16": (">=", 0.8),
}
"""Issue 4's targets for the full-size architecture on the 2-core CPU host: (comparison, bound)."""

PLOTS = {"throughput": "throughput_vs_concurrency.png", "latency_cdf": "latency_cdf.png",
         "ttfa": "ttfa_vs_concurrency.png"}


def _level(levels: Sequence[Mapping[str, Any]], c: int) -> Mapping[str, Any] | None:
    return next((lv for lv in levels if lv["concurrency"] == c), None)


def headline_ratios(baseline: Mapping[str, Any], levels: Sequence[Mapping[str, Any]],
                    raw_step: Mapping[str, Any]) -> dict[str, float | None]:
    """The four ratios of issue 4 (None where a level or measurement is missing).

    throughput_ratio_c16: audio s per wall s at c=16 over the baseline's (one request at a
    time). ttfa_ratio_c1: our TTFA p50 at c=1 over the baseline stream mode's first-chunk p50.
    p95_over_p50_c16: total latency p95 over p50 at c=16. engine_efficiency_c16: in-server
    decode tokens/s at c=16 (requests x tokens / level wall time) over the raw ORT step's
    tokens/s at batch 16.
    """
    c16 = _level(levels, 16) or {}
    c1 = _level(levels, 1) or {}
    base_off = baseline.get("offline", {})
    base_stream = baseline.get("stream", {})
    raw16 = raw_step.get("batches", {}).get("16", {})
    return {
        "throughput_ratio_c16": ratio(c16.get("audio_s_per_s"), base_off.get("audio_s_per_s")),
        "ttfa_ratio_c1": ratio(c1.get("ttfa_p50_s"), base_stream.get("first_chunk_p50_s")),
        "p95_over_p50_c16": ratio(c16.get("latency_p95_s"), c16.get("latency_p50_s")),
        "engine_efficiency_c16": ratio(c16.get("engine_tokens_per_s"), raw16.get("tokens_per_s")),
    }


FRONTEND_SHARE_TARGET = 0.05
"""Issue #11: the front end's time per request stays under 5 % of TTFA at concurrency 1."""
FRONTEND_FIGURES = ("frontend_p99_ms", "frontend_share_of_ttfa_c1")


def frontend_figures(frontend: Mapping[str, Any], levels: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """frontend_p99_ms: p99 of ``FrontEnd.prepare`` per request over the benchmark sentences;
    frontend_share_of_ttfa_c1: its p50 over the TTFA p50 at concurrency 1 (both per request);
    frontend_numbers_*: the same over number-heavy sentences."""
    ttfa_ms = (_level(levels, 1) or {}).get("ttfa_p50_s")
    ttfa_ms = ttfa_ms * 1000.0 if ttfa_ms is not None else None
    bench, numbers = frontend.get("bench", {}), frontend.get("numbers", {})
    return {"frontend_p99_ms": bench.get("p99_ms"),
            "frontend_share_of_ttfa_c1": ratio(bench.get("p50_ms"), ttfa_ms),
            "frontend_numbers_p99_ms": numbers.get("p99_ms"),
            "frontend_numbers_share_of_ttfa_c1": ratio(numbers.get("p50_ms"), ttfa_ms)}


OUTSIDE_LOAD_WARN_PERCENT = 20.0
"""Other processes' CPU (percent of one core) above which a phase is flagged as skewed."""


def outside_load(result: Mapping[str, Any]) -> dict[str, float]:
    """Phases during which other processes used more than :data:`OUTSIDE_LOAD_WARN_PERCENT`
    percent of a core: {phase name: their CPU %}."""
    phases = {"raw step": result["raw_step"].get("cpu", {}).get("other_cpu_percent"),
              "baseline": result["baseline"].get("cpu", {}).get("other_cpu_percent")}
    for lv in result["levels"]:
        phases[f"c={lv['concurrency']}"] = lv.get("other_cpu_percent")
    return {k: v for k, v in phases.items() if v is not None and v > OUTSIDE_LOAD_WARN_PERCENT}


def target_met(name: str, value: float | None) -> bool | None:
    """Whether ``value`` meets issue 4's target for ``name``; None when unknown."""
    if value is None or name not in TARGETS:
        return None
    op, bound = TARGETS[name]
    return value >= bound if op == ">=" else value <= bound


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(result: Mapping[str, Any]) -> str:
    """The report: configuration, the four ratios against their targets, baseline, per-level
    table, raw step, CPU per server process, plots."""
    cfg, mach = result["config"], result["machine"]
    base, levels, raw = result["baseline"], result["levels"], result["raw_step"]
    lines = [
        "# ChatTTS serving benchmark", "",
        f"{result['started_at']} · {mach.get('cpu_model', '?')}, {mach.get('logical_cpus')} logical CPUs, "
        f"{_f(mach.get('memory_gb'), 1)} GB · Triton {mach.get('tritonserver_version', '?')} · "
        f"onnxruntime {mach.get('onnxruntime')} · torch {mach.get('torch')} · "
        f"chattts {mach.get('chattts')}", "",
        f"Artifacts `{cfg['artifacts']}` (sizes `{cfg['sizes']}`, {cfg['gpt_layers']} layers, hidden "
        f"{cfg['hidden_size']}), weights `{cfg['weights']}`; profile `{cfg['profile']}`. "
        f"Every request asks for exactly {cfg['tokens']} tokens "
        f"({_f(cfg['audio_s_per_request'], 2)} s of audio; min = max new tokens), texts cycle "
        f"through {cfg['sentences']} Chinese sentences, voice seed {cfg['voice_seed']}. "
        f"Levels {cfg['levels']}, requests per level {cfg['requests_per_level']}, closed loop "
        "(each client sends its next request when its stream ends)."
        + (f" Note: {cfg['label']}" if cfg.get("label") else ""), "",
        "## Headline ratios", "",
        "| ratio | value | target | met |", "|---|---|---|---|",
    ]
    for name, (op, bound) in TARGETS.items():
        v = result.get(name)
        met = target_met(name, v)
        shown = "–" if met is None else ("yes" if met else "no")
        lines.append(f"| `{name}` | {_f(v)} | {op} {bound:g} | {shown} |")
    fe = result.get("frontend")
    if fe:
        share = result.get("frontend_share_of_ttfa_c1")
        fe_met = "–" if share is None else ("yes" if share <= FRONTEND_SHARE_TARGET else "no")
        lines += ["", "## Text front end (`FrontEnd.prepare` in process, per request)", "",
                  f"Profile's `[frontend] wetext = {str(fe['wetext']).lower()}`; built in "
                  f"{_f(fe.get('setup_s'), 2)} s. Share of TTFA: front-end p50 over TTFA p50 at c=1, "
                  f"target <= {FRONTEND_SHARE_TARGET:g} (met: {fe_met}).", "",
                  "| sentences | calls | mean chars | p50 ms | p99 ms | max ms | share of TTFA c=1 |",
                  "|---|---|---|---|---|---|---|"]
        for key, label, share_key in (("bench", "benchmark sentences", "frontend_share_of_ttfa_c1"),
                                      ("numbers", "number-heavy sentences", "frontend_numbers_share_of_ttfa_c1")):
            m = fe.get(key, {})
            lines.append(f"| {label} | {m.get('calls')} | {_f(m.get('chars_mean'), 1)} | {_f(m.get('p50_ms'), 2)} | "
                         f"{_f(m.get('p99_ms'), 2)} | {_f(m.get('max_ms'), 2)} | {_f(result.get(share_key), 4)} |")
    off, st = base["offline"], base["stream"]
    lines += [
        "", "## Baseline: upstream ChatTTS `Chat.infer` (torch eager), one request at a time", "",
        "| requests | latency p50 s | latency p95 s | requests/s | audio s/s | RTF mean "
        "| stream first chunk p50 s | stream total p50 s | other processes CPU % |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {off['ok']}/{off['requests']} | {_f(off['latency_p50_s'])} | {_f(off['latency_p95_s'])} | "
        f"{_f(off['requests_per_s'])} | {_f(off['audio_s_per_s'])} | {_f(off['rtf_mean'])} | "
        f"{_f(st['first_chunk_p50_s'])} | {_f(st['total_p50_s'])} | "
        f"{_f(base.get('cpu', {}).get('other_cpu_percent'), 0)} |",
        "", f"ChatTTS' stream mode yields its first chunk after {st['stream_batch_tokens']} x "
        f"({st['pass_first_n_batches']} + 1) tokens, re-decoding the whole prefix each time.",
        "", "## This server: gRPC streaming (`chattts`), closed loop", "",
        "| c | ok | TTFA p50 s | TTFA p95 s | latency p50 s | p95 s | p99 s | requests/s | audio s/s "
        "| RTF mean | tokens/s | mean decode batch | server CPU % | server RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        eng = lv.get("engine") or {}
        lines.append(
            f"| {lv['concurrency']} | {lv['ok']}/{lv['requests']} | {_f(lv['ttfa_p50_s'])} | "
            f"{_f(lv['ttfa_p95_s'])} | {_f(lv['latency_p50_s'])} | {_f(lv['latency_p95_s'])} | "
            f"{_f(lv['latency_p99_s'])} | {_f(lv['requests_per_s'])} | {_f(lv['audio_s_per_s'])} | "
            f"{_f(lv['rtf_mean'])} | {_f(lv['engine_tokens_per_s'], 1)} | {_f(eng.get('mean_batch'), 2)} | "
            f"{_f(lv['cpu_percent'], 0)} | {_f(lv['rss_mb'], 0)} |")
    lines += ["", "## Raw ONNX Runtime GPT decode step (no server)", "",
              f"Past of {raw['past_tokens']} positions, {raw['intra_op_threads']} intra-op threads, spinning "
              f"{'on' if raw['allow_spinning'] else 'off'}, median of {raw['repeats']} steps; other processes "
              f"used {_f(raw.get('cpu', {}).get('other_cpu_percent'), 0)} % CPU meanwhile.", "",
              "| batch | step ms p50 | tokens/s |", "|---|---|---|"]
    for b, m in raw["batches"].items():
        lines.append(f"| {b} | {_f(m['step_ms_p50'], 1)} | {_f(m['tokens_per_s'], 1)} |")
    labels: list[str] = []
    for lv in levels:
        for k in lv.get("cpu_s_by_process", {}):
            if k not in labels:
                labels.append(k)
    lines += ["", "## Where the server's CPU goes", "",
              "CPU seconds per server process (Python backend stubs by model) over each level, the "
              "benchmark client's own CPU (it shares the cores) and the CPU of everything else on the "
              "machine (non-zero means outside load skewed the level).", "",
              "| c | wall s | " + " | ".join(labels) + " | client CPU % | other processes CPU % |",
              "|---|---|" + "---|" * len(labels) + "---|---|"]
    for lv in levels:
        by = lv.get("cpu_s_by_process", {})
        cells = " | ".join(_f(by.get(k), 1) for k in labels)
        lines.append(f"| {lv['concurrency']} | {_f(lv['wall_s'], 1)} | {cells} | "
                     f"{_f(lv.get('client_cpu_percent'), 0)} | {_f(lv.get('other_cpu_percent'), 0)} |")
    hist_rows = [lv for lv in levels if lv.get("engine")]
    if hist_rows:
        lines += ["", "Decode-step batch sizes (steps per `tts_engine_batch_size` bucket):", ""]
        for lv in hist_rows:
            h = lv["engine"]["histogram"]
            lines.append(f"- c={lv['concurrency']}: {lv['engine']['decode_steps']} steps, "
                         + ", ".join(f"{k}: {v}" for k, v in h.items()))
    failed = [lv for lv in levels if lv.get("errors")]
    if failed:
        lines += ["", "## Errors", ""]
        for lv in failed:
            lines.append(f"- c={lv['concurrency']}: {lv['failed']} failed; " + "; ".join(lv["errors"]))
    skewed = outside_load(result)
    if skewed:
        lines += ["", "## Warning: outside load", "",
                  f"Other processes used more than {OUTSIDE_LOAD_WARN_PERCENT:g} % of a core during: "
                  + ", ".join(f"{k} ({v:.0f} %)" for k, v in skewed.items())
                  + ". Those numbers are skewed; rerun on a quiet machine."]
    lines += ["", "## Plots", ""] + [f"![{k}]({v})" for k, v in PLOTS.items()] + [""]
    return "\n".join(lines)


def plot(result: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the three PNGs of :data:`PLOTS` into ``out_dir`` (matplotlib, Agg); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels, base = result["levels"], result["baseline"]
    cs = [lv["concurrency"] for lv in levels]
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(cs, [lv["audio_s_per_s"] or 0.0 for lv in levels], "o-", label="this server (gRPC streaming)")
    if base["offline"].get("audio_s_per_s") is not None:
        ax.axhline(base["offline"]["audio_s_per_s"], color="gray", ls="--", label="ChatTTS, one at a time")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("audio seconds per wall second")
    ax.set_xticks(cs)
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out_dir / PLOTS["throughput"])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for lv in levels:
        x, y = cdf(r["total_s"] for r in lv["records"] if r["error"] is None)
        if x.size:
            ax.step(x, y, where="post", label=f"c={lv['concurrency']}")
    x, y = cdf(r["total_s"] for r in base["offline"]["records"] if r["error"] is None)
    if x.size:
        ax.step(x, y, where="post", color="gray", ls="--", label="ChatTTS, one at a time")
    ax.set_xlabel("request latency, s (send to end of stream)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF per concurrency level")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    paths.append(out_dir / PLOTS["latency_cdf"])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(cs, [lv["ttfa_p50_s"] or float("nan") for lv in levels], "o-", label="TTFA p50")
    ax.plot(cs, [lv["ttfa_p95_s"] or float("nan") for lv in levels], "s--", label="TTFA p95")
    first = base["stream"].get("first_chunk_p50_s")
    if first is not None:
        ax.axhline(first, color="gray", ls="--", label="ChatTTS stream first chunk p50")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("time to first audio, s")
    ax.set_xticks(cs)
    ax.set_title("Time to first audio vs concurrency")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    paths.append(out_dir / PLOTS["ttfa"])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
