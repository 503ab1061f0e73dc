"""Text normalisation for ChatTTS: Chinese and English text turned into words it can speak.

ChatTTS' own ``Normalizer`` deletes everything but Chinese characters, Latin letters and a few
pause marks before tokenisation, so "3月5日" or "$12.50" would lose their numbers.
:func:`normalize` runs first and verbalises every entity (numbers, dates, times, money, units,
phone numbers, scores, ranges, fractions, ...) in the language of its context, Chinese or
English, using words of the same sentence where one written form has two readings (4-0获胜 is a
score, 3-5天 a range). Its output holds only ``[一-龥A-Za-z，。、,. ]`` and ChatTTS' control
tokens; a ``[speed_N]`` token is returned apart, and whatever cannot be spoken is listed in
:attr:`NormalizedText.dropped`, never dropped silently. With ``library=True`` a few kinds read in
Chinese come from WeTextProcessing (:mod:`chattts_serving.text.wetext`, :data:`LIBRARY_KINDS`).

Layout, in the shape of WeTextProcessing's taggers and verbalisers: each kind is a pattern and
its reader (:class:`.kind.Kind`) in the module of its family (:mod:`.dates`, :mod:`.times`,
:mod:`.money`, ...); :mod:`.precedence` orders them for the scanner; :mod:`.driver` runs it.
Word lists and tables are TSV files in ``data/`` (:mod:`.vocabulary`). The expected readings are
the team's corpus, ``tests/data/textnorm/<category>.tsv``. No torch or Triton here; ``cn2an``,
``num2words`` and ``wetext`` are imported on first use.
"""

from __future__ import annotations

from .base import (
    CONTROL_NUMBERED,
    CONTROL_TOKEN,
    CONTROL_WORDS,
    DEFAULT_SPEED,
    LAST_SPOKEN_CJK,
    RESERVED_TOKENS,
    SPOKEN_CHARS,
    Lang,
    NormalizedText,
    Segment,
    TextNormError,
    speakable,
)
from .context import context_language, dominant_language
from .driver import LANGUAGES, normalize, punctuate
from .numbers import en_digits, en_int, en_number, en_ordinal, en_year, zh_digits, zh_number
from .plain import split_languages
from .precedence import KINDS, LIBRARY_KINDS, PRECEDENCE
from .width import fold_width

__all__ = [
    "CONTROL_NUMBERED",
    "CONTROL_TOKEN",
    "CONTROL_WORDS",
    "DEFAULT_SPEED",
    "KINDS",
    "LANGUAGES",
    "LAST_SPOKEN_CJK",
    "LIBRARY_KINDS",
    "PRECEDENCE",
    "RESERVED_TOKENS",
    "SPOKEN_CHARS",
    "Lang",
    "NormalizedText",
    "Segment",
    "TextNormError",
    "context_language",
    "dominant_language",
    "en_digits",
    "en_int",
    "en_number",
    "en_ordinal",
    "en_year",
    "fold_width",
    "normalize",
    "punctuate",
    "speakable",
    "split_languages",
    "zh_digits",
    "zh_number",
]
