"""Numbers that are names, not amounts: model numbers (Boeing 747, RTX 4090, A320, i7-13700K),
house numbers before a street's name (221B Baker Street, 1600 Pennsylvania Avenue) and US ZIP
codes after a state (Washington, DC 20500). They are said the way their owners say them: in
English in pairs of digits (seven forty seven, forty ninety, sixteen hundred), in Chinese digit
by digit (波音七四七, 空客A三二零), never as a count (seven hundred and forty seven)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import Groups, Kind, alt_words
from .numbers import en_digits, en_int, zh_digits, zh_number
from .vocabulary import rows, words


def en_model(num: str) -> str:
    """A name's number in English, in pairs from the right as it is said: 747 -> seven forty
    seven, 707 -> seven oh seven, 4090 -> forty ninety, 1600 -> sixteen hundred, 13700 ->
    thirteen seven hundred; round hundreds and thousands as numbers (900, 5000), a leading zero
    or more than five digits digit by digit."""
    if num.startswith("0") or len(num) > 5:
        return en_digits(num)
    if len(num) <= 2 or (len(num) == 3 and num.endswith("00")) or (len(num) == 4 and num.endswith("000")):
        return en_int(int(num))
    if len(num) == 5:
        return f"{en_int(int(num[:2]))} {en_model(num[2:])}"
    head, tail = num[:-2], num[-2:]
    if tail == "00":
        return f"{en_int(int(head))} hundred"
    return f"{en_int(int(head))} {'oh ' + en_int(int(tail)) if tail.startswith('0') else en_int(int(tail))}"


def _name_number(lang: Lang, num: str) -> str:
    return zh_digits(num) if lang == "zh" else en_model(num)


MODEL_BEFORE: Final = words("model_before")
"""Makers and series written before a model number (a space or hyphen between allowed): Boeing
747, RTX-4090, 波音747, 空客A320."""
_MODEL_LEAD: Final = "|".join(f"(?<={re.escape(w + sep)})" for w in MODEL_BEFORE for sep in ("", " ", "-"))
MODEL_FAMILIES: Final = "|".join(f"{re.escape(prefix)}(?={digit}\\d\\d(?!\\d))"
                                 for prefix, digit in rows("model_families"))
"""A capital and the first digit of a model family's three-digit number, which name it without its
maker (A320, A380: Airbus)."""


def _read_model_number(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Boeing 747 -> Boeing seven forty seven, RTX 4090 -> forty ninety, A320 -> A three twenty,
    i7-13700K -> i seven thirteen seven hundred K; 波音七四七, 空客A三二零, i七 一三七零零K."""
    if g("gl_num"):  # 7950X, 13900K, 5800X3D: the suffix's letters and digits one by one
        suffix = g("gl_suf")
        if lang == "zh":
            return zh_digits(g("gl_num")) + re.sub(r"\d", lambda d: zh_digits(d.group(0)), suffix)
        return en_model(g("gl_num")) + " " + " ".join(en_int(int(c)) if c.isdigit() else c for c in suffix)
    if g("cpu_fam"):
        fam, num, suffix = g("cpu_fam"), g("cpu_num"), g("cpu_suf") or ""
        head = fam[0] + (zh_digits(fam[1:]) if lang == "zh" else " " + en_int(int(fam[1:])))
        return f"{head} {_name_number(lang, num)}" + ((suffix if lang == "zh" else f" {suffix}") if suffix else "")
    prefix, num, suffix = g("mn_pre") or g("mn_pre2") or "", g("mn_num") or g("mn_num2"), g("mn_suf") or ""
    if lang == "zh":
        return prefix + zh_digits(num) + suffix
    return " ".join(p for p in (prefix, en_model(num), suffix) if p)


MODEL_NUMBER: Final = Kind(
    "model_number",
    rf"(?:{_MODEL_LEAD})(?P<mn_pre>[A-Z]{{1,2}}(?=\d))?(?P<mn_num>\d{{3,4}})"
    r"(?P<mn_suf>[A-Za-z]{1,2})?(?![A-Za-z0-9]|[.,]\d)"
    rf"|(?<![A-Za-z0-9])(?P<mn_pre2>{MODEL_FAMILIES})(?P<mn_num2>\d{{3}})(?![A-Za-z0-9]|[.,]\d|\s?[室号])"
    r"|(?<![A-Za-z0-9])(?P<cpu_fam>[iI][3579]|R[3579])[- ](?P<cpu_num>\d{4,5})(?P<cpu_suf>[A-Z]{1,2})?(?![A-Za-z0-9])"
    r"|(?<![A-Za-z0-9.,])(?P<gl_num>\d{4,5}(?=X)|\d{5}(?=[KFHU])|\d{4}(?=H))"
    r"(?P<gl_suf>X3D|XTX|XT|X|KF|KS|K|F|HX|HS|H|U)(?![A-Za-z0-9])",
    _read_model_number, counts=True, first=r"[\dAiIR]")
