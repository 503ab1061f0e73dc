"""Arithmetic: an equation of numbers and operators (``9 - 4 = 5``, ``3×4=12``) reads its
operators as words: 减 / minus, 加 / plus, 乘以 / times, 除以 / divided by, 等于 / equals. A dash
between two numbers is a minus only in an equation; elsewhere it is a range or a score
(:mod:`.ranges`)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import NUM, Groups, Kind
from .numbers import en_number, zh_number

_OPERATORS: Final = {"+": ("加", "plus"), "-": ("减", "minus"), "−": ("减", "minus"), "×": ("乘以", "times"),
                     "*": ("乘以", "times"), "/": ("除以", "divided by"), "÷": ("除以", "divided by"),
                     "=": ("等于", "equals")}
_TOKEN: Final = re.compile(rf"(?P<num>(?<![\d.])[-−]?{NUM})|(?P<op>[-−+×*/÷=])")


def _h_arith(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Numbers as cardinals (never 两: 2 + 2 = 4 reads 二加二等于四), a sign right before a
    number as 负 / minus, each operator as its word."""
    words: list[str] = []
    expect_number = True
    for m in _TOKEN.finditer(g("arith")):
        if m.group("num") and (expect_number or m.group("num")[0] not in "-−"):
            words.append(zh_number(m.group("num")) if lang == "zh" else en_number(m.group("num")))
            expect_number = False
        else:
            op = m.group("op") or m.group("num")[0]
            words.append(_OPERATORS[op][lang == "en"])
            expect_number = True
            if m.group("num"):  # 9-4: the dash was taken as a sign
                num = m.group("num")[1:]
                words.append(zh_number(num) if lang == "zh" else en_number(num))
                expect_number = False
    return ("" if lang == "zh" else " ").join(words)


ARITH: Final = Kind(
    "arith",
    rf"(?P<arith>(?<![\d.A-Za-z])[-−]?{NUM}(?:\s*[-−+×*/÷]\s*[-−]?{NUM})+\s*=\s*(?:[-−]?{NUM}(?![\d.]))?)",
    _h_arith, first=r"[-−\d]")
