"""Plain numbers: cardinals (with 两 before measure words), years, generations, identifiers
after context words, ordinals (``21st``), dotted numbers and IPv4 addresses."""

from __future__ import annotations

import re
import string
from typing import Final

from .base import Lang
from .context import (
    IDENTIFIER_AFTER,
    IDENTIFIER_BEFORE,
    RANGE_UNITS,
    en_identifier,
    ends_with,
    said_below,
    temperature_degrees,
)
from .kind import NUM, SIGN, Groups, Kind
from .numbers import (
    ID_CARD_DIGITS,
    LONG_IDENTIFIER_DIGITS,
    digit_groups,
    en_digits,
    en_int,
    en_number,
    en_ordinal,
    en_year,
    liang,
    read_groups,
    takes_liang,
    zh_digits,
    zh_number,
)
from .tables import MONTH_ABBR, MONTHS_EN
from .vocabulary import words


def _read_ordinal(lang: Lang, g: Groups, before: str, after: str) -> str:
    return en_ordinal(int(g("ord")))


def _read_dotted_number(lang: Lang, g: Groups, before: str, after: str) -> str:
    parts = g("dot").split(".")
    if len(parts) == 4 and all(len(p) <= 3 and int(p) <= 255 for p in parts):  # an IPv4 address
        if lang == "zh":
            return "点".join(zh_digits(p) for p in parts)
        return " dot ".join(en_digits(p) for p in parts)
    if lang == "zh":
        return "点".join(zh_number(p) for p in parts)
    return " point ".join(en_number(p) for p in parts)


_DATE_WORDS: Final = words("date_words")


def _read_number(lang: Lang, g: Groups, before: str, after: str) -> str:
    sign = (g("n_sign") or "").replace("−", "-")
    num, plus = g("n_num"), bool(g("n_plus"))
    if lang == "zh":
        words = _zh_count(num, before, after.lstrip())
        if sign == "-" and said_below(before):
            return words  # 零下-3度
        if sign == "-" and temperature_degrees(lang, before, after):
            return "零下" + words  # 温度-3.5度
        if sign == "+" and ends_with(before, IDENTIFIER_BEFORE, " :是为"):
            return read_groups(lang, [num], plus=True)  # 国际区号+1: a country code, as phones read it
        return ("负" if sign == "-" else "正" if sign == "+" else "") + words + ("多" if plus else "")
    if not sign and len(num) == 4 and num.isdigit() and 1100 <= int(num) <= 2099 and (
            _year_context(before) or _bracketed_year(before, after) or _ERA_AFTER.match(after)):
        return en_year(int(num))
    if not sign and len(num) == 4 and num.isdigit() and 1000 <= int(num) < 1100 and _early_year(before, after):
        return early_year(int(num))
    if num.isdigit() and (len(num) >= LONG_IDENTIFIER_DIGITS or (len(num) >= 3 and before[-1:].isupper())
                          or (len(num) >= 3 and not sign and en_identifier(before))):
        return read_groups(lang, digit_groups(num))  # a card number, CA981, call 911
    words = en_number(num)
    return ("minus " if sign == "-" else "plus " if sign == "+" else "") + words + (" plus" if plus else "")


