"""IO binding (the ``gpu`` profile's device-resident KV cache), exercised on the CPU EP with numpy
buffers: the same engine code path as on CUDA with cupy, minus the device. The engine with IO
binding must decode exactly what it decodes without: codes token for token, hidden states
allclose, through joins, leaves, cancellation, KV growth, trims, row reuse and text mode."""

from __future__ import annotations

import numpy as np
import pytest

import chattts_serving.engine.scheduler as engine_mod
from chattts_serving import contract
from chattts_serving.contract import SequenceMode
from chattts_serving.engine import arrays
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig, Sequence
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
def runners(small_artifacts: Artifacts) -> tuple[GptStepRunner, GptStepRunner, Embeddings]:
    return (GptStepRunner(small_artifacts), GptStepRunner(small_artifacts, OrtOptions(io_binding=True)),
            Embeddings(small_artifacts))


def _scenario(runner: GptStepRunner, emb: Embeddings, h: int) -> tuple[list[Sink], dict[str, object]]:
    """12 requests through 3 slots: staggered joins, different prompt lengths and lengths,
    speakers, sampling seeds, 3 text-mode rows, one cancelled mid-way; KV_GROWTH and KV_TRIM
    are patched small by the caller so that growth and trims happen often."""
    eng = Engine(runner, emb, EngineConfig(max_batch_size=3))
    sinks: list[Sink] = []
    for i in range(12):
        sink = Sink(cancel_after=7 if i == 4 else None)
        sinks.append(sink)
        n = 10 + 4 * i
        params = SamplingParams(seed=i, max_new_tokens=n, min_new_tokens=n)
        if i % 4 == 3:
            seq = Sequence(_prompt(12 + i, 100 + i), None, params, sink, emit_tokens=2, mode=SequenceMode.TEXT)
        else:
            seq = Sequence(_prompt(14 + 3 * (i % 5), i), _spk(h, i), params, sink, emit_tokens=1 + i % 3)
        eng.submit(seq)
        for _ in range(i % 4):
            eng.run_once()
    while eng.live_count():
        eng.run_once()
    assert eng._kv == []
    return sinks, eng.stats()


