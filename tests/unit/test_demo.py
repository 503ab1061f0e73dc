"""What ``make demo`` says it ran: the precision summary of a profile at ``auto`` over artifacts
with and without an int8 accuracy measurement, and that a measurement already made is not
repeated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chattts_serving import contract
from chattts_serving.demo import measure_accuracy, precision_summary
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile


def _with_accuracy(src: Artifacts, dst: Path, meets: bool) -> Path:
    shutil.copytree(src.root, dst)
    path = dst / contract.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["precisions"]["int8"]["accuracy"] = {"meets_threshold": meets, "top1_agreement_min": 0.957}
    path.write_text(json.dumps(manifest))
    return dst


def _with_kv_accuracy(root: Path) -> Path:
    """``root`` with int8 KV scales (any file: its presence counts) measured accurate with int8 weights."""
    path = root / contract.MANIFEST
    manifest = json.loads(path.read_text())
    shutil.copy(path, root / contract.KV_SCALES_FILE)
    manifest["kv_cache"] = {"int8": {"file": contract.KV_SCALES_FILE, "accuracy": {"int8": {"meets_threshold": True}}}}
    path.write_text(json.dumps(manifest))
    return root


def test_summary_says_what_auto_resolved_to_and_why(small_int8_artifacts: Artifacts, tmp_path: Path) -> None:
    cpu = load_profile("cpu")
    assert precision_summary(cpu, small_int8_artifacts.root).startswith("GPT fp32 (KV cache ")
    assert "auto: no int8 accuracy measured, so fp32" in precision_summary(cpu, small_int8_artifacts.root)
    good = _with_accuracy(small_int8_artifacts, tmp_path / "good", True)
    text = precision_summary(cpu, good)
    assert text.startswith("GPT int8 (KV cache ") and "vocoders int8" in text
    assert "meets the threshold, worst head top-1 0.957" in text
    assert "(KV auto: no int8 KV accuracy measured with int8 weights, so fp32)" in text
    _with_kv_accuracy(good)
    text = precision_summary(cpu, good)
    assert text.startswith("GPT int8 (KV cache int8)") and "KV auto: int8 KV accuracy meets the threshold" in text
    bad = _with_accuracy(small_int8_artifacts, tmp_path / "bad", False)
    assert precision_summary(cpu, bad).startswith("GPT fp32") and "misses the threshold" in precision_summary(cpu, bad)
    pinned = precision_summary(load_profile("cpu-int8"), small_int8_artifacts.root)
    assert pinned.startswith("GPT int8") and "auto" not in pinned


def test_a_measured_accuracy_is_not_measured_again(small_int8_artifacts: Artifacts, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def no_run(*_args: object, **_kw: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(subprocess, "run", no_run)
    measured = _with_accuracy(small_int8_artifacts, tmp_path / "measured", True)
    measure_accuracy(measured, "int8")
    measure_accuracy(_with_kv_accuracy(measured), "kv")  # measured with the int8 weights auto serves
