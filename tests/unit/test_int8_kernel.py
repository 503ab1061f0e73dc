"""Our int8 kernel (``chattts.Int8BlockMatMul``, chattts_serving/int8_kernel.py): its
weight layout, its agreement with ONNX Runtime's ``MatMulNBits`` at accuracy level 4 (the same
numerics: agreement to float rounding, far tighter than int8 rounding) over the shapes the step
and the vocoders have and their edges, and the step graph on it (small config) giving the
exported kernel's logits and tokens.

Where the kernel cannot run (no ONNX Runtime header, no compiler, a CPU without AVX-512 VNNI)
these tests skip, naming why; under CI they fail instead (the CI machines have all three)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from chattts_serving import int8_kernel
from chattts_serving.contract import Precision
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.engine.kernels import OWN_KERNEL, choose_int8_kernel, probe_graph
from chattts_serving.int8_kernel import KernelUnavailable, convertible, pack, with_own_kernel
from chattts_serving.runtime import Artifacts, OrtOptions, make_session


@pytest.fixture(scope="module")
def library(int8_library: Path) -> Path:
    return int8_library


def test_pack_lays_each_panel_out_as_the_kernel_reads_it() -> None:
    """W[p, k//4, c, k%4] is weight (column 64p + c, input k) minus 128; S and Z per block and
    column; the padded columns are zero."""
    rng = np.random.default_rng(0)
    n, k, block = 70, 64, 32
    q = rng.integers(0, 256, (n, k // block, block), dtype=np.uint8)
    scales = rng.random((n, k // block), dtype=np.float32)
    w, s, z = pack(q, scales, k, n, block)
    assert w.shape == (2, k // 4, 64, 4) and w.dtype == np.int8
    assert s.shape == z.shape == (2, k // block, 64) and z.dtype == np.int32
    signed = q.reshape(n, k).astype(np.int32) - 128
    for col, kk in [(0, 0), (5, 7), (63, 63), (64, 1), (69, 40)]:
        assert w[col // 64, kk // 4, col % 64, kk % 4] == signed[col, kk]
        assert s[col // 64, kk // block, col % 64] == scales[col, kk // block]
        assert z[col // 64, kk // block, col % 64] == -128 * signed[col, (kk // block) * block:][:block].sum()
    assert not w[1, :, 6:].any() and not s[1, :, 6:].any() and not z[1, :, 6:].any()


def test_only_8_bit_weights_without_zero_points_convert() -> None:
    node = onnx.helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=64, N=8, bits=8,
                                 block_size=32)
    assert convertible(node)
    assert not convertible(onnx.helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                                                 K=64, N=8, bits=4, block_size=32))
    assert not convertible(onnx.helper.make_node("MatMulNBits", ["x", "w", "s", "zp"], ["y"],
                                                 domain="com.microsoft", K=64, N=8, bits=8, block_size=32))
    assert not convertible(onnx.helper.make_node("MatMul", ["x", "w"], ["y"]))
    with pytest.raises(ValueError, match="no 8-bit MatMulNBits"):
        with_own_kernel(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])))


@pytest.mark.parametrize(("k", "n", "block"), [(768, 2304, 32), (96, 200, 32), (512, 130, 256), (64, 64, 32)])
def test_the_kernel_multiplies_as_matmulnbits_level_4(library: Path, k: int, n: int, block: int) -> None:
    """Same weights, same activation rounding: the outputs agree to float summation order, for
    one row, the row counts of each tile (3, 2, 1 left over), a prefill's many rows, padded
    columns (N not a multiple of 64) and the vocoders' block of 256."""
    graph = probe_graph(k, n, block, 4, layers=2)
    ref = make_session(graph, OrtOptions(2, False))
    own = make_session(with_own_kernel(graph), OrtOptions(2, False), custom_ops=library)
    rng = np.random.default_rng(k + n)
    for rows in (1, 2, 3, 4, 5, 16, 37):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        x[0, :block] = 0.0  # a block of zeros: scale 0, no division by it
        for a, b in zip(ref.run(None, {"x": x}), own.run(None, {"x": x})):
            assert b.shape == (rows, n)
            np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * np.abs(a).max())


def test_the_kernel_keeps_leading_dimensions(library: Path) -> None:
    """A [B, T, K] input (the step's layout) comes out [B, T, N], each row as when alone."""
    from onnx import TensorProto, helper

    graph = onnx.load_from_string(probe_graph(64, 96, 32, 4, layers=1))
    graph.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 64]))
    graph.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", TensorProto.FLOAT, ["b", "t", 96]))
    own = make_session(with_own_kernel(graph), OrtOptions(1, False), custom_ops=library)
    x = np.random.default_rng(3).standard_normal((2, 3, 64), dtype=np.float32)
    (y,) = own.run(None, {"x": x})
    assert y.shape == (2, 3, 96)
    (row,) = own.run(None, {"x": x[1:2, 2:3]})
    np.testing.assert_array_equal(y[1, 2], row[0, 0])


