"""``a/b``: a fraction or a month and day, as context words say, and ranges of two
(``3/5-3/8``, ``1/3-1/2``)."""

from __future__ import annotations

import re
from typing import Final, Literal

from .base import Lang
from .context import ends_with
from .dates import en_date, zh_date
from .kind import SIGN, Groups, Kind, alt_words
from .numbers import en_int, en_number, en_ordinal, liang, takes_liang, zh_digits, zh_int, zh_number
from .vocabulary import words


def _split(a: int, b: int) -> bool:
    """``a/b`` that is a split of a hundred (50/50, 60/40, 30/70): two shares, not a fraction."""
    return a + b == 100 and a % 5 == 0 and b % 5 == 0 and a > 0 and b > 0


def fraction_words(lang: Lang, a: int, b: int) -> str:
    """``a/b`` read as a fraction (三分之二, two thirds), except what is no fraction when
    written so: a split of a hundred (50/50: fifty fifty, 五十比五十), 20/20 (twenty twenty), a
    whole score (10/10, 5/5: ten out of ten) and a score above ten (11/10)."""
    if _split(a, b):
        return f"{zh_int(a)}比{zh_int(b)}" if lang == "zh" else f"{en_int(a)} {en_int(b)}"
    if lang == "zh":
        return f"{zh_int(b)}分之{zh_int(a)}"
    if a == b == 20:
        return "twenty twenty"
    if (a == b and b >= 3) or (a > b == 10):
        return f"{en_int(a)} out of {en_int(b)}"
    if b == 0:
        return f"{en_int(a)} over zero"
    if b == 2:
        return "one half" if a == 1 else f"{en_int(a)} halves"
    if b == 4:
        return "one quarter" if a == 1 else f"{en_int(a)} quarters"
    if b <= 100 and a <= 100 and b > 2:
        return f"{en_int(a)} {en_ordinal(b)}" + ("" if a == 1 else "s")
    return f"{en_int(a)} over {en_int(b)}"


EN_DATE_BEFORE: Final = words("date_before_en")
_EN_DATE_BEFORE_END: Final = re.compile(rf"(?<![A-Za-z])(?:{alt_words(EN_DATE_BEFORE)})\s*$")
"""One of :data:`EN_DATE_BEFORE` as a whole word at the end of the text before (Mason 3/4 is no date)."""


FRACTION_BEFORE: Final = words("fraction_before")
"""Written right before ``a/b`` in Chinese (为/是 between allowed), they make it a fraction
(大约11/12的时间, 占总数的2/5, 约为1/3)."""
FRACTION_AFTER: Final = re.compile(
    r"的(?:人|时间|用户|学生|老师|人口|概率|几率|比例|份额|部分|面积|员工|家庭|企业|公司|患者|受访者|网友|样本|收入|"
    r"工作|精力|预算|市场|选民|居民|土地|资金|成本|观众|玩家|股份|情况|可能)|以上|以下|左右|之多|之一|之间|强|弱")
"""Written right after ``a/b`` (or a range of two), they make it a fraction (12/25的人, 3/5以上),
as does a measure word (3/4杯水)."""
DATE_BEFORE: Final = words("date_before")
"""Written right before ``a/b`` in Chinese (是/为 between allowed), they make it a month and day
(截止12/31, 于3/5, 明天是3/5), as does a weekday (周二3/5)."""
DATE_AFTER: Final = words("date_after")
"""Written right after ``a/b`` (or a range of two), also after an adverb of
:data:`_DATE_ADVERBS`, they make it a month and day (12/31前, 3/5举行, 3/5正式上线)."""
_DATE_ADVERBS: Final = words("date_adverbs")
_WEEKDAY_END: Final = re.compile(r"(?:周|星期|礼拜)[一二三四五六日天]\s?[(（]?\s?$")


_FESTIVAL: Final = re.compile(r"(?:(?!的)[\u4e00-\u9fa5]){0,3}节(?![课目奏约省能点拍])|元旦|除夕|大促")
"""A festival or sale day right after m/d (3/8妇女节, 5/1劳动节, 1/1元旦, 6/18大促): a date."""


def zh_slash_kind(a: str, b: str, before: str, after: str) -> Literal["date", "fraction", "either"]:
    """What context words make of ``a/b`` in Chinese: a fraction (:data:`FRACTION_BEFORE`; after
    it :data:`FRACTION_AFTER` or a measure word), a date (:data:`DATE_BEFORE`,
    :data:`DATE_AFTER`), ``either`` when no word decides. Words before it are looked at first,
    then words after; a/b that is no month and day is a fraction."""
    if not (1 <= int(a) <= 12 and 1 <= int(b) <= 31):
        return "fraction"
    after = after.lstrip()
    if ends_with(before, FRACTION_BEFORE, " 为是"):
        return "fraction"
    if ends_with(before, DATE_BEFORE, " :：是为") or _WEEKDAY_END.search(before):
        return "date"
    if (after.startswith(DATE_AFTER) or (after[:2] in _DATE_ADVERBS and after[2:].startswith(DATE_AFTER))
            or _FESTIVAL.match(after)):
        return "date"
    if FRACTION_AFTER.match(after) or takes_liang(after):
        return "fraction"
    return "either"


