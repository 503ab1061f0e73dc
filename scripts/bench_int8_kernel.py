"""Our int8 kernel against ONNX Runtime's ``MatMulNBits`` in the whole GPT step, and its accuracy.

    python scripts/bench_int8_kernel.py ARTIFACTS [--rounds 3] [--accuracy] [--out results/int8-kernel.json]

- Step time: one int8 step runner per kernel (the exported ``MatMulNBits`` level 4, our
  ``own-vnni``; the KV cache the ``cpu`` profile resolves to), decode steps over a past of 300 at
  B = 1, 4, 16, the kernels interleaved round by round in one process (median of the rounds'
  medians): on a shared host the ratio is the figure to read.
- ``--accuracy``: the teacher-forced accuracy against fp32 (:func:`~chattts_serving.export.int8.accuracy_report`,
  the shipped sentences) with the int8 step on our kernel, next to the exported kernel's
  figures from the manifest. The manifest is not changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from chattts_serving.contract import Precision
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.engine.kernels import KERNELS, OWN_KERNEL, cpu_features, use_kernel
from chattts_serving.runtime import Artifacts, OrtOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench.rawstep import time_steps

EXPORTED = next(iter(KERNELS))


def step_times(art: Artifacts, rounds: int, batches: tuple[int, ...], past: int, repeats: int) -> dict[str, object]:
    opts = OrtOptions(2, False, precision=Precision.INT8, kv_cache="auto")
    runners = {}
    for name in (EXPORTED, OWN_KERNEL):
        r = GptStepRunner(art, opts)
        use_kernel(r, name)
        runners[name] = r
    ms: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for b in batches:
            for name, r in runners.items():
                ms.setdefault((name, b), []).append(float(np.median(time_steps(r, b, past, repeats, 2))) * 1e3)
    out: dict[str, object] = {"past_tokens": past, "rounds": rounds, "kv_cache": str(runners[EXPORTED].kv_precision)}
    for b in batches:
        e, o = float(np.median(ms[(EXPORTED, b)])), float(np.median(ms[(OWN_KERNEL, b)]))
        out[str(b)] = {"matmulnbits_ms": round(e, 2), "own_ms": round(o, 2), "speedup": round(e / o, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("results/int8-kernel.json"))
    args = ap.parse_args(argv)
    art = Artifacts.load(args.artifacts)
    result: dict[str, object] = {**cpu_features(), "step": step_times(art, args.rounds, (1, 4, 16), 300, args.repeats)}
    print(json.dumps(result["step"], indent=1))
    if args.accuracy:
        from chattts_serving.export.int8 import MIN_ACCURACY_DECODE_STEPS, accuracy_report
        from chattts_serving.export.sentences import load_sentences

        texts = load_sentences()
        steps = -(-MIN_ACCURACY_DECODE_STEPS // len(texts)) + 1
        own = accuracy_report(args.artifacts, texts, steps, opts=OrtOptions(2, False), kernel=OWN_KERNEL,
                              progress=lambda m: print(m, flush=True))
        exported = art.manifest.get("precisions", {}).get(str(Precision.INT8), {}).get("accuracy", {})
        keys = ("top1_agreement", "top1_agreement_min", "audio_snr_db", "audio_snr_db_min",
                "audio_snr_db_int8_vocoder", "meets_threshold", "decode_steps")
        result["accuracy"] = {OWN_KERNEL: {k: own.get(k) for k in keys}, EXPORTED: {k: exported.get(k) for k in keys}}
        print(json.dumps(result["accuracy"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
