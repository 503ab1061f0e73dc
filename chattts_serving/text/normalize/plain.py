"""The text between entities, and the output: letters and Chinese characters kept, punctuation
mapped to ChatTTS' pause marks in the local language, spoken symbols and Greek letters read,
the rest reported; then spaces and repeated marks tidied, and the result split into language
runs."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from .base import CONTROL_TOKEN, LAST_SPOKEN_CJK, Lang, Segment, is_cjk, is_latin, script
from .context import IDENTIFIER_BEFORE, Context, ends_with
from .tables import BETWEEN_NUMBERS, COMMA_MARKS, END_MARKS, GREEK_NAMES, SILENT_MARKS, SYMBOL_WORDS
from .vocabulary import words


@dataclass
class Out:
    """Output pieces and the bookkeeping of one :func:`normalize` call."""

    pieces: list[str]
    dropped: list[str]
    speed: int | None = None
    last_lang: Lang | None = None
    """Language of the last spoken output, which punctuation after it follows."""

    def drop(self, item: str) -> None:
        if item not in self.dropped:
            self.dropped.append(item)

    def words(self, lang: Lang, text: str) -> None:
        self.pieces.append(text if lang == "zh" else f" {text} ")
        self.last_lang = lang

    def letter(self, c: str) -> None:
        self.pieces.append(c)
        self.last_lang = script(c)


def _neighbour(text: str, pos: int, step: int) -> str:
    while 0 <= pos < len(text) and text[pos] == " ":
        pos += step
    return text[pos] if 0 <= pos < len(text) else ""


_RANGE_MARKS: Final = "-~–—"
_DOT_NAME: Final = re.compile(r"(?:[A-Z]{2,}|com|net|org|io|cn|ai|app|dev)(?![A-Za-z])")
"""What a dot written before a word names (.NET, .com): capitals or a web suffix; any other word
after a dot starts a sentence (我很好.Thanks)."""
_WEEKDAY: Final = re.compile(r"(?:周|星期|礼拜)[一二三四五六日天]")
_AM_PM_END: Final = re.compile(r"\d\s?[AaPp]\.?[Mm]\.?\s?$")
"""A time with am/pm right before a dash (9am-5pm, 9:00 a.m. – 5:00 p.m.)."""
_PERIOD_END: Final = re.compile(r"(?<![A-Za-z])[QH][1-4] ?$")
_PERIOD: Final = re.compile(r" ?[QH][1-4](?![A-Za-z0-9])")
"""A quarter or a half of a year (Q1, H2), each side of a dash."""


def _range_mark(text: str, i: int) -> bool:
    """A dash or tilde that joins two quantities written with Chinese units (5月1日-5月5日,
    2020年-2024年), two weekdays (周一～周五), two times with am/pm (9am–5pm) or two quarters
    (Q1-Q4): read 到."""
    prev, nxt = _neighbour(text, i - 1, -1), _neighbour(text, i + 1, 1)
    if nxt.isdigit() and is_cjk(prev):
        return any(ch.isdigit() for ch in text[max(0, i - 4):i])
    if nxt.isdigit() and _AM_PM_END.search(text, max(0, i - 12), i):
        return True
    if _PERIOD_END.search(text, max(0, i - 3), i) and _PERIOD.match(text, i + 1):
        return True  # Q1-Q4, H1-H2: a span of quarters
    return bool(_WEEKDAY.search(text[max(0, i - 3):i]) and _WEEKDAY.match(text, i + 1))


APPROXIMATELY_BEFORE: Final = words("approximately_before")
"""Words that already say "about" (约, 大约, about, roughly, ...): a tilde right after one of
them (大约~50公斤, about ~50 people) is not read again."""


def _said_approximately(text: str, i: int) -> bool:
    """Whether one of :data:`APPROXIMATELY_BEFORE` ends right before position ``i`` (spaces
    between allowed; an English word must start there)."""
    head = text[:i].rstrip()
    folded = head.lower()
    for w in APPROXIMATELY_BEFORE:
        if folded.endswith(w) and (not w.isascii() or not head[:-len(w)][-1:].isalpha()):
            return True
    return False


def _greek(c: str) -> bool:
    return unicodedata.name(c, "").startswith("GREEK")


def _in_greek_word(text: str, i: int) -> bool:
    """Whether the Greek letter at ``i`` is part of a run of Greek letters (a word in Greek)
    that holds one with no name to read (an accented letter, a final sigma, a capital not in
    the table): the whole run is then text in Greek, which ChatTTS cannot speak (αβγ, whose
    letters all have names, is read letter by letter)."""
    lo, hi = i, i + 1
    while lo > 0 and _greek(text[lo - 1]):
        lo -= 1
    while hi < len(text) and _greek(text[hi]):
        hi += 1
    return any(ch not in GREEK_NAMES for ch in text[lo:hi])


def _sharp(text: str, i: int) -> bool:
    """A ``#`` right after a lone note letter A to G (C#, F#, G#m, C#小调): read "sharp"."""
    before = text[i - 2:i - 1]
    return (i >= 1 and text[i - 1] in "ABCDEFG" and not (before.isascii() and before.isalnum())
            and not text[i + 1:i + 2].isdigit() and text[i + 1:i + 2] != "#")


