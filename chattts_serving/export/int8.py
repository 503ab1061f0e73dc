"""int8 variants of the fused GPT step graph and of both vocoders (``chattts-export --precision
int8``), for the ``cpu-int8`` profile and, when they meet :data:`ACCURACY_THRESHOLD`, the ``cpu``
profile's default.

The fp32 ``gpt_step.onnx`` (the fused graph, :mod:`.fused`) is quantized by ONNX Runtime's
own weight-only quantizer, ``onnxruntime.quantization.matmul_nbits_quantizer``
(:data:`INT8_QUANTIZATION`): every MatMul with a weight (the packed QKV, ``o_proj``, the packed
gate/up and ``down_proj``: 4 per layer) becomes ``MatMulNBits`` with

- 8-bit weights, symmetric, one fp32 scale per block of :data:`INT8_BLOCK_SIZE` input rows of
  each output column, fixed at export;
- ``accuracy_level`` 4: the kernel quantizes each activation block to int8 at run time and
  multiplies in int8 (VNNI where the CPU has it), per row: a row's result does not depend on
  the other rows of the batch.

The folded code heads (:data:`INT8_KEEP_FP32`), attention (GroupQueryAttention), norms, the KV
cache and the graph's inputs and outputs stay fp32: the engine's IO does not change. A decode
step streams about a quarter of the fp32 graph's weight bytes, which is what a decode step at
small batch is bound by (docs/decode-speed.md).

What int8 changes (measured by :func:`accuracy_report`, written to manifest.json): the logits
and hidden states differ from fp32's, so a sampled token stream differs from the one the fp32
graph (and ChatTTS) would produce from the same seed, and the hidden vocoder path renders
slightly different audio for the same tokens. int8 tokens are not ChatTTS' tokens.

Parity at export (:func:`int8_parity`, :func:`check_int8_parity`) compares the int8 graph
with the fp32 graph it came from (itself within 1e-4 of ChatTTS' torch modules), teacher-forced
on the same tokens, against relative tolerances that grow with depth (:func:`int8_tolerances`).
Accuracy for users (:func:`accuracy_report`, ``python -m chattts_serving.export.accuracy int8
--measure``) is measured the same way over real sentences (:mod:`.sentences`) and at least
:data:`MIN_ACCURACY_DECODE_STEPS` decode steps, and judged by :data:`ACCURACY_THRESHOLD`.
Block sizes are compared by ``scripts/bench_int8.py ARTIFACTS --blocks 32,64,128``.

The vocoders (DVAE decoder + Vocos, hidden and codes paths) are quantized the same way
(:data:`INT8_VOCODER_QUANTIZATION`): their pointwise convolutions are MatMuls and take about
80 % of a window's CPU, which is compute-bound per vocoded token (docs/decode-speed.md,
"Vocoder cost per token"). The MatMuls stay per row (a window's audio does not depend on the
other windows of a batch); the depthwise convolutions, norms and the ISTFT stay fp32. What that
changes: the audio of the same tokens differs from the fp32 vocoder's by int8 rounding (export
checks :data:`INT8_VOCODER_SNR_DB_MIN`; :func:`accuracy_report` measures it end to end), and a
stream at full lookahead no longer equals its offline decode bit for bit: the fp32 depthwise
convolutions round the last bit differently for windows of different lengths, and an
activation one bit apart can round to a neighbouring int8 step (tests/unit/test_int8.py bounds
it; docs/decode-speed.md has the figures).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..audio.vocoder import VocoderRunner
from ..contract import Precision
from ..engine.gpt import Embeddings, GptStepRunner
from ..runtime import Artifacts, OrtOptions
from .weights import WeightsError

INT8_GRAPH_FILES = contract.INT8_GRAPH_FILES

INT8_BLOCK_SIZE = 32
"""Input rows per weight scale. Measured (full size, generated weights, 1000 teacher-forced
steps; docs/decode-speed.md): worst head's top-1 agreement 0.950 at block 32 against 0.947 at
128, which misses the threshold; block 32 streams 9 % more bytes (a scale per 32 weights)."""

INT8_KEEP_FP32: tuple[str, ...] = ("heads.weight",)
"""Weights whose MatMul stays fp32: the 4 code heads (H x 2504: 7.7 MB of fp32 against about
200 MB streamed per step), whose rounding moves the logits directly; measured with them in
fp32 the worst head agrees on 0.957 of steps (0.950 with them quantized)."""

INT8_QUANTIZATION: dict[str, Any] = {
    "tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer", "op": "MatMulNBits",
    "bits": 8, "block_size": INT8_BLOCK_SIZE, "is_symmetric": True, "accuracy_level": 4,
    "keep_fp32": list(INT8_KEEP_FP32),
}
"""How the int8 graph is made; recorded in manifest.json (``precisions.int8.quantization``) and
part of the up-to-date check (a graph made another way is re-made)."""

INT8_VOCODER_BLOCK_SIZE = 256
"""Input rows per weight scale in the vocoders. Measured (full size, generated weights, one
core): ms per vocoded token 1.85 fp32, 1.42 at block 32, 1.16 at 128, 1.08 at 256; audio SNR
against fp32 39.5, 38.1 and 37.6 dB (docs/decode-speed.md)."""

INT8_VOCODER_QUANTIZATION: dict[str, Any] = {
    "tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer", "op": "MatMulNBits",
    "bits": 8, "block_size": INT8_VOCODER_BLOCK_SIZE, "is_symmetric": True, "accuracy_level": 4,
    "keep_fp32": [],
}
"""How the int8 vocoder graphs are made; recorded in manifest.json
(``precisions.int8.vocoder_quantization``) and part of the up-to-date check."""

INT8_VOCODER_SNR_DB_MIN = 25.0
"""The lowest audio SNR (dB) of an int8 vocoder against its fp32 graph on the same input that
export accepts (:func:`check_int8_parity`). Weight and activation rounding at 8 bits put it
near 37 dB on generated weights; a lost scale or a saturating kernel falls far below."""

INT8_HIDDEN_RELATIVE_TOLERANCE_PER_LAYER = 0.015
"""Per transformer layer: the largest relative error of the last hidden state allowed at export
is this times the number of layers (:func:`int8_tolerances`), ||h_int8 - h_fp32|| / ||h_fp32||
per position, maximum over the parity run (:func:`int8_parity`).

