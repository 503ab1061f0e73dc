"""Export a ChatTTS checkpoint into the artifact directory the Triton models load.

Artifacts (names from :mod:`chattts_serving.contract`)::

    gpt_step.onnx          GPT prefill/decode step, fused (export/fused.py): KV cache bound in place
    vocoder_hidden.onnx    hidden (B, T, H) -> Decoder -> Vocos -> audio (B, 512T-256)
    vocoder_codes.onnx     codes (B, T, 4) -> DVAE -> Vocos -> audio (B, 512T-256)
    vocoder_*.stream.onnx  the same, stateful: one stream's uncommitted tokens + caches (export/streaming.py)
    dvae_encoder.onnx      log-mel (B, 100, F) -> DVAE encoder -> codes (B, F // 2, 4) int32
    dvae_mel.npz           window (1024,), fb (513, 100) float32: the DVAE's mel front end
    embed.npz              emb_text (21178, H), emb_code (4, 626, H), head_text (21178, H) float32
                           (head_text: the weight-normed text head materialised, for refine-text mode)
    speaker_stats.npz      std, mean (H,) float32 (ChatTTS' spk_stat)
    tokenizer/             the checkpoint's BertTokenizerFast
    manifest.json          source, sizes, graphs' tensors, opset, sha256 per file, parity

The directory is built under a temporary name and renamed into place only when complete,
so a failed export never leaves a directory that looks valid. A re-run whose inputs (asset
files, exporter version, opset) hash the same as the manifest's and whose files still match
their recorded sha256 is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from .fused import FUSED_LAYOUT
from .onnxfile import OPSET, sha256_file
from .onnxfile import onnx_export as _onnx_export
from .weights import WeightsError, check_asset_dir, load_chat, read_sizes

EXPORTER_VERSION = 5
"""Part of the input fingerprint: bump whenever the artifacts' content or layout changes, so
that stale artifact directories are re-exported. 3: ``head_text`` added to embed.npz.
4: ``dvae_encoder.onnx`` and ``dvae_mel.npz`` (reference recordings, ChatTTS' ``DVAE.sample_audio``).
5: ``gpt_step.onnx`` is the fused step graph (export/fused.py)."""
PARITY_TOLERANCE = 1e-4
"""Maximum absolute error allowed between a torch module and its exported graph."""
ENCODER_MISMATCH_TOLERANCE = 1e-3
"""Largest fraction of DVAE-encoder codes allowed to differ from ChatTTS' ``sample_audio`` on
the parity recordings (:func:`chattts_serving.export.parity.encoder_parity`). The codes come
from ``floor`` of continuous features, so a feature that the graph computes 1e-6 away from
torch's could land on the other side of a level boundary. Measured with the mel computed by
torch (:func:`chattts_serving.audio.encoder.log_mel`): 0 differing codes, on the small checkpoint's
parity recordings and on 25,708 codes of 24 recordings (up to 10 s) through a full-size
generated DVAE. The bound only keeps a rare boundary case from failing an export; the tests
require exact equality."""


def check_encoder_parity(report: dict[str, float], tolerance: float = ENCODER_MISMATCH_TOLERANCE) -> None:
    """The export's gate on the DVAE encoder: ``report`` is
    :func:`chattts_serving.export.parity.encoder_parity`'s (``codes``, ``mismatched_codes``,
    ``mismatch_fraction``, ``length_mismatches``; counts as floats).

    Raises:
        WeightsError: a parity recording whose token count differs from ChatTTS'
            (``length_mismatches`` > 0: its codes were not compared at all, and a wrong length
            shifts every prompt code after it), no code compared, or more than ``tolerance``
            of the compared codes differing.
    """
    if report["length_mismatches"] > 0:
        raise WeightsError(f"the exported DVAE encoder gives a different number of tokens than ChatTTS' "
                           f"sample_audio for {report['length_mismatches']:g} parity recording(s): {report}")
    if report["codes"] <= 0:
        raise WeightsError(f"the DVAE encoder parity check compared no codes: {report}")
    if report["mismatch_fraction"] > tolerance:
        raise WeightsError(f"the exported DVAE encoder's codes differ from ChatTTS' sample_audio in "
                           f"{report['mismatched_codes']:g} of {report['codes']:g} codes "
                           f"(> {tolerance:g} of them): {report}")


def input_fingerprint(weights_root: Path) -> str:
    """sha256 over every file under ``asset/`` plus the exporter version and opset."""
    asset = Path(weights_root) / "asset"
    h = hashlib.sha256(f"exporter={EXPORTER_VERSION};opset={OPSET}".encode())
    for p in sorted(asset.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(asset)).encode())
            h.update(sha256_file(p).encode())
    return h.hexdigest()


def read_manifest(out: Path) -> dict[str, Any]:
    """``out/manifest.json``. Raises WeightsError when ``out`` holds no export."""
    man_path = Path(out) / contract.MANIFEST
    if not man_path.is_file():
        raise WeightsError(f"{out} has no {contract.MANIFEST}: run `make export` first")
    return dict(json.loads(man_path.read_text()))


def verify_artifacts(out: Path) -> dict[str, Any]:
    """Load ``out/manifest.json`` and check every listed file's sha256.

    Returns the manifest. Raises:
        WeightsError: no manifest, or a file missing or changed.
    """
    manifest = read_manifest(out)
    for rel, digest in manifest["files"].items():
        p = Path(out) / rel
        if not p.is_file() or sha256_file(p) != digest:
            raise WeightsError(f"artifact {p} is missing or does not match its manifest sha256")
    return manifest


Progress = Callable[[str], None]


def export_artifacts(weights_root: Path, out: Path, *, source: dict[str, Any], force: bool = False,
                     progress: Progress | None = None) -> tuple[Path, bool]:
    """Export ``weights_root`` (published layout) into ``out``.

    Args:
        weights_root: directory holding ``asset/``.
        out: artifact directory to create or refresh.
        source: how the weights were obtained, recorded in the manifest.
        force: export even when the artifacts are up to date.
        progress: called with a short description before each stage.

    Returns:
        (out, exported): ``exported`` is False when up-to-date artifacts were reused.

    Raises:
        WeightsError: bad weights (see :func:`load_chat`) or a failed parity check.
    """
    say = progress or (lambda _msg: None)
    out = Path(out)
    check_asset_dir(weights_root)
    say("hashing inputs")
    fingerprint = input_fingerprint(weights_root)
    if not force and (out / contract.MANIFEST).is_file():
        try:
            manifest = verify_artifacts(out)
            up_to_date = manifest.get("input_sha256") == fingerprint
        except (WeightsError, KeyError, json.JSONDecodeError):
            up_to_date = False
        if up_to_date:  # older exports lack the stateful vocoders: added, not re-exported
            from .streaming import ensure_streaming_vocoders

            return out, ensure_streaming_vocoders(out, weights_root, progress=say)
    say("loading weights through ChatTTS")
    chat = load_chat(weights_root)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        manifest = _export_into(chat, weights_root, tmp, say)
        manifest["input_sha256"] = fingerprint
        manifest["source"] = source
        say("hashing artifacts")
        manifest["files"] = {str(p.relative_to(tmp)): sha256_file(p)
                             for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / contract.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from .streaming import ensure_streaming_vocoders

    ensure_streaming_vocoders(out, weights_root, chat=chat, progress=say)
    return out, True


def _graph_io(path: Path) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def desc(vi: Any) -> dict[str, Any]:
        t = vi.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        return {"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                "shape": shape}

    return {"file": path.name, "opset": OPSET, "inputs": [desc(i) for i in model.graph.input],
            "outputs": [desc(o) for o in model.graph.output]}


def _export_into(chat: Any, weights_root: Path, tmp: Path, say: Progress) -> dict[str, Any]:
    import torch

    from . import graphs

    llama = chat.gpt.gpt
    cfg = llama.config
    layers, heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    timings: dict[str, float] = {}

    say(f"writing the fused GPT step ({layers} layers, hidden {hidden})")
    t0 = time.perf_counter()
    from .fused import export_fused

    export_fused(llama, graphs.folded_code_heads(chat.embed), tmp / contract.GPT_GRAPH)
    timings["gpt_s"] = time.perf_counter() - t0

    say("exporting vocoder (hidden -> Decoder -> Vocos)")
    t0 = time.perf_counter()
    voc_h = graphs.VocoderFromHidden(chat.decoder, chat.vocos).eval()
    _onnx_export(voc_h, (torch.randn(2, 7, hidden),), tmp / contract.VOCODER_HIDDEN_GRAPH,
                 ["hidden"], ["audio"], {"hidden": {0: "batch", 1: "tokens"}, "audio": {0: "batch", 1: "samples"}})
    say("exporting vocoder (codes -> DVAE -> Vocos)")
    voc_c = graphs.VocoderFromCodes(chat.dvae, chat.vocos).eval()
    _onnx_export(voc_c, (torch.randint(0, 625, (2, 7, contract.NUM_VQ), dtype=torch.int32),),
                 tmp / contract.VOCODER_CODES_GRAPH, ["codes"], ["audio"],
                 {"codes": {0: "batch", 1: "tokens"}, "audio": {0: "batch", 1: "samples"}})
    timings["vocoders_s"] = time.perf_counter() - t0

    say("exporting DVAE encoder (mel -> encoder -> codes)")
    t0 = time.perf_counter()
    enc = graphs.DvaeEncoder(chat.dvae).eval()
    _onnx_export(enc, (torch.randn(2, contract.N_MELS, 47),), tmp / contract.DVAE_ENCODER_GRAPH,
                 [contract.E_MEL], [contract.E_CODES],
                 {contract.E_MEL: {0: "batch", 2: "frames"}, contract.E_CODES: {0: "batch", 1: "tokens"}})
    mel = graphs.mel_parameters(chat.dvae)
    np.savez(tmp / contract.MEL_FILE, window=mel["window"], fb=mel["fb"])
    timings["dvae_encoder_s"] = time.perf_counter() - t0

    say("writing embeddings, speaker statistics, tokenizer")
    with torch.no_grad():
        np.savez(tmp / contract.EMBED_FILE,
                 emb_text=chat.embed.emb_text.weight.detach().float().numpy(),
                 emb_code=torch.stack([e.weight.detach().float() for e in chat.embed.emb_code]).numpy(),
                 head_text=graphs.folded_text_head(chat.embed).numpy())
        np.savez(tmp / contract.SPEAKER_FILE, std=chat.speaker.std.float().numpy(),
                 mean=chat.speaker.mean.float().numpy())
    chat.tokenizer._tokenizer.save_pretrained(str(tmp / contract.TOKENIZER_DIR))

    say("checking parity of the exported graphs against ChatTTS' torch modules")
    from .parity import encoder_parity, parity_report

    parity = parity_report(chat, tmp)
    worst = max(parity.values())
    if worst > PARITY_TOLERANCE:
        raise WeightsError(f"exported graphs differ from ChatTTS' modules by {worst:.3g} "
                           f"(> {PARITY_TOLERANCE}): {parity}")
    enc_parity = encoder_parity(chat, tmp)
    check_encoder_parity(enc_parity)

    sizes = read_sizes(Path(weights_root) / "asset")
    rf_hidden = graphs.receptive_field_tokens([chat.decoder.decoder, chat.decoder.out_conv], chat.vocos)
    rf_codes = graphs.receptive_field_tokens([chat.dvae.decoder, chat.dvae.out_conv], chat.vocos)
    return {
        "format": 1,
        "exporter_version": EXPORTER_VERSION,
        "sizes": sizes.name if sizes else "published",
        "config": {"num_layers": layers, "hidden_size": hidden, "num_heads": kv_heads,
                   "head_dim": head_dim, "intermediate_size": int(cfg.intermediate_size),
                   "num_vq": contract.NUM_VQ, "num_audio_tokens": contract.NUM_AUDIO_TOKENS,
                   "eos_code": contract.EOS_CODE, "text_vocab_size": contract.TEXT_VOCAB_SIZE,
                   "max_position_embeddings": int(cfg.max_position_embeddings)},
        "graphs": {"gpt_step": {**_graph_io(tmp / contract.GPT_GRAPH), "layout": FUSED_LAYOUT},
                   "vocoder_hidden": _graph_io(tmp / contract.VOCODER_HIDDEN_GRAPH),
                   "vocoder_codes": _graph_io(tmp / contract.VOCODER_CODES_GRAPH),
                   "dvae_encoder": _graph_io(tmp / contract.DVAE_ENCODER_GRAPH)},
        "opset": OPSET,
        "sample_rate_hz": contract.SAMPLE_RATE_HZ,
        "samples_per_token": contract.SAMPLES_PER_TOKEN,
        "receptive_field_tokens": {"hidden": rf_hidden, "codes": rf_codes},
        "special_token_ids": dict(contract.SPECIAL_TOKEN_IDS),
        "parity_max_abs_error": parity,
        "parity_tolerance": PARITY_TOLERANCE,
        "encoder_parity": enc_parity,
        "encoder_mismatch_tolerance": ENCODER_MISMATCH_TOLERANCE,
        "export_timings": timings,
    }