def _after_myriad(text: str, i: int) -> bool:
    """A plus sign right after a number written with 万/亿/千/百 (1万+, 10亿+) and before no
    number: "more than", read 多."""
    return (re.search(r"\d[百千万亿]$", text[max(0, i - 2):i]) is not None
            and not _neighbour(text, i + 1, 1).isdigit())


def _heading_mark(text: str, i: int) -> bool:
    """Whether the ``#`` at ``i`` is one of the one to six that start a markdown heading: at a
    line's start (spaces before allowed), a space after the run."""
    start = text.rfind("\n", 0, i) + 1
    end = i
    while end < len(text) and text[end] == "#":
        end += 1
    run = text[start:end].lstrip(" ")
    return 0 < len(run) <= 6 and set(run) == {"#"} and text[end:end + 1] == " "


def _name_apostrophe(text: str, i: int) -> bool:
    """The apostrophe of a name's prefix: one capital O, D or L starting a word, a capital after
    it (O'Brien, D'Angelo, L'Oréal)."""
    return (0 < i < len(text) - 1 and text[i - 1] in "ODL" and (i == 1 or not is_latin(text[i - 2]))
            and text[i + 1].isupper())


def _per_unit(text: str, i: int) -> bool:
    """A slash between a unit after a number and another unit (7.5元/升, 80次/分钟): read 每."""
    prev, nxt = _neighbour(text, i - 1, -1), _neighbour(text, i + 1, 1)
    return ((is_cjk(prev) or is_latin(prev) or prev in "²³" or prev.isdigit()) and is_cjk(nxt)
            and any(ch.isdigit() for ch in text[max(0, i - 8):i]))


def _lone_in_chinese(text: str, i: int) -> bool:
    """A Latin letter alone (no word: a variable, a grade) right after a Chinese character."""
    return (not is_latin(text[i + 1:i + 2]) and not is_latin(text[i - 1:i])
            and is_cjk(_neighbour(text, i - 1, -1)[:1] or " "))


