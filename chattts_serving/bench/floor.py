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

from ..runtime import Artifacts, OrtOptions, make_session

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
