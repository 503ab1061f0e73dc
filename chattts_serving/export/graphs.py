"""Torch wrappers around ChatTTS' own modules, shaped for ONNX export.

Each wrapper calls the ``ChatTTS``/``vocos``/``transformers`` module it was given; the only
computation written here is what ONNX cannot take as-is:

- :func:`folded_code_heads`: the 4 weight-normed code heads as plain matrices (the GPT step
  itself is written from the LlamaModel's weights by :mod:`.fused`).
- :class:`InverseSTFT`: ``torch.istft(center=True)`` (what Vocos' ISTFTHead calls, and which
  does not export) as one ConvTranspose1d with a windowed inverse-DFT basis, divided by the
  window envelope.
- :class:`CodeDequantizer`: ``GroupedResidualFSQ.get_output_from_indices`` (which does not
  export with dynamic shapes) folded into 4 lookup tables, exact because the dequantiser and
  its ``project_out`` are affine in each code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .. import contract


def folded_code_heads(embed: Any) -> torch.Tensor:
    """The 4 weight-normed code heads of ChatTTS' ``Embed`` as one (4, 626, H) float32 tensor."""
    with torch.no_grad():
        return torch.stack([h.weight.detach().float() for h in embed.head_code])


def folded_text_head(embed: Any) -> torch.Tensor:
    """ChatTTS' weight-normed text head (``Embed.head_text``, ``ChatTTS/model/embed.py``) as
    one plain (V_text, H) float32 matrix, V_text = 21178: reading ``.weight`` through the
    ``torch.nn.utils.parametrizations.weight_norm`` parametrization materialises
    ``g * v / ||v||`` (norm over H per row). Text-mode logits are ``hidden @ W.T`` (the head
    has no bias), which the engine computes in numpy on the GPT step's ``hidden`` output."""
    with torch.no_grad():
        return embed.head_text.weight.detach().float().clone()


