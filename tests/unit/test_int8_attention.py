"""Our attention over the int8 KV cache (``chattts.Int8KvAttention``, int8_matmul/int8_attention.cc)
against ONNX Runtime's ``GroupQueryAttention`` over the same int8 cache, node for node: decode
steps of rows with different pasts, a right-padded first prompt, several new tokens after a
past, the cache bound to both past and present (the engine's IO binding), the fused step graph
(small config) and refusals of what it does not compute.

Where the library cannot run these tests skip, naming why; under CI they fail instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from chattts_serving.contract import KvPrecision
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.int8_kernel import attention_convertible, with_own_attention
from chattts_serving.runtime import Artifacts, OrtOptions, make_session

HEADS, D, POSITIONS = 4, 64, 512


@pytest.fixture(scope="module")
def library(int8_library: Path) -> Path:
    return int8_library


def _gqa_graph(seed: int = 0, **extra: Any) -> onnx.ModelProto:
    """One GroupQueryAttention node as the fused step has it over an int8 cache (rotary inside,
    per-channel scales), inputs qkv, pk, pv, seqlens, total; outputs o, ok, ov."""
    rng = np.random.default_rng(seed)
    pos = np.arange(POSITIONS)[:, None] * (1.0 / 10000 ** (np.arange(0, D, 2) / D))[None]
    inits = [numpy_helper.from_array(np.cos(pos).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(pos).astype(np.float32), "sin"),
             numpy_helper.from_array((rng.random((HEADS, 1, D)) * 0.02 + 0.01).astype(np.float32), "ks"),
             numpy_helper.from_array((rng.random((HEADS, 1, D)) * 0.02 + 0.01).astype(np.float32), "vs")]
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["b", "s", 3 * HEADS * D]),
              helper.make_tensor_value_info("pk", TensorProto.INT8, ["b", HEADS, "c", D]),
              helper.make_tensor_value_info("pv", TensorProto.INT8, ["b", HEADS, "c", D]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [1])]
    outputs = [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["b", "s", HEADS * D]),
               helper.make_tensor_value_info("ok", TensorProto.INT8, ["b", HEADS, "t", D]),
               helper.make_tensor_value_info("ov", TensorProto.INT8, ["b", HEADS, "t", D])]
    attrs = {"num_heads": HEADS, "kv_num_heads": HEADS, "do_rotary": 1, "rotary_interleaved": 0, "scale": D ** -0.5,
             "kv_cache_bit_width": 8, "k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", **extra}
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin", "",
                                                    "", "", "ks", "vs"], ["o", "ok", "ov"], domain="com.microsoft",
                            **attrs)
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _sessions(library: Path, threads: int = 2) -> tuple[Any, Any]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    ref = ort.InferenceSession(_gqa_graph().SerializeToString(), so, providers=["CPUExecutionProvider"])
    ours_so = ort.SessionOptions()
    ours_so.intra_op_num_threads = threads
    ours_so.register_custom_ops_library(str(library))
    ours = ort.InferenceSession(with_own_attention(_gqa_graph()), ours_so, providers=["CPUExecutionProvider"])
    return ref, ours


def _feeds(rng: np.random.Generator, rows: int, new: int, cap: int, seqlens: list[int]) -> dict[str, np.ndarray]:
    return {"qkv": (rng.standard_normal((rows, new, 3 * HEADS * D)) * 2).astype(np.float32),
            "pk": rng.integers(-128, 128, (rows, HEADS, cap, D), dtype=np.int8),
            "pv": rng.integers(-128, 128, (rows, HEADS, cap, D), dtype=np.int8),
            "seqlens": np.array(seqlens, np.int32), "total": np.array([max(seqlens) + 1], np.int32)}


def _assert_same(ref: list[np.ndarray], ours: list[np.ndarray], rows_positions: list[tuple[int, int]]) -> None:
    """Attention outputs within float rounding (not int8 rounding), and the cache's positions
    ``(row, count)`` equal, but for a rare last-bit flip of a value on a rounding boundary."""
    (o_ref, k_ref, v_ref), (o, k, v) = ref, ours
    assert k.shape == k_ref.shape and v.shape == v_ref.shape
    for (b, count), (s0, s1) in zip(rows_positions, [(0, o.shape[1])] * len(rows_positions)):
        np.testing.assert_allclose(o[b, s0:s1], o_ref[b, s0:s1], rtol=0, atol=2e-5 * np.abs(o_ref[b]).max())
        for ours_c, ref_c in ((k, k_ref), (v, v_ref)):
            diff = np.abs(ours_c[b, :, :count].astype(np.int16) - ref_c[b, :, :count])
            assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


def test_decode_steps_of_rows_with_different_pasts_equal_group_query_attention(library: Path) -> None:
    ref, ours = _sessions(library)
    rng = np.random.default_rng(1)
    for seqlens in ([0, 17, 299], [5], [300] * 16):
        feeds = _feeds(rng, len(seqlens), 1, 320, seqlens)
        _assert_same(ref.run(None, feeds), ours.run(None, feeds), [(b, n + 1) for b, n in enumerate(seqlens)])


def test_a_right_padded_first_prompt_equals_group_query_attention_on_its_real_positions(library: Path) -> None:
    ref, ours = _sessions(library)
    rng = np.random.default_rng(2)
    seqlens = [6, 3, 0]
    feeds = _feeds(rng, 3, 7, 0, seqlens)
    expected, got = ref.run(None, feeds), ours.run(None, feeds)
    assert got[1].shape == (3, HEADS, 7, D)
    for b, n in enumerate(seqlens):  # padding positions are computed by both and read by neither
        np.testing.assert_allclose(got[0][b, :n + 1], expected[0][b, :n + 1], rtol=0,
                                   atol=2e-5 * np.abs(expected[0][b, :n + 1]).max())
        assert np.abs(got[1][b, :, :n + 1].astype(np.int16) - expected[1][b, :, :n + 1]).max() <= 1


def test_several_new_tokens_after_a_past_equal_group_query_attention(library: Path) -> None:
    ref, ours = _sessions(library)
    feeds = _feeds(np.random.default_rng(3), 1, 3, 64, [40])  # GroupQueryAttention takes one row so
    _assert_same(ref.run(None, feeds), ours.run(None, feeds), [(0, 41)])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cache_bound_to_past_and_present_is_written_in_place(library: Path, threads: int) -> None:
    """The engine binds one buffer to past and present: only the new positions change, and the
    step computes what it computes on separate buffers, on one thread or the pool."""
    _, ours = _sessions(library, threads)
    seqlens = [9, 200, 31, 77] * 4
    feeds = _feeds(np.random.default_rng(4), len(seqlens), 1, 256, seqlens)
    separate = ours.run(None, feeds)
    k, v = feeds["pk"].copy(), feeds["pv"].copy()
    binding = ours.io_binding()
    kv = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in (("k", k), ("v", v))}
    for name in ("qkv", "seqlens", "total"):
        binding.bind_cpu_input(name, feeds[name])
    binding.bind_ortvalue_input("pk", kv["k"])
    binding.bind_ortvalue_input("pv", kv["v"])
    binding.bind_output("o")
    binding.bind_ortvalue_output("ok", kv["k"])
    binding.bind_ortvalue_output("ov", kv["v"])
    ours.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], separate[0])
    np.testing.assert_array_equal(kv["k"].numpy(), separate[1])
    np.testing.assert_array_equal(kv["v"].numpy(), separate[2])
    written = np.zeros(k.shape, bool)
    for b, n in enumerate(seqlens):
        written[b, :, n] = True
    assert (kv["k"].numpy()[~written] == feeds["pk"][~written]).all()


def test_only_the_fused_steps_int8_attention_converts() -> None:
    assert attention_convertible(_gqa_graph().graph.node[0])
    assert not attention_convertible(_gqa_graph(softcap=30.0).graph.node[0])
    assert not attention_convertible(_gqa_graph(local_window_size=64).graph.node[0])
    assert not attention_convertible(_gqa_graph(rotary_interleaved=1).graph.node[0])
    fp32 = _gqa_graph()
    node = fp32.graph.node[0]
    kept = [a for a in node.attribute if a.name not in ("kv_cache_bit_width", "k_quant_type", "v_quant_type")]
    del node.attribute[:]
    node.attribute.extend(kept)
    assert not attention_convertible(node)
    with pytest.raises(ValueError, match="no GroupQueryAttention over an int8 KV cache"):
        with_own_attention(fp32)


def test_a_step_it_cannot_compute_is_an_error_not_a_crash(library: Path) -> None:
    _, ours = _sessions(library)
    feeds = _feeds(np.random.default_rng(5), 2, 1, 16, [3, 30])  # row 1's position is past its cache
    with pytest.raises(Exception, match=r"Int8KvAttention: seqlens_k\[b\] \+ 1 exceeds total_sequence_length"):
        ours.run(None, {**feeds, "total": np.array([20], np.int32)})


def test_the_fused_step_on_our_attention_gives_group_query_attentions_logits(library: Path,
                                                                             small_kv_artifacts: Artifacts) -> None:
    """The small step graph over an int8 cache, prefill then decode steps through the engine's
    runner (IO binding, the cache resident): logits within float rounding of GroupQueryAttention's."""
    from chattts_serving.engine.gpt import load_step_graph

    art = small_kv_artifacts
    opts = OrtOptions(2, False, kv_cache=KvPrecision.INT8)
    ref = GptStepRunner(art, opts)
    ours = GptStepRunner(art, opts)
    ours.use_session(make_session(with_own_attention(load_step_graph(art, ours.graph, KvPrecision.INT8)), opts,
                                  custom_ops=library))
    rng = np.random.default_rng(6)
    embeds = rng.standard_normal((2, 5, art.hidden_size), dtype=np.float32)
    lengths = np.array([5, 3])
    (ref_logits, _, ref_cache), (logits, _, cache) = (r.prefill(embeds, lengths) for r in (ref, ours))
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-4 * np.abs(ref_logits).max())
    caches = []
    for runner, first in ((ref, ref_cache), (ours, cache)):  # the engine's resident cache, decoded in place
        resident = runner.new_cache(2, 40)
        for row in range(2):
            resident.copy_row(row, first, row, int(lengths[row]))
        caches.append(resident)
    for step in range(20):
        x = rng.standard_normal((2, 1, art.hidden_size), dtype=np.float32)
        (ref_logits, _), (logits, _) = (r.decode(x, c, lengths + step) for r, c in zip((ref, ours), caches))
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-4 * np.abs(ref_logits).max())


