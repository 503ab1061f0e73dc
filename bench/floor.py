"""The memory floor of a decode step: how fast could this host run it at all?

A decode step at small batch reads every weight once and each row's KV cache once and does
little arithmetic per byte, so its time is bounded below by those bytes over the host's
streaming bandwidth. The bandwidth is measured in the same run, the way the step reads its
weights: one large matrix-vector product through ONNX Runtime (:func:`stream_bandwidth`),
with the profile's thread count and spinning. ``step_over_floor`` = measured step / floor:
1.0 would be a step that does nothing but stream its bytes.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving.runtime import Artifacts, OrtOptions, make_session

GEMV_SHAPE_FULL = (4096, 16384)
"""(K, N) of the bandwidth probe's fp32 weight matrix: 256 MB, far beyond any cache."""
GEMV_SHAPE_SMOKE = (4096, 4096)
"""The smoke run's probe: 64 MB (still beyond a 2-core slice of the last-level cache)."""
NOT_STREAMED = frozenset({"cos_cache", "sin_cache"})
"""Initializers of the fused graph a step reads only a row of (rotary tables)."""


def stream_bandwidth(opts: OrtOptions, shape: tuple[int, int] = GEMV_SHAPE_FULL, repeats: int = 15,
                     warmup: int = 3) -> dict[str, Any]:
    """Bytes per second one ORT MatMul of a (1, K) vector by a constant (K, N) fp32 matrix
    streams, with ``opts``' threads and spinning: {"bandwidth_gbps" (median, 1e9 B/s),
    "bandwidth_gbps_max", "matrix_bytes", "repeats", "intra_op_threads", "method"}."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, n = shape
    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory(prefix="gemv_") as tmp:
        path = Path(tmp) / "gemv.onnx"
        onnx.save(model, str(path))
        del model, graph, w
        sess = make_session(path, OrtOptions(opts.intra_op_threads, opts.allow_spinning))
    x = np.ones((1, k), np.float32)
    for _ in range(warmup):
        sess.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    nbytes = k * n * 4
    return {"bandwidth_gbps": nbytes / statistics.median(times) / 1e9, "bandwidth_gbps_max": nbytes / min(times) / 1e9,
            "matrix_bytes": nbytes, "repeats": repeats, "intra_op_threads": opts.intra_op_threads,
            "method": f"ONNX Runtime MatMul (1 x {k}) @ ({k} x {n}) fp32, median of {repeats}"}


def weight_bytes(graph: Path) -> int:
    """Bytes of the initializers a decode step of ``graph`` streams (all but the rotary tables)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        if init.name in NOT_STREAMED:
            continue
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += int(np.prod(init.dims, dtype=np.int64)) * itemsize
    return total


def kv_bytes(art: Artifacts, batch: int, past_tokens: int, kv_itemsize: int) -> int:
    """Bytes of KV cache a decode step reads: every layer's K and V of ``past_tokens``
    positions for ``batch`` rows."""
    return 2 * art.num_layers * art.num_heads * art.head_dim * past_tokens * batch * kv_itemsize


def step_floor(art: Artifacts, graph: Path, kv_itemsize: int, batches: list[int], past_tokens: int,
               bandwidth_gbps: float) -> dict[str, Any]:
    """The floor per batch size: {"weight_bytes", "kv_bytes_per_row", "bandwidth_gbps",
    "past_tokens", "floor_ms": {str(B): ms}}; ms = (weights + KV of B rows) / bandwidth."""
    wb = weight_bytes(graph)
    per_row = kv_bytes(art, 1, past_tokens, kv_itemsize)
    return {"graph": graph.name, "weight_bytes": wb, "kv_bytes_per_row": per_row, "bandwidth_gbps": bandwidth_gbps,
            "past_tokens": past_tokens,
            "floor_ms": {str(b): (wb + b * per_row) / (bandwidth_gbps * 1e9) * 1e3 for b in batches}}


def over_floor(raw_step: dict[str, Any] | None, floor: dict[str, Any] | None, batch: int) -> float | None:
    """Measured median step at ``batch`` (``measure_raw_step``'s) over its floor; None when
    either is missing."""
    if not raw_step or not floor:
        return None
    got = raw_step.get("batches", {}).get(str(batch), {}).get("step_ms_p50")
    bound = floor.get("floor_ms", {}).get(str(batch))
    return got / bound if got and bound else None


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.floor --artifacts DIR [--profiles cpu-fp32,cpu-int8]``:
    the streaming bandwidth, then each profile's decode step against its floor (the profiles
    interleaved round by round, so that outside load hits them alike), as ``make bench``
    reports them; prints a Markdown table and the JSON."""
    import argparse
    import json

    from chattts_serving.engine.gpt import GptStepRunner
    from chattts_serving.engine.kernels import choose_kernels
    from chattts_serving.serving.profile import load_profile

    from .rawstep import time_steps

    ap = argparse.ArgumentParser(prog="python -m bench.floor", description=main.__doc__)
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--profiles", default="cpu-fp32,cpu-int8")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--past", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    art = Artifacts.load(args.artifacts)
    batches = [int(b) for b in args.batches.split(",")]
    names = args.profiles.split(",")
    profiles = {n: load_profile(n) for n in names}
    bw = stream_bandwidth(profiles[names[0]].ort("engine"))
    runners = {n: GptStepRunner(art, p.ort("engine")) for n, p in profiles.items()}
    for r in runners.values():
        choose_kernels(r)  # as the engine does at start-up
    rounds: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in names}
    rng = np.random.default_rng(0)
    for _ in range(args.rounds):
        for b in batches:
            for n, r in runners.items():
                rounds[n][b].append(statistics.median(time_steps(r, b, args.past, args.steps, 2, rng)) * 1e3)
    out: dict[str, Any] = {"bandwidth": bw, "profiles": {}}
    print(f"streaming bandwidth {bw['bandwidth_gbps']:.1f} GB/s ({bw['method']})\n")
    print("| profile | graph | B | step ms (median / min of rounds) | floor ms | step / floor |")
    print("|---|---|---|---|---|---|")
    for n, r in runners.items():
        fl = step_floor(art, r.graph, r.kv_dtype(0).itemsize, batches, args.past, bw["bandwidth_gbps"])
        raw = {"batches": {str(b): {"step_ms_p50": statistics.median(v), "step_ms_min": min(v)}
                           for b, v in rounds[n].items()}}
        out["profiles"][n] = {"floor": fl, "raw_step": raw}
        for b in batches:
            m = raw["batches"][str(b)]
            print(f"| {n} | {r.graph.name} | {b} | {m['step_ms_p50']:.1f} / {m['step_ms_min']:.1f} | "
                  f"{fl['floor_ms'][str(b)]:.1f} | {over_floor(raw, fl, b):.2f} |")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
