"""Money: an amount after its currency sign or code (``¥12.50``, ``$3-5万``), before 元/块
(``3.05元``) or before a currency code (``100 USD``)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import NUM, Groups, Kind, alt_words
from .numbers import ZH_DIGITS, en_int, en_number, liang, plain_decimal, to_decimal, zh_number
from .tables import CURRENCIES, CURRENCY_CODES, CURRENCY_OF, CURRENCY_SIGNS, MULTIPLIERS


def _money(lang: Lang, neg: bool, code: str, amount: str, mult: str | None) -> str:
    cur = CURRENCIES[code]
    value = to_decimal(amount)
    scale = MULTIPLIERS.get(mult.lower() if mult.isascii() else mult) if mult else None
    if lang == "zh":
        if mult in ("万", "亿"):  # read as written: ¥3.5万 -> 三点五万元
            out = liang(zh_number(amount), mult) + mult + cur.zh
        elif scale is not None:
            total = value * scale[0]
            words = zh_number(plain_decimal(total))
            out = words + cur.zh
        elif code == "CNY" and "." in amount:
            out = _yuan_jiao_fen(amount, "元", "角")
        else:
            out = liang(zh_number(plain_decimal(value) if "." in amount else amount), cur.zh) + cur.zh
        return ("负" if neg else "") + out
    if scale is not None and mult in ("万", "亿"):  # Chinese myriads have no English word
        out = f"{en_number(plain_decimal(value * scale[0]))} {cur.en_many}"
    elif scale is not None:
        out = f"{en_number(amount)} {scale[1]} {cur.en_many}"
    else:
        whole, _, frac = amount.replace(",", "").partition(".")
        major = int(whole)
        if cur.minor_one is not None and (frac == "" or len(frac) == 2):
            minor = int(frac) if frac else 0
            parts = []
            if major or not minor:
                parts.append(f"{en_int(major)} {cur.en_one if major == 1 else cur.en_many}")
            if minor:
                parts.append(f"{en_int(minor)} {cur.minor_one if minor == 1 else cur.minor_many}")
            out = " and ".join(parts)
        else:
            out = f"{en_number(amount)} {cur.en_one if value == 1 else cur.en_many}"
    return ("minus " if neg else "") + out


def _yuan_jiao_fen(amount: str, major_word: str, tenth_word: str) -> str:
    """12.50 -> 十二元五角, 3.05 -> 三元零五分, 0.5 -> 五角 (CNY with at most two decimals); a
    count of 2 before 元 reads 两 as it does without decimals (2.5元 -> 两元五角, as 2元 -> 两元),
    and so does a lone 角 or 分 (0.2元 -> 两角)."""
    whole, _, frac = amount.replace(",", "").partition(".")
    if len(frac) > 2:
        return zh_number(amount) + major_word
    frac = (frac + "00")[:2]
    jiao, fen = int(frac[0]), int(frac[1])
    out = ""
    if int(whole) or (not jiao and not fen):
        out += liang(zh_number(whole), major_word) + major_word
    if jiao:
        out += (ZH_DIGITS[jiao] if out else liang(ZH_DIGITS[jiao], tenth_word)) + tenth_word
    elif fen and out:
        out += "零"
    if fen:
        out += (ZH_DIGITS[fen] if out else liang(ZH_DIGITS[fen], "分")) + "分"
    return out


def _read_money(lang: Lang, g: Groups, before: str, after: str) -> str:
    """An amount after its currency sign or code, or a range of two (¥100-200, $3-5万: the
    currency once, after the second amount). A currency word written after it that the
    reading already says (¥100元, €1.2亿元, $5亿美元) is read once."""
    code = CURRENCY_OF[g("mp_cur").strip()]
    amount, unit = _decimal_comma(g("mp_amt")), g("mp_unit")
    if g("mp_amt2"):
        words = _money_range(lang, bool(g("mp_neg")), code, amount, _decimal_comma(g("mp_amt2")), g("mp_mult"))
    elif lang == "zh" and code == "CNY" and "." in amount and not g("mp_mult") and after.lstrip().startswith("/"):
        words = zh_number(amount) + "元"  # ¥7.5/升: a price per unit reads the decimal
    else:
        words = _money(lang, bool(g("mp_neg")), code, amount, g("mp_mult"))
    cur = CURRENCIES[code]
    if unit and unit not in cur.written and not (unit in ("元", "块") and cur.zh.endswith("元")):
        words += unit  # not the currency's own word: keep it
    if g("mp_per"):
        zh, en = _PER[g("mp_per")]
        words = words + zh if lang == "zh" else f"{words} {en}"
    return words  # ¥100元: the unit is written twice, read once


def _decimal_comma(amount: str) -> str:
    """€3,50 -> 3.50: a comma before exactly two digits ends an amount's whole part (a thousands
    separator is followed by three); €1.200,00 -> 1200.00: dots between thousands, as much of
    Europe writes them (:data:`_DOT_THOUSANDS`)."""
    if re.fullmatch(_DOT_THOUSANDS, amount):
        return amount.replace(".", "").replace(",", ".")
    whole, comma, cents = amount.rpartition(",")
    return f"{whole}.{cents}" if comma and len(cents) == 2 and "," not in whole and "." not in amount else amount


def _money_range(lang: Lang, neg: bool, code: str, a: str, b: str, mult: str | None) -> str:
    """¥100-200 -> 一百到二百元, $3-5万 -> 三到五万美元, $10-20 -> ten to twenty dollars: both
    amounts read as numbers (decimals with 点, never 元角分), the multiplier and the currency
    once at the end."""
    cur = CURRENCIES[code]
    scale = MULTIPLIERS.get(mult.lower() if mult.isascii() else mult) if mult else None
    if lang == "zh":
        if mult in ("万", "亿"):
            return ("负" if neg else "") + f"{liang(zh_number(a), mult)}到{liang(zh_number(b), mult)}{mult}{cur.zh}"
        if scale is not None:  # $3-5m: three to five million, read in 万
            a, b = plain_decimal(to_decimal(a) * scale[0]), plain_decimal(to_decimal(b) * scale[0])
        return ("负" if neg else "") + f"{liang(zh_number(a), cur.zh)}到{liang(zh_number(b), cur.zh)}{cur.zh}"
    if mult in ("万", "亿") and scale is not None:
        a, b = plain_decimal(to_decimal(a) * scale[0]), plain_decimal(to_decimal(b) * scale[0])
        tail = cur.en_many
    else:
        tail = f"{scale[1]} {cur.en_many}" if scale is not None else cur.en_many
    return ("minus " if neg else "") + f"{en_number(a)} to {en_number(b)} {tail}"


def _read_yuan(lang: Lang, g: Groups, before: str, after: str) -> str:
    amount, word = g("ms_amt"), g("ms_cur")
    if "." in amount and not after.lstrip().startswith("/"):
        return _yuan_jiao_fen(amount, word, "角" if word == "元" else "毛")
    return liang(zh_number(amount), "个") + word  # 7.5元/升: a price per unit reads the decimal


def _read_amount_before_code(lang: Lang, g: Groups, before: str, after: str) -> str:
    """100 USD, 500 RMB, 12,50 €: an amount before its currency code or sign."""
    return _money(lang, False, CURRENCY_OF[g("cd_code")], _decimal_comma(g("cd_amt")), None)


_PER: Final = {"month": ("每月", "a month"), "mo": ("每月", "a month"), "year": ("每年", "a year"),
               "yr": ("每年", "a year"), "week": ("每周", "a week"), "wk": ("每周", "a week"), "day": ("每天", "a day"),
               "night": ("每晚", "a night"), "hour": ("每小时", "an hour"), "hr": ("每小时", "an hour"),
               "person": ("每人", "per person"), "user": ("每个用户", "per user"), "seat": ("每个席位", "per seat")}
"""A period or a head after a price's slash ($5/month, $9.99/mo, $20/person): 每月 / a month."""
_SIGNS: Final = alt_words(CURRENCY_SIGNS)
_COMMA_CENTS: Final = r"\d+,\d\d(?![\d,])"
"""An amount with a decimal comma (3,50 in €3,50 and 12,50 €): :func:`_decimal_comma`."""
_DOT_THOUSANDS: Final = r"\d{1,3}(?:\.\d{3})+,\d\d(?![\d,])|\d{1,3}(?:\.\d{3}){2,}(?![\d.]|,\d)"
"""An amount with dots between thousands and a decimal comma (1.200,00; 1.234.567,89) or two dots
or more (1.234.567): never a decimal. 1.200 alone stays one point two."""
_INDIAN: Final = r"\d{1,2}(?:,\d\d)+,\d{3}(?![\d,])(?:\.\d\d)?"
"""An amount grouped the Indian way, in lakhs and crores (1,50,000; 12,34,567; 1,00,00,000):
the commas are only separators."""
_AMOUNT: Final = rf"{_DOT_THOUSANDS}|{_INDIAN}|{_COMMA_CENTS}|{NUM}"
_CODES: Final = alt_words(CURRENCY_CODES)
_WRITTEN: Final = alt_words({w for c in CURRENCIES.values() for w in c.written if w not in ("元", "块")})

