"""Stateful vocoder graphs: each call vocodes only the tokens it has not committed yet, with the
convolution state of the tokens before them carried in explicit cache tensors.

Both vocoder paths (hidden -> Decoder -> Vocos, codes -> DVAE -> Vocos) are stacks of 'same'
Conv1d layers (stride 1, kernel ``k``, dilation ``d``, radius ``r = d (k - 1) / 2``) with
per-frame layers between them (GELU, LayerNorm over channels, Linear, the ConvNeXt blocks'
residual adds) and no layer that mixes time otherwise (no global norm, no attention): a frame's
value depends only on the frames within the summed radii. The iSTFT head is an overlap-add of
``n_fft`` windowed frames at ``hop``.

One call covers the frames ``[P, E)`` of the uncommitted tokens (2 mel frames per token; ``P``
the frames committed by the calls before, ``E`` those the call was given, lookahead included).
Every radius-``r`` convolution reads its cache (its own input at ``[P - r, P)``, zeros before
the stream's start, as offline 'same' padding) before the new input, pads ``r`` zeros after
``E`` (what the offline decode does at the end of the utterance; for a call that is not the
last, a guess for the lookahead's own right context) and outputs ``[P, E)`` again, so every
residual and per-frame layer lines up without being touched: ChatTTS' and Vocos' own modules
run as they are, with their Conv1d layers swapped for :class:`CachedConv1d`. The call commits
``commit`` frames: each cache becomes that layer's input at ``[P + commit - r, P + commit)``
(the values this call computed there) and the iSTFT cache the last :data:`SPEC_CACHE_FRAMES`
committed spectra. The frames ``[P + commit, E)`` (the lookahead) are computed again by the next
call, with the tokens that came since.

What the graph returns is the overlap-added, un-normalised iSTFT of the cached and new spectra;
:class:`chattts_serving.audio.vocoder.StreamingVocoderRunner` divides by the window envelope of the
global frame positions and cuts the samples to send. With a lookahead of at least the stack's
receptive field every committed value equals the offline decode's; with less, the committed
values near the commit point carry the lookahead's guess (the error that docs/streaming-quality.md
measures), and the next call continues from them rather than from a fresh window.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import contract
from . import graphs

SPEC_CACHE_FRAMES = 3
"""Committed spectra kept for the next call's overlap-add: a sample ``s`` is covered by the
frames ``f`` with ``hop f <= s < hop f + n_fft``, so (n_fft / hop) - 1 = 3 earlier frames reach
the first sample the next call emits."""


class _CacheContext:
    """The caches of one traced call, handed to the :class:`CachedConv1d` layers in the order
    they run (the stack is sequential: every layer runs once per call)."""

    def __init__(self) -> None:
        self.incoming: list[torch.Tensor] = []
        self.outgoing: list[torch.Tensor] = []
        self.commit: torch.Tensor = torch.zeros((), dtype=torch.long)

    def start(self, caches: list[torch.Tensor], commit: torch.Tensor) -> None:
        self.incoming, self.outgoing, self.commit = list(caches), [], commit

    def take(self) -> torch.Tensor:
        return self.incoming[len(self.outgoing)]


class CachedConv1d(nn.Module):
    """A 'same' ``nn.Conv1d`` (stride 1, symmetric zero padding ``r``) over a stream: input
    (B, C, T) of the frames ``[P, E)``, its cache (B, C, r) the frames ``[P - r, P)``; output
    (B, C_out, T) of ``[P, E)`` with zeros after ``E``; records the next cache, the input at
    ``[P + commit - r, P + commit)``."""

    def __init__(self, conv: nn.Conv1d, ctx: _CacheContext) -> None:
        super().__init__()
        if conv.stride[0] != 1 or conv.padding_mode != "zeros":
            raise ValueError("only stride-1, zero-padded convolutions can carry a cache")
        r = conv.dilation[0] * (conv.kernel_size[0] - 1) // 2
        if not isinstance(conv.padding, tuple) or conv.padding[0] != r or conv.kernel_size[0] % 2 == 0:
            raise ValueError(f"not a 'same' convolution: kernel {conv.kernel_size}, padding {conv.padding}, "
                             f"dilation {conv.dilation}")
        self.conv, self.radius, self.ctx = conv, r, ctx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = self.ctx.take()
        z = torch.cat([cache, x], dim=2)  # frames [P - r, E)
        keep = self.ctx.commit + torch.arange(self.radius, dtype=torch.long)
        self.ctx.outgoing.append(torch.index_select(z, 2, keep))
        z = nn.functional.pad(z, (0, self.radius))
        c = self.conv
        return nn.functional.conv1d(z, c.weight, c.bias, 1, 0, c.dilation, c.groups)


def _cache_convs(module: nn.Module, ctx: _CacheContext) -> list[tuple[int, int]]:
    """Swap every Conv1d of radius > 0 in ``module`` (in place, in module order) for a
    :class:`CachedConv1d`; returns (channels, radius) of each, in that order."""
    shapes = []
    for name, child in list(module.named_children()):
        if isinstance(child, CachedConv1d):
            continue
        if isinstance(child, nn.Conv1d):
            r = child.dilation[0] * (child.kernel_size[0] - 1) // 2
            if r > 0:
                setattr(module, name, CachedConv1d(child, ctx))
                shapes.append((child.in_channels, r))
        else:
            shapes.extend(_cache_convs(child, ctx))
    return shapes


class StreamingVocoder(nn.Module):
    """One stateful call of a vocoder path (see the module docstring).

    Inputs: ``x`` (B, T, H) float32 hidden states or (B, T, 4) int32 codes of the tokens
    ``[P/2, E/2)``; ``commit`` int64 (1,): mel frames to commit (2 per token, at most 2T);
    ``spec_cache`` (B, n_fft + 2, 3) float32: the real and imaginary parts of the 3 spectra
    before ``P``; ``cache_i`` (B, C_i, r_i) float32 per convolution (:attr:`cache_shapes`).
    Outputs: ``raw`` (B, hop (2T + 2) + n_fft) float32, the overlap-add of the frames
    ``[P - 3, E)`` starting at sample ``hop (P - 3)`` before the iSTFT's centring and the
    envelope division; ``next_spec_cache`` and ``next_cache_i`` as the inputs, at the commit
    point.

    ``decoder`` and ``mel_stack``: for the hidden path ChatTTS' ``Decoder`` (a DVAE without
    quantiser), for the codes path the DVAE, with ``codes`` True. The modules are deep-copied
    before their convolutions are swapped.
    """

    def __init__(self, dvae: Any, vocos: Any, codes: bool) -> None:
        super().__init__()
        self.ctx = _CacheContext()
        self.codes = codes
        self.deq = graphs.CodeDequantizer(dvae.vq_layer) if codes else None
        self.decoder = copy.deepcopy(dvae.decoder)  # copies: their convolutions are swapped below
        out_conv = copy.deepcopy(dvae.out_conv)
        self.out_conv = CachedConv1d(out_conv, self.ctx)
        self.register_buffer("coef", dvae.coef.detach().clone())
        tail = graphs.VocosTail(copy.deepcopy(vocos))
        self.backbone, self.out, self.istft = tail.backbone, tail.out, tail.istft
        self.cache_shapes = [*_cache_convs(self.decoder, self.ctx), (out_conv.in_channels, self.out_conv.radius),
                             *_cache_convs(self.backbone, self.ctx)]
        """(channels, radius) of each convolution's cache, in the order of the graph's inputs."""

    def forward(self, x: torch.Tensor, commit: torch.Tensor, spec_cache: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.ctx.start(list(caches), commit.reshape(()))
        if self.deq is not None:
            x = self.deq(x)
        y = graphs._dvae_decode(self, x.transpose(1, 2))
        y = self.backbone(y)
        y = self.out(y).transpose(1, 2)
        mag, p = y.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        spec = torch.cat([spec_cache, torch.cat([mag * torch.cos(p), mag * torch.sin(p)], dim=1)], dim=2)
        keep = commit.reshape(()) + torch.arange(SPEC_CACHE_FRAMES, dtype=torch.long)
        next_spec = torch.index_select(spec, 2, keep)
        raw = nn.functional.conv_transpose1d(spec, self.istft.basis, stride=self.istft.hop)[:, 0]
        return (raw, next_spec, *self.ctx.outgoing)

    def input_names(self) -> list[str]:
        return ["codes" if self.codes else "hidden", "commit", "spec_cache",
                *(f"cache_{i}" for i in range(len(self.cache_shapes)))]

    def output_names(self) -> list[str]:
        return ["raw", "next_spec_cache", *(f"next_cache_{i}" for i in range(len(self.cache_shapes)))]

    def example(self, batch: int, tokens: int, hidden: int) -> tuple[torch.Tensor, ...]:
        """Arguments of one call of ``tokens`` tokens from a fresh stream (for tracing)."""
        x = (torch.randint(0, 625, (batch, tokens, 4), dtype=torch.int32) if self.codes
             else torch.randn(batch, tokens, hidden))
        bins = self.istft.basis.shape[0]
        return (x, torch.tensor([2 * tokens - 2], dtype=torch.long), torch.zeros(batch, bins, SPEC_CACHE_FRAMES),
                *(torch.zeros(batch, c, r) for c, r in self.cache_shapes))

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        axes: dict[str, dict[int, str]] = {self.input_names()[0]: {0: "batch", 1: "tokens"},
                                           "raw": {0: "batch", 1: "samples"}}
        for name in self.input_names()[2:] + self.output_names()[1:]:
            axes[name] = {0: "batch"}
        return axes


def manifest_entry(model: StreamingVocoder) -> dict[str, Any]:
    """What the manifest records of a stateful graph: its caches' (channels, radius), the
    spectrum cache's size and the iSTFT's n_fft and hop (the runner builds zero caches and the
    envelope from them)."""
    return {"caches": [list(s) for s in model.cache_shapes], "spec_bins": int(model.istft.basis.shape[0]),
            "spec_cache_frames": SPEC_CACHE_FRAMES, "n_fft": int(model.istft.n_fft), "hop": int(model.istft.hop)}


def add_streaming_vocoders(chat: Any, out: Path, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Export the stateful graph of both vocoder paths of ``chat`` into the artifact directory
    ``out`` (``contract.VOCODER_STREAM_GRAPHS``) and check each against the offline graph next to
    it: a stream of chunks at a lookahead of the receptive field must give the offline decode.
    Returns the manifest section ``streaming_vocoders`` (per file: :func:`manifest_entry`, the
    parity error); the caller writes it. Raises WeightsError when the parity exceeds
    :data:`STREAM_PARITY_TOLERANCE`."""
    from .onnxfile import onnx_export

    say = progress or (lambda _msg: None)
    hidden = int(chat.gpt.gpt.config.hidden_size)
    section: dict[str, Any] = {}
    for source, dvae, codes in ((contract.VOCODER_HIDDEN_GRAPH, chat.decoder, False),
                                (contract.VOCODER_CODES_GRAPH, chat.dvae, True)):
        name = contract.VOCODER_STREAM_GRAPHS[source]
        say(f"exporting the stateful vocoder {name}")
        model = StreamingVocoder(dvae, chat.vocos, codes).eval()
        tmp = out / f".{name}.{os.getpid()}"  # renamed into place: a reader never sees half a file
        onnx_export(model, model.example(1, 9, hidden), tmp, model.input_names(), model.output_names(),
                     model.dynamic_axes())
        tmp.replace(out / name)
        section[name] = manifest_entry(model)
    return section


