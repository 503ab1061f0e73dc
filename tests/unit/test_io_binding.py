"""IO binding of the fused GPT step (the KV cache bound as both past and present, written in
place), exercised on the CPU EP with numpy buffers: the same runner code path as on CUDA with
cupy, minus the device. The bound step must compute what a plain ``session.run`` computes, and
the cache must end up holding exactly the present ``session.run`` returns."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.contract import SequenceMode
from chattts_serving.engine import arrays
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts, OrtOptions
from chattts_serving.serving.profile import load_profile

Sink = CollectingSink


def _prompt(n: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(200, 7000, n)
    ids[0], ids[1], ids[-1] = 21131, contract.SPECIAL_TOKEN_IDS["[spk_emb]"], 21132
    return ids


def _spk(h: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=h).astype(np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def runner(small_artifacts: Artifacts) -> GptStepRunner:
    return GptStepRunner(small_artifacts, OrtOptions(io_binding=True))


def _plain_run(r: GptStepRunner, embeds: np.ndarray, seqlens_k: np.ndarray,
               past: list[np.ndarray]) -> list[np.ndarray]:
    """The graph through ``session.run`` (no binding: ORT allocates the presents)."""
    feed = {contract.G_EMBEDS: embeds, contract.G_SEQLENS_K: seqlens_k.astype(np.int32),
            contract.G_TOTAL_SEQ: np.array([int(seqlens_k.max()) + 1], np.int32)}
    feed.update({n: p for n, p in zip((n for i in range(r.layers) for n in contract.past_names(i)), past)})
    return list(r.session.run(None, feed))


def test_bound_decode_equals_session_run_and_writes_the_cache_in_place(runner: GptStepRunner,
                                                                       small_artifacts: Artifacts) -> None:
    """Rows of lengths 0 (none), 3 and 9 in a cache of 12 columns of garbage: the bound decode's
    logits and hidden equal ``session.run``'s; the cache afterwards equals the presents
    ``session.run`` returned (one column per row written, at its length), in the same arrays
    at the same addresses; a second step with the same rows reuses the binding."""
    rng = np.random.default_rng(5)
    h = small_artifacts.hidden_size
    cache = runner.new_cache(3, 12)
    for buf in cache.buffers:
        buf[...] = rng.standard_normal(buf.shape, dtype=np.float32)
    ptrs = [arrays.NUMPY.ptr(b) for b in cache.buffers]
    lengths = np.array([0, 3, 9])
    for _ in range(2):
        embeds = rng.standard_normal((3, 1, h), dtype=np.float32)
        past = [b.copy() for b in cache.buffers]
        ref = _plain_run(runner, embeds, lengths, past)
        logits, hidden = runner.decode(embeds, cache, lengths)
        np.testing.assert_array_equal(logits[1:], ref[0][1:])
        np.testing.assert_array_equal(hidden[1:], ref[1][1:])
        for got, want, old in zip(cache.buffers, ref[2:], past):
            for r, n in enumerate(lengths):
                np.testing.assert_array_equal(got[r, :, :n + 1], want[r, :, :n + 1])
                np.testing.assert_array_equal(got[r, :, n + 1:], old[r, :, n + 1:])  # nothing else moved
        assert [arrays.NUMPY.ptr(b) for b in cache.buffers] == ptrs
        bound = runner._bound
        lengths = lengths + 1
    assert runner._bound is bound  # same cache and rows: the KV bindings were kept


def test_decode_over_fewer_rows_rebinds_and_stays_right(runner: GptStepRunner, small_artifacts: Artifacts) -> None:
    """The step covers the first B rows of the cache; B changing between steps rebinds."""
    rng = np.random.default_rng(6)
    h = small_artifacts.hidden_size
    cache = runner.new_cache(4, 8)
    for buf in cache.buffers:
        buf[...] = rng.standard_normal(buf.shape, dtype=np.float32)
    for b in (4, 2, 3):
        embeds = rng.standard_normal((b, 1, h), dtype=np.float32)
        lengths = np.arange(b) + 2
        ref = _plain_run(runner, embeds, lengths, [buf[:b].copy() for buf in cache.buffers])
        logits, _ = runner.decode(embeds, cache, lengths)
        np.testing.assert_array_equal(logits, ref[0])
        assert runner._bound is not None and runner._bound[1] == b


def test_prefill_of_right_padded_prompts_equals_each_prompt_alone(runner: GptStepRunner,
                                                                  small_artifacts: Artifacts) -> None:
    """Prompts of 7, 3 and 5 positions prefilled together, right-padded, give each one's
    own logits, hidden and KV (to rounding): padding never reaches a real position."""
    rng = np.random.default_rng(7)
    h = small_artifacts.hidden_size
    lens = [7, 3, 5]
    embeds = np.zeros((3, 7, h), np.float32)
    for r, n in enumerate(lens):
        embeds[r, :n] = rng.standard_normal((n, h), dtype=np.float32)
        embeds[r, n:] = 1e3  # loud padding
    logits, hidden, kv = runner.prefill(embeds, np.array(lens))
    for r, n in enumerate(lens):
        l1, h1, kv1 = runner.prefill(embeds[r:r + 1, :n], np.array([n]))
        np.testing.assert_allclose(logits[r], l1[0], atol=2e-5, rtol=0)
        np.testing.assert_allclose(hidden[r], h1[0], atol=2e-5, rtol=0)
        for a, b in zip(kv.buffers, kv1.buffers):
            np.testing.assert_allclose(a[r, :, :n], b[0], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="lengths"):
        runner.prefill(embeds, np.array([8, 1, 1]))


def test_a_full_row_is_refused_not_overrun(runner: GptStepRunner, small_artifacts: Artifacts) -> None:
    cache = runner.new_cache(1, 4)
    with pytest.raises(ValueError, match="full"):
        runner.decode(np.zeros((1, 1, small_artifacts.hidden_size), np.float32), cache, np.array([4]))


def test_bound_buffers_must_be_contiguous() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        arrays.NUMPY.ptr(np.zeros((2, 4, 6, 8), np.float32)[:, :, ::2])


def test_an_old_unfused_step_graph_is_refused_with_the_fix(tmp_path, small_artifacts: Artifacts) -> None:
    """Artifacts exported before the fused graph (per-layer past in, new KV out, a mask) are
    refused at load with the command that fixes them, not run wrongly."""
    import onnx
    from onnx import TensorProto, helper

    for p in small_artifacts.root.iterdir():
        if p.name != contract.GPT_GRAPH:
            (tmp_path / p.name).symlink_to(p)
    x = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, ["b", "t"])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["attention_mask"], ["y"])],
                                                  "old", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / contract.GPT_GRAPH))
    with pytest.raises(RuntimeError, match="make export"):
        GptStepRunner(Artifacts.load(tmp_path))


def _scenario(runner: GptStepRunner, emb: Embeddings, h: int) -> list[Sink]:
    """12 requests through 3 rows: staggered joins, different prompt lengths and lengths,
    speakers, sampling seeds, 3 text-mode rows, one cancelled mid-way."""
    eng = Engine(runner, emb, EngineConfig(max_batch_size=3))
    sinks: list[Sink] = []
    for i in range(12):
        sink = Sink(cancel_after=7 if i == 4 else None)
        sinks.append(sink)
        n = 10 + 4 * i
        params = SamplingParams(seed=i, max_new_tokens=n, min_new_tokens=n)
        if i % 4 == 3:
            seq = make_sequence(_prompt(12 + i, 100 + i), None, params, sink, emit_tokens=2, mode=SequenceMode.TEXT)
        else:
            seq = make_sequence(_prompt(14 + 3 * (i % 5), i), _spk(h, i), params, sink, emit_tokens=1 + i % 3)
        eng.submit(seq)
        for _ in range(i % 4):
            eng.run_once()
    while eng.live_count():
        eng.run_once()
    assert eng.running() == []
    return sinks


def test_cuda_io_binding_without_cupy_falls_back_to_host_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cupy(device_id: int = 0) -> arrays.ArrayBackend:
        raise ImportError("No module named 'cupy'")

    monkeypatch.setattr(arrays, "cupy_backend", no_cupy)
    assert arrays.backend_for_session(["CUDAExecutionProvider", "CPUExecutionProvider"], True) is arrays.NUMPY
    assert arrays.backend_for_session(["CPUExecutionProvider"], True) is arrays.NUMPY
    called = []
    monkeypatch.setattr(arrays, "cupy_backend", lambda device_id=0: called.append(device_id) or arrays.NUMPY)
    arrays.backend_for_session(["CUDAExecutionProvider", "CPUExecutionProvider"], True, 0)
    arrays.backend_for_session(["CUDAExecutionProvider", "CPUExecutionProvider"], False, 0)
    assert called == [0]


def test_profiles_select_io_binding_and_precision() -> None:
    gpu = load_profile("gpu")
    opts = gpu.ort("engine")
    assert opts.io_binding and opts.precision == "fp16" and opts.providers[0] == "CUDAExecutionProvider"
    assert opts.device_id == gpu.gpu_ids[0] == 0
    assert not gpu.ort("vocoder").io_binding and gpu.ort("vocoder").precision == "fp16"
    cpu = load_profile("cpu").ort("engine")
    assert cpu.precision == "auto" and cpu.providers == ("CPUExecutionProvider",)
    assert load_profile("cpu-fp32").ort("engine").precision == "fp32"


# ---- fp16 ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp16_artifacts(small_chat, small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """The small artifacts plus their fp16 graphs (``chattts-export --precision fp16``)."""
    import shutil

    from chattts_serving.export.fp16 import add_fp16

    root = tmp_path_factory.mktemp("fp16") / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    assert add_fp16(small_chat, root)
    assert not add_fp16(small_chat, root)  # up to date: reused
    return Artifacts.load(root)


def test_fp16_graphs_match_chattts_fp32_modules_within_the_fp16_tolerance(fp16_artifacts: Artifacts) -> None:
    from chattts_serving.export.build import verify_artifacts
    from chattts_serving.export.fp16 import FP16_RELATIVE_TOLERANCE, FP16_STAGES, has_fp16

    man = verify_artifacts(fp16_artifacts.root)  # the fp16 files are hashed in the manifest
    assert has_fp16(fp16_artifacts)
    parity = man["parity_fp16"]
    assert set(parity) == set(FP16_STAGES)
    for stage, e in parity.items():
        assert e["rel"] <= FP16_RELATIVE_TOLERANCE, (stage, e)
        assert e["abs"] > 0, f"{stage}: no rounding error at all, so the fp16 graph did not run"
    assert FP16_RELATIVE_TOLERANCE <= 2e-2


def test_fp16_step_keeps_float32_io_and_an_fp16_kv_cache(fp16_artifacts: Artifacts) -> None:
    r = GptStepRunner(fp16_artifacts, OrtOptions(precision="fp16"))
    assert r.kv_dtype is np.float16
    b, h = 2, fp16_artifacts.hidden_size
    logits, hidden, kv = r.prefill(np.zeros((b, 5, h), np.float32), np.array([5, 2]))
    assert logits.dtype == hidden.dtype == np.float32 and np.isfinite(logits).all()
    assert all(k.dtype == np.float16 and k.shape == (b, fp16_artifacts.num_heads, 5, fp16_artifacts.head_dim)
               for k in kv.buffers)
    cache = r.new_cache(b, 8)
    assert cache.buffers[0].dtype == np.float16
    logits, _ = r.decode(np.zeros((b, 1, h), np.float32), cache, np.array([3, 0]))
    assert np.isfinite(logits).all()


def test_fp16_engine_is_deterministic_through_joins_leaves_and_text_mode(fp16_artifacts: Artifacts) -> None:
    """The fp16 engine over its fp16 KV cache runs the whole scenario and decodes the same
    tokens twice (every row's result is its own: no dependence on the run's history)."""
    emb = Embeddings(fp16_artifacts)
    r = GptStepRunner(fp16_artifacts, OrtOptions(precision="fp16", io_binding=True))
    a = _scenario(r, emb, fp16_artifacts.hidden_size)
    b = _scenario(r, emb, fp16_artifacts.hidden_size)
    for i, (x, y) in enumerate(zip(a, b)):
        assert not x.errors and x.reason == y.reason
        np.testing.assert_array_equal(x.all_codes, y.all_codes, err_msg=f"request {i}")


def test_fp16_without_fp16_graphs_is_a_clear_error(small_artifacts: Artifacts) -> None:
    with pytest.raises(FileNotFoundError, match="--precision fp16"):
        GptStepRunner(small_artifacts, OrtOptions(precision="fp16"))


# ---- the CUDA path, without a GPU --------------------------------------------------------------

class _FakeIO:
    """Records what a runner binds (ONNX Runtime's IOBinding interface)."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[object, ...]] = {}
        self.outputs: dict[str, tuple[object, ...]] = {}
        self.cpu_inputs: dict[str, np.ndarray] = {}

    def bind_input(self, name, device_type, device_id, dtype, shape, ptr):  # type: ignore[no-untyped-def]
        self.inputs[name] = (device_type, device_id, np.dtype(dtype), tuple(shape), ptr)

    def bind_output(self, name, device_type, device_id, dtype, shape, ptr):  # type: ignore[no-untyped-def]
        self.outputs[name] = (device_type, device_id, np.dtype(dtype), tuple(shape), ptr)

    def bind_cpu_input(self, name: str, arr: np.ndarray) -> None:
        self.cpu_inputs[name] = arr.copy()

    def synchronize_inputs(self) -> None:
        pass

    def synchronize_outputs(self) -> None:
        pass


class _FakeSession:
    def __init__(self) -> None:
        self.bindings: list[_FakeIO] = []
        self.runs = 0

    def io_binding(self) -> _FakeIO:
        self.bindings.append(_FakeIO())
        return self.bindings[-1]

    def run_with_iobinding(self, io: _FakeIO) -> None:
        self.runs += 1


class _DeviceArray:
    """Stands for a cupy array: a shape, a dtype and a device address."""

    next_ptr = 1 << 40

    def __init__(self, shape: tuple[int, ...], dtype: object) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.flags = type("Flags", (), {"c_contiguous": True})()
        self.data = type("Mem", (), {"ptr": _DeviceArray.next_ptr})()
        self.size = int(np.prod(shape))
        _DeviceArray.next_ptr += 1 << 32


def _fake_cuda_backend(device_id: int) -> arrays.ArrayBackend:
    from types import SimpleNamespace

    synced: list[int] = []
    xp = SimpleNamespace(zeros=_DeviceArray, synced=synced,
                         cuda=SimpleNamespace(Device=lambda i: SimpleNamespace(synchronize=lambda: synced.append(i))))
    return arrays.ArrayBackend(xp, "cuda", device_id)  # type: ignore[arg-type]


def test_on_cuda_the_cache_is_bound_as_device_memory_for_past_and_present(small_artifacts: Artifacts) -> None:
    """The gpu profile's runner (CUDA EP, IO binding, a device-resident cache), with the device
    faked: each layer's K and V are bound as past AND present at the same device address
    (the first B rows, the whole capacity), on the profile's GPU; only the embeddings, the row
    lengths and the total length go in from the host and only logits and hidden come back; the
    device is synchronised before each step; a step over the same rows keeps its binding."""
    opts = load_profile("gpu").ort("engine")
    opts = OrtOptions(opts.intra_op_threads, opts.allow_spinning, opts.providers, opts.io_binding, "fp32", 1)
    r = GptStepRunner(small_artifacts, opts)  # the CPU-only build drops the CUDA EP: swap in the device
    be = _fake_cuda_backend(1)
    r.backend, r.session = be, _FakeSession()
    r._placeholder = be.zeros((1,), np.float32)
    cache = r.new_cache(3, 10)
    assert all(isinstance(b, _DeviceArray) and b.shape == (3, small_artifacts.num_heads, 10, small_artifacts.head_dim)
               for b in cache.buffers)
    h = small_artifacts.hidden_size
    for b, lengths in ((2, [4, 7]), (2, [5, 8]), (3, [6, 9, 0])):
        r.decode(np.zeros((b, 1, h), np.float32), cache, np.array(lengths))
        io = r.session.bindings[-1]
        for i in range(small_artifacts.num_layers):
            for j, (past, present) in enumerate(zip(contract.past_names(i), contract.present_names(i))):
                buf = cache.buffers[2 * i + j]
                want = ("cuda", 1, np.dtype(np.float32), (b, *buf.shape[1:]), buf.data.ptr)
                assert io.inputs[past] == want and io.outputs[present] == want
        np.testing.assert_array_equal(io.cpu_inputs[contract.G_SEQLENS_K], np.array(lengths, np.int32))
        assert io.cpu_inputs[contract.G_SEQLENS_K].dtype == np.int32
        np.testing.assert_array_equal(io.cpu_inputs[contract.G_TOTAL_SEQ], [max(lengths) + 1])
        assert io.cpu_inputs[contract.G_EMBEDS].shape == (b, 1, h)
        assert io.outputs[contract.G_LOGITS][0] == io.outputs[contract.G_HIDDEN][0] == "cpu"
    assert len(r.session.bindings) == 2 and r.session.runs == 3  # B=2 twice: one binding; B=3: a new one
    assert be.xp.synced == [1, 1, 1]  # type: ignore[attr-defined]

    _, _, kv = r.prefill(np.zeros((2, 5, h), np.float32), np.array([5, 3]))
    io = r.session.bindings[-1]
    buf = kv.buffers[0]
    assert io.inputs["past_key_0"] == ("cuda", 1, np.dtype(np.float32), (2, small_artifacts.num_heads, 0,
                                                                         small_artifacts.head_dim),
                                       r._placeholder.data.ptr)
    assert io.outputs["present_key_0"] == ("cuda", 1, np.dtype(np.float32), buf.shape, buf.data.ptr)
    np.testing.assert_array_equal(io.cpu_inputs[contract.G_SEQLENS_K], [4, 2])


def test_the_gpu_profile_asks_for_cuda_on_its_device_with_the_cpu_as_fallback() -> None:
    from chattts_serving.runtime import session_providers

    opts = load_profile("gpu").ort("engine")
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert session_providers(opts, cuda) == [
        ("CUDAExecutionProvider", {"device_id": "0", "do_copy_in_default_stream": "1"}), "CPUExecutionProvider"]
    assert session_providers(OrtOptions(providers=opts.providers, device_id=2), cuda)[0][1]["device_id"] == "2"
    assert session_providers(opts, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]  # a CPU-only build
    assert opts.precision == "fp16" and opts.io_binding  # ORT's CUDA GroupQueryAttention takes fp16/bf16 only