def plain(ctx: Context, start: int, end: int, out: Out) -> None:
    """Text between matches: letters and Chinese characters kept, punctuation mapped to pauses
    in the local language, spoken symbols and Greek letters read, the rest reported as dropped."""
    text = ctx.text
    for i in range(start, end):
        c = text[i]
        if is_cjk(c):
            if c > LAST_SPOKEN_CJK:  # not in ChatTTS' vocabulary
                out.drop(c)
                out.pieces.append(" ")
            else:
                out.letter(c)
        elif is_latin(c):
            out.letter(c)
            if _lone_in_chinese(text, i):
                out.last_lang = "zh"  # 求a。: a variable in a Chinese clause, which ends in 。
        elif c == "\n":
            out.pieces.append("。" if _mark_lang(ctx, i, out) == "zh" else ".")
        elif c.isspace():
            out.pieces.append(" ")
        elif c == "》" and text[i + 1:i + 2] == "《":
            out.pieces.append("、")  # 《红楼梦》《西游记》: a list of titles
        elif c in "'’" and _name_apostrophe(text, i):
            out.pieces.append(" ")  # O'Brien, D'Angelo: O Brien, not OBrien
        elif c in SILENT_MARKS:
            continue
        elif c in BETWEEN_NUMBERS and _neighbour(text, i - 1, -1).isdigit() and _neighbour(text, i + 1, 1).isdigit():
            zh, en = BETWEEN_NUMBERS[c]
            out.words(ctx.lang(i, i + 1), zh if ctx.lang(i, i + 1) == "zh" else en)
        elif c in _RANGE_MARKS and _range_mark(text, i):
            lang = ctx.lang(i, i + 1)
            out.words(lang, "到" if lang == "zh" else "to")
        elif c == "~" and _neighbour(text, i + 1, 1).isdigit() and not _neighbour(text, i - 1, -1).isdigit():
            if not _said_approximately(text, i):  # about ~50: one "about"
                lang = ctx.lang(i, i + 1)
                out.words(lang, "约" if lang == "zh" else "about")  # ~100人: about
        elif c == "/" and _per_unit(text, i):
            out.words("zh", "每")
        elif c == "/" and 0 < i < len(text) - 1 and is_latin(text[i - 1]) and is_latin(text[i + 1]):
            out.pieces.append(" ")  # P/E, A/B, I/O, TCP/IP, and/or: one name, no pause
        elif c == "+" and _after_myriad(text, i):
            out.words("zh", "多")  # 1万+人: 一万多人, as 6000+ reads 六千多
        elif c in "-+" and text.startswith(("百分之", "千分之"), i + 1) and not _neighbour(text, i - 1, -1).isdigit():
            out.words("zh", "负" if c == "-" else "正")  # -百分之5: 负百分之五, as -5% reads
        elif c in ("-", "_") and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.pieces.append(" ")  # e-mail, snake_case: a word break
        elif c == "#" and _heading_mark(text, i):
            out.pieces.append(" ")  # ### 3. Results: a markdown heading's marks, no "number"
        elif c == "#":
            if text[i + 1:i + 2].isdigit() and ends_with(text[max(0, i - 8):i], IDENTIFIER_BEFORE, " :：是为"):
                continue  # 订单号#12345: the number is the identifier, the sign is not said
            if _neighbour(text, i + 1, 1).isdigit():
                lang = ctx.lang(i, i + 1)
                out.words(lang, "井号" if lang == "zh" else "number")
            elif _sharp(text, i):
                out.words("en", "sharp")  # C#, F# (the languages), C# minor, G#: a note's sharp
            # elsewhere (#话题#) silent
        elif c in GREEK_NAMES and _in_greek_word(text, i):
            out.drop(c)  # Ελληνικά: a word in Greek, not letters named one by one; unspoken like its others
            out.pieces.append(" ")
        elif c in SYMBOL_WORDS or c in GREEK_NAMES:
            lang = ctx.lang(i, i + 1)
            zh, en = SYMBOL_WORDS.get(c) or GREEK_NAMES[c]
            out.words(lang, zh if lang == "zh" else en)
        elif c == "." and (i == 0 or text[i - 1].isspace() or is_cjk(text[i - 1])) and _DOT_NAME.match(text, i + 1):
            out.words("en", "dot")  # .NET, .com: a name's dot, no sentence end
        elif c in END_MARKS:
            out.pieces.append("。" if _mark_lang(ctx, i, out) == "zh" else ".")
        elif c in COMMA_MARKS:
            if c == "、" and _mark_lang(ctx, i, out) == "zh":
                out.pieces.append("、")
            else:
                out.pieces.append("，" if _mark_lang(ctx, i, out) == "zh" else ",")
        elif unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue  # variation selectors, joiners, combining marks: part of the character before
        elif c in "*_" and _decoration(text, i):
            out.pieces.append(" ")  # markdown emphasis or a bullet: left out on purpose, not unspoken
        else:
            out.drop(c)
            out.pieces.append(" ")


