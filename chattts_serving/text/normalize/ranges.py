"""Ranges and scores written with a dash or a tilde: ``3-5天``, ``10~20%``, ``-10~-5℃``,
``2020-2024``, ``4-0获胜`` (a score), ``3 - 1`` after a match's words, ``555-0123`` (a local phone
number); seasons and spans of years (``2024/25``, ``1999/2000``)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .context import (
    IDENTIFIER_BEFORE,
    RANGE_UNITS,
    SCORE_WORDS_EN,
    ends_with,
    said_below,
    score_near,
    score_sentence,
    temperature_degrees,
)
from .identifiers import code_words
from .kind import NUM, Groups, Kind, alt
from .numbers import en_number, en_year, liang, read_groups, score, takes_liang, zh_digits, zh_number
from .tables import GLUED_UNITS, TEMPERATURE_UNITS, UNITS, unit_reading


def _range_side(lang: Lang, num: str, year: bool) -> str:
    if year:
        return zh_digits(num) if lang == "zh" else en_year(int(num))
    return zh_number(num) if lang == "zh" else en_number(num)


_ASKED: Final = re.compile(r"(?:\b(?:[Ww]hat|[Hh]ow much) is|\b[Cc]alculate|\b[Cc]ompute|计算|算一下|求)\s*$")
"""A question or an order to calculate right before ``a - b``: a subtraction."""


def _read_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``a-b`` / ``a~b``: a range (三到五天), a score (四比零获胜), a year range or a local phone
    number (555-0123); see :data:`SCORE_SENTENCE` for how a score and a range are told apart."""
    a, b, suf = g("r_a"), g("r_b"), (g("r_suf") or "").strip()
    pct = suf in ("%", "‰") or g("r_pa") is not None
    four = len(a) == 4 and len(b) == 4 and a.isdigit() and b.isdigit()
    measured = pct or bool(suf) or bool(g("r_ua")) or takes_liang(after) or after.lstrip().startswith(RANGE_UNITS)
    years = four and 1000 <= int(a) < int(b) <= 2100 and int(b) - int(a) <= 100  # 2024-2025赛季
    year = four and not suf and (after.startswith("年") or (years and not measured) if lang == "zh"
                                 else 1000 <= int(a) <= 2099)
    if g("r_sep") == " - " and not measured and not g("r_sign") and not g("r_bsign"):
        # 3 - 1 written with spaces: a score in a match's sentence, a minus before equals or
        # after a question (5 - 3等于几, What is 5 - 3?); else as a dash without spaces (9 - 5, 10 - 20)
        if score_near(before, after) or score_sentence(before, after) or SCORE_WORDS_EN.search(before + after):
            return score(lang, a, b)
        if after.lstrip().startswith(("等于", "equals")) or _ASKED.search(before):
            return f"{zh_number(a)}减{zh_number(b)}" if lang == "zh" else f"{en_number(a)} minus {en_number(b)}"
    plain = (g("r_sep") in ("-", " - ") and not measured and not g("r_sign") and not g("r_bsign") and a.isdigit()
             and b.isdigit())
    if plain and len(a) == 3 and len(b) == 4 and (
            lang == "en" or b.startswith("0") or ends_with(before, IDENTIFIER_BEFORE, " :是为")):
        return read_groups(lang, [a, b])  # 555-0123: a local phone number, not a range
    if plain and lang == "zh" and ends_with(before, IDENTIFIER_BEFORE, " :是为"):
        return code_words(lang, [a, b])  # 取件码3-1105: a code, read part by part
    if plain and not year and len(a) <= 3 and len(b) <= 3 and (
            int(a) >= int(b) or score_near(before, after) or score_sentence(before, after)):
        return score(lang, a, b)
    signs = ["", ""]
    if g("r_sign") or g("r_bsign"):  # -5~3℃: 零下五到三摄氏度; -10~-5℃: 零下十到零下五摄氏度
        temperature = (g("r_ua") or suf) in TEMPERATURE_UNITS or temperature_degrees(lang, before, after)
        minus = ("零下" if temperature else "负") if lang == "zh" else "minus "
        signs = [minus if g("r_sign") and not said_below(before) else "", minus if g("r_bsign") else ""]
    return _range_words(lang, a, b, g("r_pa"), g("r_ua"), suf, year, after, signs,
                        "至" if g("r_sep").strip() == "至" else "到")