def test_the_probe_moves_the_step_onto_the_faster_attention_and_keeps_its_int8_kernel(
        library: Path, small_kv_artifacts: Artifacts) -> None:
    """Offered only our attention, the start-up probe rebuilds the step on it (logits as before,
    within float rounding); offered only ONNX Runtime's, it keeps the session; a runner whose
    cache is not int8 has nothing to choose."""
    from chattts_serving.engine.kernels import GQA_ATTENTION, OWN_ATTENTION, choose_attention

    art = small_kv_artifacts
    runner = GptStepRunner(art, OrtOptions(2, False, kv_cache=KvPrecision.INT8))
    embeds = np.random.default_rng(7).standard_normal((2, 4, art.hidden_size), dtype=np.float32)
    before = runner.prefill(embeds, np.array([4, 2]))[0]
    kept = choose_attention(runner, steps=1, candidates=(GQA_ATTENTION,))
    assert kept is not None and kept.chosen == GQA_ATTENTION and kept.swap_s == 0
    choice = choose_attention(runner, steps=1, candidates=(OWN_ATTENTION,))
    assert choice is not None and choice.chosen == OWN_ATTENTION and choice.swap_s > 0
    assert set(choice.as_dict()["probe_ms"][OWN_ATTENTION]) == {"1", "16"}
    assert runner._attention == OWN_ATTENTION  # type: ignore[attr-defined]
    after = runner.prefill(embeds, np.array([4, 2]))[0]
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-4 * np.abs(before).max())
    assert choose_attention(GptStepRunner(art, OrtOptions(2, False))) is None