"""After a maker or series word, a family's capital (A320) or a CPU's family (i7-13700K): never a
range (i7到一万三千七百) or a count. A chip's number with its capitals glued is one too (7950X,
13900K, 5800X3D), where the capitals are no unit's: a K after four digits stays kelvin (6500K) and
an X after fewer is a letter."""


STREET_WORDS: Final = words("street_words_en")
"""The last word of a street's name (Street, Avenue, Road, ...): a number of three or four digits
before the name is a house number."""


_STATES: Final = "|".join(f"(?<=, {s} )" for s in words("us_states"))
"""After a US state's two-letter code and a comma before it, a ZIP code (Washington, DC 20500),
never another capital pair (In 2024, US 20000 jobs)."""


def _read_address_number(lang: Lang, g: Groups, before: str, after: str) -> str:
    """221B Baker Street -> two twenty one B, 1600 Pennsylvania Avenue -> sixteen hundred;
    DC 20500 -> two zero five zero zero (a ZIP code, digit by digit)."""
    if g("zip"):
        return ", ".join(en_digits(p) for p in (g("zip"), g("zip4")) if p)
    return en_model(g("hn_num")) + (f" {g('hn_let')}" if g("hn_let") else "")


ADDRESS_NUMBER: Final = Kind(
    "address_number",
    r"(?<![\w,.$#/-])(?P<hn_num>[1-9]\d{2,3})(?P<hn_let>[A-Z])?"
    rf"(?= (?:[A-Z][a-z]+ ){{1,3}}(?:{alt_words(STREET_WORDS)})\b)"
    rf"|(?:{_STATES})(?P<zip>\d{{5}})(?:-(?P<zip4>\d{{4}}))?(?![\d-])",
    _read_address_number, lang="en", first=r"\d")
"""English only: a Chinese address's 号 says its numbers as counts."""


_VERSIONED: Final = ("Python", "Node", "Node.js", "Java", "Go", "Rust", "Ruby", "PHP", "Perl", "Kotlin", "Swift",
                     "Scala", "Julia", "TypeScript", "iOS", "iPadOS", "macOS", "watchOS", "Android", "Ubuntu", "Debian",
                     "Fedora", "Windows", "Chrome", "Firefox", "Safari", "Edge", "Kubernetes", "Docker", "PostgreSQL",
                     "MySQL", "Redis", "React", "Angular", "Vue", "Django", "Rails", "Spring", "version", "Version",
                     "release", "Release")
"""Words whose next number is a version (Python 3.10, version 2.10, iOS 17.2)."""
_AFTER_VERSIONED: Final = "|".join(f"(?<={re.escape(w)} )" for w in _VERSIONED)


def _read_version(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Python 3.10, Node v20.11.0: each part of a version as its own number in English (three
    point ten, never a decimal: three point one zero is 3.1), a part of three digits or more as a name's
    number is said; in Chinese the digits after each point, as a decimal's (三点一二); a v before
    it is version (V in Chinese)."""
    def part(p: str) -> str:
        if len(p) > 1 and p[0] == "0":  # 1.05: the digits as written
            return en_digits(p)
        return en_int(int(p)) if len(p) < 3 else en_model(p)  # Chrome 124.0.6367: one twenty four, ...

    parts = g("vn_num").split(".")
    if lang == "zh":  # as Chinese reads a decimal's digits: 三点一二, 二点零点一
        said = "点".join(zh_number(p) if i == 0 else zh_digits(p) for i, p in enumerate(parts))
    else:
        said = " point ".join(part(p) for p in parts)
    v = g("vn_v") or g("vn_v2")
    return (v.upper() if lang == "zh" else "version ") + said if v else said  # 升级到v2.10版本: V二点十版本


VERSION: Final = Kind(
    "version",
    rf"(?:(?:{_AFTER_VERSIONED})(?P<vn_v>[vV])?|(?<![A-Za-z0-9.])(?P<vn_v2>[vV]))"
    r"(?P<vn_num>\d{1,3}(?:\.\d{1,4}){1,3})(?![\d.]|[A-Za-z])",
    _read_version, first=r"[vV\d]")
"""A version after the name of what it versions, or after a v (v2.10): its parts as numbers."""


def _read_episode(lang: Lang, g: Groups, before: str, after: str) -> str:
    """S02E04: 第二季第四集 / season two episode four, never the letters and zero two."""
    season, episode = int(g("ep_s")), int(g("ep_e"))
    if lang == "zh":
        return f"第{zh_number(str(season))}季第{zh_number(str(episode))}集"
    return f"season {en_int(season)} episode {en_int(episode)}"


EPISODE: Final = Kind(
    "episode",
    r"(?<![A-Za-z0-9])[Ss](?P<ep_s>\d{1,2}) ?[Ee](?P<ep_e>\d{1,3})(?![A-Za-z0-9])",
    _read_episode, first=r"[Ss]")
"""A season and an episode as a series' fans write them (S02E04, s1e10)."""