def _range_words(lang: Lang, a: str, b: str, pa: str | None, ua: str | None, suf: str, year: bool,
                 after: str, signs: list[str] | None = None, to: str = "到") -> str:
    """The reading of a range ``a`` to ``b`` with its percent sign (``pa`` after ``a`` or as
    ``suf``), unit (``ua`` after ``a``, ``suf`` after ``b``) or year reading; ``signs``: the
    words for a minus sign before each side (负, 零下, minus), empty for none; ``to``: 到, or 至
    where it is written (-10至-5℃)."""
    sa, sb = signs or ("", "")
    pct = suf in ("%", "‰") or pa is not None
    sym = suf if suf in ("%", "‰") else pa or "%"
    unit = UNITS.get(suf) or GLUED_UNITS.get(suf)
    unit_a = UNITS.get(ua or "")
    if lang == "zh":
        if pct:
            head = "百分之" if sym == "%" else "千分之"
            return f"{sa}{head}{zh_number(a)}{to}{sb}{head}{zh_number(b)}"
        if unit_a is not None:  # 5℃~10℃
            return f"{sa}{unit_reading(lang, unit_a, a)}{to}{sb}{unit_reading(lang, unit or unit_a, b)}"
        left, right = _range_side(lang, a, year), _range_side(lang, b, year)
        if unit is None and takes_liang(after):  # 2-3个 -> 两到三个, 1-2天 -> 一到两天
            left, right = liang(left, after), liang(right, after)
        return f"{sa}{left}{to}{sb}{right}" + (unit.zh if unit else "")
    if unit_a is not None:  # 5km~10km: five kilometers to ten kilometers
        return f"{sa}{unit_reading(lang, unit_a, a)} to {sb}{unit_reading(lang, unit or unit_a, b)}"
    out = f"{sa}{_range_side(lang, a, year)} to {sb}{_range_side(lang, b, year)}"
    if pct:
        return out + (" percent" if sym == "%" else " per mille")
    return out + (f" {unit.en_many}" if unit else "")


RANGE: Final = Kind(
    "range",
    rf"(?P<r_sign>(?<![A-Za-z0-9.])[-−])?(?<![\d.])(?P<r_a>{NUM})(?P<r_pa>[%‰])?"
    # a unit before the separator where the tilde or dash is spaced alike on both sides (5km~10km,
    # 5km ~ 10km) or the same unit follows (5km ~10km): 100km/h ~50kg is a quantity, then about another
    rf"(?:(?P<r_ua>{alt(UNITS)})(?=(?:\s[~–—]\s|[~–—-])[-−]?\d|\s?[~–—]\s?[-−]?{NUM}(?P=r_ua)(?![A-Za-z/²³])))?"
    rf"(?P<r_sep>\s?[~–—]\s?|-| - (?=\d)|\s?[至到]\s?(?=[-−]\d))(?P<r_bsign>[-−])?(?P<r_b>{NUM})(?![\d])"
    rf"(?P<r_suf>\s?[%‰]|\s?(?:{alt(UNITS)})(?![A-Za-z0-9])|(?:{alt(GLUED_UNITS)})(?![A-Za-z0-9]))?",
    _read_range, first=r"[-−\d]")


def _read_year_span(lang: Lang, g: Groups, before: str, after: str) -> str:
    """2024/25, 2024-25, 1999/2000: a season or a span of years, the second year short as written
    (twenty twenty four to twenty five, nineteen ninety nine to two thousand; 二零二四到二五), never a
    fraction nor two thousand and twenty four."""
    a, b = g("ys_a"), g("ys_b")
    if lang == "zh":
        return f"{zh_digits(a)}到{zh_digits(b)}"
    if b == "00":  # 1999/00: the next century's first year
        b = str(int(a[:2]) + 1) + b
    return f"{en_year(int(a))} to {en_year(int(b)) if len(b) == 4 else en_number(b)}"


YEAR_SPAN: Final = Kind(
    "year_span",
    r"(?<![\d/.,-])(?P<ys_a>(?:1[5-9]|20)\d\d)[-/]"
    r"(?P<ys_b>(?<=/)(?:1[5-9]|20)\d\d|(?:1[3-9]|[2-9]\d|00))(?![\d/-]|[.,]\d)"
    r"(?!\s?(?!赛季|年|学年|财年|季|届)[\u4e00-\u9fa5])",
    _read_year_span, first=r"[12]")
"""A year, a slash or a hyphen and the next year or its last two digits (13 to 99 or 00: 2024-12
is a year and a month); in Chinese only before a season's or a year's word (2024-25赛季:
1520-35页 is a range of pages)."""
