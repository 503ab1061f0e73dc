"""Clock times, time ranges, ratios written with a colon, ``5pm`` and ``1h20min``; a colon's
other readings (a score, a duration, a pace, minutes and seconds) as its context says."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .context import ends_with, score_near
from .kind import Groups, Kind, alt_words
from .numbers import en_int, en_number, liang, score, zh_int, zh_number
from .vocabulary import words

DURATION_BEFORE: Final = words("duration_before")
"""Written right before ``h:mm:ss``, they make it a duration (成绩2:03:45: 两小时零三分四十五秒)."""
PACE_BEFORE: Final = words("pace_before")
"""Written right before ``m:ss``, they make it minutes and seconds (配速5:30 -> 五分三十秒)."""
COUNTDOWN_BEFORE: Final = words("countdown_before")
"""Written right before ``mm:ss``, they make it a countdown read as minutes and seconds
(倒计时05:00 -> 五分钟, 剩余时间01:30 -> 一分三十秒). 还有 does so only before ``00:ss``
(距开赛还有00:30 -> 三十秒): 还有10:30的航班 is a clock time."""
NEXT_DAY: Final = ("次日", "翌日", "第二天", "隔天", "次晨")
"""Written before a range's second time (18:30-次日2:00): it falls on the next day, said after 到."""
DAY_PARTS: Final = words("day_parts")
"""Written right before a time with am/pm (下午2:30pm), they already say which half of the
day it is: am/pm is not read a second time."""


def _time_re(p: str) -> str:
    """A clock time h:mm(:ss) with named groups ``<p>_h``, ``<p>_m``, ``<p>_s``."""
    return (rf"(?<![\d.])(?<!\d:)(?P<{p}_h>[01]?\d|2[0-3]|24(?=:00))"
            rf":(?P<{p}_m>[0-5]\d)(?::(?P<{p}_s>[0-5]\d))?(?![\d:])")


def clock(lang: Lang, h: int, m: int, s: int | None, ap: str | None, whole: bool = True) -> str:
    """A clock time: 十点三十分 / ten thirty; in English 24:00 and 00:00 are midnight and a
    24-hour time on the hour is said in hundreds (22:00: twenty two hundred). ``whole``: a
    Chinese time on the hour reads 整 (九点整); inside a range it does not (九点到十七点)."""
    ap = ap.lower() if ap else None
    s = s or None  # 9:00:00 reads as 9:00
    if lang == "zh":
        out = ("上午" if ap == "a" else "下午" if ap == "p" and h < 12 else "")
        out += ("两" if h == 2 else zh_int(h)) + "点"
        if m == 0 and s is None:
            return out + ("整" if whole else "")
        out += ("零分" if m == 0 else ("零" if m < 10 else "") + zh_int(m) + "分")
        if s is not None:
            out += ("零" if s < 10 else "") + zh_int(s) + "秒"
        return out
    if not ap and m == 0 and s is None and h in (0, 24):
        return "midnight"  # 24:00, 00:00: never twenty four o clock
    if not ap and m == 0 and s is None and h > 12:
        return en_int(h) + " hundred"  # 22:00: twenty two hundred
    out = en_int(h)
    if m == 0 and s is None:
        out += "" if ap else " o clock"
    elif m < 10:
        out += " oh " + en_int(m)
    else:
        out += " " + en_int(m)
    if s is not None:
        out += " and " + en_int(s) + (" second" if s == 1 else " seconds")
    if ap:
        out += " AM" if ap == "a" else " PM"
    return out


def _duration(lang: Lang, h: int, m: int, s: int | None) -> str:
    """h:mm:ss as a duration: 两小时零三分四十五秒 / two hours three minutes and forty five seconds."""
    if lang == "zh":
        out = liang(zh_int(h), "个") + "小时"
        out += ("零" if 0 < m < 10 else "") + (zh_int(m) + "分" if m else "")
        if s:
            out += ("零" if s < 10 and not m else "") + zh_int(s) + "秒"
        return out
    parts = [f"{en_int(h)} {'hour' if h == 1 else 'hours'}"]
    if m:
        parts.append(f"{en_int(m)} {'minute' if m == 1 else 'minutes'}")
    if s:
        parts.append(f"and {en_int(s)} {'second' if s == 1 else 'seconds'}")
    return " ".join(parts)


