"""Quantities: units (``5km``, ``-3℃``), percentages, ``3x``, sizes (``1920x1080``, ``3 x 500ml``),
``24/7``, ``/m²``, decades (``1980s``, ``1950s-60s``) and thousands written with k or w (``8k``, ``2w``)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .context import clause, said_below
from .kind import NUM, SIGN, Groups, Kind, alt, alt_words
from .numbers import en_int, en_number, en_year, liang, plain_decimal, to_decimal, zh_digits, zh_number
from .tables import GLUED_UNITS, TEMPERATURE_UNITS, UNITS, Unit, unit_reading
from .vocabulary import words


def _decade(lang: Lang, year: str) -> str:
    if lang == "zh":  # 1980s -> 一九八零年代, 80s -> 八十年代
        return (zh_number(year) if len(year) == 2 else zh_digits(year)) + "年代"
    words = en_int(int(year)) if len(year) == 2 else en_year(int(year))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


SECONDS_BEFORE: Final = words("seconds_before_en")
"""English words right before ``Ns`` (N = 10..90) that make it seconds (wait 30s); without
them it is a decade, with or without an article (70s rock, the 80s)."""
DECADE_AFTER_ZH: Final = words("decade_after")
"""Chinese words right after ``Ns`` that make it a decade (70s生人 -> 七十年代生人)."""
SECONDS_AFTER: Final = re.compile(r"\s*(?:later|left|ago|remaining|each|per|long|timeout|delay|interval|countdown|"
                                  r"to go|of|or less|or more|max|min)\b|\s*[-+]")
"""English words right after ``Ns`` that make it seconds (30s later, 10s left)."""


def _read_factor(lang: Lang, g: Groups, before: str, after: str) -> str:
    """3x, 2×: 三倍 / three times."""
    num = g("x_num")
    return liang(zh_number(num), "倍") + "倍" if lang == "zh" else f"{en_number(num)} times"


def _read_twenty_four_seven(lang: Lang, g: Groups, before: str, after: str) -> str:
    """24/7: round the clock, never a fraction."""
    return "全天候" if lang == "zh" else "twenty four seven"


def _read_per_unit(lang: Lang, g: Groups, before: str, after: str) -> str:
    """/m², /kg after an amount with a unit (100元/m²): 每平方米 / per square meter."""
    symbol = g("pu_unit")
    unit = UNITS.get(symbol) or GLUED_UNITS[symbol]
    return "每" + unit.zh if lang == "zh" else "per " + unit.en_one


def _read_decade(lang: Lang, g: Groups, before: str, after: str) -> str:
    """1980s, '80s: a decade; 80s is a decade in English (70s rock -> seventies) unless words
    around it make it seconds (:data:`SECONDS_BEFORE`, :data:`SECONDS_AFTER`); in Chinese it is
    seconds (倒计时30s) unless :data:`DECADE_AFTER_ZH` or 世纪 make it a decade (70s生人)."""
    short = g("dec3")
    if short and lang == "zh" and (after.lstrip().startswith(DECADE_AFTER_ZH) or before.rstrip().endswith("世纪")):
        return _decade(lang, short)  # 70s生人, 上世纪80s: 七十年代
    if short and (lang == "zh" or re.search(rf"\b(?:{'|'.join(SECONDS_BEFORE)})\s*$", before.lower())
                  or re.search(r"\d\s?(?:h|hrs?|m|mins?)\s*$", before) or SECONDS_AFTER.match(after)):
        return unit_reading(lang, GLUED_UNITS["s"], short)  # 倒计时30s, wait 30s: seconds
    if g("dec_b"):  # the 1950s-60s: 一九五零年代到六十年代 / nineteen fifties to sixties
        return _decade(lang, g("dec")) + ("到" if lang == "zh" else " to ") + _decade(lang, g("dec_b"))
    return _decade(lang, g("dec") or g("dec2") or short)


KILO_SENTENCE: Final = words("thousands_sentence")
"""In the clause of a number with a capital K, they make the K a thousand (月薪15K) and a small w
ten thousand (月入2w); without them a capital K is a letter (4K电视, 8K屏幕). A small k after a
number in Chinese is always 千."""


def _zh_thousands(num: str, letter: str = "k") -> str:
    """N k (N w) in Chinese: N thousand (ten thousand) read the way it is said, the last unit
    left out after a higher one (12k -> 一万二, 1.5k -> 一千五, 8k -> 八千, 20k -> 两万, 1.5w ->
    一万五)."""
    words = zh_number(plain_decimal(to_decimal(num) * (10000 if letter == "w" else 1000)))
    m = re.fullmatch(r"(.*[万千])([一二三四五六七八九])([千百])", words)
    if m and {"万": "千", "千": "百"}[m.group(1)[-1]] == m.group(3):
        return m.group(1) + m.group(2)
    return words


def _read_scale_suffix(lang: Lang, g: Groups, before: str, after: str) -> str:
    """8k, 8k-12k, 8-12K, 2w: a number of thousands (薪资8k-12k -> 八千到一万二) or of ten
    thousands (月入2w -> 两万) in Chinese when the k is small or a word of :data:`KILO_SENTENCE`
    is in the clause; else the number and the letter (4K电视 -> 四K, 功率10w -> 十w, and in
    English: 5k -> five k)."""
    a, b, k = g("kk_a"), g("kk_b"), g("kk_k")
    words_near = clause(before) + re.split(r"[，,；;]", after)[0]
    if lang == "zh" and (k == "k" or any(w in words_near for w in KILO_SENTENCE)):
        return _zh_thousands(a, g("kk_ka") or k) + ("到" + _zh_thousands(b, k) if b else "")
    read = zh_number if lang == "zh" else en_number
    letter = k if lang == "zh" else f" {k}"
    if not b:
        return read(a) + letter
    sep = "到" if lang == "zh" else " to "
    return read(a) + (letter if g("kk_ka") else "") + sep + read(b) + letter


def _read_percent(lang: Lang, g: Groups, before: str, after: str) -> str:
    sign = (g("pc_sign") or "").replace("−", "-")
    num = g("pc_num")
    if lang == "zh":
        head = "百分之" if g("pc_sym") == "%" else "千分之"
        return ("负" if sign == "-" else "正" if sign == "+" else "") + head + zh_number(num)
    tail = " percent" if g("pc_sym") == "%" else " per mille"
    return ("minus " if sign == "-" else "plus " if sign == "+" else "") + en_number(num) + tail


_ARTICLE_BEFORE: Final = re.compile(r"(?:^|[^A-Za-z])(?:a|an|A|An)\s+$")
"""An English indefinite article right before a quantity: the quantity describes one thing
(a 5km run, a 500ml bottle, a 50MP camera), its unit is read in the singular."""


_MILES_BEFORE: Final = re.compile(r"\b(?:drive|drives|drove|driven|driving|ride|rode|ridden|riding|flew|flown)\s+$",
                                  re.IGNORECASE)
"""A vehicle's verb right before ``N m``: the m may be miles as well as metres, and stays a letter."""


