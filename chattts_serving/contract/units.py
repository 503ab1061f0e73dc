"""Audio geometry and the GPT's code and text vocabularies (ChatTTS 0.2.5): sample rate, hop,
samples per token, codes per step, special-token ids."""

from __future__ import annotations

from typing import Final

# --- audio -----------------------------------------------------------------------------
SAMPLE_RATE_HZ: Final = 24000
"""Output sample rate of every audio tensor, in Hz (mono, float32 in [-1, 1])."""
HOP_SAMPLES: Final = 256
"""Vocos iSTFT hop length, samples per mel frame."""
MEL_FRAMES_PER_TOKEN: Final = 2
SAMPLES_PER_TOKEN: Final = HOP_SAMPLES * MEL_FRAMES_PER_TOKEN
"""Samples of audio per GPT step (512)."""
N_FFT: Final = 1024
"""Vocos iSTFT frame size in samples (and the DVAE encoder's STFT size)."""
N_MELS: Final = 100
"""Mel bins of the vocoders' and the DVAE encoder's mel spectrograms."""

# --- GPT codes ---------------------------------------------------------------------------
NUM_VQ: Final = 4
"""Codes per GPT step (one per code head)."""
NUM_AUDIO_TOKENS: Final = 626
"""Code vocabulary per head: 0..624 are audio codes, 625 ends the sequence."""
EOS_CODE: Final = 625
"""A code-head value that ends the sequence (not emitted)."""
TEXT_VOCAB_SIZE: Final = 21178
"""bert-base-chinese (21128) plus ChatTTS' 50 added tokens (ids 21128..21177)."""
BERT_VOCAB_SIZE: Final = 21128
SPECIAL_TOKEN_IDS: Final = {"[Stts]": 21131, "[Ebreak]": 21136, "[laugh]": 21142, "[spk_emb]": 21143,
                            "[break_0]": 21147}
"""Special-token ids of ChatTTS' published tokenizer that the project relies on."""
TEXT_EOS_ID: Final = SPECIAL_TOKEN_IDS["[Ebreak]"]
"""End token of the text mode: ``[Ebreak]`` (21136), ChatTTS' ``tokenizer.eos_token``; like
the code mode's 625 it ends the sequence and is not emitted."""


def samples_for_tokens(n_tokens: int) -> int:
    """Samples the vocoder returns for a window of ``n_tokens`` tokens.

    ``torch.istft(center=True)`` over ``2*n`` mel frames yields ``hop*(2n-1)`` samples, i.e. the
    last half token (256 samples) of an utterance is never produced; offline ChatTTS has the
    same length. Returns 0 for an empty window.
    """
    return max(0, SAMPLES_PER_TOKEN * n_tokens - HOP_SAMPLES)
