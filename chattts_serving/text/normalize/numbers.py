"""Number words: digits, cardinals, decimals, ordinals and years in Chinese (``cn2an``) and in
English (``num2words``), 两 before measure words, identifiers read digit by digit in groups."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

from .base import Lang
from .vocabulary import words

ZH_DIGITS: Final = "零一二三四五六七八九"
_EN_DIGITS: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_ZH_LIANG_BEFORE: Final = tuple(sorted(set(words("measure_words")), key=len, reverse=True))
"""Measure words (and 千/万/亿) after which a lone 2 is read 两 rather than 二 (2瓶 -> 两瓶),
longest first (``measure_words.tsv``)."""
_ZH_ER_BEFORE: Final = words("er_before")
"""Words after which a lone 2 stays 二 although they start like a measure word: labels and
ranks (2号, 2楼, 2路, 2级, 2年级, 2等奖), the month (2月), 2两 (二两, never 两两), and a
denominator or an exponent (2分之1 -> 二分之一, 2次方 -> 二次方): 两 never belongs there."""
_MAX_CARDINAL_DIGITS: Final = 16


def zh_digits(s: str, one: str = "一") -> str:
    """Read digits one by one in Chinese (``'2024'`` -> 二零二四); ``one`` replaces 一 (幺 in phone
    numbers). Non-digits are skipped."""
    return "".join(one if d == "1" else ZH_DIGITS[int(d)] for d in s if d.isdigit())


def en_digits(s: str) -> str:
    """Read digits one by one in English (``'007'`` -> zero zero seven). Non-digits are skipped."""
    return " ".join(_EN_DIGITS[int(d)] for d in s if d.isdigit())


def _split_number(num: str) -> tuple[bool, str, str]:
    s = num.replace(",", "").replace("−", "-").strip()
    neg = s.startswith("-")
    s = s.lstrip("+-")
    whole, _, frac = s.partition(".")
    return neg, whole or "0", frac


def zh_number(num: str) -> str:
    """A decimal number as Chinese words: ``'-1,234.5'`` -> 负一千二百三十四点五.

    Integers with a leading zero (``'007'``) or more than 16 digits are read digit by digit;
    decimals are read digit by digit after 点; a leading 二千/二万/二亿 becomes 两.
    """
    import cn2an

    neg, whole, frac = _split_number(num)
    if (len(whole) > 1 and whole.startswith("0")) or len(whole) > _MAX_CARDINAL_DIGITS:
        words = zh_digits(whole)
    else:
        words = str(cn2an.an2cn(whole, "low"))
        if words[:2] in ("二千", "二万", "二亿"):
            words = "两" + words[1:]
    if frac:
        words += "点" + zh_digits(frac)
    return ("负" if neg else "") + words


def _clean_en(words: str) -> str:
    return re.sub(r"\s+", " ", words.replace("-", " ").replace(",", "")).strip()


def en_int(n: int) -> str:
    """A whole number in English words without hyphens or commas (1234 -> one thousand two
    hundred and thirty four)."""
    from num2words import num2words

    return _clean_en(str(num2words(n)))


def en_number(num: str) -> str:
    """A decimal number as English words: ``'-3.14'`` -> minus three point one four.

    Integers with a leading zero or more than 21 digits are read digit by digit.
    """
    neg, whole, frac = _split_number(num)
    digit_by_digit = (len(whole) > 1 and whole.startswith("0")) or len(whole) > 21
    words = en_digits(whole) if digit_by_digit else en_int(int(whole))
    if frac:
        words += " point " + en_digits(frac)
    return ("minus " if neg else "") + words


def en_ordinal(n: int) -> str:
    """21 -> twenty first."""
    from num2words import num2words

    return _clean_en(str(num2words(n, to="ordinal")))


def en_year(y: int) -> str:
    """A year as spoken in English: 2024 -> twenty twenty four, 1905 -> nineteen oh five."""
    from num2words import num2words

    return _clean_en(str(num2words(y, to="year")))


def to_decimal(num: str) -> Decimal:
    try:
        return Decimal(num.replace(",", ""))
    except InvalidOperation:  # the patterns only hand over digits; kept for safety
        return Decimal(0)


def plain_decimal(d: Decimal) -> str:
    """A Decimal without exponent or trailing zeros: 1.50E+6 -> '1500000'."""
    return format(d.normalize(), "f")


def takes_liang(after: str) -> bool:
    """Whether a count written before ``after`` reads 两 for 2: ``after`` starts with a measure
    word of :data:`_ZH_LIANG_BEFORE` and not with a label of :data:`_ZH_ER_BEFORE`."""
    after = after.lstrip()
    return not after.startswith(_ZH_ER_BEFORE) and after.startswith(_ZH_LIANG_BEFORE)


def liang(words: str, after: str) -> str:
    """二 -> 两 before a measure word (2个 -> 两个, but 2号 -> 二号)."""
    if words == "二" and takes_liang(after):
        return "两"
    return words


def zh_int(n: int) -> str:
    return zh_number(str(n))


ID_CARD_DIGITS: Final = 18
"""A Chinese resident ID number: read in groups of 6 (region), 8 (birth date) and 4."""
LONG_IDENTIFIER_DIGITS: Final = 12
"""An unseparated integer this long is an identifier (card, order number), never a cardinal."""


def digit_groups(digits: str) -> list[str]:
    """How an unseparated identifier is read in groups: an 18-character ID number 6-8-4, a
    mobile number 3-4-4, anything of 12 or more digits in fours (a last group of one or two
    digits joins the one before), anything shorter in one group."""
    if len(digits) == ID_CARD_DIGITS:
        return [digits[:6], digits[6:14], digits[14:]]
    if len(digits) == 11 and digits.startswith("1"):
        return [digits[:3], digits[3:7], digits[7:]]
    if len(digits) == 10 and digits.startswith(("400", "800")):
        return [digits[:3], digits[3:6], digits[6:]]
    if len(digits) < LONG_IDENTIFIER_DIGITS:
        return [digits]
    groups = [digits[i:i + 4] for i in range(0, len(digits), 4)]
    if len(groups[-1]) < 3:
        groups[-2:] = [groups[-2] + groups[-1]]
    return groups


def read_groups(lang: Lang, groups: list[str], plus: bool = False) -> str:
    """Digit groups read digit by digit (1 as 幺 in Chinese) with a pause between groups."""
    if lang == "zh":
        return ("加" if plus else "") + "，".join(zh_digits(g, one="幺") for g in groups)
    return ("plus " if plus else "") + ", ".join(en_digits(g) for g in groups)


def score(lang: Lang, a: str, b: str) -> str:
    """A score or ratio: 三比二 (never 两) / three to two."""
    return f"{zh_number(a)}比{zh_number(b)}" if lang == "zh" else f"{en_number(a)} to {en_number(b)}"
