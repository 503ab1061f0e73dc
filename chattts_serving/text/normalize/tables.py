"""Tables: month and weekday names, units, currencies, multipliers, spoken symbols, Greek
letters and the punctuation classes, read from the vocabulary files (:mod:`.vocabulary`,
``data/<name>.tsv``)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from .base import Lang
from .numbers import en_number, liang, to_decimal, zh_number
from .vocabulary import rows, yes

MONTHS_EN: Final = tuple(name for _, name, _ in sorted(rows("months"), key=lambda r: int(r[0])))
"""English month names, January first (``months.tsv``)."""
MONTH_ABBR: Final = {a: int(n) for n, _, abbr in rows("months") for a in abbr.split()}
"""Abbreviated month names and their numbers (Jan 1, Sept 9)."""
MONTH_RE: Final = ("(?:" + "|".join(sorted([*MONTHS_EN, *MONTH_ABBR], key=len, reverse=True)) + r")\b")


WEEKDAYS_EN: Final = tuple(name for _, name, _ in sorted(rows("weekdays"), key=lambda r: int(r[0])))
"""English weekday names, Monday first (``weekdays.tsv``)."""
_WEEKDAY_ABBR: Final = {a: int(n) - 1 for n, _, abbr in rows("weekdays") for a in abbr.split()}
WEEKDAY_ABBREVIATIONS: Final = tuple(_WEEKDAY_ABBR)
"""The abbreviated weekday names of ``weekdays.tsv`` (Mon, Tues, Thurs)."""
WEEKDAY_RE: Final = "(?:" + "|".join(sorted([*WEEKDAYS_EN, *_WEEKDAY_ABBR], key=len, reverse=True)) + r")\b"
"""An English weekday, written out or abbreviated (Mon, Tues, Thurs)."""


def weekday_name(name: str) -> tuple[str, int]:
    """The full English name of a weekday written out or abbreviated, and its index (Monday 0)."""
    index = WEEKDAYS_EN.index(name) if name in WEEKDAYS_EN else _WEEKDAY_ABBR[name]
    return WEEKDAYS_EN[index], index


@dataclass(frozen=True)
class Unit:
    """A unit symbol's readings: Chinese, English singular and plural; ``liang``: a count of 2
    before it reads 两."""

    zh: str
    en_one: str
    en_many: str
    liang: bool = True


UNITS: Final[dict[str, Unit]] = {symbol: Unit(zh, one, many, yes(two)) for symbol, zh, one, many, two, glued
                                  in rows("units") if not yes(glued)}
"""Unit symbols read after a number; they may follow the number after one space."""
GLUED_UNITS: Final[dict[str, Unit]] = {symbol: Unit(zh, one, many, yes(two)) for symbol, zh, one, many, two, glued
                                        in rows("units") if yes(glued)}
"""One-letter unit symbols, read as units only when written right after the number (5m, 10s)."""


@dataclass(frozen=True)
class Currency:
    """A currency's readings; ``minor``: English name of the hundredth (None: read decimals);
    ``written``: Chinese words for it that may be written after the amount as well (¥100元,
    ₩100韩元), read once."""

    zh: str
    en_one: str
    en_many: str
    minor_one: str | None = None
    minor_many: str | None = None
    written: tuple[str, ...] = ()


CURRENCIES: Final[dict[str, Currency]] = {
    code: Currency(zh, one, many, minor_one or None, minor_many or None, tuple(written.split()))
    for code, zh, one, many, minor_one, minor_many, written in rows("currencies")}
"""Currencies by code (``currencies.tsv``)."""
CURRENCY_SIGNS: Final[dict[str, str]] = {sign: code for sign, code in rows("currency_signs")}
"""Currency signs written before the amount (no space needed)."""
CURRENCY_CODES: Final[dict[str, str]] = {**{code: code for code in CURRENCIES},
                                         **{alias: code for alias, code in rows("currency_code_aliases")}}
"""Currency codes (and abbreviations) written before or after the amount, a space allowed."""
CURRENCY_OF: Final = {**CURRENCY_SIGNS, **CURRENCY_CODES}
"""Every written currency sign or code and the currency (key of :data:`CURRENCIES`) it stands for."""
MULTIPLIERS: Final = {word: (Decimal(10 ** int(power)), english) for word, power, english in rows("multipliers")}
"""Words and letters after an amount that multiply it (5k, 3.2万, 1.5 billion) and their English reading."""

SYMBOL_WORDS: Final[dict[str, tuple[str, str]]] = {symbol: (zh, en) for symbol, zh, en in rows("symbols")}
"""Symbols read as words wherever they stand (Chinese, English). ``#`` is read only before a
number (``#1``); elsewhere (``#话题#``) it is silent."""
GREEK_NAMES: Final[dict[str, tuple[str, str]]] = {letter: (zh, en) for letter, zh, en in rows("greek_letters")}
"""Greek letters read by their names (Chinese, English): ChatTTS' normaliser would delete them.
``μ`` before a unit is part of the unit (``μg`` -> 微克)."""
BETWEEN_NUMBERS: Final[dict[str, tuple[str, str]]] = {
    symbol: (zh, en) for symbol, zh, en in rows("symbols_between_numbers")}
"""Symbols read as operators only between two numbers (3 < 5, 4*2); elsewhere they are
pauses (``<`` ``>`` ``/``) or unspeakable (``*`` ``^``)."""

COMMA_MARKS: Final = {mark for mark, role in rows("punctuation") if role == "pause"}
"""Marks read as a short pause (``punctuation.tsv``, role ``pause``)."""
END_MARKS: Final = {mark for mark, role in rows("punctuation") if role == "end"}
"""Marks that end a sentence (role ``end``)."""
SILENT_MARKS: Final = {mark for mark, role in rows("punctuation") if role == "silent"}
"""Quotes and title marks: no sound and no pause (two titles in a row, ``》《``, are a list: 、)."""


def month_number(name: str) -> int:
    if name in MONTHS_EN:
        return MONTHS_EN.index(name) + 1
    return MONTH_ABBR[name]


def unit_reading(lang: Lang, unit: Unit, num: str, singular: bool = False) -> str:
    """``num`` with ``unit``: 五公里 / five kilometers. ``singular``: the English unit in the
    singular whatever the number, as a quantity before a noun is said (a five kilometer run)."""
    if lang == "zh":
        words = zh_number(num)
        return (liang(words, "个") if unit.liang else words) + unit.zh
    value = to_decimal(num)
    return f"{en_number(num)} {unit.en_one if value == 1 or singular else unit.en_many}"


TEMPERATURE_UNITS: Final = tuple(symbol for symbol, unit in UNITS.items() if unit.en_one.startswith("degree "))
"""The units of a temperature (℃, °F, ...): a minus before them reads 零下."""
