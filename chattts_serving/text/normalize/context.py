"""Context: which language a span is read in, the sentence around it, and the word lists that
several kinds share to choose between two readings (``data/<name>.tsv``, :mod:`.vocabulary`).

Each list is searched in the same sentence only (up to the nearest 。！？ or line break), with
control tokens ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from .base import Lang, is_cjk, is_latin, script
from .vocabulary import rows, words, yes

SCORE_BEFORE: Final = words("score_before")
"""Written right before ``a-b`` or ``a:b`` (spaces, 为/是 between allowed), they make it a score
or ratio read with 比 (比分3:2, 首局25-23, 以2-1)."""
SCORE_AFTER: Final = words("score_after")
"""Written right after ``a-b`` or ``a:b``, they make it a score (4-0获胜, 3:1击败)."""
SCORE_SENTENCE: Final = (*SCORE_AFTER, *words("score_sentence"))
"""Anywhere in the sentence, they make a hyphen between two integers a score rather than a
range (他4-0获胜，从0-3追到3-3), unless a unit or measure word follows it (比赛还剩3-5分钟)."""

SCORE_WORDS_EN: Final = re.compile(rf"\b(?:{'|'.join(re.escape(w) for w in words('score_words_en'))})\b", re.IGNORECASE)
"""English words of a match in the sentence of ``a - b`` written with spaces (the final score was
3 - 1, they won 2 - 0): a score, read to; without them a spaced dash is a range or a minus."""


IDENTIFIER_BEFORE: Final = words("identifier_before")
"""Written right before a number of three or more digits (spaces, ``:``, 是/为 between
allowed), they make it an identifier read digit by digit with 幺 (拨打110, 验证码385921,
房间2508, 股票代码600519); after them a number with hyphens is a code read part by part
(取件码3-1105)."""
IDENTIFIER_AFTER: Final = words("identifier_after")
"""Written right after a number of three or more digits, they make it a room number read
digit by digit (1203室 -> 幺二零三室); ``3室2厅`` counts rooms."""
EN_IDENTIFIER_BEFORE: Final = words("identifier_before_en")
"""English words right before a number of three or more digits that make it an identifier
read digit by digit (call 911 -> nine one one, room 305 -> three zero five)."""
TEMPERATURE_BEFORE: Final = words("temperature_before")
"""Before ``-N度`` in the same clause, they make it a temperature: 零下 N 度."""
NO_SENTENCE_END: Final = frozenset(abbr for abbr, _, ends in rows("abbreviations") if not yes(ends))
"""Abbreviations whose dot never ends a sentence (nor do the titles' dots)."""
NO_END_ABBREVIATIONS: Final = tuple(sorted({*words("titles"), *NO_SENTENCE_END}))
"""Titles and abbreviations whose dot ends no sentence (Mr. Smith, ext. 204)."""
NUMBER_MARK_WORDS: Final = {"p": "page", "pp": "pages", "Art": "Article", "Arts": "Articles", "Para": "Paragraph",
                            "para": "paragraph"}
"""Abbreviations read as words only before a number (p. 12, Art. 12; the abbreviation kind)."""
NUMBER_MARKS: Final = ("No", "no", *NUMBER_MARK_WORDS)
"""Written with a dot before a number (No. 5, p. 12, Art. 12): that dot ends no sentence when a number
follows (``I said no. Then`` it does)."""
_NO_END_BEFORE: Final = "".join(rf"(?<!\b{re.escape(a)})" for a in NO_END_ABBREVIATIONS)
_NUMBER_MARK_BEFORE: Final = "".join(rf"(?<!\b{a})" for a in NUMBER_MARKS)
SENTENCE_END: Final = re.compile(
    rf"[。！？!?\n]|{_NO_END_BEFORE}(?:{_NUMBER_MARK_BEFORE}\.(?=\s|$)|\.(?=$|\s+[^\s\d]))")


@dataclass
class Context:
    """The folded text being normalised, the same text with tag-shaped spans blanked (so that
    the letters of ``[laugh]`` do not count as English), and the fallback language."""

    text: str
    default: Lang
    view: str = ""
    library: bool = False

    words_view: str = ""

    def __post_init__(self) -> None:
        self.view = re.sub(r"\[[A-Za-z_0-9]+\]", lambda m: " " * len(m.group(0)), self.text)
        self.words_view = LONE_LETTER.sub(" ", self.view)

    def lang(self, start: int, end: int, counts: bool = False, letters_neutral: bool = False) -> Lang:
        """The language of ``text[start:end]``; ``letters_neutral``: lone Latin letters (a
        formula's variables: 已知a²-b²=0，求a) are no English words."""
        return context_language(self.words_view if letters_neutral else self.view, start, end, self.default, counts)


LONE_LETTER: Final = re.compile(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])")
"""A Latin letter that is no part of a word: a variable, a grade, a plate's letter."""


