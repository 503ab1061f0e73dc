"""Quantities written with prime marks: degrees, minutes and seconds of arc (``39°54′``,
``31.2304°N``), feet and inches (``5'6"``, a ``65"`` TV), minutes and seconds (``5'30''``)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import NUM, Groups, Kind
from .numbers import en_number, to_decimal, zh_number

_HEMISPHERES: Final = {"N": ("北纬", "north"), "S": ("南纬", "south"), "E": ("东经", "east"), "W": ("西经", "west")}


def _read_angle(lang: Lang, g: Groups, before: str, after: str) -> str:
    """39°54′, 31.2304°N, 40°26'46"N: degrees, minutes and seconds of arc, and the hemisphere
    (北纬三十九度五十四分 / thirty nine degrees fifty four minutes north); ′ and ″ are no
    unspeakable marks after a degree."""
    deg, mins, secs, side = g("an_deg"), g("an_min"), g("an_sec"), g("an_side") or g("an_side2")
    if lang == "zh":
        head = _HEMISPHERES[side][0] if side and not before.rstrip().endswith(("经", "纬")) else ""
        return (head + zh_number(deg) + "度" + (zh_number(mins) + "分" if mins else "")
                + (zh_number(secs) + "秒" if secs else ""))
    words = [en_number(deg) + (" degree" if to_decimal(deg) == 1 else " degrees")]
    for num, one in ((mins, "minute"), (secs, "second")):
        if num:
            words.append(en_number(num) + f" {one}" + ("" if to_decimal(num) == 1 else "s"))
    return " ".join(words) + (f" {_HEMISPHERES[side][1]}" if side else "")


ANGLE: Final = Kind(
    "angle",
    rf"(?<![\d.])(?P<an_deg>{NUM})°(?:\s?(?P<an_min>\d{{1,2}}(?:\.\d+)?)[′']"
    r"(?:\s?(?P<an_sec>\d{1,2}(?:\.\d+)?)[″\"])?(?:\s?(?P<an_side>[NSEW]))?|\s?(?P<an_side2>[NSEW]))(?![A-Za-z])",
    _read_angle, first=r"\d")
"""Needs minutes or a hemisphere: a bare 45° stays a unit."""


def _read_feet_inches(lang: Lang, g: Groups, before: str, after: str) -> str:
    """5'6", 6′2″: feet and inches in English (five feet six inches); 5'30'', 6′10″ with seconds
    past 11, and every such mark in Chinese: minutes and seconds (配速五分三十秒, as a pace or a
    race time is written there), but feet and inches after 高 (身高6′2″)."""
    feet = g("fi_ft") or g("fw_ft")
    big, small = (feet, g("fi_in") or g("fw_in")) if feet else (g("ms_m"), g("ms_s"))
    if lang == "zh" and feet and ("高" in before[-4:] or g("fw_ft")):
        return zh_number(big) + "英尺" + zh_number(small) + "英寸"  # 身高6′2″, 5 ft 10 in: a height
    if lang == "zh":
        return zh_number(big) + "分" + zh_number(small.lstrip("0") or "0") + "秒"
    if feet:
        return (f"{en_number(big)} {'foot' if big == '1' else 'feet'} "
                f"{en_number(small)} {'inch' if small == '1' else 'inches'}")
    return (f"{en_number(big)} {'minute' if big == '1' else 'minutes'} "
            f"{en_number(small.lstrip('0') or '0')} {'second' if small in ('1', '01') else 'seconds'}")


FEET_INCHES: Final = Kind(
    "feet_inches",
    r"(?<![\d.°'′])(?:(?P<fi_ft>[1-9])['′](?P<fi_in>1[01]|\d)(?:\"|″|''|′′)?(?![\d'′])"
    r"|(?P<ms_m>\d{1,2})['′](?P<ms_s>[0-5]\d)(?:\"|″|''|′′)(?![\d'′])"
    r"|(?P<fw_ft>[1-9])\s?(?:ft|feet|foot)\.?\s(?P<fw_in>1[01]|\d)\s?(?:in|inches|inch)\b(?!\s(?:the|a|an)\b))",
    _read_feet_inches, first=r"\d")
"""Feet and inches, or minutes and seconds (the seconds need their mark); feet and inches also
written with their units (5 ft 10 in), where ``in`` after the inches is no preposition."""


def _read_inches(lang: Lang, g: Groups, before: str, after: str) -> str:
    """65" TV, 27″ monitor: inches (sixty five inch TV, 六十五英寸电视), in the singular before
    what it measures; a " that closes a quotation opened before it (said "I am 65") is a quote
    mark, and the number stays a number."""
    num = g("in_num")
    if g("in_mark") == '"' and len(re.findall(r'(?<![\d"])"', before)) % 2 == 1:
        return zh_number(num) if lang == "zh" else en_number(num)
    if lang == "zh":
        return zh_number(num) + "英寸"
    noun = re.match(r"\s?[A-Za-z]", after) is not None and not re.match(r"\s?(?:and|or|by|x)\b", after)
    return en_number(num) + (" inch" if noun or to_decimal(num) == 1 else " inches")


INCHES: Final = Kind(
    "inches",
    r"(?<![\d.°'′\"″])(?P<in_num>\d{1,3}(?:\.\d)?)(?P<in_mark>[\"″])(?![\d'′\"″A-Za-z])",
    _read_inches, first=r"\d")
"""A number and an inch mark: the mark is never dropped unread."""
