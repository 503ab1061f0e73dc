"""Speaker vectors: ChatTTS' ``spk_emb`` strings, seeded voices and normalisation.

A ChatTTS speaker is an H-dimensional float16 vector (H = GPT hidden size), sampled as
``randn(H) * std + mean`` from the checkpoint's speaker statistics and exchanged as a
base16384 string of its LZMA2-compressed (raw format) float16 bytes
(``ChatTTS.model.speaker.Speaker._encode``/``_decode``).
"""

from __future__ import annotations

import lzma

import numpy as np

_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


class SpeakerError(ValueError):
    """A voice that cannot be turned into a speaker vector (message says why)."""


def decode_spk_emb(s: str, dim: int) -> np.ndarray:
    """ChatTTS spk_emb string -> (dim,) float32 holding float16 values.

    Raises:
        SpeakerError: not a valid spk_emb string, or of another dimension than ``dim``.
    """
    import pybase16384 as b14

    try:
        raw = lzma.decompress(b14.decode_from_string(s), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    except Exception:  # pybase16384 and lzma raise several types on garbage
        raise SpeakerError("voice is neither an integer seed nor a valid ChatTTS spk_emb string") from None
    v = np.frombuffer(raw, dtype=np.float16)
    if v.size != dim:
        raise SpeakerError(f"spk_emb has {v.size} dimensions; this model's speakers have {dim}")
    if not np.all(np.isfinite(v)):
        raise SpeakerError("spk_emb holds non-finite values")
    return v.astype(np.float32)


def encode_spk_emb(v: np.ndarray) -> str:
    """(H,) speaker vector -> ChatTTS spk_emb string (float16, LZMA2 raw, base16384)."""
    import pybase16384 as b14

    data = lzma.compress(np.asarray(v, dtype=np.float16).tobytes(), format=lzma.FORMAT_RAW,
                         filters=_LZMA_FILTERS)
    return str(b14.encode_to_string(data))


def speaker_from_seed(seed: int, std: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """The speaker ChatTTS samples after ``torch.manual_seed(seed)``: ``randn(H, float16) * std + mean``.

    Same numbers as ``torch.manual_seed(seed); chat.sample_random_speaker()`` (the usual meaning
    of a "voice seed" in ChatTTS front ends). Returns (H,) float32 holding float16 values.
    """
    import torch

    g = torch.Generator().manual_seed(int(seed))
    std16 = torch.from_numpy(np.asarray(std, dtype=np.float16))
    mean16 = torch.from_numpy(np.asarray(mean, dtype=np.float16))
    v = torch.randn(std16.shape[0], generator=g, dtype=torch.float16).mul_(std16).add_(mean16)
    return v.numpy().astype(np.float32)


def normalize_speaker(v: np.ndarray) -> np.ndarray:
    """L2-normalise a speaker vector as ChatTTS' ``Speaker.apply`` does on its float16 tensor.

    ``F.normalize`` on float16 computes the norm in float32, rounds it to float16, divides and
    rounds the quotient to float16; doing the same here keeps prompts bit-identical to
    ChatTTS'. Input and output: (H,) float32.
    """
    v16 = np.asarray(v, dtype=np.float16)
    norm = float(np.float16(np.linalg.norm(v16.astype(np.float32))))
    norm = max(norm, 1e-12)
    return (v16.astype(np.float32) / np.float32(norm)).astype(np.float16).astype(np.float32)