def _decoration(text: str, i: int) -> bool:
    """Whether the ``*`` or ``_`` at ``i`` is markdown decoration an LLM writes (``**bold**``,
    ``*斜体*``, ``__bold__``, a ``* item`` bullet): in a run of two or more, alone at a line's
    start before a space, or opening (text after it) or closing (text before it) a span with
    another one on its line. One between two spaces (``a * b``) or without a partner
    (``5* hotel``) is not, and stays reported."""
    c, j, k = text[i], i, i
    while j > 0 and text[j - 1] == c:
        j -= 1
    while k + 1 < len(text) and text[k + 1] == c:
        k += 1
    before, after = text[j - 1:j], text[k + 1:k + 2]
    if k > j or (before in ("", "\n") and after == " "):
        return True
    line_start = text.rfind("\n", 0, j) + 1
    line_end = text.find("\n", k) if "\n" in text[k:] else len(text)
    opens = after.strip() != "" and c in text[k + 1:line_end]
    closes = before.strip() != "" and c in text[line_start:j]
    return opens or closes


def _mark_lang(ctx: Context, i: int, out: Out) -> Lang:
    """Punctuation belongs to the clause it closes: the language of the last spoken output
    decides (the context's when nothing was spoken yet)."""
    return out.last_lang or ctx.lang(i, i + 1)


_PUNCT_RUN: Final = re.compile(r"[，。、,.](?:[ ]*[，。、,.])+")
_CJK_OR_MARK: Final = "\u4e00-\u9fff，。、"


def _collapse_marks(m: re.Match[str]) -> str:
    run = m.group(0).replace(" ", "")
    zh = any(c in "，。、" for c in run)
    if any(c in "。." for c in run):
        return "。" if zh else "."
    return "，" if zh else ","


def tidy(text: str) -> str:
    """Collapse spaces and repeated pause marks, drop spaces inside Chinese, strip edges."""
    text = _PUNCT_RUN.sub(_collapse_marks, text)
    text = re.sub(r"[ ]+", " ", text)
    text = re.sub(rf"(?<=[{_CJK_OR_MARK}]) (?=[{_CJK_OR_MARK}])", "", text)
    text = re.sub(r" (?=[，。、,.])", "", text)
    text = re.sub(r"(?<=[，。、]) ", "", text)
    text = re.sub(r"([,.])(?=[A-Za-z])", r"\1 ", text)
    text = re.sub(r"^[\s，。、,.]+", "", text)
    text = re.sub(r"[\s，、,]+$", "", text)
    text = re.sub(r"(?<=\]) (?=[\u4e00-\u9fff])|(?<=[\u4e00-\u9fff]) (?=\[)", "", text)
    return text.strip()


def split_languages(text: str) -> tuple[Segment, ...]:
    """Split text into runs of Chinese (``zh``) and English (``en``).

    Chinese characters start or continue a ``zh`` run, Latin letters an ``en`` run; everything
    else (spaces, digits, marks, control tokens) joins the current run, or the first run when
    it comes before any letter. Text without letters is one ``zh`` run; ``''`` gives ``()``.
    """
    segments: list[list[str]] = []
    langs: list[Lang] = []
    pending = ""
    i = 0
    while i < len(text):
        tag = CONTROL_TOKEN.match(text, i)
        if tag:
            piece, i = tag.group(0), tag.end()
            lang = None
        else:
            piece, i = text[i], i + 1
            lang = script(piece)
        if lang is None:
            if segments:
                segments[-1].append(piece)
            else:
                pending += piece
            continue
        if not langs or langs[-1] != lang:
            langs.append(lang)
            segments.append([pending + piece])
            pending = ""
        else:
            segments[-1].append(piece)
    if pending:  # no letter at all
        return (Segment("zh", pending),)
    return tuple(Segment(lang, "".join(parts)) for lang, parts in zip(langs, segments))