STREAM_PARITY_TOLERANCE = 1e-5
"""Largest absolute difference allowed between a stateful graph's stream at a lookahead of the
receptive field and the offline graph's decode of the same tokens (float rounding only: the
same operations in another order)."""


def stream_parity(root: Path, source: str, tokens: int = 61, seed: int = 0) -> float:
    """Max absolute difference between the offline graph ``source`` of the artifacts in ``root``
    and its stateful graph streaming the same random input in uneven chunks (1, 4, 7, ... tokens)
    at a lookahead of the receptive field (``tokens`` tokens; float32 audio)."""
    from ..audio.vocoder import StreamingVocoderRunner, VocoderRunner
    from ..runtime import Artifacts

    art = Artifacts.load(root)
    path = contract.VocoderPath.HIDDEN if source == contract.VOCODER_HIDDEN_GRAPH else contract.VocoderPath.CODES
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((tokens, art.hidden_size)).astype(np.float32) if path is contract.VocoderPath.HIDDEN
         else rng.integers(0, 625, (tokens, contract.NUM_VQ)).astype(np.int32))
    offline = VocoderRunner(art, path).run(x[None])[0]
    runner = StreamingVocoderRunner(art, path)
    stream = runner.open()
    look = art.receptive_field_tokens(path)
    parts, b, size = [], 0, 1
    while b < tokens:
        e = min(tokens, b + size)
        end = min(tokens, e + look)
        final = end == tokens  # the last chunk takes the rest once its lookahead would run past the end
        audio = stream.vocode(x[b:end], b, final, None if final else e)
        parts.append(audio if final else audio[:contract.SAMPLES_PER_TOKEN * (e - b)])
        b, size = (tokens if final else e), size + 3
    return float(np.abs(np.concatenate(parts) - offline).max())