def _zh_count(num: str, before: str, after: str) -> str:
    """A plain number in Chinese, by what surrounds it: an identifier (拨打110, a card number,
    four or more digits glued to a capital letter: G1234, RTX4090) digit by digit with 幺; a
    year (2024年, 24年3月, 公元前221年) or a generation (80后) digit by digit; a date part
    without its leading zero (03月); else a cardinal, with 两 before a measure word."""
    digits = num.isdigit()
    named = _named_day(num, after)
    if named:
        return named
    if digits and len(num) == 5 and num[0] in "19" and after.startswith(SERVICE_AFTER):
        return zh_digits(num, one="幺")  # 12306网站, 10086客服: a service's number
    listed = re.search(r"\d{3,}\s*(?:或者|或是|或|和|及|、|/)\s*$", before)  # 拨打12345或12315
    if listed and len(num) >= 3 and ends_with(before[:listed.start() + 1], IDENTIFIER_BEFORE, " :是为0123456789"):
        return "，".join(zh_digits(grp, one="幺") for grp in digit_groups(num))
    if digits and len(num) == ID_CARD_DIGITS - 1 and after[:1] in ("X", "x"):
        return "，".join(zh_digits(grp, one="幺") for grp in (num[:6], num[6:14], num[14:]))  # ID ending in X
    if digits and len(num) >= 3 and after.startswith(IDENTIFIER_AFTER):
        return zh_digits(num, one="幺")  # 1203室
    if (digits and 3 <= len(num) <= 4 and _BUILDING.search(before) and not takes_liang(after)
            and not after.startswith(RANGE_UNITS)):
        return zh_digits(num, one="幺")  # 5号楼2306, A座1203: a flat's number
    if digits and (len(num) >= LONG_IDENTIFIER_DIGITS or (len(num) >= 4 and before[-1:].isupper())
                   or (len(num) >= 3 and before[-1:].isupper() and after.startswith("次"))  # D301次: a train
                   or (len(num) >= 3 and not takes_liang(after) and not after.startswith(RANGE_UNITS)
                       and ends_with(before.rstrip(string.ascii_letters), IDENTIFIER_BEFORE, " :是为#"))):
        return "，".join(zh_digits(grp, one="幺") for grp in digit_groups(num))
    if digits and after.startswith("年") and (
            (len(num) == 4 and 1100 <= int(num) <= 2199) or (len(num) == 2 and re.match(r"年\s?\d", after))
            or (len(num) <= 4 and before.rstrip().endswith(("公元", "公元前")))):
        return zh_digits(num)
    if digits and len(num) == 4 and 1900 <= int(num) <= 2099 and (after.startswith(_YEAR_LABELS)
                                                                  or _PERIOD_BEFORE.search(before)
                                                                  or _bracketed_year(before, after)):
        return zh_digits(num)  # 2024赛季, 2024款, 2024版, Q3 2024, 会议（2024）
    if digits and len(num) == 2 and re.match(r"后(?![悔来面边续期天年果退])", after):
        return zh_digits(num)  # 80后, 95后, 00后: generations
    if digits and num.startswith("0") and len(num) <= 2 and after.startswith(_DATE_WORDS):
        num = num.lstrip("0") or "0"  # 03月05日
    if digits and len(num) <= 2 and re.search(r"\d米$", before) and not takes_liang(after):
        return zh_digits(num)  # 身高1米75: 一米七五, a height's centimetres
    if before.rstrip().endswith(("第", "分之")) or (before[-1:].isascii() and before[-1:].isalpha()):
        return zh_number(num)  # 第2名 (an ordinal), 3分之2个 (a numerator), CO2排放 (a name): never 两
    return liang(zh_number(num), after)


NAMED_DAY_AFTER: Final = words("named_day_after")
"""Written right after a month and day without a slash (618, 520, 3.15, 11.11), they make it the
name of a day read digit by digit (618大促 -> 六一八大促, 3.15晚会 -> 三一五晚会, 520表白 ->
五二零表白); the same month and day twice is 双 (11.11购物节 -> 双十一购物节)."""
SERVICE_AFTER: Final = words("service_after")
"""Written right after five digits starting with 1 or 9, they make them a service's number read
digit by digit (12306网站, 10086客服, 95588热线)."""


def _named_day(num: str, after: str) -> str | None:
    if not after.startswith(NAMED_DAY_AFTER):
        return None
    m = re.fullmatch(r"(1[0-2]|[1-9])\.?(\d{2})", num)
    if m is None or not 1 <= int(m.group(2)) <= 31:
        return None
    if m.group(1) == m.group(2):
        return "双" + zh_number(m.group(1))  # 11.11, 1212
    return zh_digits(num)


_BUILDING: Final = re.compile(r"[\dA-Z一二三四五六七八九十](?:号楼|栋|幢|单元|座|号院)\s?$")
"""A building, block or entrance with its number (5号楼, 3栋, 2单元, A座) right before a number
of three or four digits: that number is a flat's, read digit by digit (5号楼2306 -> 五号楼二三零六)."""