def _read_unit(lang: Lang, g: Groups, before: str, after: str) -> str:
    sign = (g("u_sign") or "").replace("−", "-")
    symbol = g("u_unit")
    if g("u_letter") == "m" and _MILES_BEFORE.search(before):  # I drove 5 m.: miles, minutes or metres
        return (zh_number if lang == "zh" else en_number)(g("u_num")) + ("m" if lang == "zh" else " m")
    unit = UNITS[symbol] if symbol else GLUED_UNITS[g("u_glued") or g("u_spaced") or g("u_letter")]
    words = unit_reading(lang, unit, g("u_num"), singular=bool(_ARTICLE_BEFORE.search(before)))
    if sign == "-" and lang == "zh" and said_below(before):
        pass  # 零下-3℃: 零下 is written, the sign is not read again
    elif sign == "-":
        below = lang == "zh" and symbol in TEMPERATURE_UNITS  # -5℃: 零下五摄氏度
        words = ("零下" if below else "负" if lang == "zh" else "minus ") + words
    elif sign == "+":
        words = ("正" if lang == "zh" else "plus ") + words
    return words


def _library_may_read_percent(g: Groups, before: str, after: str) -> bool:
    """The library reads -2% as 百分之负二 and 5‰ as 五千分号: those stay ours."""
    return not g("pc_sign") and g("pc_sym") == "%"


