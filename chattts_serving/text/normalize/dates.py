"""Dates: ``2024-03-05``, ``2024/3/5-3/8``, ``12/25/2023``, ``March 5, 1990``, ``4th of July``."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .context import IDENTIFIER_BEFORE, ends_with
from .identifiers import code_words
from .kind import Groups, Kind, alt_words
from .numbers import en_number, en_ordinal, en_year, zh_digits, zh_int
from .tables import MONTH_RE, MONTHS_EN, WEEKDAY_ABBREVIATIONS, WEEKDAY_RE, month_number, weekday_name


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


def _code_before(g: Groups, before: str) -> bool:
    """A date-shaped code after an identifier word (提货码1230-10-8): not a date."""
    return g("ymd_sep") == "-" and ends_with(before, IDENTIFIER_BEFORE, " :是为")


def _read_year_month_day(lang: Lang, g: Groups, before: str, after: str) -> str:
    y, mo, d = g("ymd_y"), int(g("ymd_m")), int(g("ymd_d"))
    if lang == "zh" and _code_before(g, before):
        return code_words(lang, [y, g("ymd_m"), g("ymd_d")])
    return zh_date(y, mo, d) if lang == "zh" else en_date(y, mo, d)


def _read_month_day_year(lang: Lang, g: Groups, before: str, after: str) -> str:
    y, mo, d = g("mdy_y"), int(g("mdy_m")), int(g("mdy_d"))
    return zh_date(y, mo, d) if lang == "zh" else en_date(y, mo, d)


def _read_day_month_year(lang: Lang, g: Groups, before: str, after: str) -> str:
    y, mo, d = g("dmy_y"), int(g("dmy_m")), int(g("dmy_d"))
    return zh_date(y, mo, d) if lang == "zh" else en_date(y, mo, d)


def _read_month_name_day(lang: Lang, g: Groups, before: str, after: str) -> str:
    return en_date(g("md_y"), month_number(g("md_mon")), int(g("md_d")))


def _read_day_month_name(lang: Lang, g: Groups, before: str, after: str) -> str:
    article = "" if re.search(r"\bthe\s*$", before, re.IGNORECASE) else "the "
    out = f"{article}{en_ordinal(int(g('dm_d')))} of {MONTHS_EN[month_number(g('dm_mon')) - 1]}"
    return out + (f", {en_year(int(g('dm_y')))}" if g("dm_y") else "")


def _read_date_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``2024.3.5-2024.3.8``, ``2024/3/5-3/8``: a range of dates, read 到 / to; a second date
    without its year is read without it."""
    first = (g("da_y"), int(g("da_m")), int(g("da_d")))
    second = (g("db_y"), int(g("db_m")), int(g("db_d")))
    if lang == "zh":
        return zh_date(*first) + "到" + zh_date(*second)
    return en_date(*first) + " to " + en_date(*second)


def _range_word(sep: str) -> str:
    """The English word of a range's separator: a dash reads to, a word as written (thru:
    through)."""
    sep = sep.strip()
    return {"thru": "through", "till": "until"}.get(sep, sep) if sep.isalpha() else "to"


def _read_english_date_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Oct 1-7 -> October first to seventh; Oct 1 - Nov 3, 2024 -> October first to November
    third, twenty twenty four; 1-7 October -> the first to the seventh of October. A written
    word between the days (to, through, and) is read as written; a dash reads to."""
    sep = _range_word(g("er_sep") or g("em_sep"))
    year = f", {en_year(int(g('er_y')))}" if g("er_y") else ""
    if g("er_mon"):
        first = f"{MONTHS_EN[month_number(g('er_mon')) - 1]} {en_ordinal(int(g('er_a')))}"
        second = en_ordinal(int(g("er_b")))
        if g("er_mon2"):
            second = f"{MONTHS_EN[month_number(g('er_mon2')) - 1]} {second}"
        return f"{first} {sep} {second}{year}"
    article = "" if re.search(r"\bthe\s*$", before, re.IGNORECASE) else "the "
    month = MONTHS_EN[month_number(g("em_mon")) - 1]
    words = f"{article}{en_ordinal(int(g('em_a')))} {sep} the {en_ordinal(int(g('em_b')))} of {month}"
    return words + (f", {en_year(int(g('em_y')))}" if g("em_y") else "")


def _read_weekday_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Mon-Fri -> Monday to Friday (周一至周五 in Chinese context), a written word kept."""
    sep = g("wr_sep").strip()
    a, b = weekday_name(g("wr_a")), weekday_name(g("wr_b"))
    if lang == "zh":
        zh = "一二三四五六日"
        return f"周{zh[a[1]]}{'至' if sep in ('to', 'through', 'thru', 'until', 'till') else '到'}周{zh[b[1]]}"
    return f"{a[0]} {_range_word(sep)} {b[0]}"


