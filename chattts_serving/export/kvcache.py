"""The GPT step's KV cache in fp16 or int8: calibration of the int8 scales and the accuracy of
each cache precision against the fp32 cache, written to manifest.json (``kv_cache``).

The rewrite itself is :mod:`chattts_serving.engine.kvprecision` (applied when a runner loads
the graph with ``OrtOptions.kv_cache``). What it changes is measured here as the int8 weights
are (:mod:`.int8`): teacher-forced over the shipped sentences (:mod:`.sentences`), each graph fed the same
tokens over its own cache, top-1 agreement per code head and the hidden-path audio SNR, judged
by the same :data:`~chattts_serving.export.int8.ACCURACY_THRESHOLD`. The reference is the same
weights with the fp32 cache, so the figures are the cache's own error.

int8 scales (:func:`calibrate_scales`) come from the fp32 graph's cache over
:data:`~chattts_serving.export.parity.PARITY_TEXTS` (not the sentences the accuracy is measured
on): per layer, head and channel the largest |V| and the largest norm of K's rotary pairs,
times :data:`KV_INT8_MARGIN`, over 127.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..contract import KvPrecision, Precision
from ..engine.gpt import Embeddings, GptStepRunner
from ..engine.kvprecision import scales_from_absmax
from ..runtime import Artifacts, OrtOptions
from .int8 import (
    ACCURACY_THRESHOLD,
    ACCURACY_VOICE,
    _prompts,
    compare_runs,
    energy_snr_db,
    meets_threshold,
    snr_db,
    teacher_forced,
)

KV_INT8_MARGIN = 1.0
"""Calibrated maxima are multiplied by this before they map to 127 (values beyond clip)."""

CALIBRATION_STEPS = 120
"""Tokens decoded after each calibration prompt (the positions the maxima are taken over)."""


def calibrate_scales(root: Path, texts: Sequence[str] | None = None, steps: int = CALIBRATION_STEPS,
                     opts: OrtOptions | None = None, margin: float = KV_INT8_MARGIN) -> dict[str, np.ndarray]:
    """The int8 KV scales of ``root``'s fp32 GPT graph: ``k_<i>``, ``v_<i>`` (heads, 1,
    head_dim) float32 per layer i, from the cache of each of ``texts`` (default
    :data:`~chattts_serving.export.parity.PARITY_TEXTS`) prefilled and decoded ``steps``
    tokens with ChatTTS' default sampling (seed = the text's index)."""
    from ..engine.sampling import RequestSampler, sample_batch
    from ..params import SamplingParams
    from .parity import PARITY_TEXTS

    art = Artifacts.load(root)
    runner = GptStepRunner(art, replace(opts or OrtOptions(), precision=Precision.FP32, kv_cache=KvPrecision.FP32))
    emb = Embeddings(art)
    half = art.head_dim // 2
    k_max = np.zeros((art.num_layers, art.num_heads, half))
    v_max = np.zeros((art.num_layers, art.num_heads, art.head_dim))
    for seed, e in enumerate(_prompts(art, list(texts or PARITY_TEXTS), ACCURACY_VOICE)):
        n = len(e)
        cache = runner.new_cache(1, n + steps)
        logits, _, kv = runner.prefill(e[None].astype(np.float32), np.array([n]))
        cache.copy_row(0, kv, 0, n)
        sampler = RequestSampler(SamplingParams(seed=seed, max_new_tokens=steps, min_new_tokens=steps))
        for step in range(steps - 1):
            c = sample_batch(logits, [sampler])[0]
            sampler.record(c)
            logits, _ = runner.decode(emb.codes(c[None])[:, None, :].astype(np.float32), cache, np.array([n + step]))
        used = n + steps - 1
        for i in range(art.num_layers):
            k = np.asarray(cache.buffers[2 * i][0, :, :used], np.float64)  # (heads, T, head_dim), rotated
            v = np.asarray(cache.buffers[2 * i + 1][0, :, :used], np.float64)
            k_max[i] = np.maximum(k_max[i], np.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2).max(1))
            v_max[i] = np.maximum(v_max[i], np.abs(v).max(1))
    out: dict[str, np.ndarray] = {}
    for i in range(art.num_layers):
        out[f"k_{i}"], out[f"v_{i}"] = scales_from_absmax(k_max[i] * margin, v_max[i] * margin)
    return out


def write_scales(root: Path, scales: dict[str, np.ndarray], how: dict[str, Any]) -> None:
    """Save ``scales`` as :data:`~chattts_serving.contract.KV_SCALES_FILE` in ``root`` and list
    it in manifest.json: ``kv_cache.int8`` = {file, sha256, calibration: ``how``}; an earlier
    int8 accuracy measurement is dropped (it was of other scales)."""
    root = Path(root)
    path = root / contract.KV_SCALES_FILE
    np.savez(path, **scales)
    manifest = json.loads((root / contract.MANIFEST).read_text())
    kv = manifest.setdefault("kv_cache", {})
    kv[str(KvPrecision.INT8)] = {"file": contract.KV_SCALES_FILE,
                                 "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "calibration": how}
    (root / contract.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def kv_accuracy_report(root: Path, texts: Sequence[str], steps: int, kv: KvPrecision | str, *,
                       weights: Precision | str = Precision.FP32, voice: str = ACCURACY_VOICE,
                       opts: OrtOptions | None = None, progress: Any = None,
                       reference_weights: Precision | str | None = None) -> dict[str, Any]:
    """The ``kv`` cache against the fp32 cache, both with the ``weights`` graph of ``root``
    (or the reference with ``reference_weights``: e.g. fp32, for the int8 weights and cache
    together against fp32 throughout): teacher-forced over ``steps`` tokens of each text
    (sampled from the reference's logits, seed = the text's index), then each side's hidden
    states rendered by the fp32 hidden vocoder (whole utterance, one window) and compared.

    Returns :func:`~chattts_serving.export.int8.compare_runs`' figures plus ``audio_snr_db``
    (energies over all texts), ``audio_snr_db_min``, ``audio_snr_db_per_prompt``,
    ``threshold``, ``meets_threshold``, ``kv_cache``, ``weights``, ``reference`` and the setup."""
    from ..audio.vocoder import VocoderRunner

    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    art = Artifacts.load(root)
    base = replace(opts or OrtOptions(), precision=Precision(weights))
    ref_weights = Precision(reference_weights or weights)
    ref = GptStepRunner(art, replace(base, precision=ref_weights, kv_cache=KvPrecision.FP32))
    cand = GptStepRunner(art, replace(base, kv_cache=KvPrecision(kv)))
    vocoder = VocoderRunner(art, "hidden", replace(base, precision=Precision.FP32))
    runs, snrs, sig, noise = [], [], 0.0, 0.0
    for i, e in enumerate(_prompts(art, texts, voice)):
        run = teacher_forced(ref, cand, e, steps, seed=i)
        a_ref = vocoder.run(run.ref_hidden[None])[0]
        a_kv = vocoder.run(run.cand_hidden[None])[0]
        sig += float(np.sum(a_ref.astype(np.float64) ** 2))
        noise += float(np.sum((a_kv.astype(np.float64) - a_ref) ** 2))
        snrs.append(snr_db(a_ref, a_kv))
        runs.append(run)
        say(f"{kv} KV, prompt {i + 1}/{len(texts)}: {run.decode_steps} decode steps, audio SNR {snrs[-1]:.1f} dB")
    out = compare_runs(runs)
    out["audio_snr_db"] = energy_snr_db(sig, noise)
    out["audio_snr_db_min"] = min(snrs)
    out["audio_snr_db_per_prompt"] = [round(s, 2) for s in snrs]
    out["threshold"] = dict(ACCURACY_THRESHOLD)
    out["meets_threshold"] = meets_threshold(out)
    out.update(kv_cache=str(KvPrecision(kv)), weights=str(Precision(weights)), voice=voice,
               steps_per_prompt=steps, intra_op_threads=base.intra_op_threads,
               reference=f"{ref_weights} weights with the fp32 KV cache",
               sampling="ChatTTS defaults (temperature 0.3, top-p 0.7, top-k 20, repetition penalty 1.05), "
                        "seed = prompt index, tokens sampled from the fp32 cache's logits",
               measured_s=round(time.perf_counter() - t0, 1))
    return out


def write_kv_accuracy(root: Path, accuracy: dict[str, Any]) -> None:
    """Store ``accuracy`` (:func:`kv_accuracy_report`) in ``root``'s manifest.json as
    ``kv_cache.<kv>.accuracy.<weights>`` (one measurement per weight precision)."""
    path = Path(root) / contract.MANIFEST
    manifest = json.loads(path.read_text())
    entry = manifest.setdefault("kv_cache", {}).setdefault(accuracy["kv_cache"], {})
    entry.setdefault("accuracy", {})[accuracy["weights"]] = accuracy
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
