"""The DVAE encoder in ONNX Runtime (:class:`DvaeEncoderRunner`): 24 kHz audio -> audio-prompt
codes, ChatTTS 0.2.5's ``DVAE.sample_audio`` (``ChatTTS/model/dvae.py``), free of Triton.

Used for reference recordings (ChatTTS' ``spk_smp``) and for the first-piece audio prompt of
the ``chattts`` segmentation mode (:mod:`chattts_serving.audio.reference`).
"""

from __future__ import annotations

import numpy as np

from .. import contract
from ..runtime import Artifacts, OrtOptions, make_session


def log_mel(audio: np.ndarray, window: np.ndarray, fb: np.ndarray, n_fft: int = contract.N_FFT,
            hop: int = contract.HOP_SAMPLES) -> np.ndarray:
    """The DVAE encoder's log-mel of one recording, bit for bit what ChatTTS 0.2.5's
    ``MelSpectrogramFeatures`` computes (``ChatTTS/model/dvae.py``): torchaudio's
    ``MelSpectrogram(center=True, pad_mode="reflect", power=1)``, i.e. ``torch.stft`` of the
    (1, N) audio with the periodic Hann ``window``, its magnitude, ``matmul`` with the
    filterbank ``fb`` and ``log(clip(., 1e-5))``, the same torch ops in the same order.

    Args:
        audio: (N,) float32, 24 kHz mono, N >= ``contract.ENCODER_MIN_SAMPLES``.
        window: (n_fft,) float32; fb: (n_fft/2+1, 100) float32 (``dvae_mel.npz``).

    Returns:
        (100, N // hop + 1) float32.
    """
    import torch

    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).reshape(1, -1)
        spec = torch.stft(x, n_fft=n_fft, hop_length=hop, win_length=n_fft, window=torch.from_numpy(window),
                          center=True, pad_mode="reflect", normalized=False, onesided=True,
                          return_complex=True).abs()
        mel = torch.matmul(spec.transpose(-1, -2), torch.from_numpy(fb)).transpose(-1, -2)
        return torch.log(torch.clip(mel, min=1e-5))[0].numpy()


class DvaeEncoderRunner:
    """ChatTTS' ``DVAE.sample_audio`` (24 kHz audio -> mel -> DVAE encoder -> quantised
    codes): :func:`log_mel` in torch (ChatTTS' own numerics), then ``dvae_encoder.onnx``
    through ONNX Runtime. fp32 only (``opts.precision`` is ignored: the codes come from
    ``floor`` boundaries that fp16 would move).

    Raises FileNotFoundError at construction when the artifacts predate the encoder
    (exporter version < 4): re-run the export.
    """

    def __init__(self, artifacts: Artifacts, opts: OrtOptions = OrtOptions()) -> None:
        path = artifacts.root / contract.DVAE_ENCODER_GRAPH
        mel = artifacts.root / contract.MEL_FILE
        if not path.is_file() or not mel.is_file():
            raise FileNotFoundError(f"{artifacts.root} has no {contract.DVAE_ENCODER_GRAPH}/{contract.MEL_FILE}: "
                                    "these artifacts predate reference-recording support; re-run `make export`")
        with np.load(mel) as data:
            self.window = np.ascontiguousarray(data["window"], dtype=np.float32)
            self.fb = np.ascontiguousarray(data["fb"], dtype=np.float32)
        self.session = make_session(path, opts)

    def mel(self, audio: np.ndarray) -> np.ndarray:
        """:func:`log_mel` of ``audio`` (N,) float32 with this checkpoint's window and filterbank."""
        return log_mel(audio, self.window, self.fb)

    def run(self, audio: np.ndarray) -> np.ndarray:
        """Codes (T, 4) int32 in [0, 625) of one recording ``audio`` (N,) float32, mono, 24 kHz,
        T = :func:`chattts_serving.contract.encoder_tokens` (N): the transpose of ChatTTS'
        ``DVAE.sample_audio`` (4, T).

        Raises:
            ValueError: ``audio`` is not 1-D, shorter than ``contract.ENCODER_MIN_SAMPLES``
                (513) samples, or not finite.
        """
        x = np.asarray(audio, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"audio must be 1-D (mono samples), got shape {x.shape}")
        if x.size < contract.ENCODER_MIN_SAMPLES:
            raise ValueError(f"audio has {x.size} samples; the DVAE encoder needs at least "
                             f"{contract.ENCODER_MIN_SAMPLES}")
        if not np.isfinite(x).all():
            raise ValueError("audio holds NaN or infinite samples")
        out = self.session.run([contract.E_CODES], {contract.E_MEL: self.mel(x)[None]})[0]
        return np.asarray(out[0], dtype=np.int32)