MONEY: Final = Kind(
    "money",
    r"(?P<mp_neg>(?<![A-Za-z0-9.])-)?"
    rf"(?P<mp_cur>{_SIGNS}|(?<![A-Za-z])(?:{_CODES})\s?)"
    rf"(?P<mp_amt>{_AMOUNT})(?:\s?[-~–—]\s?(?:{_SIGNS})?(?P<mp_amt2>{_AMOUNT}))?"
    r"(?:\s?(?P<mp_mult>万|亿|(?:thousand|million|billion|trillion)(?![A-Za-z])"
    r"|(?:[kKmMbBtT]|[mMbBtT]n)(?![A-Za-z])))?"
    rf"(?P<mp_unit>元(?![素旦首宵件老气帅])|块(?![头状])|{_WRITTEN})?"
    rf"(?:/(?P<mp_per>{alt_words(_PER)})(?![A-Za-z]))?",
    _read_money, first=r"[^\s\d\u4e00-\u9fff]")


YUAN: Final = Kind(
    "yuan",
    rf"(?P<ms_amt>{NUM})\s?(?P<ms_cur>元(?![素旦首宵件老气帅])|块(?![头状]))",
    _read_yuan, lang="zh", first=r"\d")


AMOUNT_BEFORE_CODE: Final = Kind(
    "amount_before_code",
    rf"(?P<cd_amt>{_AMOUNT})\s?"
    rf"(?P<cd_code>{alt_words({c for c in CURRENCY_CODES if c.isalpha() and len(c) == 3})}|{_SIGNS})"
    r"(?![A-Za-z0-9])",
    _read_amount_before_code, first=r"\d")
