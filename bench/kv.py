"""``python -m bench.kv --artifacts DIR --out results/kv.json``: the GPT step's decode time
with its KV cache in fp32, fp16 and int8 (:mod:`chattts_serving.engine.kvprecision`) side by side.

The decode step (:meth:`~chattts_serving.engine.gpt.GptStepRunner.decode`, the cache bound in
place as the engine binds it) at each batch over a random past, for each weight precision the
artifacts hold (fp32, and int8 where exported) and each KV precision, interleaved round by
round in one process, so that outside load hits every variant alike; reported as medians and
as ratios to the fp32 cache of the same weights and round, written to ``--out`` as JSON.

The int8 cache needs its calibrated scales, and its accuracy is an export measurement:
``python -m chattts_serving.export.accuracy kv --artifacts DIR`` (:mod:`chattts_serving.export.accuracy`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.contract import KvPrecision, Precision
from chattts_serving.export.accuracy import exported_weights, kv_precisions
from chattts_serving.runtime import Artifacts, OrtOptions


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def measure_speed(root: Path, weights: list[str], kvs: list[KvPrecision], batches: list[int], past: int,
                  rounds: int, repeats: int, threads: int, say: Any) -> dict[str, Any]:
    """Decode step ms per (weights, kv, batch): {"<weights>/<kv>": {str(B): {"step_ms_p50",
    "step_ms_min", "round_ms": [...], "ratio_to_fp32_kv_p50"}}} (the ratio: the median over
    rounds of this variant's round median over the fp32 cache's of the same round)."""
    from chattts_serving.engine.gpt import GptStepRunner

    art = Artifacts.load(root)
    base = OrtOptions(threads, False)
    runners = {f"{w}/{kv}": GptStepRunner(art, replace(base, precision=Precision(w), kv_cache=kv))
               for w in weights for kv in kvs}
    rng = np.random.default_rng(0)
    caches: dict[tuple[str, int], Any] = {}
    for r in runners.values():
        for b in batches:
            key = (np.dtype(r.kv_dtype).name, b)
            if key not in caches:  # one cache per dtype and batch, shared by the weight precisions
                c = r.new_cache(b, past + 1)
                for buf in c.buffers:
                    x = rng.standard_normal(buf.shape, dtype=np.float32)
                    buf[...] = np.clip(np.round(x * 40), -127, 127) if r.kv_dtype is np.int8 else x
                caches[key] = c
    embeds = {b: rng.standard_normal((b, 1, art.hidden_size), dtype=np.float32) for b in batches}
    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in runners}
    for rnd in range(rounds):
        for b in batches:
            lengths = np.full(b, past, np.int64)
            for name, r in runners.items():
                cache = caches[(np.dtype(r.kv_dtype).name, b)]
                r.decode(embeds[b], cache, lengths)
                t = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    r.decode(embeds[b], cache, lengths)
                    t.append(time.perf_counter() - t0)
                times[name][b].append(float(np.median(t)) * 1e3)
        say(f"speed round {rnd + 1}/{rounds}: " + ", ".join(
            f"{n} B={b} {times[n][b][-1]:.1f}" for n in runners for b in batches))
    out: dict[str, Any] = {}
    for name in runners:
        w = name.split("/")[0]
        ref = times.get(f"{w}/{KvPrecision.FP32}")
        out[name] = {}
        for b in batches:
            row: dict[str, Any] = {"step_ms_p50": round(float(np.median(times[name][b])), 2),
                                   "step_ms_min": round(min(times[name][b]), 2),
                                   "round_ms": [round(x, 2) for x in times[name][b]]}
            if ref is not None:
                row["ratio_to_fp32_kv_p50"] = round(float(np.median(
                    [a / r0 for a, r0 in zip(times[name][b], ref[b])])), 3)
            out[name][str(b)] = row
    return out


def kv_bytes(art: Artifacts, past: int) -> dict[str, int]:
    """Bytes of one row's cache at ``past`` positions per KV precision (K and V of every layer)."""
    n = 2 * art.num_layers * art.num_heads * art.head_dim * past
    sizes = {KvPrecision.FP32: 4, KvPrecision.FP16: 2, KvPrecision.INT8: 1}
    return {str(k): n * size for k, size in sizes.items()}


def host() -> dict[str, Any]:
    """The CPU this ran on (model name and the flags that matter for these kernels)."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    import onnxruntime

    keep = ("avx2", "avx512f", "avx512_vnni", "avx512_fp16", "f16c", "amx_bf16", "amx_int8")
    return {"cpu": model, "flags": sorted(f for f in flags if f in keep), "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()), "onnxruntime": onnxruntime.__version__}


def main(argv: list[str] | None = None) -> int:
    """Time the KV cache precisions' decode step (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench.kv", description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, required=True, help="an exported artifact directory")
    ap.add_argument("--out", type=Path, default=Path("results/kv.json"), help="JSON results (default %(default)s)")
    ap.add_argument("--kv", default="fp16,int8",
                    help="reduced KV precisions to compare with fp32 (default %(default)s)")
    ap.add_argument("--weights", default=None,
                    help="weight precisions for the speed runs (default: fp32, and int8 where exported)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--past", type=int, default=300, help="positions of past per row (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2, as the cpu profile)")
    args = ap.parse_args(argv)
    started = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[kv {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        kvs = kv_precisions(args.kv)
    except ValueError as exc:
        ap.error(str(exc))
    if KvPrecision.INT8 in kvs and not (args.artifacts / contract.KV_SCALES_FILE).is_file():
        ap.error(f"{args.artifacts} has no int8 KV scales: calibrate them first "
                 f"(python -m chattts_serving.export.accuracy kv --artifacts {args.artifacts})")
    art = Artifacts.load(args.artifacts)
    weights = _csv(args.weights) if args.weights else exported_weights(art)
    result: dict[str, Any] = {"host": host(), "artifacts": str(args.artifacts), "past_tokens": args.past,
                              "kv_bytes_per_row": kv_bytes(art, args.past), "kv_precisions": [str(k) for k in kvs]}
    result["speed"] = measure_speed(args.artifacts, weights, [KvPrecision.FP32, *kvs],
                                    [int(b) for b in _csv(args.batches)], args.past, args.rounds, args.repeats,
                                    args.threads, say)
    result["host"]["load_average_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True))
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