def zh_slash_date(a: str, b: str, before: str, after: str) -> bool:
    """Whether ``a/b`` in Chinese is a month and day rather than a fraction: as context words
    say (:func:`zh_slash_kind`), else a date when it is written with a leading zero (03/05),
    has a day over 12 (12/25: no fraction has such a denominator in running text) or a month
    not less than its day (10/1, 11/11: an improper fraction is rare); else a fraction (3/5)."""
    kind = zh_slash_kind(a, b, before, after)
    if kind != "either":
        return kind == "date"
    return a.startswith("0") or b.startswith("0") or int(b) > 12 or int(a) >= int(b)


_EN_FRACTION_AFTER: Final = re.compile(r"\s*(?:[-\"″%]|of\b|an?\b|(?:inch|inches|in|cups?|teaspoons?|tsp|"
                                       r"tablespoons?|tbsp|miles?|mi|pounds?|lbs?|oz|ounces?|th|ths)\b)", re.IGNORECASE)
"""Written right after ``a/b``, they make it a quantity's fraction (5/16 inch, 3/32", 7/16 of)."""


def _en_slash_date(a: str, b: str, before: str, after: str) -> bool:
    """English: m/d is a date when zero-padded (03/05), after on/by/until/arrives/... (on 3/5,
    arrives 5/22), or when its second number is no denominator one says (13 to 31: 5/22,
    11/28) and no unit or "of" follows it (5/16 inch stays a fraction)."""
    if not (1 <= int(a) <= 12 and 1 <= int(b) <= 31):
        return False
    return (a.startswith("0") or b.startswith("0") or _EN_DATE_BEFORE_END.search(before.lower()) is not None
            or (int(b) >= 13 and not _EN_FRACTION_AFTER.match(after)))


