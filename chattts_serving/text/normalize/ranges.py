"""Ranges and scores written with a dash or a tilde: ``3-5天``, ``10~20%``, ``-10~-5℃``,
``2020-2024``, ``4-0获胜`` (a score), ``555-0123`` (a local phone number)."""

from __future__ import annotations

from typing import Final

from .base import Lang
from .context import (
    IDENTIFIER_BEFORE,
    RANGE_UNITS,
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
    plain = (g("r_sep") == "-" and not measured and not g("r_sign") and not g("r_bsign") and a.isdigit()
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
    rf"(?P<r_sep>\s?[~–—]\s?|-|\s?[至到]\s?(?=[-−]\d))(?P<r_bsign>[-−])?(?P<r_b>{NUM})(?![\d])"
    rf"(?P<r_suf>\s?[%‰]|\s?(?:{alt(UNITS)})(?![A-Za-z0-9])|(?:{alt(GLUED_UNITS)})(?![A-Za-z0-9]))?",
    _read_range, first=r"[-−\d]")