FACTOR: Final = Kind(
    "factor",
    rf"(?<![A-Za-z0-9.])(?P<x_num>{NUM})[x×](?![A-Za-z0-9])",
    _read_factor, first=r"\d")


def _read_size(lang: Lang, g: Groups, before: str, after: str) -> str:
    """1920x1080, 2 x 4, 10×20×30cm, 3 x 500ml: a size or a pack, 乘以 / by between the numbers,
    never the letter x; a unit after the last number is read with it, and a unit after each
    (12 ft x 15 ft, 3 m × 4 m) with each."""
    if g("su_a"):  # 12 ft x 15 ft, 3 m × 4 m: each number with its unit
        sides = [(g(f"su_{p}"), g(f"su_u{p}").strip()) for p in "abc" if g(f"su_{p}")]
        one = bool(_ARTICLE_BEFORE.search(before))
        said = [unit_reading(lang, UNITS.get(u) or GLUED_UNITS.get(u) or _INCH, n, singular=one) for n, u in sides]
        return "乘以".join(said) if lang == "zh" else " by ".join(said)
    nums = [n for n in (g("sz_a"), g("sz_b"), g("sz_c")) if n]
    read = zh_number if lang == "zh" else en_number
    parts = [read(n) for n in nums[:-1]]
    unit = UNITS[g("sz_unit")] if g("sz_unit") else GLUED_UNITS[g("sz_glued")] if g("sz_glued") else None
    parts.append(unit_reading(lang, unit, nums[-1], singular=bool(_ARTICLE_BEFORE.search(before)))
                 if unit is not None else read(nums[-1]))
    return "乘以".join(parts) if lang == "zh" else " by ".join(parts)


_TIMES: Final = r"(?: ?[x×] ?)"
_SIDE_UNIT: Final = rf"\s?(?:{alt(UNITS)}|{alt(GLUED_UNITS)})(?![A-Za-z0-9^⁰¹²³⁴⁵⁶⁷⁸⁹⁻])|[\"″]"
_INCH: Final = Unit("英寸", "inch", "inches")
"""The inch mark's unit (12" x 18")."""
SIZE: Final = Kind(
    "size",
    rf"(?<![A-Za-z0-9.#])(?P<su_a>{NUM})(?P<su_ua>{_SIDE_UNIT}){_TIMES}(?P<su_b>{NUM})(?P<su_ub>{_SIDE_UNIT})"
    rf"(?:{_TIMES}(?P<su_c>{NUM})(?P<su_uc>{_SIDE_UNIT}))?"
    rf"|(?<![A-Za-z0-9.#])(?!0x)(?P<sz_a>{NUM}){_TIMES}(?P<sz_b>{NUM})(?:{_TIMES}(?P<sz_c>{NUM}))?"
    rf"(?:\s?(?P<sz_unit>{alt(UNITS)})|(?P<sz_glued>{alt(GLUED_UNITS)}))?(?![A-Za-z0-9^⁰¹²³⁴⁵⁶⁷⁸⁹⁻])",
    _read_size, first=r"\d", letters_neutral=True)


TWENTY_FOUR_SEVEN: Final = Kind(
    "twenty_four_seven",
    r"(?<![\d/])24/7(?![\d/])",
    _read_twenty_four_seven, first=r"2")


PER_UNIT: Final = Kind(
    "per_unit",
    rf"(?<=[\u4e00-\u9fa5A-Za-z²³\d])/(?P<pu_unit>{alt(UNITS)}|{alt(GLUED_UNITS)})(?![A-Za-z0-9])",
    _read_per_unit, first=r"/")


DECADE: Final = Kind(
    "decade",
    r"(?<![\d.])(?P<dec>\d{3}0)s(?:[-–—~](?P<dec_b>(?:\d\d)?\d0)s)?(?![A-Za-z])|(?<![A-Za-z0-9])'(?P<dec2>\d0)s(?![A-Za-z])"
    r"|(?<![A-Za-z0-9.'])(?P<dec3>[1-9]0)s(?![A-Za-z])",
    _read_decade, first=r"[\d']")