def ensure_streaming_vocoders(out: Path, weights_root: Path, *, chat: Any = None,
                              quantize: Callable[[Path, Path], None] | None = None,
                              progress: Callable[[str], None] | None = None) -> bool:
    """Add the stateful vocoder graphs to the complete artifact directory ``out`` where missing
    (loading the checkpoint in ``weights_root`` unless ``chat`` is given), and, given
    ``quantize`` (src, dst: the int8 vocoders' quantization, which
    :func:`chattts_serving.export.variants.ensure_precision` passes), the int8 file of each where
    the directory has int8 vocoders. Records them in manifest.json
    (``streaming_vocoders``: per file its caches, ``parity_max_abs_error`` against the offline
    graph, ``variants``; their sha256 under ``files``). Returns True when a file was written.

    Raises:
        WeightsError: a stateful graph's stream differs from the offline decode by more than
            :data:`STREAM_PARITY_TOLERANCE` (its files are removed, the manifest keeps no entry).
    """
    from .onnxfile import sha256_file
    from .weights import WeightsError

    say = progress or (lambda _msg: None)
    man_path = out / contract.MANIFEST
    manifest = json.loads(man_path.read_text())
    section = dict(manifest.get("streaming_vocoders", {}))
    wrote = False
    if any("parity_max_abs_error" not in section.get(name, {}) or not (out / name).is_file()
           for name in contract.VOCODER_STREAM_GRAPHS.values()):
        if chat is None:
            from .weights import load_chat

            say("loading weights through ChatTTS (stateful vocoders)")
            chat = load_chat(weights_root)
        section = add_streaming_vocoders(chat, out, progress=say)
        _write_section(man_path, section, {n: sha256_file(out / n) for n in section})
        for source, name in contract.VOCODER_STREAM_GRAPHS.items():
            err = stream_parity(out, source)
            section[name]["parity_max_abs_error"] = err
            if not err <= STREAM_PARITY_TOLERANCE:
                for n in contract.VOCODER_STREAM_GRAPHS.values():
                    (out / n).unlink(missing_ok=True)
                _write_section(man_path, None, {})
                raise WeightsError(f"the stateful vocoder {name} streams its offline graph's decode with an error of "
                                   f"{err:.3g} (> {STREAM_PARITY_TOLERANCE})")
        wrote = True
    int8 = manifest.get("precisions", {}).get("int8", {})
    files: dict[str, str] = {}
    for source, name in contract.VOCODER_STREAM_GRAPHS.items():
        variants = section[name].setdefault("variants", {})
        if quantize and int8.get(source) and not (variants.get("int8") and (out / variants["int8"]).is_file()):
            dst = name.removesuffix(".onnx") + contract.STREAM_INT8_SUFFIX
            say(f"quantizing the stateful vocoder {name} to int8")
            tmp = out / f".{dst}.{os.getpid()}"
            quantize(out / name, tmp)
            tmp.replace(out / dst)
            variants["int8"] = dst
            wrote = True
        files.update({f: sha256_file(out / f) for f in (name, *variants.values())})
    if wrote:
        _write_section(man_path, section, files)
    return wrote


def _write_section(man_path: Path, section: dict[str, Any] | None, files: dict[str, str]) -> None:
    """Re-read manifest.json, set (or with None drop) ``streaming_vocoders``, add ``files``, and
    replace the file in one rename (other writers' keys kept)."""
    manifest = json.loads(man_path.read_text())
    if section is None:
        manifest.pop("streaming_vocoders", None)
    else:
        manifest["streaming_vocoders"] = section
    manifest.setdefault("files", {}).update(files)
    tmp = man_path.with_name(f".{man_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.replace(man_path)
