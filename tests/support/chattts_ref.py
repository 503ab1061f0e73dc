"""ChatTTS' own ``Chat.infer`` as the reference of the ``chattts`` segmentation and of
reference recordings, computed once per session for each set of arguments (the in-process
and the real-server tests compare against the same waveforms).

Greedy settings (temperature 1e-6: at 1e-4 a logit gap of about 1e-4 still leaves near-ties to
chance), ChatTTS' ``manual_seed`` fixed, no ``min_new_token`` (pieces end at different
lengths, so ChatTTS' group padding matters), refine-text skipped. Compared before
``Chat.infer``'s deletion of near-silent samples (:func:`chat_infer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.text.speaker import encode_spk_emb, speaker_from_seed

GREEDY = 1e-6
VOICE = 7
"""The voice seed both sides speak with (``voice="7"`` on ours)."""

_DONE: dict[tuple[Any, ...], tuple[np.ndarray, Any]] = {}


def strip_like_chattts(wav: np.ndarray) -> np.ndarray:
    """What ``Chat.infer`` keeps of a waveform: ``wav[np.abs(wav) > 1e-5]`` (``thr`` in
    ChatTTS/core.py). Elementwise, so stripping a concatenation equals concatenating the
    stripped pieces."""
    return wav[np.abs(wav) > np.float32(1e-5)]


def chat_infer(chat: Any, artifacts_root: Path, text: str, max_new: int, spk_smp: str | None = None,
               txt_smp: str | None = None, speaker: bool = True) -> tuple[np.ndarray, Any]:
    """``Chat.infer(text)`` of ``chat`` with the seed-:data:`VOICE` speaker (as a spk_emb string,
    from the artifacts' speaker statistics) or none, ``spk_smp``/``txt_smp`` as given, and
    fresh ``InferCodeParams`` (``Chat.infer`` writes the first-piece prompt into them): its
    waveform (N,) float32 *before* the deletion of near-silent samples, and those parameters.
    Cached per arguments.

    The undeleted waveform is every row ``Chat._infer`` yields, concatenated, caught on the way
    through the unchanged ``Chat.infer``; what ``Chat.infer`` returns must equal it after
    :func:`strip_like_chattts`, exactly (same process, same arrays). Comparing undeleted audio
    keeps a sample within float noise of 1e-5, whose side of the threshold depends on the CPU's
    kernels, from changing the length on one side only."""
    key = (id(chat), str(artifacts_root), text, max_new, spk_smp, txt_smp, speaker)
    if key not in _DONE:
        spk = None
        if speaker:
            stats = np.load(Path(artifacts_root) / contract.SPEAKER_FILE)
            spk = encode_spk_emb(speaker_from_seed(VOICE, stats["std"], stats["mean"]))
        params = chat.InferCodeParams(spk_emb=spk, temperature=GREEDY, manual_seed=0, max_new_token=max_new,
                                      min_new_token=0, show_tqdm=False, spk_smp=spk_smp, txt_smp=txt_smp)
        rows: list[np.ndarray] = []
        upstream = chat._infer

        def caught(*args: Any, **kwargs: Any) -> Any:
            for wavs in upstream(*args, **kwargs):
                rows.extend(np.array(w, np.float32) for w in wavs)
                yield wavs

        chat._infer = caught
        try:
            wavs = chat.infer(text, skip_refine_text=True, params_infer_code=params)
        finally:
            del chat._infer
        raw = np.concatenate(rows) if rows else np.zeros(0, np.float32)
        np.testing.assert_array_equal(np.asarray(wavs[0], np.float32), strip_like_chattts(raw))
        _DONE[key] = (raw, params)
    return _DONE[key]


def recording(chat: Any, seed: int = 12, tokens: int = 90) -> np.ndarray:
    """Speech-like 24 kHz audio (N,) float32: random codes decoded by ``chat``'s own DVAE and
    Vocos (the kind of audio ChatTTS' encoder sees)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 625, (1, contract.NUM_VQ, tokens), generator=g, dtype=torch.int32)
    with torch.no_grad():
        return chat.vocos.decode(chat.dvae(codes)).numpy()[0].astype(np.float32)


FLOOR_NOISE = 1e-4
"""How near a level boundary a feature that ChatTTS' DVAE floors into a code may lie and still be
floored the other way by another implementation of the same arithmetic (ONNX Runtime, another
CPU's kernels). The features of the test recordings computed by torch's AVX-512 and its AVX2
kernels (``ATEN_CPU_CAPABILITY=avx2``) differ by up to 1.7e-5; some lie 1.1e-5 from a boundary."""


def sample_audio_with_knife_edges(chat: Any, wav: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ChatTTS' ``DVAE.sample_audio(wav)``: its codes (4, T) int32 and a (4, T) bool mask of the
    codes decided by a ``floor`` of a feature within :data:`FLOOR_NOISE` of a level boundary, in
    that code's residual stage or an earlier one of its group (a later stage quantizes what the
    earlier left). Only those codes may come out otherwise from arithmetic that is equal to
    float noise."""
    import vector_quantize_pytorch.finite_scalar_quantization as fsq

    features: list[np.ndarray] = []
    floor = fsq.floor_ste

    def caught(z: Any) -> Any:
        features.append(z.detach().double().numpy().copy())
        return floor(z)

    fsq.floor_ste = caught
    try:
        codes = chat.dvae.sample_audio(np.array(wav, np.float32)).numpy().astype(np.int32)
    finally:
        fsq.floor_ste = floor
    stages = len(chat.dvae.vq_layer.quantizer.rvqs[0].layers)
    assert len(features) == codes.shape[0] == contract.NUM_VQ, (len(features), codes.shape)
    near = np.zeros(codes.shape, bool)
    for q, z in enumerate(features):  # one floor per (group, stage), in the codes' row order
        frac = z.reshape(codes.shape[1], -1) % 1.0
        close = (np.minimum(frac, 1.0 - frac) <= FLOOR_NOISE).any(axis=-1)
        near[q:(q // stages + 1) * stages] |= close
    return codes, near


def assert_same_codes(ours: np.ndarray, ref: np.ndarray, near: np.ndarray) -> int:
    """Ours (T, 4) equals ChatTTS' ``ref`` (4, T) code for code, except the ``near`` ones of
    :func:`sample_audio_with_knife_edges`, which may differ. Returns how many were excused."""
    assert ours.shape == ref.T.shape, (ours.shape, ref.shape)
    keep = ~near.T
    np.testing.assert_array_equal(ours[keep], ref.T[keep])
    return int(near.sum())


def assert_same_audio(ours: np.ndarray, ref: np.ndarray) -> float:
    """Ours (the server's, undeleted) equals ``ref`` (:func:`chat_infer`'s, undeleted) sample for
    sample: the same length and within 1e-5 (measured: within 3e-7). Returns the largest
    difference."""
    got = np.asarray(ours, np.float32)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = float(np.abs(got - ref).max()) if ref.size else 0.0
    assert err <= 1e-5, err
    return err