def test_engine_with_io_binding_decodes_exactly_what_it_decodes_without(
        runners, small_artifacts: Artifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, bound, emb = runners
    assert bound.io_binding and bound.backend is arrays.NUMPY and not plain.io_binding
    monkeypatch.setattr(engine_mod, "KV_GROWTH", 3)
    monkeypatch.setattr(engine_mod, "KV_TRIM", 6)
    ref, ref_stats = _scenario(plain, emb, small_artifacts.hidden_size)
    got, stats = _scenario(bound, emb, small_artifacts.hidden_size)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.errors == b.errors == []
        assert a.reason == b.reason, i
        np.testing.assert_array_equal(np.concatenate(b.codes), np.concatenate(a.codes), err_msg=f"request {i}")
        np.testing.assert_allclose(np.concatenate(b.hidden), np.concatenate(a.hidden), atol=1e-5, rtol=0)
    assert stats["batch_sizes"] == ref_stats["batch_sizes"]
    assert int(stats["row_reuses"]) >= 1 and int(stats["rebuilds"]) >= 3, stats  # type: ignore[call-overload]
    assert stats["cancelled"] == 1


def test_bound_step_equals_session_run(runners, small_artifacts: Artifacts) -> None:
    """One prefill and one decode over a cache with masked spare columns: same outputs."""
    plain, bound, _ = runners
    rng = np.random.default_rng(5)
    b, t, h = 3, 7, small_artifacts.hidden_size
    embeds = rng.standard_normal((b, t, h), dtype=np.float32)
    mask = np.ones((b, t), np.int64)
    mask[0, :3] = 0
    l0, h0, p0 = plain.run(embeds, mask, plain.empty_past(b))
    l1, h1, p1 = bound.step(embeds, mask, bound.empty_past(b))
    np.testing.assert_array_equal(l1, l0)
    np.testing.assert_array_equal(h1, h0)
    for x, y in zip(p1, p0):
        np.testing.assert_array_equal(x, y)
    spare = 4
    past = [np.concatenate([p, rng.standard_normal((*p.shape[:2], spare, p.shape[3]), dtype=np.float32)], 2)
            for p in p0]
    mask2 = np.concatenate([mask, np.zeros((b, spare), np.int64), np.ones((b, 1), np.int64)], 1)
    step = rng.standard_normal((b, 1, h), dtype=np.float32)
    l0, h0, n0 = plain.run(step, mask2, past)
    l1, h1, n1 = bound.step(step, mask2, past, reuse_outputs=True)
    np.testing.assert_array_equal(l1, l0)
    np.testing.assert_array_equal(h1, h0)
    for x, y in zip(n1, n0):
        np.testing.assert_array_equal(x, y)
    # reused output buffers: the same arrays come back for the same (B, T)
    _, _, n2 = bound.step(step, mask2, past, reuse_outputs=True)
    assert all(x is y for x, y in zip(n1, n2))


def test_kv_buffers_stay_in_place_between_decode_steps(runners, small_artifacts: Artifacts) -> None:
    """With IO binding the engine's KV buffers are bound, not copied: between growths, a
    decode step writes one column into the same buffers (the property that keeps the cache
    on the device on CUDA)."""
    _, bound, emb = runners
    eng = Engine(bound, emb, EngineConfig())
    eng.submit(Sequence(_prompt(20, 1), None, SamplingParams(max_new_tokens=8, min_new_tokens=8), Sink()))
    eng.run_once()
    bufs, ptrs = list(eng._kv), [arrays.NUMPY.ptr(b) for b in eng._kv]
    w = eng._width
    eng.run_once()
    assert eng._width == w + 1
    assert all(a is b for a, b in zip(bufs, eng._kv))
    assert [arrays.NUMPY.ptr(b) for b in eng._kv] == ptrs
    assert int(eng._mask[0, -1]) == 1 and eng._mask.shape[1] == eng._kv[0].shape[2] + 1


def test_bound_buffers_must_be_contiguous(runners, small_artifacts: Artifacts) -> None:
    _, bound, _ = runners
    b, h = 2, small_artifacts.hidden_size
    past = [np.zeros((b, small_artifacts.num_heads, 6, small_artifacts.head_dim), np.float32)[:, :, ::2]
            for _ in range(2 * bound.layers)]
    with pytest.raises(ValueError, match="contiguous"):
        bound.step(np.zeros((b, 1, h), np.float32), np.ones((b, 4), np.int64), past)


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
    assert cpu.precision == "fp32" and cpu.providers == ("CPUExecutionProvider",)


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
    logits, hidden, new_kv = r.run(np.zeros((b, 5, h), np.float32), np.ones((b, 5), np.int64), r.empty_past(b))
    assert logits.dtype == hidden.dtype == np.float32 and np.isfinite(logits).all()
    assert all(k.dtype == np.float16 and k.shape == (b, fp16_artifacts.num_heads, 5, fp16_artifacts.head_dim)
               for k in new_kv)


def test_fp16_engine_with_io_binding_decodes_exactly_what_it_decodes_without(
        fp16_artifacts: Artifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    emb = Embeddings(fp16_artifacts)
    plain = GptStepRunner(fp16_artifacts, OrtOptions(precision="fp16"))
    bound = GptStepRunner(fp16_artifacts, OrtOptions(precision="fp16", io_binding=True))
    monkeypatch.setattr(engine_mod, "KV_GROWTH", 3)
    monkeypatch.setattr(engine_mod, "KV_TRIM", 6)
    ref, _ = _scenario(plain, emb, fp16_artifacts.hidden_size)
    got, _ = _scenario(bound, emb, fp16_artifacts.hidden_size)
    for i, (a, b) in enumerate(zip(ref, got)):
        np.testing.assert_array_equal(np.concatenate(b.codes), np.concatenate(a.codes), err_msg=f"request {i}")
        np.testing.assert_allclose(np.concatenate(b.hidden), np.concatenate(a.hidden), atol=1e-5, rtol=0)


def test_fp16_without_fp16_graphs_is_a_clear_error(small_artifacts: Artifacts) -> None:
    with pytest.raises(FileNotFoundError, match="--precision fp16"):
        GptStepRunner(small_artifacts, OrtOptions(precision="fp16"))
