"""Identifiers read digit by digit: phone numbers, spaced digit groups, ``No.123``, codes
with hyphens (取件码3-2-1105, parking space B2-105), and keypad keys (按*号键, press #)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .context import IDENTIFIER_BEFORE, en_identifier, ends_with
from .kind import Groups, Kind, alt_words
from .numbers import digit_groups, en_digits, en_number, read_groups, zh_digits, zh_number
from .vocabulary import words


def _phone(lang: Lang, raw: str) -> str:
    plus = raw.lstrip().startswith("+")
    if "*" in raw:  # 138****5678: the masked digits are read as stars
        head, stars, tail = re.match(r"(\d+)(\*+)(\d+)", raw).groups()  # type: ignore[union-attr]
        star = "星" if lang == "zh" else "star"
        mask = star * len(stars) if lang == "zh" else " ".join([star] * len(stars))
        sep = "，" if lang == "zh" else ", "
        return sep.join([read_groups(lang, [head]), mask, read_groups(lang, [tail])])
    groups = [g for g in re.split(r"[^\d]+", raw) if g]
    word = re.search(r"[A-Z]{3,}$", raw)
    if word:  # 1-800-FLOWERS: the number's word is said as written
        return read_groups(lang, groups) + ("，" if lang == "zh" else ", ") + word.group(0)
    if len(groups) == 1:
        groups = digit_groups(groups[0])
    elif len(groups) == 2 and groups[0] == "86" and len(groups[1]) == 11:
        groups = ["86", *digit_groups(groups[1])]
    return read_groups(lang, groups, plus)


def _read_phone(lang: Lang, g: Groups, before: str, after: str) -> str:
    return _phone(lang, g("phone"))


def _read_digit_groups(lang: Lang, g: Groups, before: str, after: str) -> str:
    return read_groups(lang, g("groups").split())


def _read_numero(lang: Lang, g: Groups, before: str, after: str) -> str:
    """No.1 / No.12345678: 第一 / number one; three or more digits are an identifier."""
    num = g("no_num")
    if len(num) >= 3:
        return read_groups(lang, digit_groups(num))
    return "第" + zh_number(num) if lang == "zh" else "number " + en_number(num)


def code_words(lang: Lang, parts: list[str]) -> str:
    """A code written with hyphens, part by part: digits one by one (1 as 幺), letters as they
    are, the hyphen read 杠 / dash (3-2-1105 -> 三杠二杠幺幺零五, B2-105 -> B二杠幺零五)."""
    def part(p: str) -> str:
        pieces = re.findall(r"[A-Za-z]+|\d+", p)
        if lang == "zh":
            return "".join(x if x.isalpha() else zh_digits(x, one="幺") for x in pieces)
        return " ".join(x if x.isalpha() else en_digits(x) for x in pieces)

    return ("杠" if lang == "zh" else " dash ").join(part(p) for p in parts)


def _read_hyphenated_code(lang: Lang, g: Groups, before: str, after: str) -> str:
    return code_words(lang, g("code").split("-"))


def _read_prefixed_code(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Capital letters, a hyphen and a number (A-1023, CA-1023, B-203): after a word that
    introduces an identifier (编号, 房间, 航班: :data:`.context.IDENTIFIER_BEFORE`; flight, room:
    :func:`.context.en_identifier`) a code read part by part (编号A-1023 -> 编号A杠幺零二三,
    Flight CA-1023 -> Flight CA one zero two three); elsewhere the letters and the
    number (F-16 -> F sixteen, 型号X-100 -> 型号X一百), in the language of the words around
    (the letters alone do not make a Chinese sentence's number English)."""
    letters, num = g("px_letters"), g("px_num")
    if lang == "zh" and ends_with(before, IDENTIFIER_BEFORE, " :：是为#"):
        return code_words(lang, [letters, num])
    if lang == "en" and en_identifier(before):
        return f"{letters} {en_digits(num)}"  # as flight CA981 reads
    return f"{letters} {zh_number(num) if lang == 'zh' else en_number(num)}"


