"""The benchmark's Markdown report (bench.md): :data:`SECTIONS` in order, from the result
written to bench.json."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .doors import doors_markdown
from .figures import (
    DOOR_NAMES,
    FIGURES,
    FRONTEND_SHARE_TARGET,
    OUTSIDE_LOAD_WARN_PERCENT,
    TARGETS,
    cpu_other,
    level,
    outside_load,
    ran_profiles,
    target_met,
    targets_for,
)
from .gatewayload import gateway_markdown
from .modes import modes_markdown
from .plots import PLOTS
from .stats import attention_ms, fmt, projections_ms, ratio
from .wsload import ws_markdown


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
    profs = ran_profiles(result)
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
             f"{fmt(off.get('rtf_p50'))} | {fmt(cpu_other(off), 0)} |"]
    if bat:
        lines.append(f"| `Chat.infer(texts)`, {bat['texts']} texts in one batch (`split_text=False`), "
                     f"{bat['repeats']} call(s) | {bat['texts'] * bat['repeats']} | {fmt(bat['latency_p50_s'])} | "
                     f"{fmt(bat['requests_per_s'])} | {fmt(bat['audio_s_per_s'])} | – | {fmt(cpu_other(bat), 0)} |")
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
                         f"{fmt(cpu_other(st), 0)} |")
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
                  f"processes {fmt(cpu_other(raw), 0)} % CPU):", "",
                  "| batch | step ms p50 | per round | tokens/s |", "|---|---|---|---|", *raw_rows, ""]
    ops = prof.get("op_profile") or {}
    if ops:
        lines += ["The same step by op type (ONNX Runtime's profiler, ms of kernel time per step; "
                  "`python -m bench.opprofile`):", "",
                  "| batch | KV cache | step ms (profiled) | projections | attention | other ops |",
                  "|---|---|---|---|---|---|"]
        for b, r in ops.items():
            mm = projections_ms(r["ops"])
            gqa = attention_ms(r["ops"])
            lines.append(f"| {b} | {r['kv_cache']} | {fmt(r['step_ms_p50'], 1)} | {fmt(mm, 1)} | {fmt(gqa, 1)} | "
                         f"{fmt(r['node_ms_per_step'] - mm - gqa, 1)} |")
        lines.append("")
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
