"""The GPT step's KV cache in fp16 and int8 (engine/kvprecision.py, export/kvcache.py,
export/accuracy.py, bench/kv.py) on the small generated checkpoint: the same tokens as the fp32 cache, buffers
of the cache's dtype, the profile knob, the int8 scales and the manifest fields."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from chattts_serving import contract
from chattts_serving.contract import KvPrecision, Precision
from chattts_serving.deploy import render
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.kvprecision import graph_kv_precision, kv_cache_graph
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.export.int8 import ACCURACY_THRESHOLD, _prompts, compare_runs, teacher_forced
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts, OrtOptions
from chattts_serving.serving.profile import ProfileError, load_profile, profile_from_json

TEXTS = ("今天天气很好，我们去公园散步吧。", "请把这段文字读出来。", "语音合成服务正在运行。")


def _engine_codes(art: Artifacts, kv: KvPrecision, steps: int) -> list[np.ndarray]:
    """Codes of 4 sequences (different prompts and seeds, ChatTTS' default sampling) decoded
    together by the engine with a ``kv`` cache."""
    eng = Engine(GptStepRunner(art, OrtOptions(kv_cache=kv)), Embeddings(art), EngineConfig(max_batch_size=4))
    rng = np.random.default_rng(0)
    sinks = []
    for i in range(4):
        ids = rng.integers(200, 7000, 12 + 5 * i)
        ids[0], ids[1], ids[-1] = 21131, contract.SPECIAL_TOKEN_IDS["[spk_emb]"], 21132
        spk = rng.normal(size=art.hidden_size).astype(np.float32)
        sink = CollectingSink()
        eng.submit(make_sequence(ids, spk / np.linalg.norm(spk), SamplingParams(seed=i, max_new_tokens=steps,
                                                                                  min_new_tokens=steps), sink))
        sinks.append(sink)
    while eng.live_count():
        eng.run_once()
    return [s.all_codes for s in sinks]


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Steps (rows of ``[steps, NUM_VQ]`` codes) on which ``a`` and ``b`` agree before they part."""
    differs = np.flatnonzero((a != b).any(axis=1))
    return int(differs[0]) if differs.size else len(a)


FP16_SHARED_STEPS_MIN = 0.9
"""Fraction of the steps the fp16-cache engine samples as the fp32 one before their sequences
part. A draw that lands within fp16 rounding of a boundary of the cumulative distribution picks
the neighbouring code (how often depends on the CPU's kernels), and the sequence follows another
path from there; anything beyond a rare such draw is a broken cache."""


def test_the_fp16_cache_engine_samples_the_fp32_cache_engines_tokens(small_artifacts: Artifacts) -> None:
    """4 sequences decoded together for 60 steps each: the fp16-cache engine samples the
    fp32-cache engine's codes (the small model's logits move by fp16 rounding only) for at least
    :data:`FP16_SHARED_STEPS_MIN` of the steps, counted up to where each pair of sequences parts."""
    ref = _engine_codes(small_artifacts, KvPrecision.FP32, 60)
    got = _engine_codes(small_artifacts, KvPrecision.FP16, 60)
    assert all(a.shape == (60, contract.NUM_VQ) for a in ref + got)
    shared = [_common_prefix(a, b) for a, b in zip(ref, got)]
    assert sum(shared) >= FP16_SHARED_STEPS_MIN * 4 * 60, shared


@pytest.mark.parametrize("kv", [KvPrecision.FP16, KvPrecision.INT8])
def test_a_reduced_cache_agrees_with_the_fp32_cache_teacher_forced(small_kv_artifacts: Artifacts,
                                                                     kv: KvPrecision) -> None:
    """Teacher-forced over 3 prompts x 60 steps: top-1 agreement of every code head at least
    the project's threshold (0.95), and the hidden states within a few percent."""
    ref = GptStepRunner(small_kv_artifacts, OrtOptions())
    cand = GptStepRunner(small_kv_artifacts, OrtOptions(kv_cache=kv))
    runs = [teacher_forced(ref, cand, e, 60, seed=i) for i, e in enumerate(_prompts(small_kv_artifacts, TEXTS, "2"))]
    acc = compare_runs(runs)
    assert acc["decode_steps"] == 3 * 59
    assert acc["top1_agreement_min"] >= ACCURACY_THRESHOLD["top1_agreement_min"], acc["top1_agreement"]
    assert acc["hidden_rel_err_max"] < (0.01 if kv is KvPrecision.FP16 else 0.1), acc["hidden_rel_err_max"]
    assert acc["hidden_rel_err_max"] > 0  # the cache really is another precision


@pytest.mark.parametrize(("kv", "dtype", "itemsize"), [(KvPrecision.FP32, np.float32, 4),
                                                      (KvPrecision.FP16, np.float16, 2),
                                                      (KvPrecision.INT8, np.int8, 1)])
def test_the_engines_preallocated_cache_holds_the_cache_dtype(small_kv_artifacts: Artifacts, kv: KvPrecision,
                                                             dtype: type, itemsize: int) -> None:
    """The runner's buffers (and the prefill's) are of the cache's dtype: an fp16 cache is
    half the bytes of the fp32 one, an int8 cache a quarter; the graph's IO says the same."""
    r = GptStepRunner(small_kv_artifacts, OrtOptions(kv_cache=kv))
    assert r.kv_dtype is dtype
    cache = r.new_cache(2, 32)
    assert all(b.dtype == dtype for b in cache.buffers)
    a = small_kv_artifacts
    assert sum(b.nbytes for b in cache.buffers) == 2 * a.num_layers * 2 * a.num_heads * 32 * a.head_dim * itemsize
    types = {i.name: i.type for i in r.session.get_inputs()}
    assert types[contract.past_names(0)[0]] == {1: "tensor(int8)", 2: "tensor(float16)", 4: "tensor(float)"}[itemsize]
    x = np.random.default_rng(0).normal(size=(1, 5, a.hidden_size)).astype(np.float32)
    _, _, prefill = r.prefill(x, np.array([5]))
    assert prefill.buffers[0].dtype == dtype
    assert not np.all(prefill.buffers[0][0, :, :5] == 0)  # the prefill wrote its positions


def test_int8_weights_take_a_reduced_cache_too(small_int8_artifacts: Artifacts) -> None:
    """The rewrite applies to the int8-weight graph as well (the cpu profile's): its fp16-cache
    logits stay within fp16 rounding of its fp32-cache ones."""
    opts = OrtOptions(precision=Precision.INT8)
    ref, cand = GptStepRunner(small_int8_artifacts, opts), GptStepRunner(small_int8_artifacts,
                                                                         replace(opts, kv_cache=KvPrecision.FP16))
    assert cand.kv_dtype is np.float16 and cand.graph.name == contract.INT8_GRAPH_FILES[contract.GPT_GRAPH]
    x = np.random.default_rng(0).normal(size=(2, 9, small_int8_artifacts.hidden_size)).astype(np.float32)
    la, _, _ = ref.prefill(x, np.array([9, 6]))
    lb, _, _ = cand.prefill(x, np.array([9, 6]))
    assert np.abs(lb - la).max() <= 1e-2 * np.abs(la).max()


def test_the_rewrite_refuses_what_it_cannot_express(small_artifacts: Artifacts, tmp_path: Path) -> None:
    """An int8 cache without scales names the command that calibrates them; scales of the
    wrong shape or sign are refused; a graph whose cache is already reduced is not rewritten
    again; an unknown precision names the known ones."""
    with pytest.raises(FileNotFoundError, match=r"python -m chattts_serving\.export\.accuracy kv --artifacts"):
        GptStepRunner(small_artifacts, OrtOptions(kv_cache=KvPrecision.INT8))
    model = onnx.load(str(small_artifacts.root / contract.GPT_GRAPH))
    layers, heads, hd = small_artifacts.num_layers, small_artifacts.num_heads, small_artifacts.head_dim
    good = {f"{k}_{i}": np.ones((heads, 1, hd), np.float32) for i in range(layers) for k in "kv"}
    with pytest.raises(ValueError, match="k_0"):
        kv_cache_graph(onnx.load(str(small_artifacts.root / contract.GPT_GRAPH)), "int8",
                       {**good, "k_0": np.ones((heads, hd), np.float32)})
    with pytest.raises(ValueError, match="v_1"):
        kv_cache_graph(onnx.load(str(small_artifacts.root / contract.GPT_GRAPH)), "int8",
                       {**good, "v_1": np.zeros((heads, 1, hd), np.float32)})
    fp16 = kv_cache_graph(model, "fp16")
    assert graph_kv_precision(fp16) is KvPrecision.FP16
    with pytest.raises(ValueError, match="already fp16"):
        kv_cache_graph(fp16, "int8", good)
    with pytest.raises(ValueError, match=r"expected one of .*fp32.*fp16.*int8"):
        OrtOptions(kv_cache="bf16")  # type: ignore[arg-type]


def _profile_with(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (render.REPO_SRC.parent / "profiles" / f"{name}.toml").read_text()
    assert old in text
    p = tmp_path / f"{name}-variant.toml"
    p.write_text(text.replace(old, new, 1))
    return p


def test_the_profile_knob_reaches_the_engine_and_the_rendered_repository(tmp_path: Path,
                                                                       small_artifacts: Artifacts) -> None:
    """``[engine] kv_cache`` goes into the engine's ONNX Runtime options (not the vocoders')
    and into the profile the renderer writes for the models; the fidelity profile keeps fp32;
    the cpu profile's ``auto`` runs the fp32 cache on artifacts where nothing was measured."""
    assert load_profile("cpu-fp32").engine.kv_cache is KvPrecision.FP32
    assert load_profile("cpu").engine.kv_cache is KvPrecision.AUTO
    assert GptStepRunner(small_artifacts, load_profile("cpu").ort("engine")).kv_precision is KvPrecision.FP32
    assert load_profile("cpu-fp32").ort("engine").kv_cache is KvPrecision.FP32
    prof = load_profile(_profile_with(tmp_path, "cpu", 'kv_cache = "auto"', 'kv_cache = "fp16"'))
    assert prof.ort("engine").kv_cache is KvPrecision.FP16
    assert prof.ort("vocoder").kv_cache is KvPrecision.FP32
    render.render_repository(prof, small_artifacts.root, tmp_path / "repo")
    rendered = [p for p in (tmp_path / "repo").rglob(render.PROFILE_JSON)]
    assert rendered
    for p in rendered:
        assert profile_from_json(p.read_text()).engine.kv_cache is KvPrecision.FP16
        assert json.loads(p.read_text())["engine"]["kv_cache"] == "fp16"


@pytest.mark.parametrize(("name", "old", "new", "cause"), [
    ("cpu", 'kv_cache = "auto"', 'kv_cache = "fp8"', "kv_cache"),
    ("cpu", 'kv_cache = "auto"', "kv_cache = 16", "kv_cache"),
    ("gpu", 'kv_cache = "fp16"', 'kv_cache = "int8"', "kv_cache int8 needs a graph with an fp32 KV cache"),
])
def test_a_bad_kv_cache_value_is_a_clear_profile_error(tmp_path: Path, name: str, old: str, new: str,
                                                       cause: str) -> None:
    with pytest.raises(ProfileError, match=cause):
        load_profile(_profile_with(tmp_path, name, old, new))


def test_the_accuracy_command_and_the_benchmark_write_their_numbers_and_the_manifest_fields(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """``python -m chattts_serving.export.accuracy kv`` on a copy of the small artifacts:
    calibrates the int8 scales (file + sha256 + how, in manifest.json ``kv_cache.int8``),
    measures both reduced caches' accuracy and writes it under ``kv_cache.<kv>.accuracy.fp32``
    and into its results file; then ``python -m bench.kv`` times every weight/cache pair at
    each batch. The benchmark refuses an int8 cache without scales."""
    from bench.kv import main as bench_kv
    from chattts_serving.export.accuracy import main

    root = tmp_path / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    out = tmp_path / "kv.json"
    with pytest.raises(SystemExit, match="2"):
        bench_kv(["--artifacts", str(root), "--out", str(out), "--rounds", "1", "--repeats", "1"])
    acc_out = tmp_path / "kv-accuracy.json"
    assert main(["kv", "--artifacts", str(root), "--out", str(acc_out), "--steps", "4"]) == 0
    assert bench_kv(["--artifacts", str(root), "--out", str(out), "--rounds", "1", "--repeats", "1",
                     "--batches", "1,2"]) == 0
    res = json.loads(out.read_text())
    assert set(res["speed"]) == {"fp32/fp32", "fp32/fp16", "fp32/int8"}
    assert res["speed"]["fp32/fp16"]["2"]["step_ms_p50"] > 0
    assert res["speed"]["fp32/fp32"]["1"]["ratio_to_fp32_kv_p50"] == 1.0
    assert res["kv_bytes_per_row"]["fp16"] * 2 == res["kv_bytes_per_row"]["fp32"]
    manifest = json.loads((root / contract.MANIFEST).read_text())
    int8 = manifest["kv_cache"]["int8"]
    assert int8["file"] == contract.KV_SCALES_FILE and len(int8["sha256"]) == 64 and int8["calibration"]["steps"]
    for kv in ("fp16", "int8"):
        acc = manifest["kv_cache"][kv]["accuracy"]["fp32"]
        assert acc == json.loads(acc_out.read_text())["accuracy"][f"fp32/{kv}"]
        assert len(acc["top1_agreement"]) == contract.NUM_VQ and acc["decode_steps"] == 20 * 3
        assert {"audio_snr_db", "audio_snr_db_min", "meets_threshold", "threshold"} <= set(acc)
        assert acc["kv_cache"] == kv and acc["weights"] == "fp32"


def test_auto_takes_int8_only_where_measured_accurate_with_the_weights_in_use(small_kv_artifacts: Artifacts) -> None:
    """``kv_cache = "auto"``: int8 when the scales exist and the int8 cache's accuracy measured
    with the weights in use meets the threshold; fp32 without a measurement, with one below
    the threshold, with one of other weights, or without the scales file."""
    from chattts_serving.runtime import resolve_kv_precision

    def art(accuracy: dict, scales: bool = True) -> Artifacts:
        m = json.loads(json.dumps(small_kv_artifacts.manifest))
        m["kv_cache"]["int8"]["accuracy"] = accuracy
        if not scales:
            m["kv_cache"]["int8"]["file"] = "missing.npz"
        return Artifacts(small_kv_artifacts.root, m)

    ok, low = {"meets_threshold": True}, {"meets_threshold": False}
    assert resolve_kv_precision(small_kv_artifacts, "auto") is KvPrecision.FP32  # scales, no measurement
    assert resolve_kv_precision(art({"fp32": ok}), "auto") is KvPrecision.INT8
    assert resolve_kv_precision(art({"fp32": ok}), "auto", "int8") is KvPrecision.FP32  # measured with fp32 weights
    assert resolve_kv_precision(art({"fp32": low}), "auto") is KvPrecision.FP32
    assert resolve_kv_precision(art({"fp32": ok}, scales=False), "auto") is KvPrecision.FP32
    assert resolve_kv_precision(art({"fp32": low}), "fp16") is KvPrecision.FP16  # a pinned value stays
    runner = GptStepRunner(art({"fp32": ok}), OrtOptions(kv_cache=KvPrecision.AUTO))
    assert runner.kv_precision is KvPrecision.INT8 and runner.kv_dtype is np.int8


def test_auto_falls_back_to_the_fp32_cache_where_onnxruntime_cannot_run_int8(
        small_kv_artifacts: Artifacts, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An onnxruntime whose GroupQueryAttention takes no int8 cache (1.23, NVIDIA's and older
    images) refuses the rewritten graph: with ``auto`` the runner says so and serves the fp32
    cache, where a pinned ``int8`` is an error naming the version."""
    from chattts_serving.engine import gpt

    m = json.loads(json.dumps(small_kv_artifacts.manifest))
    m["kv_cache"]["int8"]["accuracy"] = {"fp32": {"meets_threshold": True}}
    art = Artifacts(small_kv_artifacts.root, m)
    real = gpt.make_session

    def old_onnxruntime(model: object, opts: OrtOptions, **kw: object) -> object:
        if isinstance(model, bytes) and b"kv_cache_bit_width" in model:  # as 1.23 refuses it
            raise RuntimeError("GroupQueryAttention has input size 14 not in range [min=7, max=12]")
        return real(model, opts, **kw)

    monkeypatch.setattr(gpt, "make_session", old_onnxruntime)
    with caplog.at_level("WARNING", logger="chattts_serving.engine.gpt"):
        runner = GptStepRunner(art, OrtOptions(kv_cache=KvPrecision.AUTO))
    assert runner.kv_precision is KvPrecision.FP32 and runner.kv_dtype is np.float32
    assert "running the fp32 KV cache instead" in caplog.text
    x = np.random.default_rng(0).normal(size=(1, 5, art.hidden_size)).astype(np.float32)
    assert np.isfinite(runner.prefill(x, np.array([5]))[0]).all()
    with pytest.raises(RuntimeError, match=r"onnxruntime .* cannot load .* int8 KV cache"):
        GptStepRunner(art, OrtOptions(kv_cache=KvPrecision.INT8))


def test_the_accuracy_against_fp32_throughout_counts_the_weights_error_too(small_int8_artifacts: Artifacts) -> None:
    """``reference_weights``: int8 weights with an fp16 cache against fp32 weights and cache
    carries the weights' rounding as well, so it differs more than against the int8 weights
    with the fp32 cache, and says which reference it had."""
    from chattts_serving.export.kvcache import kv_accuracy_report

    same = kv_accuracy_report(small_int8_artifacts.root, TEXTS[:2], 8, "fp16", weights="int8")
    full = kv_accuracy_report(small_int8_artifacts.root, TEXTS[:2], 8, "fp16", weights="int8",
                              reference_weights="fp32")
    assert same["reference"] == "int8 weights with the fp32 KV cache"
    assert full["reference"] == "fp32 weights with the fp32 KV cache"
    assert full["hidden_rel_err_mean"] > 2 * same["hidden_rel_err_mean"] > 0


def test_measure_if_missing_measures_what_auto_reads_once(small_int8_artifacts: Artifacts, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``kv --measure-if-missing`` (what ``make demo`` and ``make bench`` run): the int8 cache
    with the weights ``precision = "auto"`` serves (fp32 until the int8 graphs' accuracy meets
    the threshold, then int8), calibrating the scales first; a second run measures nothing and
    leaves the manifest as it was; new int8 graphs drop the measurement made with the old ones,
    and the one made with fp32 weights stays."""
    from chattts_serving.export.accuracy import has_kv_accuracy, main
    from chattts_serving.export.int8 import add_int8
    from chattts_serving.runtime import resolve_kv_precision

    root = tmp_path / "artifacts"
    shutil.copytree(small_int8_artifacts.root, root)
    assert main(["kv", "--artifacts", str(root), "--measure-if-missing", "--steps", "3"]) == 0
    man = json.loads((root / contract.MANIFEST).read_text())
    assert set(man["kv_cache"]) == {"int8"} and set(man["kv_cache"]["int8"]["accuracy"]) == {"fp32"}
    assert "with fp32 weights to measure" in capsys.readouterr().err
    man["precisions"]["int8"]["accuracy"] = {"meets_threshold": True}  # auto now serves the int8 graphs
    (root / contract.MANIFEST).write_text(json.dumps(man))
    assert not has_kv_accuracy(Artifacts.load(root), "int8")
    assert main(["kv", "--artifacts", str(root), "--measure-if-missing", "--steps", "3"]) == 0
    art = Artifacts.load(root)
    assert has_kv_accuracy(art, "int8") and has_kv_accuracy(art, "fp32")
    ok = art.manifest["kv_cache"]["int8"]["accuracy"]["int8"]["meets_threshold"]
    assert resolve_kv_precision(art, "auto", "auto") is (KvPrecision.INT8 if ok else KvPrecision.FP32)
    before = (root / contract.MANIFEST).read_text()
    capsys.readouterr()
    assert main(["kv", "--artifacts", str(root), "--measure-if-missing", "--steps", "3"]) == 0
    assert "already measured" in capsys.readouterr().err and (root / contract.MANIFEST).read_text() == before
    assert add_int8(root, force=True)
    art = Artifacts.load(root)
    assert not has_kv_accuracy(art, "int8") and has_kv_accuracy(art, "fp32")


@pytest.mark.parametrize("extra", [[], ["--measure-if-missing"]])
def test_the_kv_command_on_a_folder_without_an_export_is_a_clear_error(tmp_path: Path, extra: list[str],
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from chattts_serving.export.accuracy import main

    assert main(["kv", "--artifacts", str(tmp_path / "none"), *extra]) == 2
    assert "has no manifest.json: run `make export` first" in capsys.readouterr().err
