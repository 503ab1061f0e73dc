"""The driver: the scanner finds each entity, its kind's reader reads it in the language of
its context (or WeTextProcessing does, for the kinds routed to it), the text between entities
goes through the plain pass, and the result is tidied."""

from __future__ import annotations

import re
from typing import Final

from .base import CONTROL_NUMBERED, CONTROL_WORDS, RESERVED_TOKENS, Lang, NormalizedText, TextNormError
from .context import Context, dominant_language, near
from .plain import Out, plain, split_languages, tidy
from .precedence import KINDS, SCANNER, TAG_SCANNER
from .width import fold_width

LANGUAGES: Final = ("auto", "zh", "en")
"""The values of :func:`normalize`'s ``language``."""


def normalize(text: str, library: bool = True, language: str = "auto") -> NormalizedText:
    """Verbalise ``text`` for ChatTTS (see the package docstring, :mod:`chattts_serving.text.normalize`).

    ``library``: read the Chinese-context entities of :data:`LIBRARY_KINDS` with WeTextProcessing
    (:mod:`chattts_serving.text.wetext`) where it reads them as the corpus expects; False:
    our rules alone (the profile knob ``[frontend] wetext``).

    ``language``: the language of what has no context of its own (a bare ``25kg``, ``03:04pm``,
    a text of digits and symbols): ``'zh'`` or ``'en'``, or ``'auto'`` (the language with more
    words in the text, Chinese on a tie). Words around an entity still decide its language
    (``3个`` is Chinese, ``3 apples`` English, whatever ``language`` says).

    Returns a :class:`NormalizedText` whose ``text`` holds only Chinese characters of
    U+4E00..U+9FA5, Latin letters, spaces, ``，。、,.`` and control tokens.

    Raises:
        TextNormError: a numbered control token outside its range (``[break_9]``), a
            ``language`` other than those of :data:`LANGUAGES`.
    """
    if language not in LANGUAGES:
        raise TextNormError(f"language must be one of {', '.join(LANGUAGES)}; got {language!r}")
    return _normalize(text, library, SCANNER, language)


def punctuate(text: str) -> NormalizedText:
    """Only the formatting part of :func:`normalize`: width folding, control tokens, pause
    marks, spoken symbols and reported characters, without reading any entity (digits and
    entity symbols left in ``text`` are reported as not spoken). Used to score the WeTextProcessing
    library alone on the corpus (``python -m chattts_serving.text.normalize_report``).

    Raises:
        TextNormError: a numbered control token outside its range.
    """
    return _normalize(text, False, TAG_SCANNER)


def _normalize(text: str, library: bool, scanner: re.Pattern[str], language: str = "auto") -> NormalizedText:
    folded = fold_width(text)
    default: Lang = "zh" if language == "zh" else "en" if language == "en" else dominant_language(folded)
    ctx = Context(folded, default, library=library)
    out = Out([], [])
    pos = 0
    while (m := scanner.search(folded, pos)) is not None:
        if m.start() > pos:
            plain(ctx, pos, m.start(), out)
        name = (m.lastgroup or "k_").removeprefix("k_")
        if m.group(0)[:1] in ("-", "−") and _AFTER_QUANTITY.search(ctx.view[max(0, m.start() - 4):m.start()]):
            # not a minus sign but a range dash after a quantity with a Chinese unit (5月1日-5月5日)
            lang = ctx.lang(m.start(), m.start() + 1)
            out.words(lang, "到" if lang == "zh" else "to")
            pos = m.start() + 1
            continue
        _entity(ctx, name, m, out)
        pos = m.end()
    if pos < len(folded):
        plain(ctx, pos, len(folded), out)
    result = tidy("".join(out.pieces))
    dropped = sorted(out.dropped, key=lambda d: folded.find(d) if d in folded else len(folded))
    return NormalizedText(result, out.speed, tuple(dropped), split_languages(result))


def _entity(ctx: Context, name: str, m: re.Match[str], out: Out) -> None:
    g = m.group
    if name == "tag":
        _tag(ctx, m, out)
        return
    kind = KINDS[name]
    lang = kind.lang or ctx.lang(m.start(), m.end(), counts=kind.counts, letters_neutral=kind.letters_neutral)
    before, after = near(ctx.view, m.start(), m.end())
    words = None
    if (ctx.library and lang == "zh" and kind.library
            and (kind.library_may_read is None or kind.library_may_read(g, before, after))):
        from ..wetext import read_zh

        words = read_zh(m.group(0))
        if words is not None and kind.library_fits is not None and not kind.library_fits(g, words, before, after):
            words = None
    if words is None:
        words = kind.read(lang, g, before, after)
    if lang == "zh" and _RUNS_ON.match(words) and _WEEKDAY_END.search(ctx.view[max(0, m.start() - 4):m.start()]):
        out.pieces.append("，")  # 周三15:00: 周三，十五点, never 周三十五点
    out.words(lang, words)


def _tag(ctx: Context, m: re.Match[str], out: Out) -> None:
    name = m.group("tag")
    if name in CONTROL_WORDS:
        out.pieces.append(f"[{name}]")
        return
    if name in RESERVED_TOKENS:
        out.drop(f"[{name}]")
        out.pieces.append(" ")
        return
    base, _, num = name.rpartition("_")
    if base in CONTROL_NUMBERED and num.isdigit():
        n, count = int(num), CONTROL_NUMBERED[base]
        if not 0 <= n < count:
            raise TextNormError(f"control token [{name}] is out of range: [{base}_N] takes N in 0..{count - 1}")
        if base == "speed":
            if out.speed is None:
                out.speed = n
            out.pieces.append(" ")
        else:
            out.pieces.append(f"[{base}_{n}]")
        return
    # not a ChatTTS token: brackets are pauses, the word inside is read
    plain(ctx, m.start(), m.end(), out)


_WEEKDAY_END: Final = re.compile(r"(?:周|星期|礼拜)[一二三四五六] ?$")
"""A Chinese weekday named by a numeral, right before an entity."""
_RUNS_ON: Final = re.compile(r"十|[一二三四五六七八九两][十百千]")
"""The start of a reading that would run into such a weekday's numeral (周三十五点 heard as
week thirty-five o'clock, 周一十点 as 一十): a pause parts them. 周二三月五日 and 周三三次 need none."""

_AFTER_QUANTITY: Final = re.compile(r"\d[\u4e00-\u9fa5]{1,3} *$")
"""The end of a quantity written with a Chinese unit (5月1日, 2020年): a dash after it is a range."""
