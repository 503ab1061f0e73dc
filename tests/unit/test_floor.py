"""The decode step's memory floor (bench/floor.py): what bytes it counts and how, on the small
artifacts. No speed is asserted: the bandwidth probe only has to run and give a number."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bench.floor import kv_bytes, over_floor, step_floor, stream_bandwidth, weight_bytes
from chattts_serving import contract
from chattts_serving.runtime import Artifacts, OrtOptions


def test_weight_bytes_count_every_streamed_initializer_once(small_artifacts: Artifacts) -> None:
    graph = small_artifacts.root / contract.GPT_GRAPH
    model = onnx.load(str(graph))
    matrices = sum(onnx.numpy_helper.to_array(i).nbytes for i in model.graph.initializer
                   if i.name.endswith(".weight") and len(i.dims) == 2)
    got = weight_bytes(graph)
    assert matrices <= got < matrices * 1.01  # the matrices, plus norms and small constants; no rotary tables
    cfg = small_artifacts.manifest["config"]
    h, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_layers"]
    assert matrices == 4 * (layers * (3 * h * h + h * h + 2 * h * f + f * h) + h * 4 * 626)


def test_kv_bytes_and_floor_follow_the_cache_geometry(small_artifacts: Artifacts) -> None:
    a = small_artifacts
    assert kv_bytes(a, 4, 300, 4) == 2 * a.num_layers * a.num_heads * a.head_dim * 300 * 4 * 4
    fl = step_floor(a, a.root / contract.GPT_GRAPH, 4, [1, 4, 16], 300, bandwidth_gbps=50.0)
    w, row = fl["weight_bytes"], fl["kv_bytes_per_row"]
    for b in (1, 4, 16):
        assert fl["floor_ms"][str(b)] == pytest.approx((w + b * row) / 50e9 * 1e3)
    raw = {"batches": {"1": {"step_ms_p50": 2 * fl["floor_ms"]["1"]}}}
    assert over_floor(raw, fl, 1) == pytest.approx(2.0)
    assert over_floor(raw, fl, 4) is None and over_floor(None, fl, 1) is None


def test_the_bandwidth_probe_runs_a_gemv_through_onnx_runtime() -> None:
    got = stream_bandwidth(OrtOptions(1, False), shape=(512, 1024), repeats=2, warmup=1)
    assert got["matrix_bytes"] == 512 * 1024 * 4 and np.isfinite(got["bandwidth_gbps"]) and got["bandwidth_gbps"] > 0
    assert got["bandwidth_gbps_max"] >= got["bandwidth_gbps"]