SCALE_SUFFIX: Final = Kind(
    "scale_suffix",
    rf"(?<![A-Za-z0-9.])(?P<kk_a>{NUM})(?:(?P<kk_ka>[kKw])?\s?(?P<kk_sep>[-~–—])\s?(?P<kk_b>{NUM}))?"
    r"(?P<kk_k>[kKw])(?![A-Za-z0-9])",
    _read_scale_suffix, first=r"\d")


_BILLION_NOUNS: Final = (r"(?:parameters|params|users|people|views|downloads|tokens|subscribers|followers|"
                         r"streams|plays|visits|visitors|devices|years|stars|records|rows)")


def _read_million(lang: Lang, g: Groups, before: str, after: str) -> str:
    """1.2M, 5M views, 1.5B parameters, 3bn: millions and billions without a currency sign
    (one point two million; 一百二十万), never the letter."""
    num = g("mm_num") or g("mm_dnum")
    billion = g("mm_s") not in ("M", "mn")  # bn, B before a count, or 1.5B (no mm_s)
    if lang == "zh":
        return zh_number(plain_decimal(to_decimal(num) * (10 ** 9 if billion else 10 ** 6)))
    return f"{en_number(num)} {'billion' if billion else 'million'}"


MILLION: Final = Kind(
    "million",
    rf"(?<![A-Za-z0-9.#$])(?:(?P<mm_num>{NUM})(?P<mm_s>M|mn|bn|B(?=\s{_BILLION_NOUNS}\b))"
    r"|(?P<mm_dnum>\d+\.\d+)B)(?![A-Za-z0-9])",
    _read_million, first=r"\d")
"""A B is a billion only with a decimal point (1.5B) or before what is counted (3B parameters):
Apt 3B, seat 12B and 221B Baker Street stay a number and a letter."""


PERCENT: Final = Kind(
    "percent",
    rf"(?P<pc_sign>{SIGN})?(?P<pc_num>{NUM})\s?(?P<pc_sym>[%‰])",
    _read_percent, library=True, library_may_read=_library_may_read_percent, first=r"[-+−\d]")


METRE_AFTER_EN: Final = words("metre_after_en")
"""English words after ``N m`` (a space between) that make the m metres (8,849 m high, 5 m away)."""


UNIT: Final = Kind(
    "unit",
    rf"(?P<u_sign>{SIGN})?(?P<u_num>{NUM})(?:\s?(?P<u_unit>{alt(UNITS)})"
    rf"|(?P<u_glued>{alt(GLUED_UNITS)})|\s(?P<u_spaced>m)(?=\s(?:{alt_words(METRE_AFTER_EN)})\b)"
    r"|\s(?P<u_letter>[mgsLh])(?=[.,;:!?)。，；：！？]|\s+of\b|\s*$))(?![A-Za-z0-9])",
    _read_unit, first=r"[-+−\d]")
"""A one-letter unit (m, g, s, L, h) after a space only where it cannot be a letter: before a
measured word (5 m away), a pause or the end (ran 300 m. Then, for 10 s, then) or of (5 g of
salt); grade 5 A, at 5 p.m. and a name's initial stay letters."""


PRESSURE_BEFORE: Final = words("blood_pressure_before")
"""Written before ``a/b`` (为/是/:/of/is and spaces between allowed), they make it a blood
pressure (血压135/85), as ``mmHg`` after it does."""
_PRESSURE_LEAD: Final = "|".join(f"(?<={re.escape(w + sep)})" for w in PRESSURE_BEFORE
                                 for sep in ("", " ", "为", "是", ":", ": ", " of ", " is ", " was "))


