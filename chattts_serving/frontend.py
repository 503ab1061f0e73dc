"""Text front end: ChatTTS' normaliser, the tokenizer, prompt building and speaker selection.

The prompt is ChatTTS' ``Speaker.decorate_code_prompts`` form::

    [Stts][spk_emb][speed_5]{normalised text}[Ptts]

tokenised without special tokens; the ``[spk_emb]`` position later receives the speaker
vector. ChatTTS' ``Normalizer`` (without a registered number normaliser) deletes characters
it cannot speak, digits among them; the front end never drops text silently: it reports
those characters, and refuses text with nothing speakable left.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .runtime import Artifacts
from .speaker import SpeakerError, decode_spk_emb, normalize_speaker, speaker_from_seed

log = logging.getLogger("chattts_serving.frontend")

_SPEAKABLE = re.compile(r"[\u4e00-\u9fffA-Za-z]")
_PROMPT_TAGS = ("[Stts]", "[spk_emb]", "[empty_spk]", "[Ptts]")
MAX_VOICE_SEED = 2**32 - 1


class FrontendError(ValueError):
    """Input the front end refuses (empty text, nothing speakable, unknown voice, too long)."""


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine.

    input_ids: (T,) int32 prompt ids; spk_emb: (H,) float32 normalised speaker vector;
    normalized: the text actually spoken; dropped: characters ChatTTS' normaliser removed.
    """

    input_ids: np.ndarray
    spk_emb: np.ndarray
    normalized: str
    dropped: tuple[str, ...]


class FrontEnd:
    """Stateless text -> prompt conversion for one artifact directory."""

    def __init__(self, artifacts: Artifacts, max_text_chars: int, default_voice_seed: int) -> None:
        from transformers import BertTokenizerFast  # type: ignore[attr-defined]

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.tokenizer = BertTokenizerFast.from_pretrained(str(artifacts.root / "tokenizer"))
        stats = np.load(artifacts.root / "speaker_stats.npz")
        self.std, self.mean = stats["std"], stats["mean"]
        self.dim = int(self.std.shape[0])
        self.max_text_chars = max_text_chars
        self.default_voice_seed = default_voice_seed
        self.normalizer = _chattts_normalizer()

    def speaker(self, voice: str) -> np.ndarray:
        """(H,) normalised speaker vector for ``voice``: '' (default voice), an integer seed
        in [0, 2**32-1], or a ChatTTS spk_emb string. Raises :class:`FrontendError`."""
        voice = voice.strip()
        if not voice:
            raw = speaker_from_seed(self.default_voice_seed, self.std, self.mean)
        elif re.fullmatch(r"[+-]?\d+", voice):
            seed = int(voice)
            if not 0 <= seed <= MAX_VOICE_SEED:
                raise FrontendError(f"voice seed {seed} is out of range [0, {MAX_VOICE_SEED}]")
            raw = speaker_from_seed(seed, self.std, self.mean)
        else:
            try:
                raw = decode_spk_emb(voice, self.dim)
            except SpeakerError as exc:
                raise FrontendError(f"unknown voice: {exc}") from None
        return normalize_speaker(raw)

    def prepare(self, text: str, voice: str = "") -> Prepared:
        """Normalise, build the prompt and tokenize. Raises :class:`FrontendError`."""
        if len(text) > self.max_text_chars:
            raise FrontendError(f"text has {len(text)} characters; the limit is {self.max_text_chars}")
        for tag in _PROMPT_TAGS:
            text = text.replace(tag, "")
        text = text.strip()
        if not text:
            raise FrontendError("text is empty")
        spk = self.speaker(voice)
        dropped = tuple(sorted(self.normalizer._count_invalid_characters(text)))
        normalized = self.normalizer(text, do_text_normalization=True, do_homophone_replacement=True).strip()
        if not _SPEAKABLE.search(re.sub(r"\[[\w_]+\]", "", normalized)):
            raise FrontendError("text has nothing speakable after normalisation "
                                f"(only punctuation, symbols or unsupported characters: {''.join(dropped)!r})")
        prompt = f"[Stts][spk_emb][speed_5]{normalized}[Ptts]"
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return Prepared(np.asarray(ids, dtype=np.int32), spk, normalized, dropped)


def _chattts_normalizer() -> Any:
    """ChatTTS' own ``Normalizer`` with its homophones map, logging quietly."""
    import ChatTTS
    from ChatTTS.norm import Normalizer

    quiet = logging.getLogger("chattts_serving.chattts_norm")
    quiet.setLevel(logging.ERROR)
    res = Path(ChatTTS.__file__).parent / "res" / "homophones_map.json"
    return Normalizer(str(res), quiet)
