"""The exported artifacts: ONNX graph files and their variants (fp16, int8, streaming), the
files beside them, and the input and output names of the GPT step and the DVAE encoder."""

from __future__ import annotations

from typing import Final

from .units import HOP_SAMPLES, N_FFT

# --- ONNX graphs ---------------------------------------------------------------------------
ONNX_IR_VERSION: Final = 8
"""The ONNX IR version of the graphs the project writes itself (the fused step, the kernel
probe): onnx's default is newer than the onnxruntime builds of NVIDIA's image read."""
GPT_GRAPH: Final = "gpt_step.onnx"
VOCODER_HIDDEN_GRAPH: Final = "vocoder_hidden.onnx"
VOCODER_CODES_GRAPH: Final = "vocoder_codes.onnx"
DVAE_ENCODER_GRAPH: Final = "dvae_encoder.onnx"
"""log-mel (B, 100, F) float32 -> codes (B, F // 2, 4) int32: ChatTTS' ``DVAE.sample_audio``
after its mel (which audio.encoder.log_mel computes; reference recordings and the first-piece
audio prompt, see chattts_serving/audio/reference.py). fp32 only: its codes come from floor() boundaries
that fp16 would move."""
VOCODER_STREAM_GRAPHS: Final = {VOCODER_HIDDEN_GRAPH: "vocoder_hidden.stream.onnx",
                                VOCODER_CODES_GRAPH: "vocoder_codes.stream.onnx"}
"""The stateful variant of each vocoder graph (chattts_serving/export/streaming.py: a call vocodes
only the uncommitted tokens, the convolutions' left context carried in cache tensors), listed
in manifest.json under ``streaming_vocoders``; its int8 file is ``STREAM_INT8_SUFFIX`` in place of
``.onnx``."""
STREAM_INT8_SUFFIX: Final = ".int8.onnx"
FP16_GRAPH_FILES: Final = {GPT_GRAPH: "gpt_step.fp16.onnx",
                           VOCODER_HIDDEN_GRAPH: "vocoder_hidden.fp16.onnx",
                           VOCODER_CODES_GRAPH: "vocoder_codes.fp16.onnx"}
"""fp16 file of each graph (fp16 weights and compute, fp32 inputs and outputs), as the exporter
writes them and lists them in manifest.json under ``precisions.fp16``."""
INT8_GRAPH_FILES: Final = {GPT_GRAPH: "gpt_step.int8.onnx",
                           VOCODER_HIDDEN_GRAPH: "vocoder_hidden.int8.onnx",
                           VOCODER_CODES_GRAPH: "vocoder_codes.int8.onnx"}
"""int8 file of each graph that has one (8-bit weight-only MatMulNBits, fp32 IO; see
``chattts_serving/export/int8.py``), as ``chattts-export --precision int8`` writes them and lists
them in manifest.json under ``precisions.int8``."""
KV_SCALES_FILE: Final = "kv_scales.npz"
"""The int8 KV cache's scales (``k_<layer>``, ``v_<layer>``: (heads, 1, head_dim) float32 each),
written by ``python -m chattts_serving.export.accuracy kv`` and listed in manifest.json under
``kv_cache.int8``."""
MANIFEST: Final = "manifest.json"
EMBED_FILE: Final = "embed.npz"
SPEAKER_FILE: Final = "speaker_stats.npz"
TOKENIZER_DIR: Final = "tokenizer"

E_MEL: Final = "mel"
"""DVAE encoder graph input: (B, 100, F) float32 log-mel of 24 kHz audio (audio.encoder.log_mel)."""
E_CODES: Final = "codes"
"""DVAE encoder graph output: (B, F // 2, 4) int32 codes in [0, 625) (T = encoder_tokens(N))."""
MEL_FILE: Final = "dvae_mel.npz"
"""window (1024,) and fb (513, 100) float32 of the DVAE's mel front end (torchaudio's)."""
ENCODER_MIN_SAMPLES: Final = N_FFT // 2 + 1
"""Shortest audio the DVAE encoder takes (its STFT reflect-pads n_fft/2 samples): 513."""


def encoder_tokens(n_samples: int) -> int:
    """Audio-prompt tokens the DVAE encoder makes of ``n_samples`` samples: the mel has
    ``n // 256 + 1`` frames (centred STFT, hop 256) and the encoder's stride-2 convolution
    (kernel 4, padding 1) halves that, rounding down: ``(n // 256 + 1) // 2``, about one token
    per 512 samples like the GPT's own tokens (ChatTTS 0.2.5 ``DVAE.forward(mode="encode")``)."""
    return (n_samples // HOP_SAMPLES + 1) // 2 if n_samples >= ENCODER_MIN_SAMPLES else 0


G_EMBEDS: Final = "inputs_embeds"
"""GPT step input: (B, S, H) float32 embeddings of the S new positions (right-padded in a prefill)."""
G_SEQLENS_K: Final = "seqlens_k"
"""GPT step input: (B,) int32, each row's positions in its KV cache after the call, minus 1
(GroupQueryAttention's ``seqlens_k``; chattts_serving/export/fused.py)."""
G_TOTAL_SEQ: Final = "total_sequence_length"
"""GPT step input: (1,) int32, ``max(seqlens_k) + 1``."""
G_LOGITS: Final = "logits"
G_HIDDEN: Final = "hidden"


def past_names(layer: int) -> tuple[str, str]:
    """Names of layer ``layer``'s KV-cache inputs: (B, heads, C, head_dim) each, the cache
    buffers (C columns; each row's positions from column 0)."""
    return f"past_key_{layer}", f"past_value_{layer}"


def present_names(layer: int) -> tuple[str, str]:
    """Names of layer ``layer``'s KV-cache outputs: (B, heads, max(C, total), head_dim) each;
    the engine binds them to the same buffers as :func:`past_names` (the new positions are
    written in place)."""
    return f"present_key_{layer}", f"present_value_{layer}"