def _read_blood_pressure(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Blood pressure, systolic and diastolic: 一百三十五，八十五毫米汞柱 / one hundred thirty five
    over eighty five millimeters of mercury; never a fraction (八十五分之一百三十五)."""
    a, b = g("bp_a") or g("bp_a2"), g("bp_b") or g("bp_b2")
    unit = UNITS["mmHg"] if g("bp_unit") or g("bp_unit2") else None
    if lang == "zh":
        return zh_number(a) + "，" + zh_number(b) + (unit.zh if unit else "")
    return f"{en_number(a)} over {en_number(b)}" + (f" {unit.en_many}" if unit else "")


BLOOD_PRESSURE: Final = Kind(
    "blood_pressure",
    rf"(?:{_PRESSURE_LEAD})(?P<bp_a>\d{{2,3}})/(?P<bp_b>\d{{2,3}})(?:\s?(?P<bp_unit>mmHg)(?![A-Za-z]))?(?![\d/])"
    r"|(?<![\d/.])(?P<bp_a2>\d{2,3})/(?P<bp_b2>\d{2,3})\s?(?P<bp_unit2>mmHg)(?![A-Za-z])",
    _read_blood_pressure, first=r"\d")


def _read_resolution(lang: Lang, g: Groups, before: str, after: str) -> str:
    """1080p, 720P, 4320p: a video resolution, named by its digits (一零八零P / ten eighty p),
    never a count (一千零八十p)."""
    num, letter = g("rs_num"), g("rs_p")
    if lang == "zh":
        return zh_digits(num) + letter.upper()
    head, tail = num[:-2], num[-2:]
    return f"{en_int(int(head))} {en_int(int(tail))} {letter.lower()}"


RESOLUTION: Final = Kind(
    "resolution",
    r"(?<![\d.])(?P<rs_num>480|576|720|1080|1440|2160|4320)(?P<rs_p>[pPiI])(?![A-Za-z0-9])",
    _read_resolution, first=r"[12457]")


AMPERE_BEFORE: Final = words("ampere_before")
"""Written right before ``NA`` (为/是/:/达 and spaces between allowed), they make the A amperes
(电流10A -> 十安, outputs 10 A); elsewhere A is a letter (5A景区, 3A游戏, 10 A students)."""
_AMPERE_LEAD: Final = "|".join(f"(?<={re.escape(w + sep)})" for w in AMPERE_BEFORE
                               for sep in ("", " ", "为", "是", ":", ": ", "达", "约"))


def _read_ampere(lang: Lang, g: Groups, before: str, after: str) -> str:
    num = g("amp_num") or g("amp_num2")
    if lang == "zh":
        return liang(zh_number(num), "个") + "安"
    return en_number(num) + (" amp" if to_decimal(num) == 1 else " amps")


AMPERE: Final = Kind(
    "ampere",
    rf"(?:{_AMPERE_LEAD})(?P<amp_num>{NUM})\s?A(?![A-Za-z0-9])"
    rf"|(?<![A-Za-z0-9.])(?P<amp_num2>{NUM})\s?A(?=\s(?:fuse|breaker|circuit|charger)\b)",
    _read_ampere, first=r"\d")
"""Amperes only where an electrical word says so: the letter A after a number is a grade or a class
far more often."""


BASE_PAIR_SENTENCE: Final = words("base_pair_sentence")
"""In the sentence of ``N bp``, they make bp base pairs (DNA片段500bp)."""
BIT_RATE_SENTENCE: Final = words("bit_rate_sentence")
"""In the sentence of ``N bps``, they make bps bits per second (a 9600 bps modem)."""


def _read_basis_points(lang: Lang, g: Groups, before: str, after: str) -> str:
    """25bp, 50 bps: basis points in finance (加息25bp -> 加息二十五个基点, twenty five basis points),
    base pairs where the sentence speaks of DNA, bits per second beside a modem."""
    num, symbol = g("bps_num"), g("bps_u")
    sentence = before + after
    if any(w in sentence for w in BASE_PAIR_SENTENCE):
        zh, one, many = "个碱基对", "base pair", "base pairs"
    elif symbol == "bps" and any(w in sentence for w in BIT_RATE_SENTENCE):
        zh, one, many = "比特每秒", "bit per second", "bits per second"
    else:
        zh, one, many = "个基点", "basis point", "basis points"
    if lang == "zh":
        return liang(zh_number(num), "个") + zh
    return f"{en_number(num)} {one if to_decimal(num) == 1 else many}"


BASIS_POINTS: Final = Kind(
    "basis_points",
    rf"(?<![A-Za-z0-9.])(?P<bps_num>{NUM})\s?(?P<bps_u>bps?)(?![A-Za-z0-9])",
    _read_basis_points, first=r"\d")