def test_weights_packed_for_another_shape_are_refused_not_read(library: Path) -> None:
    """A graph whose packed scales do not fit K, N and block_size fails its run with the op's
    message instead of reading past the buffer."""
    graph = onnx.load_from_string(with_own_kernel(probe_graph(64, 96, 32, 4, layers=1)))
    scales = next(t for t in graph.graph.initializer if t.name.endswith("scales_panels"))
    short = onnx.numpy_helper.to_array(scales)[:, :1].copy()
    scales.CopyFrom(onnx.numpy_helper.from_array(short, scales.name))
    own = make_session(graph.SerializeToString(), OrtOptions(1, False), custom_ops=library)
    with pytest.raises(Exception, match="S and Z must hold"):
        own.run(None, {"x": np.ones((1, 64), np.float32)})


def test_no_header_says_where_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHATTTS_ORT_INCLUDE", str(tmp_path))
    monkeypatch.setattr(int8_kernel, "REPO_INCLUDE", tmp_path / "none")
    if Path("/usr/include/onnxruntime", int8_kernel.HEADER).is_file():
        pytest.skip("this machine has the header system-wide")
    with pytest.raises(KernelUnavailable, match=r"scripts/setup\.sh"):
        int8_kernel.library()


def test_the_step_on_our_kernel_gives_the_exported_kernels_logits(library: Path,
                                                                   small_int8_artifacts: Artifacts) -> None:
    """Offered only our kernel, the probe moves the int8 step onto it: prefill and decode logits
    within float rounding of MatMulNBits level 4's (far inside int8 rounding), greedy tokens equal."""
    art = small_int8_artifacts
    runner = GptStepRunner(art, OrtOptions(2, False, precision=Precision.INT8))
    rng = np.random.default_rng(5)
    embeds = rng.standard_normal((3, 6, art.hidden_size), dtype=np.float32)
    lengths = np.array([6, 4, 1])
    exported = runner.prefill(embeds, lengths)
    choice = choose_int8_kernel(runner, {}, steps=1, own=True)
    assert choice is not None and choice.chosen == OWN_KERNEL and choice.swap_s > 0
    assert choice.as_dict()["accuracy_level"] == 4
    ours = runner.prefill(embeds, lengths)
    scale = np.abs(exported[0]).max()
    np.testing.assert_allclose(ours[0], exported[0], rtol=0, atol=1e-4 * scale)
    assert (ours[0].argmax(-1) == exported[0].argmax(-1)).all()


