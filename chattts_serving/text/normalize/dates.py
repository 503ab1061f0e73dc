"""Dates: ``2024-03-05``, ``2024/3/5-3/8``, ``12/25/2023``, ``March 5, 1990``, ``4th of July``."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import Groups, Kind
from .numbers import en_ordinal, en_year, zh_digits, zh_int
from .tables import MONTH_RE, MONTHS_EN, month_number


def zh_date(y: str | None, m: int, d: int | None) -> str:
    out = (zh_digits(y) + "年") if y else ""
    out += zh_int(m) + "月"
    if d is not None:
        out += zh_int(d) + "日"
    return out


def en_date(y: str | None, m: int, d: int | None) -> str:
    out = MONTHS_EN[m - 1]
    if d is not None:
        out += " " + en_ordinal(d)
    if y:
        out += ", " + en_year(int(y))
    return out


def _h_ymd(lang: Lang, g: Groups, before: str, after: str) -> str:
    y, mo, d = g("ymd_y"), int(g("ymd_m")), int(g("ymd_d"))
    return zh_date(y, mo, d) if lang == "zh" else en_date(y, mo, d)


def _h_mdy(lang: Lang, g: Groups, before: str, after: str) -> str:
    y, mo, d = g("mdy_y"), int(g("mdy_m")), int(g("mdy_d"))
    return zh_date(y, mo, d) if lang == "zh" else en_date(y, mo, d)


def _h_md(lang: Lang, g: Groups, before: str, after: str) -> str:
    return en_date(g("md_y"), month_number(g("md_mon")), int(g("md_d")))


def _h_dm(lang: Lang, g: Groups, before: str, after: str) -> str:
    article = "" if re.search(r"\bthe\s*$", before, re.IGNORECASE) else "the "
    out = f"{article}{en_ordinal(int(g('dm_d')))} of {MONTHS_EN[month_number(g('dm_mon')) - 1]}"
    return out + (f", {en_year(int(g('dm_y')))}" if g("dm_y") else "")


def _h_drange(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``2024.3.5-2024.3.8``, ``2024/3/5-3/8``: a range of dates, read 到 / to; a second date
    without its year is read without it."""
    first = (g("da_y"), int(g("da_m")), int(g("da_d")))
    second = (g("db_y"), int(g("db_m")), int(g("db_d")))
    if lang == "zh":
        return zh_date(*first) + "到" + zh_date(*second)
    return en_date(*first) + " to " + en_date(*second)


DRANGE: Final = Kind(
    "drange",
    r"(?<![\d.])(?P<da_y>\d{4})(?P<da_sep>[-/.])(?P<da_m>1[0-2]|0?[1-9])(?P=da_sep)"
    r"(?P<da_d>3[01]|[12]\d|0?[1-9])\s?(?P<dr_sep>[-~–—])\s?"
    r"(?:(?P<db_y>\d{4})(?P=da_sep))?"
    r"(?P<db_m>1[0-2]|0?[1-9])(?P=da_sep)(?P<db_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)",
    _h_drange)


YMD: Final = Kind(
    "ymd",
    r"(?<![\d.])(?P<ymd_y>\d{4})(?P<ymd_sep>[-/.])(?P<ymd_m>1[0-2]|0?[1-9])(?P=ymd_sep)"
    r"(?P<ymd_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)",
    _h_ymd, library=True)


MDY: Final = Kind(
    "mdy",
    r"(?<![\d/])(?P<mdy_m>1[0-2]|0?[1-9])/(?P<mdy_d>3[01]|[12]\d|0?[1-9])/(?P<mdy_y>\d{4})(?![\d/])",
    _h_mdy)


MD: Final = Kind(
    "md",
    rf"\b(?P<md_mon>{MONTH_RE})\.?\s+(?P<md_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?(?![\dA-Za-z])"
    r"(?:,?\s+(?P<md_y>\d{4})(?!\d))?",
    _h_md, lang="en")


DM: Final = Kind(
    "dm",
    rf"\b(?P<dm_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dm_mon>{MONTH_RE})"
    r"(?:(?<=\b[A-Z][a-z]{2})\.(?!\s*$)|(?<=Sept)\.)?"
    r"(?:,?\s+(?P<dm_y>\d{4})(?!\d))?",
    _h_dm, lang="en")