PREFIXED_CODE: Final = Kind(
    "prefixed_code",
    rf"(?<![A-Za-z0-9.+-])(?!(?:{alt_words(words('model_before'))})-\d{{3}})"
    r"(?P<px_letters>[A-Z]{1,3})-(?P<px_num>\d{2,6})(?![A-Za-z0-9-]|[.,]\d)",
    _read_prefixed_code, first=r"[A-Z]", letters_neutral=True)


_KEY_NAMES: Final = {"*": ("星号", "star"), "#": ("井号", "pound")}


def _read_keypad_key(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A keypad key: 按*号键 -> 按星号键, 按#结束 -> 按井号结束, press # -> press pound."""
    sym = g("key") or g("key2")
    tail = g("key_tail") or g("key_tail2") or ""
    if lang == "zh":
        return _KEY_NAMES[sym][0] + ("键" if "键" in tail else "")
    return _KEY_NAMES[sym][1]


_PRESS: Final = "".join(f"(?<={w})" if i == 0 else f"|(?<={w})" for i, w in enumerate(
    ("按", "按下", "请按", "再按", "Press", "press", "Press ", "press ", "Dial ", "dial ", "Push ", "push ", "Hit ",
     "hit ")))
KEYPAD_KEY: Final = Kind(
    "keypad_key",
    rf"(?=\s?[*#])(?:{_PRESS})\s?(?P<key>[*#])(?P<key_tail>号键|号|键)?(?![\d*#])"
    r"|(?P<key2>[*#])(?:(?P<key_tail2>号键|键)|(?=\s?key\b))",
    _read_keypad_key)


def _read_star_code(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A dial code of stars, hashes and digits: *67 -> star sixty seven / 星号六七, *#06# -> star
    hash zero six hash / 星号井号零六井号; two digits after a lone star are said as a number in English
    (star sixty nine), any other digits one by one."""
    code = g("star")
    out: list[str] = []
    for part in re.findall(r"\d+|[*#]", code):
        if part in "*#":
            out.append(_KEY_NAMES[part][0] if lang == "zh" else ("star" if part == "*" else "hash"))
        elif lang == "zh":
            out.append(zh_digits(part))
        else:
            pair = len(part) == 2 and not part.startswith("0") and code == "*" + part
            out.append(en_number(part) if pair else en_digits(part))
    return "".join(out) if lang == "zh" else " ".join(out)


STAR_CODE: Final = Kind(
    "star_code",
    r"(?<![A-Za-z0-9*#])(?![^\n]*?[^\s*]\*(?![\d#]))"
    r"(?P<star>\*(?!\*)(?:[#\d]|\*(?!\*))*\d(?:[#\d]|\*(?!\*))*|#(?:\*|\d)*\*(?:[#\d]|\*(?!\*))*|#\d{1,4}#)"
    r"(?![A-Za-z0-9*])",
    _read_star_code, first=r"[*#]")
"""A code dialled on a phone's keypad (*67, *#06#, #31#, *69): the star is never dropped. A star
that a later one closes on its line (*5* stars, *5 items*) is markdown emphasis, left to the plain
pass."""


HYPHENATED_CODE: Final = Kind(
    "hyphenated_code",
    r"(?=[A-Z\d])(?<![A-Za-z0-9.+-])(?P<code>(?:[A-Z]{0,3}\d{1,10}(?:-\d{1,10}){2,}|[A-Z]{1,3}\d{1,3}-\d{1,6}"
    r"|[A-Z]{2,4}(?:-\d{1,8}){2,}|[A-Z]{0,3}\d{7,}-\d{1,10}|[A-Z]{0,3}\d{1,10}-\d{7,}|[A-Z]{1,3}\d{5,}-\d{1,10}"
    r"|[A-Z]{0,3}\d{4,10}-0\d{2,9})(?:-[A-Z]{1,3})?)"
    r"(?![A-Za-z0-9-]|\.\d)",
    _read_hyphenated_code)
"""Also capitals and two or more numbers (SKU-2024-001, INV-2023-0042, POL-889-221-A): a code,
never a range; and two numbers where no range is meant: one of seven digits or more
(112-4567890-1234567), capitals glued to five digits or more (DD20240520-0001), a zero-led
second number after four digits or more (5012-0001; 555-0123 stays a phone number)."""


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
    r"|\+\d{1,3}[-\s]\d{1,4}[-\s]\d{5,8}(?!\d)"
    r"|(?<![\d+-])1-8\d\d-[A-Z]{3,}(?![A-Za-z]))",
    _read_phone, first=r"[+(\d]")


DIGIT_GROUPS: Final = Kind(
    "digit_groups",
    r"(?<![\d.,])(?P<groups>\d{2,4}(?: \d{2,4}){2,})(?![\d]|[.,]\d)",
    _read_digit_groups, first=r"\d")


PROVINCES: Final = "".join(words("provinces"))
"""The one-character province names a Chinese licence plate starts with (粤B·67890)."""


def _read_licence_plate(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A licence plate after its province: the letters as they are, the digits one by one
    (粤B·67890 -> 粤B六七八九零), never a quantity; the dot is silent."""
    return code_words(lang, [g("pl_letter") + g("pl_rest")])


LICENCE_PLATE: Final = Kind(
    "licence_plate",
    rf"(?<=[{PROVINCES}])(?P<pl_letter>[A-Z])[ ]?(?P<pl_rest>(?=[A-Z]?\d)[A-Z\d]{{5,6}})(?![A-Za-z\d])",
    _read_licence_plate, first=r"[A-Z]")
"""After fold_width the plate's middle dot (粤B·67890) is a space."""


EXCHANGES: Final = words("stock_exchanges")
"""Exchange suffixes of a stock code (600519.SH), read as letters."""


def _read_ticker(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A stock code alone in brackets after the company's name (宁德时代（300750）, 腾讯控股
    （00700.HK）): digit by digit with 幺, never an amount; the exchange suffix as letters."""
    ex = g("tk_ex")
    words = zh_digits(g("tk_num"), one="幺") if lang == "zh" else en_digits(g("tk_num"))
    return words + (f" {ex}" if ex else "")


TICKER: Final = Kind(
    "ticker",
    r"(?:(?<=[\u4e00-\u9fa5A-Za-z]\()|(?<=[\u4e00-\u9fa5A-Za-z] \())(?P<tk_num>\d{5,6})"
    rf"(?:\.(?P<tk_ex>{'|'.join(EXCHANGES)}))?(?=\))",
    _read_ticker, first=r"\d")
"""Five or six digits and nothing else in the brackets: (300元) and (2024) are no codes."""


NUMERO: Final = Kind(
    "numero",
    r"(?<![A-Za-z])(?:No|NO|no)\.\s?(?P<no_num>\d+)(?!\d|\.\d)",
    _read_numero, first=r"[Nn]")


def _read_hash_number(lang: Lang, g: Groups, before: str, after: str) -> str:
    """#1234 inside Chinese (PR #1234的修改, 第#3的): 一二三四号, 三号, never the English word
    number; after an identifier word (订单号#12345) the number alone, digit by digit."""
    num = g("hs_num")
    if lang == "en":
        return "number " + (en_digits(num) if en_identifier(before) else en_number(num))
    if ends_with(before, IDENTIFIER_BEFORE, " :：是为"):
        return "，".join(zh_digits(grp, one="幺") for grp in digit_groups(num))
    return (zh_digits(num) if len(num) >= 3 else zh_number(num)) + ("" if after.lstrip().startswith("号") else "号")


HASH_NUMBER: Final = Kind(
    "hash_number",
    r"(?<![A-Za-z0-9#&])#(?P<hs_num>\d+)(?=\s?[\u4e00-\u9fa5])",
    _read_hash_number, counts=True, first="#")
"""A number after # with Chinese right after it: a Chinese sentence's numbered item."""
