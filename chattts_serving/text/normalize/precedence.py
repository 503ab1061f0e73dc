"""The scanner's precedence: every entity kind, in the order the scanner tries them.

At each position the first kind in :data:`PRECEDENCE` whose pattern matches wins, so a longer
or more specific form comes before the forms it contains (a date range before a date, a date
before a fraction, a time before a ratio, money before a plain number). ChatTTS' control tokens
(``[laugh]``, ``[speed_5]``) come before every kind. Adding a kind: write it (its pattern and
reader) in the module of its family and put it here.
"""

from __future__ import annotations

import re
from typing import Final

from . import (
    arithmetic,
    cardinals,
    dates,
    fractions,
    identifiers,
    letters,
    lists,
    marks,
    money,
    names,
    quantities,
    ranges,
    times,
    web,
)
from .base import TAG_PATTERN
from .kind import Kind

PRECEDENCE: Final[tuple[Kind, ...]] = (
    web.EMAIL, web.URL, web.FILE_NAME,
    identifiers.KEYPAD_KEY, identifiers.STAR_CODE, identifiers.LICENCE_PLATE, identifiers.TICKER, lists.LIST_ITEM,
    names.MODEL_NUMBER, names.EPISODE, identifiers.HASH_NUMBER, names.VERSION, names.ADDRESS_NUMBER,
    arithmetic.SCIENTIFIC, arithmetic.FACTORIAL,
    arithmetic.ARITHMETIC, quantities.SIZE, arithmetic.MATH_FUNCTION, arithmetic.FORMULA,
    quantities.BLOOD_PRESSURE, fractions.RATING, marks.ANGLE,
    marks.FEET_INCHES, marks.INCHES,
    dates.CARD_EXPIRY, ranges.YEAR_SPAN,
    dates.DATE_RANGE, fractions.MONTH_DAY_RANGE, dates.YEAR_MONTH_DAY, dates.MONTH_DAY_YEAR, dates.DAY_MONTH_YEAR,
    dates.ENGLISH_DATE_RANGE, dates.WEEKDAY_RANGE, dates.WEEKDAY_ABBREVIATION, dates.MONTH_NAME_DAY,
    dates.DAY_MONTH_NAME,
    dates.DOTTED_MONTH_DAY,
    times.RACE_TIME, times.HOUR_H_MINUTES, times.MILITARY_TIME,
    times.TIME_RANGE, times.TIME, times.DOTTED_TIME, times.RATIO, times.HOUR_AM_PM,
    identifiers.PHONE, identifiers.HYPHENATED_CODE, identifiers.PREFIXED_CODE, identifiers.DIGIT_GROUPS,
    times.HOURS_AND_MINUTES,
    money.MONEY, money.YUAN, money.AMOUNT_BEFORE_CODE,
    quantities.FACTOR, quantities.RESOLUTION, quantities.TWENTY_FOUR_SEVEN, quantities.PER_UNIT, quantities.DECADE,
    quantities.SCALE_SUFFIX, quantities.MILLION,
    quantities.AMPERE, quantities.BASIS_POINTS,
    ranges.RANGE, quantities.PERCENT, quantities.UNIT, fractions.FRACTION,
    cardinals.ORDINAL, identifiers.NUMERO, cardinals.DOTTED_NUMBER, cardinals.NUMBER,
    letters.ROMAN_NUMERAL, letters.ABBREVIATION, letters.ADDRESS_ABBREVIATION, letters.SECTION,
    letters.DOSE_FREQUENCY, letters.CONTRACTION, letters.SLASH_ABBREVIATION,
)
"""Every entity kind, first tried first."""
KINDS: Final[dict[str, Kind]] = {k.name: k for k in PRECEDENCE}
SCANNER: Final = re.compile("|".join([f"(?P<k_tag>{TAG_PATTERN})", *(
    f"(?P<k_{k.name}>{f'(?={k.first})' if k.first else ''}(?:{k.pattern}))" for k in PRECEDENCE)]))
"""One regex of all kinds; a match's ``lastgroup`` is ``k_<kind name>`` (``k_tag``: a control token)."""
TAG_SCANNER: Final = re.compile(f"(?P<k_tag>{TAG_PATTERN})")
"""Control tokens only (:func:`chattts_serving.text.normalize.punctuate`)."""
LIBRARY_KINDS: Final[frozenset[str]] = frozenset(k.name for k in PRECEDENCE if k.library)
"""Entity kinds whose Chinese reading is WeTextProcessing's when the library is on: the corpus
shows the library reading every one of their Chinese instances (dates 2024-03-05, 2024/3/5,
2024.3.5; fractions; percentages without sign; ratios) as expected on the span alone. Not
routed, because the corpus shows the library wrong on them: plain numbers (两 before
台/倍/次/种..., 第两名, years, identifiers), ranges and scores (4-0 -> 四减零, 10-20% ->
十月二日...), times (3:30分 -> 三比三零分, 0:30 -> 零比三十), time ranges (0:00-6:00), phone
numbers and digit groups, money (¥88.8元 -> 八元八点八元), units (GWh, mAh, 零下), signed
percentages and ‰. A span the library leaves with digits or symbols, or on which it fails, is
read by our rules."""
