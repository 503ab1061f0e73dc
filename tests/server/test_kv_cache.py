"""The reduced KV cache on a real tritonserver, small config: the ``cpu`` profile's
``kv_cache = "auto"`` serves a stream from the int8 cache once
``python -m chattts_serving.export.accuracy kv`` calibrated and measured it, and says so at
start-up, with the attention over it the start-up probe chose (logged). The rewrite, the
buffers and the accuracy in process: tests/unit/test_kv_cache.py; our attention:
tests/unit/test_int8_attention.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from chattts_serving import contract
from chattts_serving.export.accuracy import main as measure
from chattts_serving.runtime import Artifacts
from tests.support.servers import stream_24_tokens


def test_the_cpu_profile_serves_the_measured_int8_cache(small_artifacts: Artifacts, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    assert measure(["kv", "--artifacts", str(root), "--kv", "int8", "--steps", "6"]) == 0
    acc = json.loads((root / contract.MANIFEST).read_text())["kv_cache"]["int8"]["accuracy"]["fp32"]
    assert acc["meets_threshold"], acc["top1_agreement"]
    _, text = stream_24_tokens(Artifacts.load(root), tmp_path / "srv", "cpu")
    assert "KV cache auto: int8" in text, text[-3000:]
    assert "int8 KV attention: " in text, text[-3000:]