def _read_dotted_month_day(lang: Lang, g: Groups, before: str, after: str) -> str:
    """5·12, 9·11, 3·15: a month and day with a middle dot names an event, read digit by
    digit (五一二, 九一一; nine eleven)."""
    m, d = g("dot_m"), g("dot_d")
    if lang == "zh":
        return zh_digits(m) + zh_digits(d)
    return f"{en_number(m)} {en_number(d)}"


_DAY: Final = r"3[01]|[12]\d|0?[1-9]"
_RANGE_WORD: Final = r"\s?[-–—~]\s?|\s+(?:to|through|thru|until|till|and)\s+"

ENGLISH_DATE_RANGE: Final = Kind(
    "english_date_range",
    rf"(?=[A-Z])\b(?P<er_mon>{MONTH_RE})\.?\s+(?P<er_a>{_DAY})(?:st|nd|rd|th)?(?P<er_sep>{_RANGE_WORD})"
    rf"(?:(?P<er_mon2>{MONTH_RE})\.?\s+)?(?P<er_b>{_DAY})(?:st|nd|rd|th)?(?![\dA-Za-z:]|\.\d)"
    r"(?:,?\s+(?P<er_y>\d{4})(?!\d))?"
    rf"|(?=\d)\b(?P<em_a>{_DAY})(?:st|nd|rd|th)?(?P<em_sep>{_RANGE_WORD})(?:the\s+)?(?P<em_b>{_DAY})(?:st|nd|rd|th)?"
    rf"\s+(?:of\s+)?(?P<em_mon>{MONTH_RE})(?:,?\s+(?P<em_y>\d{{4}})(?!\d))?",
    _read_english_date_range, lang="en")


WEEKDAY_RANGE: Final = Kind(
    "weekday_range",
    rf"(?=[A-Z])(?<![A-Za-z])(?P<wr_a>{WEEKDAY_RE})\.?(?P<wr_sep>\s?[-–—~]\s?|\s+(?:to|through|thru|until|till)\s+)"
    rf"(?P<wr_b>{WEEKDAY_RE})(?:\.(?=\s+[\da-z]))?(?![A-Za-z])",
    _read_weekday_range)


_TIME_OR_DATE_AFTER: Final = (rf",?\s+(?:{MONTH_RE}|\d{{1,2}}/\d{{1,2}}\b"
                              r"|\d{1,2}(?::\d\d)?\s?(?:[ap]\.?m\b|[AP]\.?M\b)|\d{1,2}:\d\d\b)")


