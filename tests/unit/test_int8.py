"""The int8 GPT step and vocoders (``chattts-export --precision int8``, profile ``cpu-int8``),
small config, in process: their parity with the fp32 graphs within their own stated tolerances,
what they quantize, the engine running it consistently with the graph it loads, the int8
vocoders per row and streamed, the accuracy measurement and its command, and the profiles. A
real server on ``cpu-int8``: tests/server/test_int8.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from chattts_serving import contract
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.export.build import verify_artifacts
from chattts_serving.export.int8 import (
    ACCURACY_THRESHOLD,
    INT8_QUANTIZATION,
    INT8_VOCODER_QUANTIZATION,
    INT8_VOCODER_SNR_DB_MIN,
    accuracy_report,
    add_int8,
    has_int8,
    int8_tolerances,
    int8_up_to_date,
    write_accuracy,
)
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts, OrtOptions
from chattts_serving.serving.profile import load_profile

INT8 = OrtOptions(precision="int8")


@pytest.fixture(scope="module")
def int8_artifacts(small_int8_artifacts: Artifacts) -> Artifacts:
    """The small artifacts with their int8 graphs; exporting again reuses them (up to date)."""
    assert not add_int8(small_int8_artifacts.root)
    return small_int8_artifacts


def test_int8_graph_is_within_its_stated_tolerance_of_the_fp32_graph(int8_artifacts: Artifacts) -> None:
    man = verify_artifacts(int8_artifacts.root)  # the int8 file is hashed in the manifest
    assert has_int8(int8_artifacts) and int8_up_to_date(int8_artifacts.root)
    entry = man["precisions"]["int8"]
    for graph, file in contract.INT8_GRAPH_FILES.items():
        assert entry[graph] == file and file in man["files"]
    assert entry["sources"] == {g: man["files"][g] for g in contract.INT8_GRAPH_FILES}
    assert entry["quantization"] == INT8_QUANTIZATION
    assert entry["vocoder_quantization"] == INT8_VOCODER_QUANTIZATION
    parity = man["parity_int8"]
    tol = int8_tolerances(int8_artifacts.num_layers)
    assert man["parity_int8_tolerance"] == tol
    assert tol["hidden_rel_err_max"] <= 0.03 and tol["logits_rel_max"] <= 0.05  # the small config's 2 layers
    assert parity["logits_rel_max"] <= tol["logits_rel_max"]
    assert parity["hidden_rel_err_max"] <= tol["hidden_rel_err_max"]
    assert parity["logit_abs_err_max"] > 0, "no error at all: the int8 graph did not run"
    assert parity["decode_steps"] > 0 and len(parity["top1_agreement"]) == contract.NUM_VQ
    for path in ("hidden", "codes"):  # the int8 vocoders ran (not bit-equal) and stayed close
        assert INT8_VOCODER_SNR_DB_MIN <= parity[f"vocoder_{path}_snr_db"] < 120


def test_int8_graph_quantizes_the_weight_matmuls_only(int8_artifacts: Artifacts) -> None:
    root = int8_artifacts.root
    fp32 = onnx.load(str(root / contract.GPT_GRAPH))
    q = onnx.load(str(root / contract.INT8_GRAPH_FILES[contract.GPT_GRAPH]))
    weights = {i.name for i in fp32.graph.initializer}
    weight_matmuls = sum(n.op_type == "MatMul" and n.input[1] in weights for n in fp32.graph.node)
    ops = [n.op_type for n in q.graph.node]
    assert weight_matmuls == 4 * int8_artifacts.num_layers + 1
    assert ops.count("MatMulNBits") == 4 * int8_artifacts.num_layers  # every projection ...
    heads = [n for n in q.graph.node if n.op_type == "MatMul"]
    assert [n.input[1] for n in heads] == list(INT8_QUANTIZATION["keep_fp32"]) == ["heads.weight"]  # ... not the heads
    assert ops.count("GroupQueryAttention") == int8_artifacts.num_layers
    for n in q.graph.node:
        if n.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (
                8, INT8_QUANTIZATION["block_size"], 4)
    packed = [i for i in q.graph.initializer if i.data_type == onnx.TensorProto.UINT8]
    assert sum(np.prod(i.dims) for i in packed) >= sum(  # one byte per weight
        np.prod(i.dims) for i in fp32.graph.initializer if i.name in {n.input[1] for n in fp32.graph.node
                                                                        if n.op_type == "MatMul"}
        and i.name != "heads.weight")
    # the IO, KV cache included, is unchanged: float32 in and out
    assert [(v.name, v.type.tensor_type.elem_type) for v in q.graph.input] == \
        [(v.name, v.type.tensor_type.elem_type) for v in fp32.graph.input]
    assert [(v.name, v.type.tensor_type.elem_type) for v in q.graph.output] == \
        [(v.name, v.type.tensor_type.elem_type) for v in fp32.graph.output]


def test_int8_step_keeps_float32_io_and_kv_cache(int8_artifacts: Artifacts) -> None:
    r = GptStepRunner(int8_artifacts, INT8)
    assert r.kv_dtype is np.float32
    b, h = 2, int8_artifacts.hidden_size
    logits, hidden, kv = r.prefill(np.ones((b, 5, h), np.float32), np.array([5, 3]))
    assert logits.dtype == hidden.dtype == np.float32
    assert logits.shape == (b, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS)
    assert all(k.dtype == np.float32 and k.shape == (b, int8_artifacts.num_heads, 5, int8_artifacts.head_dim)
               for k in kv.buffers)


def test_engine_on_the_int8_graph_decodes_its_greedy_tokens(int8_artifacts: Artifacts) -> None:
    """The engine with an int8 runner (its preallocated KV cache, sampling at top_k=1) emits
    exactly the int8 graph's own step-by-step tokens (the same sampler over the graph's logits),
    alone or with another sequence in the batch (MatMulNBits quantizes activations per row: no
    dependence on the other rows): the engine is consistent with the graph it loads."""
    runner = GptStepRunner(int8_artifacts, INT8)
    emb = Embeddings(int8_artifacts)
    rng = np.random.default_rng(4)
    ids = rng.integers(200, 7000, 23)
    ids[0], ids[1], ids[-1] = 21131, contract.SPECIAL_TOKEN_IDS["[spk_emb]"], 21132
    spk = rng.standard_normal(int8_artifacts.hidden_size).astype(np.float32)
    spk /= np.linalg.norm(spk)
    n = 40
    # ChatTTS' sampler keeps at least 3 candidates whatever top_k says: greedy is temperature 1e-6
    params = SamplingParams(temperature=1e-6, top_k=1, repetition_penalty=1.0, max_new_tokens=n, min_new_tokens=n)
    from chattts_serving.engine.sampling import RequestSampler, sample_batch

    x = emb.prompt(ids, spk)[None].astype(np.float32)
    cache = runner.new_cache(1, len(ids) + n)
    sampler = RequestSampler(params)  # the engine's own sampler, same seed: near-ties fall the same way
    want = []
    for step in range(n):
        if step == 0:
            logits, _, kv = runner.prefill(x, np.array([len(ids)]))
            cache.copy_row(0, kv, 0, len(ids))
        else:
            logits, _ = runner.decode(x, cache, np.array([len(ids) + step - 1]))
        codes = sample_batch(logits, [sampler])[0]
        sampler.record(codes)
        want.append(codes)
        x = emb.codes(codes[None])[:, None, :].astype(np.float32)
    for companion in (False, True):
        sink = CollectingSink()
        engine = Engine(runner, emb, EngineConfig())
        if companion:
            engine.submit(make_sequence(ids[:15], None, SamplingParams(seed=3, max_new_tokens=n), CollectingSink()))
        engine.submit(make_sequence(ids, spk, params, sink, emit_tokens=3))
        while engine.live_count():
            engine.run_once()
        assert not sink.errors, sink.errors
        assert sink.reason == contract.StopReason.MAX_TOKENS
        np.testing.assert_array_equal(sink.all_codes, np.stack(want), err_msg=f"with a companion: {companion}")


def test_accuracy_report_measures_int8_against_fp32_and_lands_in_the_manifest(int8_artifacts: Artifacts,
                                                                               tmp_path: Path) -> None:
    root = tmp_path / "art"
    shutil.copytree(int8_artifacts.root, root)
    texts = ["今天天气很好，我们一起去公园散步吧。", "列车即将到达终点站，请带好您的随身物品。"]
    acc = accuracy_report(root, texts, steps=12)
    assert acc["prompts"] == 2 and acc["positions"] == 24 and acc["decode_steps"] == 22
    assert len(acc["top1_agreement"]) == contract.NUM_VQ
    assert all(0.0 <= a <= 1.0 for a in acc["top1_agreement"])
    assert 0 < acc["logit_abs_err_mean"] <= acc["logit_abs_err_max"]
    assert 0 < acc["hidden_rel_err_mean"] <= acc["hidden_rel_err_max"]
    assert acc["hidden_rel_err_max"] <= int8_tolerances(int8_artifacts.num_layers)["hidden_rel_err_max"]
    assert np.isfinite(acc["audio_snr_db"]) and len(acc["audio_snr_db_per_prompt"]) == 2
    per_prompt = acc["audio_snr_db_per_prompt"]
    assert acc["audio_snr_db_min"] == pytest.approx(min(per_prompt), abs=0.01)
    # the pooled SNR (energies summed) lies between the prompts' own
    assert min(per_prompt) - 0.01 <= acc["audio_snr_db"] <= max(per_prompt) + 0.01
    # the int8 vocoder adds its own rounding to the int8 GPT's: measured, finite, not better
    assert np.isfinite(acc["audio_snr_db_int8_vocoder"]) and acc["audio_snr_db_int8_vocoder_min"] <= \
        acc["audio_snr_db_int8_vocoder"] + 0.01
    assert acc["threshold"] == ACCURACY_THRESHOLD
    assert acc["meets_threshold"] == (acc["top1_agreement_min"] >= ACCURACY_THRESHOLD["top1_agreement_min"]
                                      and min(acc["audio_snr_db"], acc["audio_snr_db_min"],
                                              acc["audio_snr_db_int8_vocoder"], acc["audio_snr_db_int8_vocoder_min"])
                                      >= ACCURACY_THRESHOLD["audio_snr_db_min"])
    write_accuracy(root, acc)
    stored = json.loads((root / contract.MANIFEST).read_text())["precisions"]["int8"]["accuracy"]
    assert stored["decode_steps"] == 22
    verify_artifacts(root)  # the manifest's file hashes still hold
    assert int8_up_to_date(root) and not add_int8(root)  # the measurement does not invalidate the graph


def test_measure_command_writes_the_accuracy_into_the_manifest(int8_artifacts: Artifacts, tmp_path: Path) -> None:
    root = tmp_path / "art"
    shutil.copytree(int8_artifacts.root, root)
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.export.accuracy", "int8", "--artifacts",
                           str(root), "--measure", "--steps", "4"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "top-1 agreement per code head" in proc.stdout
    acc = json.loads((root / contract.MANIFEST).read_text())["precisions"]["int8"]["accuracy"]
    assert acc["prompts"] >= 20 and acc["decode_steps"] == acc["prompts"] * 3
    # make bench measures only what is missing: the measurement stands until the graph changes
    before = (root / contract.MANIFEST).read_text()
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.export.accuracy", "int8", "--artifacts",
                           str(root), "--measure-if-missing", "--steps", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "already measured" in proc.stderr, proc.stderr
    assert (root / contract.MANIFEST).read_text() == before


def test_raw_step_benchmark_times_the_graph_the_profile_names(int8_artifacts: Artifacts) -> None:
    from bench.rawstep import measure_raw_step

    opts = load_profile("cpu-int8").ort("engine")
    got = measure_raw_step(int8_artifacts.root, opts, [1, 2], past_tokens=8, repeats=2, warmup=1)
    assert set(got["batches"]) == {"1", "2"}  # type: ignore[arg-type]
    runner = GptStepRunner(int8_artifacts, opts)
    assert runner.graph.name == contract.INT8_GRAPH_FILES[contract.GPT_GRAPH]


def test_int8_without_the_int8_graph_is_a_clear_error(small_artifacts: Artifacts) -> None:
    with pytest.raises(FileNotFoundError, match="--precision int8"):
        GptStepRunner(small_artifacts, INT8)


def test_cpu_int8_and_cpu_fp32_profiles_are_the_cpu_profile_with_one_precision() -> None:
    """cpu-int8 and cpu-fp32 differ from cpu in their precisions only (weights and KV cache:
    both pin the fp32 cache where cpu takes ``auto``), and cpu-fp32 also in its chunk growth
    (doubling: slower than real time, fewer vocoder windows)."""
    cpu, int8, fp32 = load_profile("cpu"), load_profile("cpu-int8"), load_profile("cpu-fp32")
    assert (cpu.stream.growth_basis, fp32.stream.growth_basis, fp32.stream.growth) == ("audio", "chunk", 2.0)
    assert int8.engine.precision == "int8" and int8.ort("engine").precision == "int8"
    assert fp32.engine.precision == "fp32" and cpu.engine.precision == "auto"
    assert (cpu.vocoder.precision, int8.vocoder.precision, fp32.vocoder.precision) == ("auto", "int8", "fp32")
    assert int8.ort("vocoder").precision == "int8"
    assert (cpu.engine.kv_cache, int8.engine.kv_cache, fp32.engine.kv_cache) == ("auto", "fp32", "fp32")
    dumps = [p.model_dump() for p in (cpu, int8, fp32)]
    for d in dumps:
        d["engine"].pop("precision")
        d["engine"].pop("kv_cache")
        d["vocoder"].pop("precision")
        d["stream"].pop("growth")
        d["stream"].pop("growth_basis")
    assert [d.pop("name") for d in dumps] == ["cpu", "cpu-int8", "cpu-fp32"]
    assert dumps[0] == dumps[1] == dumps[2]


def test_the_cpu_profile_runs_int8_only_where_it_was_measured_accurate_enough(
        int8_artifacts: Artifacts, small_artifacts: Artifacts, tmp_path: Path) -> None:
    """precision "auto": int8 when the artifacts' int8 graph has a measured accuracy that meets
    the threshold (manifest precisions.int8.accuracy.meets_threshold), else fp32: not
    measured, measured below, or no int8 graph at all; the benchmark then skips a pinned
    profile that runs the same as cpu (cpu-int8 where int8 is measured accurate enough)."""
    from bench.profiles import same_as
    from chattts_serving.runtime import resolve_precision

    root = tmp_path / "art"
    shutil.copytree(int8_artifacts.root, root)
    opts = load_profile("cpu").ort("engine")
    fp32_file, int8_file = contract.GPT_GRAPH, contract.INT8_GRAPH_FILES[contract.GPT_GRAPH]
    assert resolve_precision(Artifacts.load(root), "auto") == "fp32"  # not measured
    assert GptStepRunner(Artifacts.load(root), opts).graph.name == fp32_file
    # cpu on fp32 still differs from cpu-fp32 in its chunks (audio growth against doubling)
    assert same_as(root, "cpu-fp32", {"cpu": _key(root, "cpu")}) is None
    assert same_as(root, "cpu-int8", {"cpu": _key(root, "cpu")}) is None
    vopts = load_profile("cpu").ort("vocoder")
    for meets, want in ((True, int8_file), (False, fp32_file)):
        write_accuracy(root, {"meets_threshold": meets, "top1_agreement_min": 0.96 if meets else 0.9})
        assert GptStepRunner(Artifacts.load(root), opts).graph.name == want
        for path, graph in (("hidden", contract.VOCODER_HIDDEN_GRAPH), ("codes", contract.VOCODER_CODES_GRAPH)):
            got = VocoderRunner(Artifacts.load(root), path, vopts).graph.name
            assert got == (contract.INT8_GRAPH_FILES[graph] if meets else graph)
    write_accuracy(root, {"meets_threshold": True})
    assert same_as(root, "cpu-int8", {"cpu": _key(root, "cpu")}) == "cpu"
    assert same_as(root, "cpu-fp32", {"cpu": _key(root, "cpu")}) is None
    assert resolve_precision(small_artifacts, "auto") == "fp32"  # no int8 graph
    with pytest.raises(ValueError, match="unknown precision"):
        resolve_precision(small_artifacts, "int4")


def _key(root: Path, name: str) -> str:
    from bench.profiles import resolved_key

    return resolved_key(root, load_profile(name))




def test_int8_vocoders_quantize_the_pointwise_matmuls_only(int8_artifacts: Artifacts) -> None:
    root = int8_artifacts.root
    for graph in (contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH):
        fp32 = onnx.load(str(root / graph))
        q = onnx.load(str(root / contract.INT8_GRAPH_FILES[graph]))
        weights = {i.name for i in fp32.graph.initializer}
        ops = [n.op_type for n in q.graph.node]
        assert ops.count("MatMulNBits") == sum(n.op_type == "MatMul" and n.input[1] in weights
                                               for n in fp32.graph.node) > 0
        assert ops.count("Conv") == [n.op_type for n in fp32.graph.node].count("Conv")  # convolutions stay fp32
        for n in q.graph.node:
            if n.op_type == "MatMulNBits":
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
                assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (
                    8, INT8_VOCODER_QUANTIZATION["block_size"], 4)
        assert [(v.name, v.type.tensor_type.elem_type) for v in q.graph.input] == \
            [(v.name, v.type.tensor_type.elem_type) for v in fp32.graph.input]


def test_int8_vocoder_window_does_not_depend_on_the_other_windows_of_its_batch(int8_artifacts: Artifacts) -> None:
    """The vocoder model batches windows of different streams: with int8 activations quantized
    per row inside MatMulNBits, a window's audio is the same alone or in any batch."""
    rng = np.random.default_rng(5)
    hidden = VocoderRunner(int8_artifacts, "hidden", INT8)
    codes = VocoderRunner(int8_artifacts, "codes", INT8)
    x = rng.standard_normal((4, 20, int8_artifacts.hidden_size)).astype(np.float32)
    c = rng.integers(0, contract.NUM_AUDIO_TOKENS - 1, (4, 20, contract.NUM_VQ)).astype(np.int32)
    for runner, batch in ((hidden, x), (codes, c)):
        together = runner.run(batch)
        for i in range(len(batch)):
            np.testing.assert_array_equal(runner.run(batch[i:i + 1])[0], together[i])