def _countdown(before: str, mm: str) -> bool:
    """``mm:ss`` after a countdown word (:data:`COUNTDOWN_BEFORE`; 还有 only before 00:ss)."""
    return ends_with(before, COUNTDOWN_BEFORE, " :为是") or (mm == "00" and ends_with(before, ("还有",), " :"))


def _minutes_seconds(lang: Lang, m: int, s: int, unit_follows: bool = False) -> str:
    """``mm:ss`` as minutes and seconds: 五分三十秒, 三十秒, on the minute 五分钟 (五分 when
    ``unit_follows``: the 秒 written after it is read next) / five minutes thirty seconds."""
    if lang == "zh":
        if not m:
            return zh_int(s) + ("" if unit_follows else "秒")
        if not s and not unit_follows:
            return liang(zh_int(m), "分钟") + "分钟"
        return zh_int(m) + "分" + ("零" if s < 10 else "") + zh_int(s) + ("" if unit_follows else "秒")
    parts = [f"{en_int(m)} {'minute' if m == 1 else 'minutes'}"] if m else []
    if s or not m:
        parts.append(f"{en_int(s)} {'second' if s == 1 else 'seconds'}")
    return " ".join(parts)


def _read_time(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A clock time, or what its context makes of ``a:b``: a score (比分为21:19), a duration
    (成绩2:03:45), a pace (配速5:30), minutes and seconds (``10:30秒``, 倒计时05:00). A unit
    written after it that the reading already says (17:20分, 15:16:36秒, 12:00点, 9:30点) is
    read once; am/pm after a day part (下午2:30pm) is not read again."""
    h, m, sec, unit = int(g("t_h")), int(g("t_m")), g("t_s"), g("t_unit") or ""
    s = int(sec) if sec else None
    if s is None and not g("t_ap") and score_near(before, after[len(unit):] if unit else after):
        return score(lang, g("t_h"), g("t_m")) + unit  # 比分为21:19
    if s is not None and ends_with(before, DURATION_BEFORE, " :"):
        return _duration(lang, h, m, s) + ("" if unit == "秒" else unit)  # 成绩2:03:45
    if s is None and lang == "zh" and ends_with(before, PACE_BEFORE, " :为是"):
        return f"{zh_int(h)}分{zh_int(m)}秒"  # 配速5:30
    if s is None and not g("t_ap") and (unit == "秒" or (unit in ("", "整") and _countdown(before, g("t_h")))):
        return _minutes_seconds(lang, h, m) + ("" if unit == "秒" else unit)  # 10:30秒, 倒计时05:00
    ap: str | None = g("t_ap")
    if ap and lang == "zh" and ends_with(before, DAY_PARTS):
        ap = None  # 下午2:30pm: 下午 is said once
    on_hour = m == 0 and s is None
    words = clock(lang, h, m, s, ap, whole=not (on_hour and unit in ("整", "点", "点钟")))
    if lang == "zh":
        if unit == "整":
            return words + "整"
        if unit == "点钟":
            return words + ("钟" if on_hour else "")  # 10:00点钟 -> 十点钟
        # 17:20分, 15:16:36秒, 12:00点: the unit the reading already says is written once
        if (unit == "分" and s is None) or (unit == "秒" and s is not None) or unit == "点":
            return words
    return words + unit


def _read_time_range(lang: Lang, g: Groups, before: str, after: str) -> str:
    sides = []
    for p in ("ta", "tb"):
        sec = g(f"{p}_s")
        sides.append(clock(lang, int(g(f"{p}_h")), int(g(f"{p}_m")), int(sec) if sec else None, None, whole=False))
    sep, part = g("tr_sep").strip(), g("tr_part") or ""
    if lang == "zh" or part:  # 上午9:00-下午5:30: the second time's day part is said after 到
        return sides[0] + ("至" if sep == "至" else "到") + part + sides[1]
    return f"{sides[0]} to {sides[1]}"


def _read_race_time(lang: Lang, g: Groups, before: str, after: str) -> str:
    """3:55.2, a race time with tenths: 三分五十五点二秒 / three minutes fifty five point two seconds,
    never a clock time and a decimal (three fifty five. two)."""
    m, s = g("rc_m"), g("rc_s").lstrip("0") + "." + g("rc_f")
    s = s if not s.startswith(".") else "0" + s
    if lang == "zh":
        return zh_number(m) + "分" + zh_number(s) + "秒"
    return f"{en_number(m)} {'minute' if m == '1' else 'minutes'} {en_number(s)} seconds"


def _read_ratio(lang: Lang, g: Groups, before: str, after: str) -> str:
    """``a:b`` that is no clock time: a ratio or score (三比二), or minutes and seconds before
    秒 or after a countdown word (45:30秒 -> 四十五分三十, the 秒 read next; 倒计时59:59)."""
    a, b = g("ra_a"), g("ra_b")
    if mm_ss(a, b, before, after):
        return _minutes_seconds(lang, int(a), int(b), unit_follows=after.startswith("秒"))
    return score(lang, a, b)


def mm_ss(a: str, b: str, before: str, after: str) -> bool:
    """Whether ``a:b`` (no clock time) is minutes and seconds: two-digit seconds under 60
    followed by 秒 or after a countdown word."""
    return len(b) == 2 and int(b) < 60 and int(a) < 1000 and (after.startswith("秒") or _countdown(before, a))


def _read_hour_am_pm(lang: Lang, g: Groups, before: str, after: str) -> str:
    """5pm: five PM / 下午五点 (五点 after a day part: 下午5pm)."""
    ap: str | None = g("hap_ap")
    if lang == "zh" and ends_with(before, DAY_PARTS):
        ap = None
    return clock(lang, int(g("hap_h")), 0, None, ap, whole=False)


def _read_hours_and_minutes(lang: Lang, g: Groups, before: str, after: str) -> str:
    h, m = g("hm_h"), g("hm_m")
    if lang == "zh":
        return liang(zh_number(h), "个") + "小时" + zh_number(m) + "分钟"
    return f"{en_number(h)} {'hour' if h == '1' else 'hours'} {en_number(m)} {'minute' if m == '1' else 'minutes'}"


def _library_may_read_ratio(g: Groups, before: str, after: str) -> bool:
    """45:30秒 and 倒计时59:59 are minutes and seconds, not a ratio: not for the library."""
    return not mm_ss(g("ra_a"), g("ra_b"), before, after)


def _read_dotted_time(lang: Lang, g: Groups, before: str, after: str) -> str:
    """8.15 written as a clock time where the context says time (晚上8.15, at 8.15, 8.15pm):
    八点十五分 / eight fifteen, never 八点一五."""
    h, m = int(g("dt_h") or g("dt_h2")), int(g("dt_m") or g("dt_m2"))
    ap: str | None = g("dt_ap") or g("dt_ap2")
    if ap and lang == "zh" and ends_with(before, DAY_PARTS + _DAY_WORDS):
        ap = None
    return clock(lang, h, m, None, ap)


_DAY_WORDS: Final = words("day_words")
_DOT_TIME_BEFORE: Final = "|".join(f"(?<={re.escape(w)})" for w in (*DAY_PARTS, *_DAY_WORDS, "at ", "At ", "by "))
_AP: Final = r"\.?[Mm](?:\.(?=\S| [a-z]| [-–—~] ?\d))?(?![A-Za-z])"
"""The rest of am/pm after its first letter."""


TIME_RANGE: Final = Kind(
    "time_range",
    _time_re("ta") + r"(?P<tr_sep>\s?[-~–—]\s?|至|到)"
    + rf"(?P<tr_part>(?:{alt_words(NEXT_DAY)})?(?:{alt_words(DAY_PARTS)})?)" + _time_re("tb"),
    _read_time_range, first=r"\d")


RACE_TIME: Final = Kind(
    "race_time",
    r"(?<![\d.:])(?P<rc_m>\d{1,2}):(?P<rc_s>[0-5]\d)\.(?P<rc_f>\d{1,3})(?![\d:]|\.\d)",
    _read_race_time, first=r"\d")
"""Minutes, seconds and their decimals: a clock never writes tenths."""


TIME: Final = Kind(
    "time",
    _time_re("t") + r"(?:\s?(?P<t_ap>[AaPp])\.?[Mm](?:\.(?=\S| [a-z]| [-–—~] ?\d))?(?![A-Za-z]))?"
    r"(?P<t_unit>分(?![钟别享析之配为成组批])|秒|整|点钟|点(?![名评击赞菜餐燃亮播头数滴]))?",
    _read_time, first=r"\d")


RATIO: Final = Kind(
    "ratio",
    r"(?<![\d.])(?<!\d:)(?P<ra_a>\d{1,3}):(?P<ra_b>\d{1,3})(?![\d:])",
    _read_ratio, library=True, library_may_read=_library_may_read_ratio, first=r"\d")


HOUR_AM_PM: Final = Kind(
    "hour_am_pm",
    r"(?<![\d:.])(?P<hap_h>1[0-2]|0?[1-9])\s?(?P<hap_ap>[AaPp])\.?[Mm](?:\.(?=\S| [a-z]| [-–—~] ?\d))?(?![A-Za-z])",
    _read_hour_am_pm, first=r"\d")


HOURS_AND_MINUTES: Final = Kind(
    "hours_and_minutes",
    r"(?<![\d.])(?P<hm_h>\d+)\s?h(?:rs?)?\s?(?P<hm_m>\d+)\s?(?:mins?|m)(?![A-Za-z0-9])",
    _read_hours_and_minutes, first=r"\d")


DOTTED_TIME: Final = Kind(
    "dotted_time",
    rf"(?=\s?\d{{1,2}}\.\d)(?:{_DOT_TIME_BEFORE})\s?(?P<dt_h>[01]?\d|2[0-3])\.(?P<dt_m>[0-5]\d)(?![\d%‰]|\.\d)(?:\s?(?P<dt_ap>[AaPp]){_AP})?"
    rf"|(?=\d)(?<![\d.])(?P<dt_h2>1[0-2]|0?\d)\.(?P<dt_m2>[0-5]\d)\s?(?P<dt_ap2>[AaPp]){_AP}",
    _read_dotted_time)


def _read_hour_h_minutes(lang: Lang, g: Groups, before: str, after: str) -> str:
    """14h30, as French and much of Europe write a clock time: 十四点三十分 / fourteen thirty,
    never the letter h; after a duration word (took 1h30, 用时1h30) hours and minutes."""
    h, m = int(g("fh_h")), int(g("fh_m"))
    if ends_with(before, DURATION_BEFORE, " :") or _EN_DURATION_BEFORE.search(before):
        if lang == "zh":
            return liang(zh_int(h), "个") + "小时" + (zh_int(m) + "分钟" if m else "")
        return f"{en_int(h)} {'hour' if h == 1 else 'hours'}" + (
            f" {en_int(m)} {'minute' if m == 1 else 'minutes'}" if m else "")
    return clock(lang, h, m, None, None)


_EN_DURATION_BEFORE: Final = re.compile(r"\b(?:for|took|takes|lasts|lasted|runs|ran|in|within)\s*$")
"""English words before 1h30 that make it a duration (took 1h30, in 2h15)."""


HOUR_H_MINUTES: Final = Kind(
    "hour_h_minutes",
    r"(?<![\d.A-Za-z])(?P<fh_h>[01]?\d|2[0-3])h(?P<fh_m>[0-5]\d)(?![\dA-Za-z])",
    _read_hour_h_minutes, first=r"\d")
"""Hours, h and two digits of minutes with nothing after (1h30min is hours and minutes)."""


def _read_military_time(lang: Lang, g: Groups, before: str, after: str) -> str:
    """0900 hours, 1730 hours: a 24-hour time said in hundreds (oh nine hundred, seventeen thirty),
    the word hours read after it as written; in Chinese the clock time (九点整)."""
    h, m = int(g("mil_h")), int(g("mil_m"))
    if lang == "zh":
        return clock(lang, h, m, None, None)
    head = "zero" if h == 0 else f"oh {en_int(h)}" if h < 10 else en_int(h)
    tail = "hundred" if m == 0 else f"oh {en_int(m)}" if m < 10 else en_int(m)
    return f"{head} {tail}"


_MILITARY_LEAD: Final = "|".join(f"(?<={w} )" for w in ("at", "At", "by", "By", "until", "till", "from", "From",
                                                        "before", "after", "since", "around", "to"))
MILITARY_TIME: Final = Kind(
    "military_time",
    rf"(?:(?=0)|{_MILITARY_LEAD})(?<![\d.,:])(?P<mil_h>[01]\d|2[0-3])(?P<mil_m>[0-5]\d)(?=\s?(?:hours|hrs)\b)",
    _read_military_time, first=r"\d")
"""Four digits before hours are a time when zero-led (0900 hours) or after at, by, until, ...
(at 1730 hours); 1200 hours of work stays a count."""