def _read_weekday_abbreviation(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Fri, Mar 8 / Sat 9am / See you Wed.: the weekday's name (Friday; 周五 in Chinese context)."""
    name, index = weekday_name(g("wd_abbr"))
    if lang == "zh":
        return f"周{'一二三四五六日'[index]}"
    ends = g("wd_dot") and (not after.strip() or re.match(r"\s+[A-Z]", after) is not None)
    return name + "." if ends else name  # See you Wed. Bye: the dot also ends the sentence


WEEKDAY_ABBREVIATION: Final = Kind(
    "weekday_abbreviation",
    rf"(?=[A-Z])(?<![A-Za-z])(?P<wd_abbr>{alt_words(WEEKDAY_ABBREVIATIONS)})"
    rf"(?:(?P<wd_dot>\.)|(?={_TIME_OR_DATE_AFTER}))(?![A-Za-z])",
    _read_weekday_abbreviation, lang="en")
"""A weekday abbreviated without its range: before a date or a time (Fri, Mar 8; Sat 9am-1pm;
Tue 14:00) or with its dot (See you Wed.). Alone, Sun, Sat and Wed are words."""


DOTTED_MONTH_DAY: Final = Kind(
    "dotted_month_day",
    r"(?=\d)(?<![\d.·])(?P<dot_m>1[0-2]|[1-9])·(?P<dot_d>3[01]|[12]\d|[1-9])(?![\d·])",
    _read_dotted_month_day)


DATE_RANGE: Final = Kind(
    "date_range",
    r"(?<![\d.])(?P<da_y>\d{4})(?P<da_sep>[-/.·])(?P<da_m>1[0-2]|0?[1-9])(?P=da_sep)"
    r"(?P<da_d>3[01]|[12]\d|0?[1-9])\s?(?P<dr_sep>[-~–—])\s?"
    r"(?:(?P<db_y>\d{4})(?P=da_sep))?"
    r"(?P<db_m>1[0-2]|0?[1-9])(?P=da_sep)(?P<db_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)",
    _read_date_range, first=r"\d")


YEAR_MONTH_DAY: Final = Kind(
    "year_month_day",
    r"(?<![\d.])(?P<ymd_y>\d{4})(?P<ymd_sep>[-/.·])(?P<ymd_m>1[0-2]|0?[1-9])(?P=ymd_sep)"
    r"(?P<ymd_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)",
    _read_year_month_day, library=True,
    library_may_read=lambda g, before, after: g("ymd_sep") != "·" and not _code_before(g, before), first=r"\d")


MONTH_DAY_YEAR: Final = Kind(
    "month_day_year",
    r"(?<![\d/])(?P<mdy_m>1[0-2]|0?[1-9])/(?P<mdy_d>3[01]|[12]\d|0?[1-9])/(?P<mdy_y>\d{4})(?![\d/])",
    _read_month_day_year, first=r"\d")


DAY_MONTH_YEAR: Final = Kind(
    "day_month_year",
    r"(?<![\d.vV])(?<!版本)(?<!版本号)(?<!ersion )(?P<dmy_d>3[01]|[12]\d|0?[1-9])\.(?P<dmy_m>1[0-2]|0?[1-9])"
    r"\.(?P<dmy_y>(?:19|20)\d\d)(?!\d|\.\d)",
    _read_day_month_year, first=r"\d")
"""05.03.2024: day, month and year with dots, as Europe writes them (2024年3月5日, March fifth), never
a dotted number (零五点零三点两千零二十四); after v, 版本 or version it stays a version."""


MONTH_NAME_DAY: Final = Kind(
    "month_name_day",
    rf"\b(?P<md_mon>{MONTH_RE})\.?\s+(?P<md_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?(?![\dA-Za-z])"
    r"(?:,?\s+(?P<md_y>\d{4})(?!\d))?",
    _read_month_name_day, lang="en", first=r"[A-Z]")


DAY_MONTH_NAME: Final = Kind(
    "day_month_name",
    rf"\b(?P<dm_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dm_mon>{MONTH_RE})"
    r"(?:(?<=\b[A-Z][a-z]{2})\.(?!\s*$)|(?<=Sept)\.)?"
    r"(?:,?\s+(?P<dm_y>\d{4})(?!\d))?",
    _read_day_month_name, lang="en", first=r"\d")


def _read_card_expiry(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A card's expiry, month and two-digit year: Exp 09/27 -> expiry September twenty twenty
    seven, valid thru 03/29 -> valid thru March twenty twenty nine; never a day of the month."""
    written = g("ce_y")
    year = int(written) + 2000 if len(written) == 2 else int(written)
    said = f"{MONTHS_EN[int(g('ce_m')) - 1]} {en_year(year)}"
    return f"expiry {said}" if g("ce_exp") else said


_EXPIRY_LEAD: Final = "|".join(f"(?<={w}{sep})" for w in (
    "Expiry", "expiry", "EXPIRY", "Expires", "expires", "Expiration", "expiration", "Expiry date", "expiry date",
    "Expiration date", "expiration date", "valid thru", "Valid thru", "VALID THRU", "valid through", "Valid through",
    "good thru", "Good thru") for sep in (" ", ": "))
CARD_EXPIRY: Final = Kind(
    "card_expiry",
    rf"(?:(?<![A-Za-z])(?P<ce_exp>(?:Exp|exp|EXP)\.?(?: [Dd]ate)?:? ?)|{_EXPIRY_LEAD})"
    r"(?P<ce_m>0?[1-9]|1[0-2])/(?P<ce_y>\d{2}|20\d{2})(?![\d/])",
    _read_card_expiry, lang="en", first=r"[\dEe]")
"""MM/YY after an expiry word (Exp, expires, valid thru): the month and the year a card runs to."""