def test_int8_vocoder_stream_at_full_lookahead_is_its_offline_decode_within_int8_rounding(
        int8_artifacts: Artifacts) -> None:
    """At full lookahead the fp32 vocoder streams its offline decode to 1e-7
    (tests/unit/test_chunking.py); the int8 one does not bit for bit (a last-bit difference of
    an fp32 convolution between window lengths can move an activation to the neighbouring int8
    step: export/int8.py), but stays far closer to its own offline decode than int8 audio is
    to fp32 audio."""
    from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker
    from chattts_serving.export.int8 import snr_db

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((90, int8_artifacts.hidden_size)).astype(np.float32)
    int8 = VocoderRunner(int8_artifacts, "hidden", INT8)
    offline = int8.run(hidden[None])[0]
    fp32_offline = VocoderRunner(int8_artifacts, "hidden").run(hidden[None])[0]
    rf = int8_artifacts.receptive_field_tokens("hidden")
    chunker, out, avail = StreamChunker(ChunkSchedule(8, 2.0, 64, 24, 8, 512).with_lookahead(rf)), [], 0
    while not chunker.done:
        avail = min(len(hidden), avail + 3)
        while (w := chunker.next_window(avail, avail == len(hidden))) is not None:
            out.append(chunker.emit(w, int8.run(hidden[None, w.start:w.end])[0]))
    streamed = np.concatenate(out)
    assert streamed.shape == offline.shape
    assert snr_db(offline, streamed) >= max(50.0, snr_db(fp32_offline, offline) + 10.0)
