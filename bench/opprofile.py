"""Where a decode step's time goes: ONNX Runtime's own profile of the GPT step, by op type.

``python -m bench.opprofile --artifacts artifacts/full [--profiles cpu] [--batches 1,4,16]
[--past 300] [--steps 20] [--out results/opprofile.json]`` runs, per profile and batch, the
decode step as :mod:`bench.rawstep` times it (the graph, KV cache and int8 kernel the profile
resolves to on these artifacts, its threads, a random past of ``--past`` positions) in a
session with ONNX Runtime's profiler on, and sums the kernels' time per op type over the timed
steps (the warm-up steps are left out). It answers what ``step_over_floor`` cannot: which ops
hold the step above its floor (the 8-bit projections, ``MatMulNBits``; attention over the KV
cache, ``GroupQueryAttention``; the rest). The profiler costs a little per node, so read the
shares, and take step times from ``bench.floor`` or ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.stats import attention_ms, projections_ms
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.engine.kernels import choose_kernels, use_kernel
from chattts_serving.runtime import Artifacts, OrtOptions

from .config import positive_int, positive_ints, profile_names
from .rawstep import time_steps

WARMUP_STEPS = 2
"""Untimed steps before the profiled ones (first-run allocations)."""


def op_times(trace: list[dict[str, Any]], runs: slice) -> dict[str, float]:
    """Kernel time in ms per op type summed over the runs ``runs`` (in order) of ``trace``
    (ONNX Runtime's profile: ``Session``/``model_run`` events and ``Node`` ``*_kernel_time``
    events)."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace
                   if e.get("cat") == "Session" and e.get("name") == "model_run")[runs]
    out: dict[str, float] = defaultdict(float)
    for e in trace:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        if any(start <= e["ts"] <= end for start, end in spans):
            out[e["args"]["op_name"]] += e["dur"] / 1e3
    return dict(out)


def profile_steps(art: Artifacts, opts: OrtOptions, batches: Sequence[int], past: int, steps: int,
                  workdir: Path) -> dict[str, dict[str, Any]]:
    """One profiled session (the graph, KV cache and int8 kernel ``opts`` resolve to on this
    host) running ``steps`` decode steps of each batch over ``past`` positions: per batch
    {"step_ms_p50", "node_ms_per_step", "ops": {op type: ms per step}, "kv_cache", "graph",
    "kernel"}, ops largest first."""
    runner = GptStepRunner(art, opts)
    kernel, attention = choose_kernels(runner)  # the kernels the engine would run on this host
    workdir.mkdir(parents=True, exist_ok=True)
    use_kernel(runner, profile_prefix=str(workdir / "step"))  # the same graph, with the profiler on
    times = [time_steps(runner, b, past, steps, WARMUP_STEPS) for b in batches]
    trace = json.loads(Path(runner.session.end_profiling()).read_text())
    per_batch = WARMUP_STEPS + steps  # runs of each batch in the trace, in order
    out: dict[str, dict[str, Any]] = {}
    for i, (b, t) in enumerate(zip(batches, times)):
        runs = slice(i * per_batch + WARMUP_STEPS, (i + 1) * per_batch)
        ops = {k: v / steps for k, v in sorted(op_times(trace, runs).items(), key=lambda kv: -kv[1])}
        out[str(b)] = {"graph": runner.graph.name, "kv_cache": str(runner.kv_precision),
                       "kernel": kernel.as_dict() if kernel is not None else None,
                       "attention": attention.as_dict() if attention is not None else None,
                       "step_ms_p50": statistics.median(t) * 1e3, "node_ms_per_step": sum(ops.values()), "ops": ops}
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: per profile and batch, the step, its node time and the three largest op types."""
    lines = ["| profile | B | KV cache | step ms (profiled) | projections | attention | other ops |",
             "|---|---|---|---|---|---|---|"]
    for name, per_batch in result["profiles"].items():
        for b, r in per_batch.items():
            ops = r["ops"]
            mm, gqa = projections_ms(ops), attention_ms(ops)
            rest = r["node_ms_per_step"] - mm - gqa
            lines.append(f"| {name} | {b} | {r['kv_cache']} | {r['step_ms_p50']:.1f} | {mm:.1f} | {gqa:.1f} | "
                         f"{rest:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Profile the decode step per profile and batch; print a table and write ``--out``."""
    from chattts_serving.serving.profile import load_profile

    ap = argparse.ArgumentParser(prog="python -m bench.opprofile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--profiles", type=profile_names, default=("cpu",), help="deployment profiles (default cpu)")
    ap.add_argument("--batches", type=positive_ints, default=(1, 4, 16), help="batch sizes (default 1,4,16)")
    ap.add_argument("--past", type=positive_int, default=300, help="positions each row holds (default %(default)s)")
    ap.add_argument("--steps", type=positive_int, default=20, help="profiled steps per batch (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        art = Artifacts.load(args.artifacts)
        profiles = {name: load_profile(name) for name in args.profiles}
    except (OSError, ValueError) as exc:  # no such artifacts, a profile that does not exist or validate
        ap.error(str(exc))
    result: dict[str, Any] = {"artifacts": str(args.artifacts), "past_tokens": args.past, "steps": args.steps,
                              "profiles": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, profile in profiles.items():
            result["profiles"][name] = profile_steps(art, profile.ort("engine"), args.batches, args.past, args.steps,
                                                     Path(tmp) / name)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
