"""The reduced KV cache on a real tritonserver, small config: the ``cpu`` profile's
``kv_cache = "auto"`` serves a stream from the int8 cache once ``bench.kv`` calibrated and
measured it, and says so at start-up. The rewrite, the buffers and the accuracy in process:
tests/unit/test_kv_cache.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from chattts_serving import contract
from chattts_serving.bench.kv import main as bench_kv
from chattts_serving.runtime import Artifacts
from tests.support.servers import serve_profile


def test_the_cpu_profile_serves_the_measured_int8_cache(small_artifacts: Artifacts, tmp_path: Path) -> None:
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    root = tmp_path / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    assert bench_kv(["--artifacts", str(root), "--out", str(tmp_path / "kv.json"), "--kv", "int8", "--no-speed",
                     "--steps", "6"]) == 0
    acc = json.loads((root / contract.MANIFEST).read_text())["kv_cache"]["int8"]["accuracy"]["fp32"]
    assert acc["meets_threshold"], acc["top1_agreement"]
    srv = serve_profile(Artifacts.load(root), tmp_path / "srv", profile="cpu")
    try:
        res = synthesize_stream(f"127.0.0.1:{srv.grpc_port}", SynthesisRequest(
            text="你好，欢迎使用流式语音合成服务。", seed=1, max_new_tokens=24, min_new_tokens=24))
    finally:
        srv.stop()
    assert res.chunks >= 2
    assert res.audio.size == contract.samples_for_tokens(24) and np.isfinite(res.audio).all()
    text = (tmp_path / "srv" / "tritonserver.log").read_text(errors="replace")
    assert "KV cache auto: int8" in text, text[-3000:]
