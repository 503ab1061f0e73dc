"""Text normalisation for ChatTTS: Chinese and English text turned into words, per language.

ChatTTS' GPT reads Chinese characters, Latin letters and a few pause marks (``，。、,.``);
everything else (digits, ``%``, ``$``, ``:``, ``?``, emoji, ...) is deleted by its own
``Normalizer`` before tokenisation, so "3月5日" or "$12.50" would be spoken as "月日" and "".
:func:`normalize` runs before that ``Normalizer`` and rewrites the text so that nothing it
would delete carries meaning:

* Numbers, dates, times, phone numbers, money, percentages, ranges, fractions, ordinals, units
  and spoken symbols are verbalised in the language of their context: each match is read in
  Chinese (with ``cn2an`` for cardinals) or in English (with ``num2words``), whichever script
  surrounds it (see :func:`context_language`), so that mixed text reads each part in its own
  language. ``split_languages`` shows the resulting Chinese and English runs.
* Where one written form has two readings, words of the same sentence decide (the lists are
  module constants): ``a-b`` is a score (四比零) after or before score words (:data:`.context.SCORE_BEFORE`,
  :data:`.context.SCORE_AFTER`, :data:`.context.SCORE_SENTENCE`) or when ``a >= b``, else a range (三到五天); a
  colon is a time (十点三十分), a score after 比分, a ratio between small numbers (三比二), a
  duration after 成绩/用时, minutes and seconds before 秒 or after a countdown word (倒计时05:00);
  ``a/b`` is a fraction or a month and day as its context words say (:func:`.fractions.zh_slash_date`:
  大约11/12的时间, 截止12/31), with or without the library; a number after 电话/卡号/拨打
  (:data:`.context.IDENTIFIER_BEFORE`), in spaced digit groups or of 12 digits and more is an identifier
  read digit by digit with 幺 and a pause between groups; a lone 2 reads 两 before a measure
  word but 二 in 第2, 2号, 2楼, 2两; ``N+`` and ``N万+`` read N多; ``8k`` reads 八千; a unit
  written after a time (17:20分, 12:00点) or an amount (¥100元, €1.2亿元) is read once; a range
  of amounts, dates or negative numbers keeps its 到 (¥100-200, 3/5-3/8, -10~-5℃).
* What call centres, news and assistants say: ``*``/``#`` after 按 are keys (星号键, 井号键); a
  number after 房间/车牌/股票代码/取件码... or before 室 is an identifier, and a code with hyphens
  (3-2-1105, B2-105) is read part by part with 杠; Roman numerals (Ⅳ卷, II型, World War II,
  Louis XIV) are numbers; English titles and abbreviations (Dr., St., etc., vs.) are words;
  ``Oct 1-7`` and ``Mon-Fri`` keep their "to"; ``70s`` is a decade in English unless a word
  says seconds; ``8.15`` after 晚上/at is a clock time; ``9 - 4 = 5`` is arithmetic (减); a
  middle dot separates date parts (2019·2·10) or names an event (5·12, 五一二); ₩ ₹ ₽ ฿ and
  other signs are currencies; ``-1/3`` is 负三分之一. ``language`` ('zh', 'en', 'auto') chooses
  the language of what has no context of its own (a bare ``25kg``).
* Full-width letters, digits and punctuation are folded to half-width first, and characters
  with a readable form are replaced by it (Kangxi radicals and enclosed ideographs by their
  ideograph, 〇 by 零, ㎡ by m², Greek letters by their names); punctuation is then mapped to
  ChatTTS' pause marks in the segment's language (``，``/``。`` in Chinese, ``,``/``.`` in
  English); quotes and title marks are silent.
* ChatTTS' control tokens (``[uv_break]``, ``[laugh]``, ``[break_N]``, ``[oral_N]``, ...) are
  kept verbatim and never read aloud; a ``[speed_N]`` token is taken out of the text and
  returned as :attr:`NormalizedText.speed` (it belongs in the prompt). Prompt-structure tokens
  (``[Stts]``, ``[spk_emb]``, ...) are removed and reported.
* Nothing is dropped silently: every character that cannot be spoken (emoji, other scripts,
  unknown symbols, Chinese characters after U+9FA5 that no bert-base-chinese vocabulary has)
  and every removed reserved token is listed in :attr:`NormalizedText.dropped`.
* With ``library=True`` the Chinese reading of a few entity kinds comes from WeTextProcessing
  (:mod:`chattts_serving.text.wetext`), where the normalisation corpus shows it right.

The output holds only characters ChatTTS' ``Normalizer`` keeps (``[一-龥A-Za-z，。、,. ]``)
plus control tokens. Nothing here imports torch or Triton; ``cn2an``, ``num2words`` and
``wetext`` are imported on first use. The expected readings are the team's corpus,

The package is laid out by kind, in the shape of WeTextProcessing's taggers and verbalisers:
each family of kinds (:mod:`.dates`, :mod:`.times`, :mod:`.money`, :mod:`.quantities`,
:mod:`.ranges`, :mod:`.fractions`, :mod:`.identifiers`, :mod:`.cardinals`, :mod:`.web`) holds
each kind's pattern next to its reader (:class:`.kind.Kind`); :mod:`.precedence` lists the
kinds in the order the scanner tries them; number words (:mod:`.numbers`), tables
(:mod:`.tables`), context words and languages (:mod:`.context`), width folding (:mod:`.width`)
and the plain-text pass (:mod:`.plain`) are their own modules; :mod:`.driver` runs them.
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