Why: each layer adds the outputs of its 4 quantized MatMuls (packed QKV, o, packed gate/up,
down) into the residual stream. With 8-bit weights and a scale per block of 128 input rows a
Gaussian block (max about 3 sigma) rounds with an RMS error of 3 / (127 sqrt(12)) = 0.7 % of
the weights' RMS, and ``accuracy_level`` 4 rounds the activations per block to int8 in the
same way (more where outlier channels widen a block's range). How much reaches the residual
stream depends on how large each sublayer's output is next to it, so the error grows about
linearly with depth. The bound (0.03 for the small config's 2 layers, 0.30 for the full 20)
is 4x what the earlier per-channel dynamic int8 measured on generated weights (0.0036-0.0038
per layer); the block-wise 8-bit graph measures below that (manifest.json ``parity_int8``).
What int8 rounding cannot explain still fails it: a lost scale, a quantized KV cache or
attention operand, a saturating kernel. It says nothing about tokens: that is what
:func:`accuracy_report` measures.
"""

INT8_LOGITS_RELATIVE_TOLERANCE_BASE = 0.03
INT8_LOGITS_RELATIVE_TOLERANCE_PER_LAYER = 0.01
"""The largest logit error allowed at export, relative to the fp32 logits' largest magnitude
(max |l_int8 - l_fp32| / max |l_fp32|), is BASE + PER_LAYER x layers (:func:`int8_tolerances`):
the code heads' own quantized MatMul plus the hidden state's error carried through them
(0.05 small, 0.23 full: about 4x what per-channel dynamic int8 measured on generated weights)."""


def int8_tolerances(num_layers: int) -> dict[str, float]:
    """The export parity bounds for a GPT of ``num_layers`` layers: {"logits_rel_max",
    "hidden_rel_err_max"} (see :data:`INT8_HIDDEN_RELATIVE_TOLERANCE_PER_LAYER` and
    :data:`INT8_LOGITS_RELATIVE_TOLERANCE_PER_LAYER` for where the numbers come from)."""
    return {"logits_rel_max": INT8_LOGITS_RELATIVE_TOLERANCE_BASE + INT8_LOGITS_RELATIVE_TOLERANCE_PER_LAYER
            * num_layers, "hidden_rel_err_max": INT8_HIDDEN_RELATIVE_TOLERANCE_PER_LAYER * num_layers}


PARITY_STEPS = 24
"""Tokens compared per parity prompt at export (prefill + 23 decode steps)."""

MIN_ACCURACY_DECODE_STEPS = 1000
"""Fewest decode steps :func:`accuracy_report` compares (the issue's requirement)."""

ACCURACY_THRESHOLD: dict[str, float] = {"top1_agreement_min": 0.95, "audio_snr_db_min": 20.0}
"""The bar for making int8 a profile's default precision (docs/decode-speed.md, "8-bit weights"): the fp32 and
int8 graphs' top-1 codes agree on at least 95 % of teacher-forced steps on every one of the 4
heads, and the hidden-path audio of the same token stream differs from fp32's by at least
20 dB SNR (error energy at most 1 % of the signal's). Below it fp32 stays the default and int8
is one profile away (``cpu-int8``)."""

ACCURACY_VOICE = "2"
"""Voice of the accuracy prompts (the cpu profile's default voice seed)."""


# --- quantization ---------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantization tools log every node at INFO on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_graph(src: Path, dst: Path, bits: int = 8, block_size: int = INT8_BLOCK_SIZE,
                   accuracy_level: int = 4, keep_fp32: tuple[str, ...] = INT8_KEEP_FP32) -> None:
    """Write the weight-only ``bits``-bit variant of ONNX graph ``src`` to ``dst``: ONNX
    Runtime's ``MatMulNBitsQuantizer`` (symmetric, one scale per ``block_size`` input rows;
    ``accuracy_level`` 4 = int8 activations inside the kernel, 0 = weights dequantized to
    fp32). ``keep_fp32``: weight initializers whose MatMuls stay fp32 (e.g. ``heads.weight``,
    the code heads). The defaults are :data:`INT8_QUANTIZATION`'s.

    Raises:
        ImportError: this onnxruntime build lacks ``onnxruntime.quantization``.
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    exclude = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in set(keep_fp32)]
    with _quiet_quantizer():
        logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=True,
                                 accuracy_level=accuracy_level, nodes_to_exclude=exclude)
        q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=False)


# --- teacher-forced comparison ---------------------------------------------------------------

@dataclass(frozen=True)
class TeacherForced:
    """One prompt decoded by a reference and a candidate GPT graph on the same tokens.

    ``codes``: (N, 4) int64, the token stream, sampled from the reference's logits (the
    prefill's and then each decode step's) with the project's sampler; both graphs are fed
    exactly these tokens, each over its own KV cache. ``ref_logits``/``cand_logits``: (N, 4,
    626) float32, the logits each graph gave for position n (row 0 from the prefill, then N-1
    decode steps). ``ref_hidden``/``cand_hidden``: (N, H) float32, the matching last hidden
    states (what the engine sends to the hidden vocoder with each token).
    """

    codes: np.ndarray
    ref_logits: np.ndarray
    cand_logits: np.ndarray
    ref_hidden: np.ndarray
    cand_hidden: np.ndarray

    @property
    def decode_steps(self) -> int:
        """Positions that came from decode calls (all but the prefill's)."""
        return len(self.codes) - 1


def teacher_forced(reference: GptStepRunner, candidate: GptStepRunner, embeds: np.ndarray, steps: int,
                   seed: int = 0) -> TeacherForced:
    """Decode ``steps`` tokens after the prompt ``embeds`` (T, H) float32 (batch of 1, no
    padding) with ``reference``, sampling with ChatTTS' default parameters (temperature 0.3,
    top-p 0.7, top-k 20, repetition penalty 1.05; seed ``seed``; the end code suppressed, so
    the stream is ``steps`` long), and run ``candidate`` on the same tokens. Both runners
    must share the embedding tables (the same artifact directory)."""
    from ..engine.sampling import RequestSampler, sample_batch
    from ..params import SamplingParams

    emb = Embeddings(reference.art)
    sampler = RequestSampler(SamplingParams(seed=seed, max_new_tokens=steps, min_new_tokens=steps))
    x = np.ascontiguousarray(embeds[None], np.float32)
    n = x.shape[1]
    caches = [r.new_cache(1, n + steps) for r in (reference, candidate)]
    codes, rl, cl, rh, ch = [], [], [], [], []
    for step in range(steps):
        outs = []
        for runner, cache in zip((reference, candidate), caches):
            if step == 0:
                lg, hd, prompt_kv = runner.prefill(x, np.array([n]))
                cache.copy_row(0, prompt_kv, 0, n)
            else:
                lg, hd = runner.decode(x, cache, np.array([n + step - 1]))
            outs.append((lg, hd))
        (lr, hr), (lc, hc) = outs
        c = sample_batch(lr, [sampler])[0]
        sampler.record(c)
        codes.append(c)
        rl.append(lr[0])
        cl.append(lc[0])
        rh.append(hr[0])
        ch.append(hc[0])
        x = emb.codes(c[None])[:, None, :].astype(np.float32)
    return TeacherForced(np.stack(codes), np.stack(rl), np.stack(cl), np.stack(rh), np.stack(ch))


def compare_runs(runs: Sequence[TeacherForced]) -> dict[str, Any]:
    """Error figures of the candidate against the reference over ``runs`` (every compared
    position of every run, prefill positions included):

    ``top1_agreement``: per code head (4 floats), the fraction of positions where both graphs'
    argmax code is the same; ``top1_agreement_min``: the lowest head's. ``logit_abs_err_mean``
    and ``logit_abs_err_max``: over every logit. ``logits_rel_max``: max |error| / max |ref
    logit|. ``ref_logit_std_mean``: the reference logits' standard deviation per position and
    head, averaged (their scale). ``ref_top2_gap_median``: median gap between the reference's
    best and second-best logit (small gaps: flat logits, where argmax flips easily).
    ``hidden_rel_err_mean``/``_max``: ||h_cand - h_ref|| / ||h_ref|| per position.
    ``positions``, ``decode_steps``, ``prompts``: counts.
    """
    rl = np.concatenate([r.ref_logits for r in runs])
    cl = np.concatenate([r.cand_logits for r in runs])
    rh = np.concatenate([r.ref_hidden for r in runs])
    chh = np.concatenate([r.cand_hidden for r in runs])
    err = np.abs(cl - rl)
    agree = rl.argmax(-1) == cl.argmax(-1)  # (N, 4)
    top2 = np.sort(rl, -1)[..., -2:]
    hid = np.linalg.norm(chh - rh, axis=-1) / np.maximum(np.linalg.norm(rh, axis=-1), 1e-12)
    per_head = [float(a) for a in agree.mean(0)]
    return {
        "top1_agreement": per_head, "top1_agreement_min": min(per_head),
        "logit_abs_err_mean": float(err.mean()), "logit_abs_err_max": float(err.max()),
        "logits_rel_max": float(err.max() / max(float(np.abs(rl).max()), 1e-12)),
        "ref_logit_std_mean": float(rl.std(-1).mean()),
        "ref_top2_gap_median": float(np.median(top2[..., 1] - top2[..., 0])),
        "hidden_rel_err_mean": float(hid.mean()), "hidden_rel_err_max": float(hid.max()),
        "positions": len(rl), "decode_steps": int(sum(r.decode_steps for r in runs)), "prompts": len(runs),
    }


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (test - ref)^2) in dB (inf when identical)."""
    noise = float(np.sum((np.asarray(test, np.float64) - reference) ** 2))
    return energy_snr_db(float(np.sum(np.asarray(reference, np.float64) ** 2)), noise)


def energy_snr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB from energies summed over several signals (inf when the
    noise is 0)."""
    return float("inf") if noise == 0 else 10.0 * float(np.log10(max(signal, 1e-30) / noise))


def _prompts(art: Artifacts, texts: Sequence[str], voice: str) -> list[np.ndarray]:
    """Prefill embeddings (T, H) of each text through the project's FrontEnd (normalisation,
    prompt, tokenizer, voice) and :class:`~chattts_serving.engine.gpt.Embeddings`."""
    from ..text.frontend import FrontEnd

    fe = FrontEnd(art, max_text_chars=4096, default_voice_seed=int(ACCURACY_VOICE))
    emb = Embeddings(art)
    out = []
    for text in texts:
        p = fe.prepare(text, voice)
        out.append(emb.prompt(p.input_ids.astype(np.int64), p.spk_emb))
    return out


def _runners(art: Artifacts, opts: OrtOptions | None, kernel: str | None = None) -> tuple[GptStepRunner, GptStepRunner]:
    """(fp32, int8) step runners; the int8 one on ``kernel`` (a
    :func:`~chattts_serving.engine.kernels.kernel_graph` name) where given, else as exported."""
    from dataclasses import replace

    from ..engine.kernels import use_kernel

    base = opts or OrtOptions()
    ref, cand = (GptStepRunner(art, replace(base, precision=Precision.FP32)),
                 GptStepRunner(art, replace(base, precision=Precision.INT8)))
    if kernel is not None:
        use_kernel(cand, kernel)
    return ref, cand


def int8_parity(art: Artifacts, opts: OrtOptions | None = None) -> dict[str, Any]:
    """Export-time parity of ``art``'s int8 GPT graph against its fp32 graph: teacher-forced
    over :data:`PARITY_STEPS` tokens of each of :data:`~chattts_serving.export.parity.PARITY_TEXTS`
    (voice :data:`ACCURACY_VOICE`). Returns :func:`compare_runs`' figures.

    Raises:
        FileNotFoundError: ``art`` lists no int8 graph.
    """
    from .parity import PARITY_TEXTS

    ref, cand = _runners(art, opts)
    runs = [teacher_forced(ref, cand, e, PARITY_STEPS, seed=i)
            for i, e in enumerate(_prompts(art, PARITY_TEXTS, ACCURACY_VOICE))]
    return {**compare_runs(runs), **vocoder_parity(art, runs, opts)}


def _vocoders(art: Artifacts, path: str, opts: OrtOptions | None) -> tuple[VocoderRunner, VocoderRunner]:
    """(fp32, int8) vocoder runners of ``path`` ("hidden" or "codes")."""
    from dataclasses import replace

    base = opts or OrtOptions()
    return (VocoderRunner(art, path, replace(base, precision=Precision.FP32)),
            VocoderRunner(art, path, replace(base, precision=Precision.INT8)))


def vocoder_parity(art: Artifacts, runs: Sequence[TeacherForced], opts: OrtOptions | None = None) -> dict[str, Any]:
    """The int8 vocoders against the fp32 ones on the same input: each run's reference hidden
    states (hidden path) and its tokens (codes path), each utterance in one window. Returns
    ``vocoder_hidden_snr_db`` and ``vocoder_codes_snr_db`` (dB, energies summed over the runs)."""
    out: dict[str, Any] = {}
    for path in ("hidden", "codes"):
        fp32, int8 = _vocoders(art, path, opts)
        sig = noise = 0.0
        for run in runs:
            x = run.ref_hidden[None] if path == "hidden" else run.codes[None].astype(np.int32)
            a, b = fp32.run(x)[0].astype(np.float64), int8.run(x)[0]
            sig += float(np.sum(a ** 2))
            noise += float(np.sum((b - a) ** 2))
        out[f"vocoder_{path}_snr_db"] = energy_snr_db(sig, noise)
    return out


def check_int8_parity(parity: dict[str, Any], num_layers: int) -> None:
    """Raise :class:`WeightsError` when ``parity`` (:func:`int8_parity`) of a GPT of
    ``num_layers`` layers exceeds :func:`int8_tolerances` (or is NaN), or an int8 vocoder's
    audio SNR is below :data:`INT8_VOCODER_SNR_DB_MIN`."""
    tol = int8_tolerances(num_layers)
    bad = {k: parity[k] for k, bound in tol.items() if not parity[k] <= bound}
    if bad:
        raise WeightsError(f"the int8 GPT graph differs from the fp32 one by more than its tolerance {tol}: {bad}")
    low = {k: parity[k] for k in ("vocoder_hidden_snr_db", "vocoder_codes_snr_db")
           if not parity[k] >= INT8_VOCODER_SNR_DB_MIN}
    if low:
        raise WeightsError(f"an int8 vocoder's audio differs from the fp32 one's by more than "
                           f"{INT8_VOCODER_SNR_DB_MIN} dB SNR allows: {low}")


def accuracy_report(root: Path, texts: Sequence[str], steps: int, *, voice: str = ACCURACY_VOICE,
                    opts: OrtOptions | None = None, progress: Any = None, kernel: str | None = None) -> dict[str, Any]:
    """int8 against fp32 on the same checkpoint, teacher-forced over ``steps`` tokens of each
    text (see :func:`teacher_forced`; sampling seed = the text's index), then each graph's
    hidden states of the same token stream rendered by the fp32 hidden vocoder (whole
    utterance, one window) and compared; and the int8 GPT's hidden states rendered by the int8
    hidden vocoder, against fp32 throughout (what the ``cpu`` profile plays when both are int8).

    Returns :func:`compare_runs`' figures plus ``audio_snr_db`` (int8 audio vs fp32 audio,
    energies summed over all texts), ``audio_snr_db_min`` and ``audio_snr_db_per_prompt``;
    ``audio_snr_db_int8_vocoder`` and ``audio_snr_db_int8_vocoder_min`` (int8 GPT and vocoder);
    ``threshold`` (:data:`ACCURACY_THRESHOLD`), ``meets_threshold``, the setup (``voice``,
    ``steps_per_prompt``, ``sampling``, ``intra_op_threads``) and ``measured_s``. ``kernel``:
    the int8 step on that kernel (:func:`~chattts_serving.engine.kernels.kernel_graph`; the
    report's ``kernel``), else on the exported ``MatMulNBits``.
    """
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    art = Artifacts.load(root)
    opts = opts or OrtOptions()
    ref, cand = _runners(art, opts, kernel)
    vocoder, vocoder_int8 = _vocoders(art, "hidden", opts)
    runs, snrs, snrs_v, sig, noise, noise_v = [], [], [], 0.0, 0.0, 0.0
    for i, e in enumerate(_prompts(art, texts, voice)):
        run = teacher_forced(ref, cand, e, steps, seed=i)
        a_ref = vocoder.run(run.ref_hidden[None])[0]
        a_int8 = vocoder.run(run.cand_hidden[None])[0]
        a_all8 = vocoder_int8.run(run.cand_hidden[None])[0]
        sig += float(np.sum(a_ref.astype(np.float64) ** 2))
        noise += float(np.sum((a_int8.astype(np.float64) - a_ref) ** 2))
        noise_v += float(np.sum((a_all8.astype(np.float64) - a_ref) ** 2))
        snrs.append(snr_db(a_ref, a_int8))
        snrs_v.append(snr_db(a_ref, a_all8))
        runs.append(run)
        say(f"prompt {i + 1}/{len(texts)}: {run.decode_steps} decode steps, audio SNR {snrs[-1]:.1f} dB "
            f"({snrs_v[-1]:.1f} dB with the int8 vocoder)")
    out = compare_runs(runs)
    out["audio_snr_db"] = energy_snr_db(sig, noise)
    out["audio_snr_db_min"] = min(snrs)
    out["audio_snr_db_per_prompt"] = [round(s, 2) for s in snrs]
    out["audio_snr_db_int8_vocoder"] = energy_snr_db(sig, noise_v)
    out["audio_snr_db_int8_vocoder_min"] = min(snrs_v)
    out["threshold"] = dict(ACCURACY_THRESHOLD)
    out["meets_threshold"] = meets_threshold(out)
    out.update(voice=voice, steps_per_prompt=steps, intra_op_threads=opts.intra_op_threads,
               kernel=kernel or "exported",
               sampling="ChatTTS defaults (temperature 0.3, top-p 0.7, top-k 20, repetition penalty 1.05), "
                        "seed = prompt index, tokens sampled from the fp32 logits",
               vocoder="hidden path, whole utterance in one window: fp32 graph (audio_snr_db), "
                       "int8 graph (audio_snr_db_int8_vocoder)",
               measured_s=round(time.perf_counter() - t0, 1))
    return out


def meets_threshold(accuracy: dict[str, Any]) -> bool:
    """True when ``accuracy`` (:func:`accuracy_report`) meets :data:`ACCURACY_THRESHOLD`:
    every head's top-1 agreement and the overall and worst prompt's audio SNR, with the fp32
    and (where measured) the int8 vocoder."""
    t = ACCURACY_THRESHOLD
    snrs = [accuracy[k] for k in ("audio_snr_db", "audio_snr_db_min", "audio_snr_db_int8_vocoder",
                                  "audio_snr_db_int8_vocoder_min") if k in accuracy]
    return bool(accuracy["top1_agreement_min"] >= t["top1_agreement_min"]
                and all(v >= t["audio_snr_db_min"] for v in snrs))


# --- the artifact directory ------------------------------------------------------------------

def int8_up_to_date(root: Path) -> bool:
    """True when ``root``'s manifest lists an int8 graph quantized from its current fp32 graph
    with the current :data:`INT8_QUANTIZATION`, and every listed file matches its sha256.
    Raises :class:`WeightsError` as :func:`~chattts_serving.export.build.verify_artifacts`."""
    from .build import verify_artifacts

    manifest = verify_artifacts(Path(root))
    sources = {src: manifest["files"][src] for src in INT8_GRAPH_FILES}
    have = manifest.get("precisions", {}).get("int8", {})
    return bool(have.get("sources") == sources and have.get("quantization") == INT8_QUANTIZATION
                and have.get("vocoder_quantization") == INT8_VOCODER_QUANTIZATION
                and all(f in manifest["files"] for f in INT8_GRAPH_FILES.values()))


def add_int8(root: Path, *, force: bool = False, progress: Any = None) -> bool:
    """Add the int8 GPT and vocoder graphs to the (fp32, complete) artifact directory ``root``:
    quantize, check parity against the fp32 graphs (:func:`check_int8_parity`), then list them in
    manifest.json (``precisions.int8``: the files, the fp32 graphs' sha256 they came from,
    :data:`INT8_QUANTIZATION` and :data:`INT8_VOCODER_QUANTIZATION`; ``parity_int8`` and its
    tolerances; ``graphs_int8``; their sha256 under ``files``). Needs no weights: only the fp32
    graphs. Skipped (returns False) when :func:`int8_up_to_date`, unless ``force``. New int8
    graphs drop an earlier accuracy measurement (``precisions.int8.accuracy``, and the int8 KV
    cache's with int8 weights): re-run :func:`accuracy_report`.

    Raises:
        WeightsError: parity failed (the int8 file is removed, the manifest is unchanged), or
            the artifacts are incomplete.
    """
    from .build import _graph_io, sha256_file

    say = progress or (lambda _msg: None)
    root = Path(root)
    if not force and int8_up_to_date(root):
        return False
    manifest = json.loads((root / contract.MANIFEST).read_text())
    sources = {src: manifest["files"][src] for src in INT8_GRAPH_FILES}
    say("quantizing the GPT step and the vocoders to 8-bit MatMulNBits (onnxruntime matmul_nbits_quantizer)")
    t0 = time.perf_counter()
    for src, dst in INT8_GRAPH_FILES.items():
        if src == contract.GPT_GRAPH:
            quantize_graph(root / src, root / dst)
        else:
            quantize_graph(root / src, root / dst, block_size=INT8_VOCODER_BLOCK_SIZE, keep_fp32=())
    took = time.perf_counter() - t0
    say("checking int8 parity against the fp32 graph")
    listed = {**manifest, "precisions": {**manifest.get("precisions", {}), "int8": dict(INT8_GRAPH_FILES)}}
    try:
        art = Artifacts(root, listed)
        parity = int8_parity(art)
        check_int8_parity(parity, art.num_layers)
    except BaseException:
        for f in INT8_GRAPH_FILES.values():
            (root / f).unlink(missing_ok=True)
        raise
    manifest.setdefault("precisions", {})["int8"] = {**INT8_GRAPH_FILES, "sources": sources,
                                      "quantization": INT8_QUANTIZATION,
                                      "vocoder_quantization": INT8_VOCODER_QUANTIZATION, "quantize_s": round(took, 1)}
    manifest["parity_int8"] = parity
    # the int8 KV cache's accuracy with int8 weights was measured on the graph replaced here
    manifest.get("kv_cache", {}).get("int8", {}).get("accuracy", {}).pop("int8", None)
    manifest["parity_int8_tolerance"] = int8_tolerances(art.num_layers)
    manifest["graphs_int8"] = {src: _graph_io(root / f) for src, f in INT8_GRAPH_FILES.items()}
    for f in INT8_GRAPH_FILES.values():
        manifest["files"][f] = sha256_file(root / f)
    (root / contract.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return True


def has_int8(art: Artifacts) -> bool:
    """True when ``art`` lists an int8 GPT graph (exported with ``--precision int8``)."""
    return bool(art.manifest.get("precisions", {}).get("int8"))


def write_accuracy(root: Path, accuracy: dict[str, Any]) -> None:
    """Store ``accuracy`` (:func:`accuracy_report`) as ``precisions.int8.accuracy`` in ``root``'s
    manifest.json. Raises :class:`WeightsError` when ``root`` lists no int8 graph."""
    path = Path(root) / contract.MANIFEST
    manifest = json.loads(path.read_text())
    if "int8" not in manifest.get("precisions", {}):
        raise WeightsError(f"{root} has no int8 graph: export it with `chattts-export ... --precision int8`")
    manifest["precisions"]["int8"]["accuracy"] = accuracy
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))