def dominant_language(text: str) -> Lang:
    """'zh' when the text has at least as many Chinese characters as English words (also when
    it has neither), else 'en'; a lone letter other than the words I and A (a variable: x=5)
    is no English word."""
    cjk = sum(1 for c in text if is_cjk(c))
    words = len(re.findall(r"[A-Za-z]{2,}|(?<![A-Za-z])[AI](?![A-Za-z\d²³⁰-⁹=<>≤≥≠])", text))
    return "zh" if cjk >= words else "en"


CONTEXT_CHARS: Final = 80
"""How far :func:`context_language` looks for a Chinese character or Latin letter, each side."""
_CLAUSE_BREAKS: Final = set(",;:!?。，；：！？\n") | {"."}


_MODEL_NAME: Final = re.compile(r"(?<![A-Za-z])[A-Za-z]*[A-Z][A-Za-z]*[ -]?$")
"""A Latin word with a capital letter right before a number (one space or hyphen allowed: RTX-4090)."""


def context_language(text: str, start: int, end: int, default: Lang, counts: bool = False) -> Lang:
    """The language in which to read ``text[start:end]`` (a number, a symbol, a mark).

    Latin letters glued to the span (the ``G`` of ``5G``, the ``mp`` of ``mp3``) are skipped,
    then the nearest Chinese character or Latin letter on each side decides:

    1. a Chinese character right after the span (``3个``) makes it Chinese;
    2. else, for a count (``counts``: a plain number) in mostly Chinese text, a capitalised
       Latin name right before or after it (``iPhone 15 Pro``, ``Windows 11``, ``骁龙8 Gen``)
       makes it Chinese: model numbers inside Chinese are read in Chinese;
    3. else, for a count, a word right after it or after one space in the same clause decides:
       a number is read in the language of what it counts (``和5 pears`` reads "five pears");
    4. else a Chinese character right before it (``第3``) makes it Chinese;
    5. else the nearer one within the same clause (no ``,;:!?。`` in between; ties go right);
    6. else the nearer one anywhere (ties go left);
    7. else ``default``.

    Each side is searched up to ``CONTEXT_CHARS`` characters away.
    """
    i = start - 1
    while i >= 0 and is_latin(text[i]):
        i -= 1
    j = end
    while j < len(text) and is_latin(text[j]):
        j += 1

    def scan(pos: int, step: int) -> tuple[Lang | None, int, bool]:
        gap, crossed = 0, False
        while 0 <= pos < len(text) and gap < CONTEXT_CHARS:
            c = text[pos]
            s = script(c)
            if s == "en" and _glued_to_number(text, pos):
                while 0 <= pos < len(text) and is_latin(text[pos]):  # a unit or a suffix (12GB, 3m)
                    gap += 1
                    pos += step
                continue
            if s is not None:
                return s, gap, crossed
            if c in _CLAUSE_BREAKS and not (c == "." and 0 < pos < len(text) - 1
                                            and text[pos - 1].isdigit() and text[pos + 1].isdigit()):
                crossed = True
            gap += 1
            pos += step
        return None, gap, crossed

    left, lgap, lcross = scan(i, -1)
    right, rgap, rcross = scan(j, 1)
    if right == "zh" and rgap == 0:
        return "zh"
    if counts and default == "zh" and (_MODEL_NAME.search(text, max(0, start - 40), start)
                                       or re.match(r" ?[A-Z]", text[end:end + 2])):
        return "zh"
    if counts and right is not None and not rcross and rgap <= 1:
        return right
    if left == "zh" and lgap == 0:
        return "zh"
    same = [(g, 0 if side == "right" else 1, lang) for side, lang, g, crossed in
            (("left", left, lgap, lcross), ("right", right, rgap, rcross)) if lang is not None and not crossed]
    if same:
        return min(same)[2]
    anywhere = [(g, 0 if side == "left" else 1, lang) for side, lang, g in
                (("left", left, lgap), ("right", right, rgap)) if lang is not None]
    if anywhere:
        return min(anywhere)[2]
    return default