def _read_fraction(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``a/b``: a fraction (五分之三) or, as its context says, a month and day (US order in
    English: on 3/5; 截止12/31 in Chinese, see :func:`zh_slash_date`)."""
    a, b, sign = g("fr_a"), g("fr_b"), (g("fr_sign") or "").replace("−", "-")
    if g("fr_whole") and int(a) < int(b):  # 1 1/2 cups: a mixed number
        return mixed_number(lang, g("fr_whole"), int(a), int(b))
    if g("fr_whole"):  # 5 3/2: two numbers
        return (zh_int if lang == "zh" else en_int)(int(g("fr_whole"))) + " " + fraction_words(lang, int(a), int(b))
    if _event(a, b, after):  # the 9/11 memorial, 9/11事件: a day that names an event
        return f"{en_int(int(a))} {en_int(int(b))}" if lang == "en" else zh_digits(a + b)
    if sign:  # -1/3: a signed fraction, never a date
        return {"-": ("负", "minus "), "+": ("正", "plus ")}[sign][lang == "en"] + fraction_words(lang, int(a), int(b))
    if zh_slash_date(a, b, before, after) if lang == "zh" else _en_slash_date(a, b, before, after):
        return zh_date(None, int(a), int(b)) if lang == "zh" else en_date(None, int(a), int(b))
    return fraction_words(lang, int(a), int(b))


EVENT_AFTER: Final = words("event_after")
"""Written right after m/d, they make it the name of an event, read as two numbers (the 9/11
memorial: nine eleven; 9/11事件: 九一一事件), never a fraction or a date."""


def _event(a: str, b: str, after: str) -> bool:
    return 1 <= int(a) <= 12 and 1 <= int(b) <= 31 and after.lstrip().startswith(EVENT_AFTER)


def mixed_number(lang: Lang, whole: str, a: int, b: int) -> str:
    """A whole number and a proper fraction (1 1/2, 2 3/4): 一又二分之一 / one and a half,
    two and three quarters, never two numbers in a row."""
    if lang == "zh":
        return f"{zh_int(int(whole))}又{fraction_words(lang, a, b)}"
    part = fraction_words(lang, a, b)
    if a == 1:
        part = "a " + part.removeprefix("one ")
    return f"{en_int(int(whole))} and {part}"


def _read_month_day_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``a/b-c/d``: two months and days (3/5-3/8 -> 三月五日到三月八日) or two fractions
    (1/3-1/2的人 -> 三分之一到二分之一). Context words decide as for one (:func:`zh_slash_kind`);
    without them it is a date range when the dates run forward and the fractions do not
    (3/5-3/8), or when either side alone reads as a date (12/24-12/26)."""
    a1, b1, a2, b2 = g("ma_m"), g("ma_d"), g("mb_m"), g("mb_d")
    sep = g("mr_sep").strip()
    valid = all(1 <= int(m) <= 12 and 1 <= int(d) <= 31 for m, d in ((a1, b1), (a2, b2)))
    # the dates run forward while the fractions do not grow: 3/5-3/8
    forward = (int(a1), int(b1)) < (int(a2), int(b2)) and int(a1) * int(b2) >= int(a2) * int(b1)
    if lang == "zh":
        kind = zh_slash_kind(a1, b1, before, after) if valid else "fraction"
        if kind == "either":
            kind = zh_slash_kind(a2, b2, "", after)
        date = kind == "date" or (kind == "either" and (
            forward or zh_slash_date(a1, b1, "", "") or zh_slash_date(a2, b2, "", "")))
    else:
        date = valid and (_en_slash_date(a1, b1, before, after) or forward)
    if date:
        sides = [zh_date(None, int(m), int(d)) if lang == "zh" else en_date(None, int(m), int(d))
                 for m, d in ((a1, b1), (a2, b2))]
    else:
        sides = [fraction_words(lang, int(x), int(y)) for x, y in ((a1, b1), (a2, b2))]
    if lang == "zh":
        return sides[0] + ("至" if sep == "至" else "到") + sides[1]
    return f"{sides[0]} to {sides[1]}"


def _library_fits_fraction(g: Groups, words: str, before: str, after: str) -> bool:
    """Whether the library's reading is of the sort our context words choose: it reads a/b
    with a of 10 to 12 as a date (11/12 -> 十一月十二日, also in 大约11/12的时间) and the others
    as fractions (6/30, also in 截止6/30), so a fraction must read 分之 and a date 月."""
    return ("月" in words) == zh_slash_date(g("fr_a"), g("fr_b"), before, after)


MONTH_DAY_RANGE: Final = Kind(
    "month_day_range",
    r"(?<![\d/.])(?P<ma_m>\d{1,2})/(?P<ma_d>\d{1,2})\s?(?P<mr_sep>[-~–—]|到|至)\s?"
    r"(?P<mb_m>\d{1,2})/(?P<mb_d>\d{1,2})(?![\d/])",
    _read_month_day_range, first=r"\d")


FRACTION: Final = Kind(
    "fraction",
    r"(?:(?<![\d/.,])(?P<fr_whole>\d{1,3}) (?=[1-9]/(?:[2-9]|1[0-6])(?![\d/])))?"
    rf"(?P<fr_sign>{SIGN})?(?<![\d/.])(?P<fr_a>\d+)/(?P<fr_b>\d+)(?![\d/])",
    _read_fraction, library=True,
    library_may_read=lambda g, before, after: not g("fr_sign") and not g("fr_whole") and not _split(
        int(g("fr_a")), int(g("fr_b"))) and not _event(g("fr_a"), g("fr_b"), after),
    library_fits=_library_fits_fraction, first=r"[-+−\d]")


RATING_BEFORE: Final = words("rating_before")
"""Written right before ``a/b`` (为/是/:/of/is and spaces between allowed), they make it a rating out of
b (评分4.8/5, rated 4.5/5, give it 9/10), as a star word after it does (4.5/5星, 4/5 stars)."""
_RATING_LEAD: Final = "|".join(f"(?<={re.escape(w + sep)})" for w in RATING_BEFORE
                               for sep in ("", " ", "为", "是", ":", ": ", " of ", " is ", " was "))


def _read_rating(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A rating: 四点八分，满分五分 (the unit written after it, 分 or 星, said on both sides) / four
    point five out of five; never a fraction (五分之四点八) nor a quotient (四点八除以五)."""
    a, b = g("rt_a"), g("rt_b")
    if lang == "zh":
        unit = g("rt_unit") or "分"
        return f"{liang(zh_number(a), unit)}{unit}，满分{zh_number(b)}{unit}"
    return f"{en_number(a)} out of {en_number(b)}"


RATING: Final = Kind(
    "rating",
    rf"(?:{_RATING_LEAD}|(?=\d(?:\.\d)?/(?:5|10)\s?(?:stars?\b|星|颗星)))(?<![\d/.])"
    r"(?P<rt_a>\d{1,3}(?:\.\d{1,2})?)/(?P<rt_b>5|10|100)(?![\d/]|\.\d)(?P<rt_unit>颗星|星|分(?![钟之]))?",
    _read_rating, first=r"\d")
"""A rating out of 5, 10 or 100 after a rating word or before a star: 评分4.8/5分, Rated 4.5/5 stars."""
