"""Export: parity with ChatTTS' torch modules, greedy equality with ChatTTS' own generation,
the manifest, reuse of up-to-date artifacts, and clear errors for bad sources."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from chattts_serving import contract
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.export.build import PARITY_TOLERANCE, export_artifacts, sha256_file
from chattts_serving.export.fused import FUSED_LAYOUT
from chattts_serving.export.parity import chattts_prompt, parity_report
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.text.speaker import normalize_speaker

ROOT = Path(__file__).resolve().parents[2]


def test_every_stage_matches_chattts_within_tolerance(small_chat, small_artifacts: Artifacts) -> None:
    report = parity_report(small_chat, small_artifacts.root)
    assert set(report) == {"embed_prompt", "gpt_prefill_logits", "gpt_prefill_hidden", "gpt_decode_logits",
                           "gpt_decode_hidden", "gpt_decode_spare_columns_logits", "vocoder_hidden", "vocoder_codes",
                           "text_head_logits", "gpt_text_prefill_logits", "gpt_text_decode_logits"}
    for stage, err in report.items():
        assert err <= PARITY_TOLERANCE, f"{stage}: max abs error {err} > {PARITY_TOLERANCE}"
    assert PARITY_TOLERANCE <= 1e-4


_Collect = CollectingSink


def test_engine_greedy_codes_equal_chattts_generate(small_chat, small_artifacts: Artifacts) -> None:
    """Our decode loop over the exported step == ChatTTS' GPT.generate, token for token, for
    three copies of the request joining the in-flight batch at different steps."""
    chat = small_chat
    torch.manual_seed(3)
    spk = chat.speaker.sample_random()
    text = "你好，欢迎使用流式语音合成。"
    n = 48
    params = chat.InferCodeParams(spk_emb=spk, temperature=1e-5, manual_seed=0, max_new_token=n,
                                  min_new_token=n, show_tqdm=False, repetition_penalty=1.05)
    ref = next(chat._infer_code([text], False, torch.device("cpu"), True, params))
    ref_codes = ref.ids[0].numpy()
    ref_hidden = ref.hiddens[0].numpy()
    assert ref_codes.shape == (n, contract.NUM_VQ)

    input_ids, _, _ = chattts_prompt(chat, [text], spk)
    ids = input_ids[0, :, 0].numpy().astype(np.int64)
    spk_vec = normalize_speaker(chat.speaker._decode(spk).astype(np.float32))
    engine = Engine(GptStepRunner(small_artifacts), Embeddings(small_artifacts), EngineConfig())
    sinks = []
    for _ in range(3):
        sink = _Collect()
        sinks.append(sink)
        engine.submit(make_sequence(ids, spk_vec, SamplingParams(temperature=1e-5, max_new_tokens=n, min_new_tokens=n),
                               sink, emit_tokens=5))
        engine.run_once()
        engine.run_once()
    while engine.live_count():
        engine.run_once()
    for sink in sinks:
        np.testing.assert_array_equal(np.concatenate(sink.codes), ref_codes)
        np.testing.assert_allclose(np.concatenate(sink.hidden), ref_hidden, atol=1e-4)
        assert sink.reason == contract.StopReason.MAX_TOKENS and not sink.errors
    assert max(int(k) for k in engine.stats()["batch_sizes"]) == 3  # type: ignore[attr-defined]


def test_manifest_records_geometry_tensors_and_hashes(small_artifacts: Artifacts) -> None:
    m = small_artifacts.manifest
    assert m["sample_rate_hz"] == contract.SAMPLE_RATE_HZ == 24000
    assert m["samples_per_token"] == contract.SAMPLES_PER_TOKEN == 512
    assert m["opset"] >= 17
    step = m["graphs"]["gpt_step"]
    names = [t["name"] for t in step["inputs"]]
    assert names[:3] == [contract.G_EMBEDS, contract.G_SEQLENS_K, contract.G_TOTAL_SEQ]
    assert names[3:5] == list(contract.past_names(0))
    assert [t["name"] for t in step["outputs"]][:4] == [contract.G_LOGITS, contract.G_HIDDEN,
                                                         *contract.present_names(0)]
    assert step["layout"] == FUSED_LAYOUT
    assert step["outputs"][0]["shape"][1:] == [contract.NUM_VQ, contract.NUM_AUDIO_TOKENS]
    for rel, digest in m["files"].items():
        assert sha256_file(small_artifacts.root / rel) == digest
    assert m["receptive_field_tokens"]["hidden"] >= 1
    assert m["source"]["kind"] == "synthetic"


def test_the_gpt_step_is_the_fused_graph(small_artifacts: Artifacts) -> None:
    """Per layer one packed QKV MatMul, one GroupQueryAttention (rotary inside), one packed
    gate/up MatMul, fused RMSNorms with the residual add; no attention spelled out in
    primitives (Softmax, Concat of the cache) and none of the projections unpacked."""
    import onnx

    model = onnx.load(str(small_artifacts.root / contract.GPT_GRAPH))
    ops = Counter(n.op_type for n in model.graph.node)
    layers = small_artifacts.num_layers
    assert ops["GroupQueryAttention"] == layers
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers - 1 and ops["SimplifiedLayerNormalization"] == 2
    assert ops["MatMul"] == 4 * layers + 1  # qkv, o, gate/up, down per layer, then the code heads
    assert ops["QuickGelu"] == layers and "Softmax" not in ops
    assert ops["Concat"] <= 1  # only the last-position gather's shape, never a KV cache
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["do_rotary"] == 1 and attrs["num_heads"] == attrs["kv_num_heads"] == small_artifacts.num_heads
    assert len(model.graph.node) < 12 * layers + 20, len(model.graph.node)


def test_rerun_reuses_up_to_date_artifacts(small_weights: Path, small_artifacts: Artifacts) -> None:
    _, exported = export_artifacts(small_weights, small_artifacts.root, source=small_artifacts.manifest["source"])
    assert exported is False


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chattts_serving.export", "--quiet", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def _assert_one_clear_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("chattts-export: error:")]
    assert len(err_lines) == 1, proc.stderr
    for needle in needles:
        assert needle in err_lines[0], err_lines[0]


def test_missing_asset_directory_is_one_clear_error(tmp_path: Path) -> None:
    proc = _cli("--assets", str(tmp_path / "nope"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_one_clear_line(proc, "does not exist")
    assert not (tmp_path / "out").exists()


def test_corrupt_asset_is_one_clear_error_and_leaves_no_artifacts(tmp_path: Path, small_weights: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(small_weights, snap)
    (snap / "asset" / "Vocos.safetensors").write_bytes(b"\x00garbage" * 10)
    proc = _cli("--assets", str(snap), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_one_clear_line(proc, "Vocos.safetensors")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_missing_file_is_named(tmp_path: Path, small_weights: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(small_weights, snap)
    (snap / "asset" / "DVAE.safetensors").unlink()
    proc = _cli("--assets", str(snap), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_one_clear_line(proc, "DVAE.safetensors")


def test_tokenizer_of_wrong_vocabulary_size_is_refused(tmp_path: Path, small_weights: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(small_weights, snap)
    tok = snap / "asset" / "tokenizer" / "tokenizer.json"
    data = json.loads(tok.read_text())
    data["added_tokens"] = data["added_tokens"][:-3]
    tok.write_text(json.dumps(data))
    for extra in ("added_tokens.json", "special_tokens_map.json"):
        (snap / "asset" / "tokenizer" / extra).unlink(missing_ok=True)
    cfg = snap / "asset" / "tokenizer" / "tokenizer_config.json"
    conf = json.loads(cfg.read_text())
    decoder = conf.get("added_tokens_decoder", {})
    for key in sorted(decoder, key=int)[-3:]:
        del decoder[key]
    conf.pop("extra_special_tokens", None)
    conf.pop("additional_special_tokens", None)
    cfg.write_text(json.dumps(conf))
    proc = _cli("--assets", str(snap), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_one_clear_line(proc, "tokens", str(contract.TEXT_VOCAB_SIZE))
    assert not (tmp_path / "out").exists()


def test_unreachable_download_is_one_clear_error(tmp_path: Path) -> None:
    proc = _cli("--download", "--weights-dir", str(tmp_path / "hf"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_one_clear_line(proc, "Hugging Face")
    assert not (tmp_path / "out").exists()


def test_help_lists_the_three_sources() -> None:
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.export", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--assets", "--download", "--synthetic", "--size", "--seed"):
        assert flag in proc.stdout


def test_assets_snapshot_exports_through_the_cli(tmp_path: Path, small_weights: Path,
                                                 small_artifacts: Artifacts) -> None:
    """The real-weights path (--assets) on a checkpoint in the published layout gives the
    same graphs as the synthetic path (same weights, same exporter)."""
    snap = tmp_path / "ChatTTS"
    shutil.copytree(small_weights, snap)
    proc = _cli("--assets", str(snap), "--out", str(tmp_path / "art"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["source"] == {"kind": "assets", "path": str(snap.resolve())}
    assert man["files"][contract.GPT_GRAPH] == small_artifacts.manifest["files"][contract.GPT_GRAPH]
    assert max(man["parity_max_abs_error"].values()) <= PARITY_TOLERANCE
