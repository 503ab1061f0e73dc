"""The int8 GPT step on our kernel with and without its two graph rewrites, in one process.

    python scripts/bench_step_rewrites.py ARTIFACTS [--rounds 7] [--past 300] [--out results/step-rewrites.json]

Three sessions of the same int8 step graph over the int8 KV cache, all on our int8 MatMul
(``own-vnni``): ``before`` (ONNX Runtime's ``GroupQueryAttention``, the MLP gate as ``Split``,
``QuickGelu`` and ``Mul`` nodes), ``gate folded`` (the gate in the down projection,
:func:`~chattts_serving.int8_kernel.with_own_kernel`) and ``gate folded + own attention``
(:func:`~chattts_serving.int8_kernel.with_own_attention`). Decode steps at B = 1, 4, 16, the
sessions interleaved round by round (median of the rounds' medians): on a shared host the
ratios are the figures to read. docs/decode-speed.md, "Attention over the int8 cache".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from chattts_serving import int8_kernel
from chattts_serving.contract import KvPrecision, Precision
from chattts_serving.engine.gpt import GptStepRunner, load_step_graph
from chattts_serving.engine.kernels import cpu_features
from chattts_serving.runtime import Artifacts, OrtOptions, make_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench.rawstep import time_steps

BATCHES = (1, 4, 16)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--past", type=int, default=300)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    art = Artifacts.load(args.artifacts)
    opts = OrtOptions(2, False, precision=Precision.INT8, kv_cache=KvPrecision.INT8)
    runner = GptStepRunner(art, opts)
    library = int8_kernel.library()
    model = load_step_graph(art, runner.graph, KvPrecision.INT8)
    folded = int8_kernel.with_own_kernel(model)
    graphs = {"before": int8_kernel.with_own_kernel(model, fold_gates=False), "gate folded": folded,
              "gate folded + own attention": int8_kernel.with_own_attention(folded)}
    sessions = {name: make_session(g, opts, custom_ops=library) for name, g in graphs.items()}
    times: dict[str, dict[int, list[float]]] = {name: {b: [] for b in BATCHES} for name in sessions}
    rng = np.random.default_rng(0)
    names = list(sessions)
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            runner.use_session(sessions[name])
            for b in BATCHES:
                times[name][b].append(float(np.median(time_steps(runner, b, args.past, args.steps, 3, rng))) * 1e3)
    result = {"machine": cpu_features(), "past": args.past, "rounds": args.rounds,
              "step_ms_p50": {name: {str(b): round(float(np.median(v)), 2) for b, v in per.items()}
                              for name, per in times.items()}}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