@pytest.mark.parametrize("path", ["hidden", "codes"])
def test_an_int8_vocoder_runs_on_the_faster_kernel_with_the_same_numerics(
        library: Path, small_int8_artifacts: Artifacts, path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both vocoder runners time the exported MatMulNBits and our op on a window at start-up and
    keep the faster (logged); on our op a window's audio is within int8 rounding of the exported
    kernel's (blocks of 256: a rounding flip of one activation moves the audio, not the level)."""
    import logging

    from chattts_serving.audio.vocoder import StreamingVocoderRunner, VocoderRunner
    from chattts_serving.export.int8 import snr_db
    from chattts_serving.int8_kernel import EXPORTED, NAME, fastest_session

    art = small_int8_artifacts
    opts = OrtOptions(1, False, precision=Precision.INT8)
    with caplog.at_level(logging.INFO, logger="chattts_serving.int8_kernel"):
        offline = VocoderRunner(art, path, opts)
        streaming = StreamingVocoderRunner(art, path, opts)
    assert offline.kernel in {EXPORTED, NAME} and streaming.kernel in {EXPORTED, NAME}
    assert caplog.text.count("int8 kernel") >= 2
    rng = np.random.default_rng(7)
    window = (rng.standard_normal((1, 40, art.hidden_size), dtype=np.float32) if path == "hidden"
              else rng.integers(0, 600, (1, 40, 4)).astype(np.int32))
    feed = {offline.input_name: window}
    exported = make_session(offline.graph, opts).run(["audio"], feed)[0]
    _, name, ms = fastest_session(offline.graph, opts, lambda s: None)
    assert set(ms) == {EXPORTED, NAME} and name in ms
    own = make_session(with_own_kernel(offline.graph), opts, custom_ops=library).run(["audio"], feed)[0]
    assert own.shape == exported.shape and snr_db(exported, own) > 25.0


def test_a_library_built_for_another_image_runs_without_header_or_compiler(
        library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out DIR`` (the image's build stage) leaves DIR/int8_matmul.so; where
    ``$CHATTTS_INT8_KERNEL`` names it, :func:`int8_kernel.library` loads it with no compiler
    on PATH and no header (the served image has neither), and the op computes as built here."""
    out = tmp_path / "kernel"
    assert int8_kernel.main(["--out", str(out)]) == 0
    built = out / int8_kernel.OUT_NAME
    assert built.read_bytes() == int8_kernel.build().read_bytes()
    assert built.stat().st_mode & 0o755 == 0o755  # the image serves it as another user
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("CHATTTS_ORT_INCLUDE", str(empty))
    monkeypatch.setattr(int8_kernel, "REPO_INCLUDE", empty)
    with pytest.raises(KernelUnavailable):
        int8_kernel.build()  # what the served image would hit without the prebuilt library
    monkeypatch.setenv(int8_kernel.PREBUILT_ENV, str(built))
    assert int8_kernel.library() == built
    graph = probe_graph(64, 96, 32, 4, layers=1)
    x = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    ours = make_session(with_own_kernel(graph), OrtOptions(1, False), custom_ops=built).run(None, {"x": x})[0]
    ref = make_session(graph, OrtOptions(1, False)).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-4)


def test_a_prebuilt_library_that_is_missing_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image whose build stage could not build the kernel leaves the variable naming no file:
    the error says which, and the engine keeps ONNX Runtime's kernel (KernelUnavailable)."""
    monkeypatch.setenv(int8_kernel.PREBUILT_ENV, str(tmp_path / "int8_matmul.so"))
    with pytest.raises(KernelUnavailable, match=r"CHATTTS_INT8_KERNEL names .*int8_matmul.so, which does not exist"):
        int8_kernel.library()


def test_out_makes_its_directory_even_where_nothing_can_be_built(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's COPY of the kernel directory needs it to exist when the build stage had no
    header: ``--out`` makes it, says why it is empty and exits 0 (1 with ``--require``)."""
    monkeypatch.setattr(int8_kernel, "include_dir", lambda: None)  # no header in this build stage
    assert int8_kernel.main(["--out", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k").is_dir() and not any((tmp_path / "k").iterdir())
    assert int8_kernel.main(["--out", str(tmp_path / "k"), "--require"]) == 1


def test_the_probe_graph_loads_where_the_exported_graphs_load() -> None:
    """The start-up probe's graph carries the exported graphs' IR version (onnx's default is
    newer than some onnxruntime builds read, 1.23's in NVIDIA's image: every candidate would
    then be dropped and the choice silently skipped)."""
    from chattts_serving import contract

    probe = onnx.load_from_string(probe_graph(64, 96, 32, 4, layers=1))
    assert probe.ir_version == contract.ONNX_IR_VERSION == 8


def _mlp_graph(alpha: float = 1.0, extra_use: bool = False) -> onnx.ModelProto:
    """x -> gate|up MatMulNBits -> Split -> QuickGelu(gate) * up -> down MatMulNBits -> y, as the
    fused step's MLP (K = 64 hidden, F = 96); ``extra_use``: the product is a graph output too."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)

    def weights(name: str, k: int, n: int) -> list[onnx.TensorProto]:
        return [numpy_helper.from_array(rng.integers(0, 256, (n, k // 32, 32), dtype=np.uint8), f"{name}.q"),
                numpy_helper.from_array((rng.random((n, k // 32)) * 0.02 + 0.001).astype(np.float32), f"{name}.s")]

    nodes = [helper.make_node("MatMulNBits", ["x", "gu.q", "gu.s"], ["gu"], domain="com.microsoft", K=64, N=192,
                              bits=8, block_size=32, accuracy_level=4),
             helper.make_node("Split", ["gu", "halves"], ["gate", "up"], axis=-1),
             helper.make_node("QuickGelu", ["gate"], ["silu"], domain="com.microsoft", alpha=alpha),
             helper.make_node("Mul", ["silu", "up"], ["act"]),
             helper.make_node("MatMulNBits", ["act", "down.q", "down.s"], ["y"], domain="com.microsoft", K=96, N=64,
                              bits=8, block_size=32, accuracy_level=4)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 64])]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("act", TensorProto.FLOAT, ["m", 96]))
    inits = [*weights("gu", 64, 192), *weights("down", 96, 64),
             numpy_helper.from_array(np.array([96, 96], np.int64), "halves")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 64])],
                              outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def test_the_mlp_gate_folds_into_the_down_projection_with_the_same_numerics(library: Path) -> None:
    """Split, SiLU and Mul before the down projection become its gated mode: the same output as
    ONNX Runtime's nodes to float rounding, at 1 to 17 rows; a QuickGelu of another alpha, or a
    product read elsewhere too, is left as it is."""
    folded = onnx.load_from_string(with_own_kernel(_mlp_graph()))
    assert [n.op_type for n in folded.graph.node] == ["Int8BlockMatMul", "Int8BlockMatMul"]
    ours = make_session(folded.SerializeToString(), OrtOptions(2, False), custom_ops=library)
    ref = make_session(_mlp_graph().SerializeToString(), OrtOptions(2, False))
    for rows in (1, 3, 17):
        x = np.random.default_rng(rows).standard_normal((rows, 64), dtype=np.float32)
        expected = ref.run(None, {"x": x})[0]
        np.testing.assert_allclose(ours.run(None, {"x": x})[0], expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    for kept in (_mlp_graph(alpha=1.702), _mlp_graph(extra_use=True)):
        ops = [n.op_type for n in onnx.load_from_string(with_own_kernel(kept)).graph.node]
        assert ops == ["Int8BlockMatMul", "Split", "QuickGelu", "Mul", "Int8BlockMatMul"], ops