def accuracy_table(acc: dict[str, Any]) -> str:
    """A Markdown table of :func:`accuracy_report`'s figures (as in docs/decode-speed.md)."""
    t = acc["threshold"]
    heads = " / ".join(f"{a:.3f}" for a in acc["top1_agreement"])
    rows = [
        ("top-1 agreement per code head (0-3)", heads, f">= {t['top1_agreement_min']} each"),
        ("mean / max abs logit error", f"{acc['logit_abs_err_mean']:.4f} / {acc['logit_abs_err_max']:.4f}", ""),
        ("fp32 logit std (mean) / top-2 gap (median)",
         f"{acc['ref_logit_std_mean']:.4f} / {acc['ref_top2_gap_median']:.4f}", ""),
        ("hidden-state relative error, mean / max",
         f"{acc['hidden_rel_err_mean']:.4f} / {acc['hidden_rel_err_max']:.4f}", ""),
        ("audio SNR, hidden path (all / worst prompt)",
         f"{acc['audio_snr_db']:.1f} / {acc['audio_snr_db_min']:.1f} dB", f">= {t['audio_snr_db_min']} dB"),
    ]
    if "audio_snr_db_int8_vocoder" in acc:
        rows.append(("audio SNR, int8 GPT and int8 vocoder (all / worst prompt)",
                     f"{acc['audio_snr_db_int8_vocoder']:.1f} / {acc['audio_snr_db_int8_vocoder_min']:.1f} dB",
                     f">= {t['audio_snr_db_min']} dB"))
    lines = ["| int8 vs fp32, teacher-forced | value | threshold |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.append(f"| prompts / decode steps | {acc['prompts']} / {acc['decode_steps']} | "
                 f">= {MIN_ACCURACY_DECODE_STEPS} steps |")
    lines.append(f"| meets the threshold | {'yes' if acc['meets_threshold'] else 'no'} | |")
    return "\n".join(lines)
