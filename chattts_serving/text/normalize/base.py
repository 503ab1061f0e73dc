"""The normaliser's vocabulary: languages, ChatTTS' control tokens, the result types and
character classes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

Lang = Literal["zh", "en"]

DEFAULT_SPEED: Final = 5
"""ChatTTS' default speed token is ``[speed_5]``."""

CONTROL_WORDS: Final = ("uv_break", "v_break", "lbreak", "llbreak", "laugh")
"""Control tokens without a number, kept in the text."""
CONTROL_NUMBERED: Final = {"break": 8, "laugh": 3, "oral": 10, "speed": 10}
"""Numbered control tokens ``[name_N]`` and how many N each has (N in 0..count-1), as in
ChatTTS' tokenizer (``[break_0..7]``, ``[laugh_0..2]``, ``[oral_0..9]``, ``[speed_0..9]``)."""
RESERVED_TOKENS: Final = ("Sbreak", "Pbreak", "Sasr", "Stts", "Ptts", "Pasr", "Easr", "Etts", "Ebreak",
                          "undefine", "spk_emb", "empty_spk", "music", "pure")
"""Tokens of ChatTTS' tokenizer that structure the prompt: removed from user text and reported."""

SPOKEN_CHARS: Final = re.compile(r"[\u4e00-\u9fffA-Za-z]")
"""A character that is spoken (Chinese character or Latin letter)."""
CONTROL_TOKEN: Final = re.compile(
    r"\[(?:" + "|".join(CONTROL_WORDS) + r"|(?:" + "|".join(CONTROL_NUMBERED) + r")_\d+)\]")
"""A control token as it appears in normalised text."""
TAG_PATTERN: Final = r"\[(?P<tag>[A-Za-z]+(?:_[A-Za-z]+)*(?:_\d+)?)\]"
"""Anything shaped like a token (``[word]``, ``[word_N]``): the scanner's first pattern."""


def speakable(text: str) -> bool:
    """Whether normalised ``text`` holds anything spoken (:data:`SPOKEN_CHARS`) outside its
    control tokens."""
    return bool(SPOKEN_CHARS.search(CONTROL_TOKEN.sub("", text)))


class TextNormError(ValueError):
    """Text that cannot be normalised: a control token out of its range (message says which)."""


@dataclass(frozen=True)
class Segment:
    """A run of normalised text in one language; neutral characters (spaces, pause marks,
    control tokens) belong to the run they follow."""

    lang: Lang
    text: str


@dataclass(frozen=True)
class NormalizedText:
    """Result of :func:`normalize`.

    text: the text to speak, with control tokens in place and without ``[speed_N]``.
    speed: N of the first ``[speed_N]`` token in the input (0..9), or None.
    dropped: characters that could not be spoken and reserved tokens that were removed,
    each once, in order of first appearance.
    segments: ``text`` split into Chinese and English runs (:func:`split_languages`).
    """

    text: str
    speed: int | None
    dropped: tuple[str, ...]
    segments: tuple[Segment, ...]


# --- character classes ------------------------------------------------------------


def is_cjk(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff"


def is_latin(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def script(c: str) -> Lang | None:
    if is_cjk(c):
        return "zh"
    if is_latin(c):
        return "en"
    return None


LAST_SPOKEN_CJK: Final = "\u9fa5"
"""The last character of the CJK Unified Ideographs of Unicode 1.1 (U+4E00..U+9FA5). ChatTTS'
tokenizer has the vocabulary of bert-base-chinese, whose Chinese characters all lie in that
range (its last one is 龟, U+9F9F); later additions to the block (U+9FA6..U+9FFF, e.g. the
element 鿏) would reach the GPT as ``[UNK]``, so :func:`normalize` reports them as not spoken.
The front end then checks every character against the vocabulary it loaded."""