class InverseSTFT(nn.Module):
    """``torch.istft(spec, n_fft, hop, window=hann(n_fft), center=True)`` from real/imag parts.

    Inputs: real, imag: (B, n_fft//2+1, F) float32. Output: (B, hop*(F-1)) float32.
    As in ``torch.fft.irfft``, the imaginary parts of the DC and Nyquist bins are ignored.
    """

    basis: torch.Tensor
    win_sq: torch.Tensor

    def __init__(self, n_fft: int, hop: int, window: torch.Tensor) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        bins = n_fft // 2 + 1
        k = torch.arange(bins, dtype=torch.float64)[:, None]
        n = torch.arange(n_fft, dtype=torch.float64)[None, :]
        ang = 2.0 * math.pi * k * n / n_fft
        scale = torch.full((bins, 1), 2.0, dtype=torch.float64)
        scale[0] = scale[-1] = 1.0
        w = window.to(torch.float64)[None, :]
        cos_b = scale * torch.cos(ang) / n_fft * w
        sin_b = -scale * torch.sin(ang) / n_fft * w
        sin_b[0] = 0.0
        sin_b[-1] = 0.0
        self.register_buffer("basis", torch.cat([cos_b, sin_b], 0)[:, None, :].float())
        self.register_buffer("win_sq", (window.float() ** 2)[None, None, :])

    def forward(self, real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
        x = torch.cat([real, imag], dim=1)
        y = nn.functional.conv_transpose1d(x, self.basis, stride=self.hop)
        ones = torch.ones_like(real[:1, :1, :])
        env = nn.functional.conv_transpose1d(ones, self.win_sq, stride=self.hop)
        half = self.n_fft // 2
        y = y / env
        return y[:, 0, half:-half]


class VocosTail(nn.Module):
    """Vocos' backbone and ISTFT head (mel (B, 100, 2T) -> waveform (B, 512T-256))."""

    def __init__(self, vocos: Any) -> None:
        super().__init__()
        self.backbone = vocos.backbone
        head = vocos.head
        self.out = head.out
        self.istft = InverseSTFT(head.istft.n_fft, head.istft.hop_length, head.istft.window)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.backbone(mel)
        x = self.out(x).transpose(1, 2)
        mag, p = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        return self.istft(mag * torch.cos(p), mag * torch.sin(p))


def _dvae_decode(dvae: Any, feats: torch.Tensor) -> torch.Tensor:
    """ChatTTS ``DVAE.forward`` decode path after dequantisation: (B, C, T) -> mel (B, 100, 2T)."""
    b, c, t = feats.shape
    x = feats.view(b, 2, c // 2, t).permute(0, 2, 3, 1).flatten(2)
    return dvae.out_conv(dvae.decoder(x)) * dvae.coef


class VocoderFromHidden(nn.Module):
    """ChatTTS' default path: hidden (B, T, H) -> Decoder -> mel -> Vocos -> audio (B, 512T-256)."""

    def __init__(self, decoder: Any, vocos: Any) -> None:
        super().__init__()
        self.decoder = decoder
        self.tail = VocosTail(vocos)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.tail(_dvae_decode(self.decoder, hidden.transpose(1, 2)))


class CodeDequantizer(nn.Module):
    """codes (B, T, 4) int -> DVAE features (B, T, C), as ``GFSQ._embed`` computes them.

    ``table[c, i]`` is the change of the dequantised output when code channel ``c`` is ``i``
    instead of 0 and ``base`` the output for all-zero codes; the output is
    ``base + sum_c table[c, codes[..., c]]``, exact up to float rounding because FSQ's
    dequantisation and ``project_out`` are affine per code (checked by the parity test).
    """

    tables: torch.Tensor
    base: torch.Tensor

    def __init__(self, gfsq: Any) -> None:
        super().__init__()
        levels = 625
        with torch.no_grad():
            zero = torch.zeros(1, 1, contract.NUM_VQ, dtype=torch.long)
            base = self._embed(gfsq, zero)[0, 0]
            tables = []
            for c in range(contract.NUM_VQ):
                idx = torch.zeros(1, levels, contract.NUM_VQ, dtype=torch.long)
                idx[0, :, c] = torch.arange(levels)
                tables.append(self._embed(gfsq, idx)[0] - base)
        self.register_buffer("tables", torch.stack(tables).float())  # (4, 625, C)
        self.register_buffer("base", base.float())

    @staticmethod
    def _embed(gfsq: Any, codes_btq: torch.Tensor) -> torch.Tensor:
        """ChatTTS' ``GFSQ._embed`` on (B, T, 4) codes -> (B, T, C)."""
        b, t, _ = codes_btq.shape
        x = codes_btq.view(b, t, gfsq.G, gfsq.R).permute(2, 0, 1, 3)
        return gfsq.quantizer.get_output_from_indices(x)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.long().clamp(0, 624)
        out = self.base
        for c in range(contract.NUM_VQ):
            out = out + self.tables[c][codes[..., c]]
        return out


class VocoderFromCodes(nn.Module):
    """ChatTTS' cheaper path: codes (B, T, 4) int32 -> DVAE -> mel -> Vocos -> audio (B, 512T-256)."""

    def __init__(self, dvae: Any, vocos: Any) -> None:
        super().__init__()
        self.deq = CodeDequantizer(dvae.vq_layer)
        self.dvae = dvae
        self.tail = VocosTail(vocos)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        feats = self.deq(codes).transpose(1, 2)
        return self.tail(_dvae_decode(self.dvae, feats))


def conv_radius_frames(module: nn.Module) -> int:
    """Half-width, in input frames, of the receptive field of a stack of 'same' Conv1d layers.

    Sums ``dilation * (kernel - 1) // 2`` over every stride-1 Conv1d in ``module`` (the Decoder,
    the DVAE and Vocos' backbone are sequential stacks of such convolutions; pointwise
    Linear/LayerNorm layers add nothing).
    """
    r = 0
    for m in module.modules():
        if isinstance(m, nn.Conv1d) and m.stride[0] == 1:
            r += m.dilation[0] * (m.kernel_size[0] - 1) // 2
    return r


def receptive_field_tokens(mel_stack: list[nn.Module], vocos: Any) -> int:
    """Tokens of context on each side that fully determine a token's samples: the mel-rate
    convolutions of ``mel_stack`` (Decoder or DVAE decoder and out_conv), Vocos' backbone and
    the iSTFT's overlap of n_fft/2 samples, rounded up to whole tokens."""
    frames = sum(conv_radius_frames(m) for m in mel_stack) + conv_radius_frames(vocos.backbone)
    frames += math.ceil((contract.N_FFT // 2) / contract.HOP_SAMPLES)
    return math.ceil(frames / contract.MEL_FRAMES_PER_TOKEN)


class FsqQuantizer(nn.Module):
    """ChatTTS' ``GFSQ.forward`` (a ``GroupedResidualFSQ`` of ``vector_quantize_pytorch``:
    G groups, each a residual FSQ of R levels-(5, 5, 5, 5) quantizers) written out with the
    module's own weights and buffers, because einops' shape recipes do not export with a
    dynamic length. Per group: ``project_in``, the soft clamp ``tanh(x / c) * c``, then for
    each residual layer r: ``z = residual / scale_r``, the symmetry-preserving bound with hard
    clamp (``floor((L - 1) * (clamp(z, -1, 1) + 1) / 2 + 0.5)``), the code index
    ``sum(level_index * basis)`` and ``residual -= (level_index * 2 / (L - 1) - 1) * scale_r``
    (``vector_quantize_pytorch`` 1.32 ``ResidualFSQ.forward``, ``FSQ.symmetry_preserving_bound``,
    ``FSQ.codes_to_indices``).

    Input: features (B, T, G * dim) float32. Output: codes (B, T, G * R) int32, ordered
    group-major as ``GFSQ.forward`` returns them (``ind.permute(1, 2, 0, 3)``).
    """

    def __init__(self, gfsq: Any) -> None:
        super().__init__()
        grouped = gfsq.quantizer
        self.groups = int(gfsq.G)
        self.rvqs = grouped.rvqs
        for rvq in self.rvqs:
            fsq0 = rvq.layers[0]
            if not (fsq0.preserve_symmetry and fsq0.bound_hard_clamp and rvq.soft_clamp_input_value is not None
                    and not fsq0.orthogonal_rotation and fsq0.num_codebooks == 1):
                raise ValueError("FsqQuantizer reproduces only ChatTTS' residual FSQ settings "
                                 "(symmetry-preserving, hard-clamped, soft-clamped input)")
        if int(gfsq.R) != len(self.rvqs[0].layers):
            raise ValueError("GFSQ.R does not match the residual FSQ's layer count")

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        out = []
        for rvq, x in zip(self.rvqs, feats.chunk(self.groups, dim=-1)):
            x = rvq.project_in(x)
            c = rvq.soft_clamp_input_value
            residual = (x / c).tanh() * c
            for layer, scale in zip(rvq.layers, rvq.scales):
                levels_m1 = layer._levels - 1
                z = torch.clamp(residual / scale, -1.0, 1.0)
                bracket = torch.floor(levels_m1 * (z + 1) / 2.0 + 0.5)
                out.append((bracket * layer._basis).sum(-1).round().to(torch.int32))
                codes = (2.0 / levels_m1) * bracket - 1.0
                residual = residual - codes * scale
        return torch.stack(out, -1)


class DvaeEncoder(nn.Module):
    """ChatTTS' ``DVAE.sample_audio`` (``DVAE.forward(mode="encode")``) after its mel: log-mel
    -> divided by the DVAE's ``coef`` -> ``downsample_conv`` (stride 2) -> ``encoder`` ->
    :class:`FsqQuantizer`.

    The log-mel itself (torchaudio's ``MelSpectrogram`` then ``log(clip(., 1e-5))``) is not in
    the graph: :func:`chattts_serving.audio.encoder.log_mel` computes it with the same torch ops, bit
    for bit. Expressed in the graph (a Conv1d with a windowed DFT basis) or in numpy float64, it
    came within 1.4e-4 of torch's at low-energy bins, which moved 2 of 25,708 codes across a
    level boundary on the full-size generated DVAE; with torch's own mel the graph's codes were
    all equal (docs/chattts-multisentence.md).

    Input: mel (B, 100, F) float32, F >= 2 (``N // 256 + 1`` frames of N samples).
    Output: codes (B, F // 2, 4) int32 in [0, 625): the transpose of what ``sample_audio``
    returns ((4, T) for one recording).
    """

    def __init__(self, dvae: Any) -> None:
        super().__init__()
        if getattr(dvae, "encoder", None) is None or dvae.vq_layer is None:
            raise ValueError("this DVAE has no encoder/quantizer (ChatTTS' Decoder module was given)")
        self.dvae = dvae
        self.quant = FsqQuantizer(dvae.vq_layer)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.dvae.encoder(self.dvae.downsample_conv(mel / self.dvae.coef.view(1, -1, 1)))  # (B, vq_dim, T)
        return self.quant(x.transpose(1, 2))


def mel_parameters(dvae: Any) -> dict[str, Any]:
    """The DVAE's mel front end as arrays and numbers (``DVAE.preprocessor_mel``, torchaudio
    ``MelSpectrogram``): ``window`` (n_fft,) float32 (periodic Hann), ``fb`` (n_fft/2+1, n_mels)
    float32 (torchaudio's filterbank matrix), ``n_fft``, ``hop``. Raises ValueError unless the
    settings are ChatTTS' (centred, reflect padding, magnitude, one-sided, not normalised)."""
    mel_spec = dvae.preprocessor_mel.mel_spec
    spec = mel_spec.spectrogram
    if not (spec.center and spec.pad_mode == "reflect" and spec.power == 1 and spec.onesided
            and not spec.normalized and spec.win_length == spec.n_fft and spec.pad == 0):
        raise ValueError("only ChatTTS' MelSpectrogram settings are supported "
                         "(center, reflect padding, power 1, onesided, not normalized)")
    return {"window": spec.window.detach().float().numpy().copy(),
            "fb": mel_spec.mel_scale.fb.detach().float().numpy().copy(),
            "n_fft": int(spec.n_fft), "hop": int(spec.hop_length)}
