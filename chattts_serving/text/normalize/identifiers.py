"""Identifiers read digit by digit: phone numbers, spaced digit groups, ``No.123``."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import Groups, Kind
from .numbers import digit_groups, en_number, read_groups, zh_number


def _phone(lang: Lang, raw: str) -> str:
    plus = raw.lstrip().startswith("+")
    if "*" in raw:  # 138****5678: the masked digits are read as stars
        head, stars, tail = re.match(r"(\d+)(\*+)(\d+)", raw).groups()  # type: ignore[union-attr]
        star = "星" if lang == "zh" else "star"
        mask = star * len(stars) if lang == "zh" else " ".join([star] * len(stars))
        sep = "，" if lang == "zh" else ", "
        return sep.join([read_groups(lang, [head]), mask, read_groups(lang, [tail])])
    groups = [g for g in re.split(r"[^\d]+", raw) if g]
    if len(groups) == 1:
        groups = digit_groups(groups[0])
    elif len(groups) == 2 and groups[0] == "86" and len(groups[1]) == 11:
        groups = ["86", *digit_groups(groups[1])]
    return read_groups(lang, groups, plus)


def _h_phone(lang: Lang, g: Groups, before: str, after: str) -> str:
    return _phone(lang, g("phone"))


def _h_groups(lang: Lang, g: Groups, before: str, after: str) -> str:
    return read_groups(lang, g("groups").split())


def _h_numero(lang: Lang, g: Groups, before: str, after: str) -> str:
    """No.1 / No.12345678: 第一 / number one; three or more digits are an identifier."""
    num = g("no_num")
    if len(num) >= 3:
        return read_groups(lang, digit_groups(num))
    return "第" + zh_number(num) if lang == "zh" else "number " + en_number(num)


PHONE: Final = Kind(
    "phone",
    r"(?P<phone>(?<![\d+])(?:\+?86[-\s]?)?1[3-9]\d(?:[-\s]?\d{4}){2}(?!\d)"
    r"|(?<!\d)0\d{2,3}-\d{7,8}(?!\d)"
    r"|(?<!\d)0\d{2,3}-\d{3,4}[-\s]\d{4}(?!\d)"
    r"|\(0\d{1,3}\)[-\s]?(?:\d{7,8}|\d{3,4}[-\s]\d{4})(?!\d)"
    r"|(?<![\d+])[48]00[-\s]?\d{3}[-\s]?\d{4}(?!\d)"
    r"|(?<![\d+-])\d{3,4}(?:-\d{3,4}){2,}(?![\d-])"
    r"|(?<![\d*])\d{3}\*{3,4}\d{4}(?![\d*])"
    r"|(?<![\d+])(?:\+?1[-.\s])?(?:\(\d{3}\)\s?|\d{3}[-.])\d{3}[-.]\d{4}(?!\d)"
    r"|\+\d{1,3}(?:[-\s]\d{1,4}){2,5}(?!\d)"
    r"|\+\d{1,3}[-\s]\d{1,4}[-\s]\d{5,8}(?!\d))",
    _h_phone)


GROUPS: Final = Kind(
    "groups",
    r"(?<![\d.,])(?P<groups>\d{2,4}(?: \d{2,4}){2,})(?![\d]|[.,]\d)",
    _h_groups)


NUMERO: Final = Kind(
    "numero",
    r"(?<![A-Za-z])(?:No|NO|no)\.\s?(?P<no_num>\d+)(?![\d.])",
    _h_numero)
