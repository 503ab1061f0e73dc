"""The int8 step's kernel probe: the CPU flags it reads, the accuracy-level variants it builds
(the same weights, another kernel: the same tokens within rounding), and its choice on a real
int8 step graph (small config), our own kernel among the candidates."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from chattts_serving import contract
from chattts_serving.contract import Precision
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.engine.kernels import (
    KERNELS,
    OWN_KERNEL,
    accuracy_level,
    choose_int8_kernel,
    cpu_features,
    probe_graph,
    race,
    runs_int8,
    with_accuracy_level,
)
from chattts_serving.runtime import Artifacts, OrtOptions

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu
"""


def test_cpu_features_reads_the_model_and_the_flags_that_matter(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    got = cpu_features(info)
    assert got == {"cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                   "cpu_flags": ["avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                                 "amx_tile", "amx_int8", "amx_bf16"]}
    assert cpu_features(tmp_path / "missing") == {"cpu_model": None, "cpu_flags": []}


def test_accuracy_level_variant_changes_only_the_kernel(small_int8_artifacts: Artifacts) -> None:
    art = small_int8_artifacts
    path = art.root / art.manifest["precisions"]["int8"][contract.GPT_GRAPH]
    variant = onnx.load_from_string(with_accuracy_level(path, 1))
    base = onnx.load(str(path))
    levels = {a.i for n in variant.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"}
    assert levels == {1}
    assert [i.name for i in variant.graph.initializer] == [i.name for i in base.graph.initializer]
    assert all(a.raw_data == b.raw_data for a, b in zip(variant.graph.initializer, base.graph.initializer))
    with pytest.raises(ValueError, match="no MatMulNBits"):
        with_accuracy_level(art.root / contract.GPT_GRAPH, 4)


def test_probe_graph_multiplies_as_its_kernel_says() -> None:
    """The probe's graph at level 4 and 1 (same random weights) runs and agrees within int8
    activation rounding: it times the kernels the step would run."""
    from chattts_serving.runtime import make_session

    x = np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32)
    outs = [make_session(probe_graph(64, 96, 32, level, layers=2), OrtOptions(1, False)).run(None, {"x": x})
            for level in (4, 1)]
    assert [o.shape for o in outs[0]] == [(3, 96), (3, 96)]
    for a, b in zip(*outs):
        assert np.abs(a - b).max() < 0.05 * np.abs(b).max()


def test_probe_keeps_the_fastest_candidate_and_the_tokens_stay_within_rounding(
        small_int8_artifacts: Artifacts, caplog: pytest.LogCaptureFixture) -> None:
    art = small_int8_artifacts
    opts = OrtOptions(1, False, precision=Precision.INT8)
    runner = GptStepRunner(art, opts)
    assert runs_int8(runner) and not runs_int8(GptStepRunner(art, replace(opts, precision=Precision.FP32)))
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((2, 5, art.hidden_size), dtype=np.float32)
    before, _, _ = runner.prefill(embeds, np.array([5, 3]))
    with caplog.at_level(logging.INFO, logger="chattts_serving.engine.kernels"):
        choice = choose_int8_kernel(runner, steps=1)
    assert choice is not None and choice.chosen in {*KERNELS, OWN_KERNEL}
    scores = {k: sum(v.values()) for k, v in choice.probe_ms.items()}
    assert choice.chosen == min(scores, key=scores.__getitem__)
    assert set(choice.probe_ms) | set(choice.dropped) == {*KERNELS, OWN_KERNEL}
    assert f"int8 GPT kernel: {choice.chosen}" in caplog.text
    after, _, _ = runner.prefill(embeds, np.array([5, 3]))
    assert np.allclose(after, before, atol=0.05 * np.abs(before).max())
    assert choice.as_dict()["accuracy_level"] == accuracy_level(choice.chosen)
    assert choose_int8_kernel(GptStepRunner(art, replace(opts, precision=Precision.FP32))) is None


def test_a_kernel_other_than_the_exported_one_rebuilds_the_session(small_int8_artifacts: Artifacts) -> None:
    """Offered only the fp32-activation kernel, the probe moves the runner onto it (a new
    session of the same weights: logits within int8 activation rounding), and back."""
    runner = GptStepRunner(small_int8_artifacts, OrtOptions(1, False, precision=Precision.INT8))
    embeds = np.random.default_rng(2).standard_normal((1, 4, small_int8_artifacts.hidden_size), dtype=np.float32)
    exported, _, _ = runner.prefill(embeds, np.array([4]))
    session = runner.session
    choice = choose_int8_kernel(runner, {"fp32-activations": 1}, steps=1, own=False)
    assert choice is not None and choice.chosen == "fp32-activations" and choice.swap_s > 0
    assert runner.session is not session
    moved, _, _ = runner.prefill(embeds, np.array([4]))
    assert not np.array_equal(moved, exported) and np.allclose(moved, exported, atol=0.05 * np.abs(exported).max())
    back = choose_int8_kernel(runner, {"int8-activations": 4}, steps=1, own=False)
    assert back is not None and back.swap_s > 0
    np.testing.assert_array_equal(runner.prefill(embeds, np.array([4]))[0], exported)
    again = choose_int8_kernel(runner, {"int8-activations": 4}, steps=1, own=False)
    assert again is not None and again.swap_s == 0.0  # already on it: the session is kept


def test_the_probe_races_candidates_call_by_call_and_keeps_each_ones_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside load that lands on one candidate's runs (here: the first round of "ours", three
    times its own cost) does not decide the race: the candidates take turns call by call and
    each keeps its fastest run. On a clock the calls advance, so the figures are exact."""
    from chattts_serving.engine import kernels

    clock = [0.0]
    order: list[str] = []
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: clock[0])

    def call(name: str, rows: int, ms: float, loaded_rounds: int = 0) -> object:
        def run() -> None:
            order.append(f"{name}{rows}")
            loaded = order.count(f"{name}{rows}") <= loaded_rounds
            clock[0] += (3 * ms if loaded else ms) / 1e3
        return run

    times = race({"theirs": {1: call("theirs", 1, 0.8), 16: call("theirs", 16, 5.0)},
                  "ours": {1: call("ours", 1, 0.4, loaded_rounds=1), 16: call("ours", 16, 3.0, loaded_rounds=1)}}, 3)
    assert order[:4] == ["theirs1", "theirs16", "ours1", "ours16"] and len(order) == 12
    assert times == {"theirs": {1: pytest.approx(0.8), 16: pytest.approx(5.0)},
                     "ours": {1: pytest.approx(0.4), 16: pytest.approx(3.0)}}