def _glued_to_number(text: str, pos: int) -> bool:
    """Whether the Latin run through ``text[pos]`` follows a digit or a degree sign (the unit of
    ``12GB``, the ``m`` of ``2m``, the ``N`` of ``31°N``): a unit says nothing of the language
    around it (内存12GB+256GB, 2m×3m的地毯)."""
    i = pos
    while i > 0 and is_latin(text[i - 1]):
        i -= 1
    return i > 0 and (text[i - 1].isdigit() or text[i - 1] == "°")


NEAR_CHARS: Final = 40
"""How far each side of an entity its reading looks for context words (within the sentence)."""


def near(view: str, start: int, end: int) -> tuple[str, str]:
    """The text before and after ``view[start:end]`` within its sentence (at most
    :data:`NEAR_CHARS` each side; control tokens are blanks in ``view``)."""
    before = view[max(0, start - NEAR_CHARS):start]
    cuts = list(SENTENCE_END.finditer(before))
    if cuts:
        before = before[cuts[-1].end():]
    after = view[end:end + NEAR_CHARS]
    cut = SENTENCE_END.search(after)
    return before, after[:cut.start()] if cut else after


def ends_with(before: str, words: tuple[str, ...], skip: str = " ") -> bool:
    return before.rstrip(skip).endswith(words)


def en_identifier(before: str) -> bool:
    """English: a number right after a word of :data:`EN_IDENTIFIER_BEFORE` (a ``#``, ``:`` or
    ``.`` between allowed, is/was/number/in/with between too (card ending in 4242), and an
    airline's code: flight UA 857) is an identifier (call 911, room 305, gate B12's 12 is not)."""
    m = re.search(r"([A-Za-z]+)\.?(?:\s+(?:is|was|number|no\.?|in|with))?(?:\s+(?:[A-Z][A-Z\d]|\d[A-Z]))?[\s:#]*$",
                  before)
    return m is not None and (m.group(1) in EN_IDENTIFIER_BEFORE or m.group(1).lower() in EN_IDENTIFIER_BEFORE)


def score_near(before: str, after: str) -> bool:
    """A score word right before (比分, 以, 首局 ...) or right after (获胜, 领先 ...)."""
    return ends_with(before, SCORE_BEFORE, " 为是:") or after.lstrip().startswith(SCORE_AFTER)


def score_sentence(before: str, after: str) -> bool:
    return any(w in before or w in after for w in SCORE_SENTENCE)


def temperature_degrees(lang: Lang, before: str, after: str) -> bool:
    """A signed number before 度 after a temperature word of the clause (气温-3度, 温差-5~-1度)."""
    return lang == "zh" and after.lstrip().startswith("度") and any(w in clause(before) for w in TEMPERATURE_BEFORE)


def said_below(before: str) -> bool:
    """零下 written right before a minus sign (零下-3℃): the sign is not read a second time."""
    return before.rstrip().endswith("零下")


RANGE_UNITS: Final = words("range_units")
"""Chinese words after ``a-b`` that make it a quantity range, never a score."""


def clause(before: str) -> str:
    """The part of ``before`` after its last comma or semicolon."""
    return re.split(r"[，,；;]", before)[-1]