_PERIOD_BEFORE: Final = re.compile(r"(?<![A-Za-z])(?:Q[1-4],?\s|H[12],?\s|FY\s?|CY\s?)$")
"""A quarter, a half or a fiscal year right before a four-digit number (Q1 2024, H2 2023,
FY2024): the number is its year."""


def _bracketed_year(before: str, after: str) -> bool:
    """A number alone in brackets right after a title or a cited name (《流浪地球》（2019）,
    Smith (2020)): the year it was made or published. After a Chinese word it stays a count
    (员工（2000）人, 人数（2000）)."""
    return re.search(r"[A-Za-z》”\"'] ?\($", before) is not None and after.startswith(")")


_YEAR_LABELS: Final = words("year_labels")
"""After a four-digit number from 1900 to 2099 they make it a year read digit by digit."""


_YEAR_WORDS: Final = {*words("year_words_en"), *MONTHS_EN, *MONTH_ABBR}


def _year_context(before: str) -> bool:
    """English: a 4-digit number after 'in', 'since', a month name, ... is a year, and so is
    the second of 'from 2010 to 2020' / 'between 2010 and 2020'."""
    if re.search(r"\b(?:from|between)\s+\d{4}\s+(?:to|and|until|till)\s*$", before, re.IGNORECASE):
        return True
    if _PERIOD_BEFORE.search(before):
        return True
    words = re.findall(r"[A-Za-z]+", before)
    return bool(words) and before.rstrip(" ,").endswith(words[-1]) and (
        words[-1] in _YEAR_WORDS or words[-1].lower() in _YEAR_WORDS)


_ERA_AFTER: Final = re.compile(r"\s?(?:AD|BC|BCE|CE|A\.D\.|B\.C\.)(?![A-Za-z])")
"""An era after a number: the number is a year (1066 AD, 1200 BC)."""
_EARLY_YEAR_BEFORE: Final = re.compile(r"\b(?:[Ii]n|[Ss]ince|[Yy]ear|[Uu]ntil|[Tt]ill|[Ff]rom|[Bb]efore|[Aa]fter|"
                                       r"[Cc]irca|[Aa]round|AD|c\.)\s*$")
_EARLY_YEAR_AFTER: Final = re.compile(r"\s*(?:$|[,.;:!?)]|(?:the|when|and|he|she|they|it|we|there|during|as|a|an)\b"
                                      r"|[A-Z])")
"""What may follow a year: punctuation, a clause's first word, a name (in 1066 the Normans, in
1066, William); a noun after the number makes it a count (in 1024 bytes)."""


def _early_year(before: str, after: str) -> bool:
    """A number from 1000 to 1099 is a year only after in, since, year, AD, ... with no noun after it
    (in 1066, the year 1066), or before an era (1066 AD): 1 in 1000 people stays a count."""
    return _ERA_AFTER.match(after) is not None or (
        _EARLY_YEAR_BEFORE.search(before) is not None and _EARLY_YEAR_AFTER.match(after) is not None)


def early_year(y: int) -> str:
    """A year from 1000 to 1099 as it is said: ten sixty six, ten oh five (1000: one thousand)."""
    if 1000 < y < 1010:
        return f"ten oh {en_int(y - 1000)}"
    return en_year(y)


ORDINAL: Final = Kind(
    "ordinal",
    r"(?<![\d.])(?P<ord>\d+)(?:st|nd|rd|th)(?![A-Za-z])",
    _read_ordinal, lang="en", first=r"\d")


DOTTED_NUMBER: Final = Kind(
    "dotted_number",
    r"(?<![\d.])(?P<dot>\d+(?:\.\d+){2,})(?![\d])",
    _read_dotted_number, counts=True, first=r"\d")


NUMBER: Final = Kind(
    "number",
    rf"(?P<n_sign>{SIGN})?(?P<n_num>{NUM})(?P<n_plus>\+(?![\d+]))?",
    _read_number, counts=True, first=r"[-+−\d]")
