"""``python -m bench``: the side-by-side benchmark in one command.

In one process tree, with one artifact directory and the checkpoint it was exported from, one
list of sentences and one token budget per request, in this order (never overlapping, so each
part has the machine to itself):

0. the text front end alone (``FrontEnd.prepare`` per request, in process);
1. the baselines: upstream ChatTTS on torch, served as a user would serve it: ``Chat.infer``
   one request at a time, over a list of 16 texts at once, and in its own stream mode at its
   default and smaller ``stream_batch`` settings (:mod:`~bench.baseline`);
2. for each profile (``--profiles``; the first is the default, whose figures are also the
   top-level ones), the ceilings in process: the raw ONNX Runtime GPT decode step and the
   minimal pipeline (engine + chunking + batched vocoder, :mod:`~bench.minimal`),
   each repeated and reduced to its median; then this system: the model repository rendered
   from a benchmark copy of the profile whose degraded mode is out of reach (the default path:
   ``degradation = "off for default-path levels"``), the bundled tritonserver on free ports, and
   the server phases of :data:`SERVER_PHASES` in order (closed-loop levels, open-loop
   arrivals, the overload burst);
3. for the default profile, one row "under load, as deployed": the profile as shipped (its
   degraded mode live) at the top concurrency level.
4. for the default profile, the OpenAI gateway in front of the same server against direct
   gRPC (:mod:`~bench.gatewayload`), then text replayed at LLM speed over its
   WebSocket at concurrency 1 and 8 (:mod:`~bench.wsload`).
5. for the default profile, on the same server, the time to first audio of each segmentation
   mode and of a reference recording (:mod:`~bench.modes`), and the two
   streaming doors, ``chattts`` (BLS) and ``chattts_ensemble``, taking turns at c=1 and c=16
   (:mod:`~bench.doors`).

Every request records the server's ``info`` (generated tokens, degraded mode, vocoder); a
figure whose measurement ran a degraded request, or ran while other processes loaded the
machine, is null and ``null_reasons`` says why. Writes ``<out>/bench.json``, ``<out>/bench.md``,
three PNG plots and the server logs. Speeds are measured, never asserted: the exit status is 0
unless a part could not run at all.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chattts_serving import contract

from . import load_sentences
from .config import DEFAULT_PROFILES, PIPELINE_BATCH, Config, build_parser, ensure_smoke_artifacts, resolve
from .cpuload import CpuWindow
from .doors import DOOR_FIGURES, door_figures
from .figures import DEGRADATION_NOTE, FRONTEND_FIGURES, definitions, frontend_figures, profile_figures
from .gatewayload import FIRST_BYTE_FIGURES, GATEWAY_FIGURES, first_byte_figures, gateway_figures
from .machine import machine_info
from .modes import MODE_KEYS, mode_figures
from .opprofile import profile_steps
from .phases import BURST_TOKENS, SERVER_PHASES, PhaseContext
from .plots import plot
from .profiles import default_path_profile, missing_graphs, resolved_key, same_as
from .report import markdown
from .server import SERVER_CRASH_SIGNS, serving
from .wsload import WS_FIGURES, ws_figures

OP_PROFILE_STEPS = 10
"""Profiled decode steps per batch for ``op_profile`` (:mod:`bench.opprofile`)."""


def _clean(v: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None, tuples lists, paths strings."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v


def _empty_baseline(tokens: int) -> dict[str, Any]:
    from .stats import summarize

    return {"skipped": True, "tokens": tokens, "offline": {**summarize([], 0.0), "records": []},
            "batched": None, "stream": None, "stream_settings": [], "stream_smallest": None}


def run_profile(cfg: Config, name: str, is_default: bool, sentences: list[str], prompts: list[Any],
                progress: Callable[[str], None], bandwidth_gbps: float | None = None) -> dict[str, Any]:
    """Every per-profile part for profile ``name`` (module docstring, steps 2 and 3); returns
    its result (``skipped`` with the reason when its graphs are missing). ``bandwidth_gbps``:
    the host's streaming bandwidth measured in this run, for the step's floor (none: no floor)."""
    from chattts_serving.engine.gpt import GptStepRunner
    from chattts_serving.runtime import Artifacts, resolve_precision
    from chattts_serving.serving.profile import load_profile

    from .floor import step_floor
    from .minimal import measure_pipeline
    from .rawstep import measure_raw_step
    from .serverload import run_level

    profile = load_profile(name)
    precision = str(profile.engine.precision)
    if missing_graphs(cfg.artifacts, profile) is None:
        precision = str(resolve_precision(Artifacts.load(cfg.artifacts), profile.engine.precision))
    prof: dict[str, Any] = {"profile": name, "default": is_default, "precision": precision,
                            "precision_setting": str(profile.engine.precision),
                            "vocoder": str(profile.stream.default_vocoder), "degradation": DEGRADATION_NOTE}
    missing = missing_graphs(cfg.artifacts, profile)
    if missing:
        progress(f"{name}: skipped: {missing}")
        return {**prof, "skipped": missing}

    progress(f"{name}: raw ORT step, batches {list(cfg.raw_batches)}, past {cfg.raw_past_tokens}, 3 rounds")
    window = CpuWindow()
    prof["raw_step"] = measure_raw_step(cfg.artifacts, profile.ort("engine"), cfg.raw_batches,
                                        past_tokens=cfg.raw_past_tokens, repeats=cfg.raw_repeats)
    prof["raw_step"]["cpu"] = window.stop()
    if bandwidth_gbps:
        art = Artifacts.load(cfg.artifacts)
        runner = GptStepRunner(art, profile.ort("engine"))
        prof["floor"] = step_floor(art, runner.graph, runner.kv_dtype(0).itemsize, list(cfg.raw_batches),
                                   cfg.raw_past_tokens, bandwidth_gbps)
        del runner
    progress(f"{name}: the raw step by op type (ONNX Runtime's profiler)")
    with tempfile.TemporaryDirectory() as tmp:
        prof["op_profile"] = profile_steps(Artifacts.load(cfg.artifacts), profile.ort("engine"), cfg.raw_batches,
                                           cfg.raw_past_tokens, OP_PROFILE_STEPS, Path(tmp))

    progress(f"{name}: minimal pipeline, batch {len(prompts)}, {cfg.tokens} tokens, {cfg.pipeline_repeats} runs")
    prof["pipeline"] = measure_pipeline(cfg.artifacts, profile, prompts, tokens=cfg.tokens,
                                        repeats=cfg.pipeline_repeats)

    with serving(default_path_profile(profile), cfg, f"bench_tritonserver_{name}.log", sentences,
                 progress) as session:
        prof["server_start_s"] = session.started_s
        prof["tritonserver_version"] = session.triton_version
        for phase in SERVER_PHASES:
            if phase.default_only and not is_default:
                continue
            prof[phase.key] = phase.run(PhaseContext(cfg, session, prof, is_default))

    if is_default and cfg.as_deployed:
        top = max(cfg.levels)
        with serving(profile, cfg, f"bench_tritonserver_{name}_as_deployed.log", sentences, progress) as session:
            progress(f"{name}: under load, as deployed (degraded mode live), c={top}")
            prof["as_deployed"] = run_level(session, top, cfg.requests_for(top), cfg.tokens)
    return prof


def run(cfg: Config) -> dict[str, Any]:
    """Run every part and write the outputs; returns the result written to bench.json."""
    from chattts_serving.runtime import Artifacts
    from chattts_serving.serving.profile import load_profile

    from .baseline import run_baseline
    from .frontend_cost import measure_frontend
    from .minimal import pipeline_prompts
    from .serverload import level_jobs

    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[bench {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    ensure_smoke_artifacts(cfg, progress)
    art = Artifacts.load(cfg.artifacts)
    default = load_profile(cfg.profiles[0])
    sentences = load_sentences()
    cfg.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "started_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": {
            "artifacts": str(cfg.artifacts), "weights": str(cfg.weights), "profile": cfg.profiles[0],
            "profiles": list(cfg.profiles),
            "sizes": art.manifest.get("sizes"), "gpt_layers": art.num_layers, "hidden_size": art.hidden_size,
            "tokens": cfg.tokens,
            "audio_s_per_request": contract.samples_for_tokens(cfg.tokens) / contract.SAMPLE_RATE_HZ,
            "levels": list(cfg.levels),
            "requests_per_level": {str(c): cfg.requests_for(c) for c in cfg.levels},
            "baseline_requests": cfg.baseline_requests, "stream_requests": cfg.stream_requests,
            "baseline_batch": cfg.baseline_batch, "batched_repeats": cfg.batched_repeats,
            "pipeline_batch": PIPELINE_BATCH, "pipeline_repeats": cfg.pipeline_repeats,
            "open_loop_requests": cfg.open_loop_requests, "burst_clients": cfg.burst_clients,
            "burst_rounds": cfg.burst_rounds,
            "burst_tokens": BURST_TOKENS, "hold_tokens": cfg.hold_tokens, "as_deployed": cfg.as_deployed,
            "voice_seed": cfg.voice_seed, "sentences": len(sentences), "smoke": cfg.smoke, "label": cfg.label,
            "engine_max_batch_size": default.engine.max_batch_size,
        },
        "machine": machine_info(),
        "degradation": DEGRADATION_NOTE,
    }

    progress(f"front end: FrontEnd.prepare in process, {cfg.frontend_repeats} passes")
    result["frontend"] = measure_frontend(cfg.artifacts, default, sentences, cfg.frontend_repeats)

    if cfg.skip_baseline or (cfg.baseline_requests <= 0 and cfg.stream_requests <= 0 and cfg.batched_repeats <= 0):
        result["baseline"] = _empty_baseline(cfg.tokens)
    else:
        progress(f"baseline: ChatTTS from {cfg.weights}: {cfg.baseline_requests} requests one at a time, "
                 f"{cfg.batched_repeats} x {cfg.baseline_batch} texts batched, {cfg.stream_requests} stream-mode "
                 "requests per setting")
        window = CpuWindow()
        result["baseline"] = run_baseline(cfg.weights, cfg.artifacts, sentences, tokens=cfg.tokens,
                                          requests=max(0, cfg.baseline_requests),
                                          stream_requests=max(0, cfg.stream_requests), voice_seed=cfg.voice_seed,
                                          batch=cfg.baseline_batch, batched_repeats=max(0, cfg.batched_repeats),
                                          progress=progress)
        result["baseline"]["cpu"] = window.stop()

    texts = [j.text for j in level_jobs(sentences, PIPELINE_BATCH, PIPELINE_BATCH, cfg.tokens)]
    prompts = pipeline_prompts(cfg.artifacts, default, texts, str(cfg.voice_seed))
    from .floor import GEMV_SHAPE_FULL, GEMV_SHAPE_SMOKE, stream_bandwidth

    progress("streaming bandwidth: one large GEMV through ONNX Runtime")
    window = CpuWindow()
    result["floor"] = stream_bandwidth(default.ort("engine"), GEMV_SHAPE_SMOKE if cfg.smoke else GEMV_SHAPE_FULL,
                                       repeats=5 if cfg.smoke else 15)
    result["floor"]["cpu"] = window.stop()
    result["profiles"] = {}
    ran: dict[str, str] = {}
    for i, name in enumerate(cfg.profiles):
        twin = same_as(cfg.artifacts, name, ran) if i else None
        if twin is not None:
            progress(f"{name}: skipped: it runs what {twin} ran")
            result["profiles"][name] = {"profile": name, "default": False, "skipped": f"the same as {twin}"}
            continue
        ran[name] = resolved_key(cfg.artifacts, load_profile(name))
        prof = run_profile(cfg, name, i == 0, sentences, prompts, progress, result["floor"]["bandwidth_gbps"])
        if "skipped" not in prof:
            figures, nulls = profile_figures(prof, result["baseline"])
            prof.update(figures)
            prof["null_reasons"] = nulls
        result["profiles"][name] = prof
    top = result["profiles"][cfg.profiles[0]]
    if "skipped" in top:
        raise ProfileSkipped(f"the default profile {cfg.profiles[0]} cannot run: {top['skipped']}")
    result["machine"]["tritonserver_version"] = top.get("tritonserver_version")
    for key in ("raw_step", "pipeline", "server_start_s", *(ph.key for ph in SERVER_PHASES), "as_deployed",
                "null_reasons"):
        if key in top:
            result[key] = top[key]
    result.update({k: v for k, v in top.items() if k in definitions()})
    result.update(frontend_figures(result["frontend"], result["levels"]))
    result.update(door_figures(result.get("doors")))
    result.update(gateway_figures(result.get("gateway")))
    result.update(first_byte_figures(result.get("gateway")))
    result.update(ws_figures(result.get("ws")))
    result.update(mode_figures(result.get("modes")))
    result["definitions"] = definitions()
    result["elapsed_s"] = time.perf_counter() - started
    result = _clean(result)
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    (cfg.out / "bench.json").write_text(text, encoding="utf-8")
    (cfg.out / "bench.md").write_text(markdown(result), encoding="utf-8")
    plot(result, cfg.out)
    progress(f"wrote {cfg.out / 'bench.json'}, {cfg.out / 'bench.md'} and plots")
    return result


class ProfileSkipped(RuntimeError):
    """The default profile could not run (its graphs were not exported)."""


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (and SIGINT, which a background job inherits as ignored) unwind through the
    # server's context manager, so a stopped benchmark never leaves a tritonserver behind.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    cfg = resolve(args)
    if not cfg.profiles:
        print(f"bench: error: none of the profiles {', '.join(DEFAULT_PROFILES)} exists (pass --profiles)",
              file=sys.stderr)
        return 2
    if not cfg.smoke and not (cfg.artifacts / contract.MANIFEST).is_file():
        print(f"bench: error: no artifacts in {cfg.artifacts} (run `python -m chattts_serving.export "
              "--synthetic --size full` first)", file=sys.stderr)
        return 2
    if not cfg.skip_baseline and cfg.baseline_requests + cfg.stream_requests + cfg.batched_repeats > 0 \
            and not cfg.smoke and not cfg.weights.is_dir():
        print(f"bench: error: no checkpoint in {cfg.weights} for the baseline (pass --weights or "
              "--skip-baseline)", file=sys.stderr)
        return 2
    from chattts_serving.deploy.server import ServerError
    from chattts_serving.serving.profile import ProfileError

    from .serverload import WarmupError

    try:
        result = run(cfg)
    except (ServerError, WarmupError, ProfileError, ProfileSkipped) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    for name in (*definitions(), *FRONTEND_FIGURES, *DOOR_FIGURES, *GATEWAY_FIGURES, *FIRST_BYTE_FIGURES,
                 *WS_FIGURES, *MODE_KEYS.values()):
        print(f"{name}: {result.get(name)}")
    for name, reason in result.get("null_reasons", {}).items():
        print(f"{name} is null: {reason}")
    if any(lv["ok"] == 0 for prof in result["profiles"].values() for lv in prof.get("levels", [])):
        print("bench: error: a concurrency level had no successful request", file=sys.stderr)
        return 1
    if SERVER_CRASH_SIGNS:
        print("bench: error: a server log shows a crash:\n  " + "\n  ".join(SERVER_CRASH_SIGNS[:20]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
