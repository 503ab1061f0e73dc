"""Text normalisation for ChatTTS: Chinese and English text turned into words, per language.

ChatTTS' GPT reads Chinese characters, Latin letters and a few pause marks (``，。、,.``);
everything else (digits, ``%``, ``$``, ``:``, ``?``, emoji, ...) is deleted by its own
``Normalizer`` before tokenisation, so "3月5日" or "$12.50" would be spoken as "月日" and "".
:func:`normalize` runs before that ``Normalizer`` and rewrites the text so that nothing it
would delete carries meaning:

* Numbers, dates, times, phone numbers, money, percentages, ranges, fractions, ordinals, units
  and spoken symbols are verbalised in the language of their context: each match is read in
  Chinese (with ``cn2an`` for cardinals) or in English (with ``num2words``), whichever script
  surrounds it (see :func:`context_language`), so that mixed text reads each part in its own
  language. ``split_segments`` shows the resulting Chinese and English runs.
* Where one written form has two readings, words of the same sentence decide (the lists are
  module constants): ``a-b`` is a score (四比零) after or before score words (:data:`SCORE_BEFORE`,
  :data:`SCORE_AFTER`, :data:`SCORE_SENTENCE`) or when ``a >= b``, else a range (三到五天); a
  colon is a time (十点三十分), a score after 比分, a ratio between small numbers (三比二), a
  duration after 成绩/用时, minutes and seconds before 秒 or after a countdown word (倒计时05:00);
  ``a/b`` is a fraction or a month and day as its context words say (:func:`_zh_slash_date`:
  大约11/12的时间, 截止12/31), with or without the library; a number after 电话/卡号/拨打
  (:data:`IDENTIFIER_BEFORE`), in spaced digit groups or of 12 digits and more is an identifier
  read digit by digit with 幺 and a pause between groups; a lone 2 reads 两 before a measure
  word but 二 in 第2, 2号, 2楼, 2两; ``N+`` and ``N万+`` read N多; ``8k`` reads 八千; a unit
  written after a time (17:20分, 12:00点) or an amount (¥100元, €1.2亿元) is read once; a range
  of amounts, dates or negative numbers keeps its 到 (¥100-200, 3/5-3/8, -10~-5℃).
* Full-width letters, digits and punctuation are folded to half-width first, and characters
  with a readable form are replaced by it (Kangxi radicals and enclosed ideographs by their
  ideograph, 〇 by 零, ㎡ by m², Greek letters by their names); punctuation is then mapped to
  ChatTTS' pause marks in the segment's language (``，``/``。`` in Chinese, ``,``/``.`` in
  English); quotes and title marks are silent.
* ChatTTS' control tokens (``[uv_break]``, ``[laugh]``, ``[break_N]``, ``[oral_N]``, ...) are
  kept verbatim and never read aloud; a ``[speed_N]`` token is taken out of the text and
  returned as :attr:`NormalizedText.speed` (it belongs in the prompt). Prompt-structure tokens
  (``[Stts]``, ``[spk_emb]``, ...) are removed and reported.
* Nothing is dropped silently: every character that cannot be spoken (emoji, other scripts,
  unknown symbols, Chinese characters after U+9FA5 that no bert-base-chinese vocabulary has)
  and every removed reserved token is listed in :attr:`NormalizedText.dropped`.
* With ``library=True`` the Chinese reading of a few entity kinds comes from WeTextProcessing
  (:mod:`chattts_serving.text.wetext`), where the normalisation corpus shows it right.

The output holds only characters ChatTTS' ``Normalizer`` keeps (``[一-龥A-Za-z，。、,. ]``)
plus control tokens. Nothing here imports torch or Triton; ``cn2an``, ``num2words`` and
``wetext`` are imported on first use. The expected readings are the team's corpus,
``tests/data/textnorm_corpus.tsv`` (``python -m chattts_serving.text.normalize_report``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final, Literal

Lang = Literal["zh", "en"]

DEFAULT_SPEED: Final = 5
"""ChatTTS' default speed token is ``[speed_5]``."""

CONTROL_WORDS: Final = ("uv_break", "v_break", "lbreak", "llbreak", "laugh")
"""Control tokens without a number, kept in the text."""
CONTROL_NUMBERED: Final = {"break": 8, "laugh": 3, "oral": 10, "speed": 10}
"""Numbered control tokens ``[name_N]`` and how many N each has (N in 0..count-1), as in
ChatTTS' tokenizer (``[break_0..7]``, ``[laugh_0..2]``, ``[oral_0..9]``, ``[speed_0..9]``)."""
RESERVED_TOKENS: Final = ("Sbreak", "Pbreak", "Sasr", "Stts", "Ptts", "Pasr", "Easr", "Etts", "Ebreak",
                          "undefine", "spk_emb", "empty_spk", "music", "pure")
"""Tokens of ChatTTS' tokenizer that structure the prompt: removed from user text and reported."""

SPOKEN_CHARS: Final = re.compile(r"[\u4e00-\u9fffA-Za-z]")
"""A character that is spoken (Chinese character or Latin letter)."""
CONTROL_TOKEN: Final = re.compile(
    r"\[(?:" + "|".join(CONTROL_WORDS) + r"|(?:" + "|".join(CONTROL_NUMBERED) + r")_\d+)\]")
"""A control token as it appears in normalised text."""


def speakable(text: str) -> bool:
    """Whether normalised ``text`` holds anything spoken (:data:`SPOKEN_CHARS`) outside its
    control tokens."""
    return bool(SPOKEN_CHARS.search(CONTROL_TOKEN.sub("", text)))


class TextNormError(ValueError):
    """Text that cannot be normalised: a control token out of its range (message says which)."""


@dataclass(frozen=True)
class Segment:
    """A run of normalised text in one language; neutral characters (spaces, pause marks,
    control tokens) belong to the run they follow."""

    lang: Lang
    text: str


@dataclass(frozen=True)
class NormalizedText:
    """Result of :func:`normalize`.

    text: the text to speak, with control tokens in place and without ``[speed_N]``.
    speed: N of the first ``[speed_N]`` token in the input (0..9), or None.
    dropped: characters that could not be spoken and reserved tokens that were removed,
    each once, in order of first appearance.
    segments: ``text`` split into Chinese and English runs (:func:`split_segments`).
    """

    text: str
    speed: int | None
    dropped: tuple[str, ...]
    segments: tuple[Segment, ...]


# --- character classes --------------------------------------------------------------------

def _is_cjk(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff"


def _is_latin(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def _script(c: str) -> Lang | None:
    if _is_cjk(c):
        return "zh"
    if _is_latin(c):
        return "en"
    return None


_LIGATURES: Final = {"ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D",
                     "ł": "l", "Ł": "L", "ı": "i", "…": "...", "−": "-", "﹣": "-", "‐": "-", "‑": "-",
                     "\u00a0": " ", "\t": " ", "\r": "", "·": " ", "・": " ", "〇": "零", "〜": "~", "µ": "μ",
                     "㎡": "m²", "㎥": "m³", "㎢": "km²", "㎞": "km", "㎏": "kg", "㎎": "mg", "㎝": "cm", "㎜": "mm",
                     "㎖": "ml", "㎐": "Hz", "㎑": "kHz", "㎒": "MHz", "㎓": "GHz", "㎾": "kW", "㏈": "dB"}
"""Characters folded to a readable form: ligatures and dashes to ASCII, 〇 (U+3007, outside the
CJK block ChatTTS keeps) to 零, the CJK square unit symbols to the units they stand for."""
LAST_SPOKEN_CJK: Final = "\u9fa5"
"""The last character of the CJK Unified Ideographs of Unicode 1.1 (U+4E00..U+9FA5). ChatTTS'
tokenizer has the vocabulary of bert-base-chinese, whose Chinese characters all lie in that
range (its last one is 龟, U+9F9F); later additions to the block (U+9FA6..U+9FFF, e.g. the
element 鿏) would reach the GPT as ``[UNK]``, so :func:`normalize` reports them as not spoken.
The front end then checks every character against the vocabulary it loaded."""


def _ideograph_form(c: str) -> str | None:
    """The CJK ideograph a Kangxi radical, CJK compatibility or enclosed ideograph stands for
    (its NFKC form: ``⼈`` -> 人, ``㊣`` -> 正), None for any other character."""
    if "\u4e00" <= c <= "\u9fff" or c.isascii():
        return None
    plain = unicodedata.normalize("NFKC", c)
    return plain if len(plain) == 1 and "\u4e00" <= plain <= LAST_SPOKEN_CJK else None


def fold_width(text: str) -> str:
    """Full-width ASCII (U+FF01..U+FF5E) to half-width, the ideographic space to a space, ``￥``
    to ``¥``, accented Latin letters to their base letter (``é`` -> ``e``), circled, subscript
    and fraction digits to ASCII (``①`` -> 1, ``½`` -> 1/2), a few ligatures, dashes and unit
    symbols to ASCII (``㎡`` -> m², ``〇`` -> 零), Kangxi radicals and compatibility or enclosed
    ideographs to the ideograph they stand for (``⼈`` -> 人, ``㊣`` -> 正). Chinese punctuation
    outside the full-width block (``。、「」``) is kept."""
    out: list[str] = []
    for c in unicodedata.normalize("NFC", text):
        o = ord(c)
        if 0xFF01 <= o <= 0xFF5E:
            c = chr(o - 0xFEE0)
        elif o == 0x3000:
            c = " "
        elif o == 0xFFE5:
            c = "¥"
        elif c in _LIGATURES:
            c = _LIGATURES[c]
        elif (ideograph := _ideograph_form(c)) is not None:
            c = ideograph
        elif 0xC0 <= o < 0x250 and c.isalpha():
            base = unicodedata.normalize("NFKD", c)[0]
            if _is_latin(base):
                c = base
        elif unicodedata.category(c) == "No" and c not in "¹²³":
            # circled, subscript and fraction digits (①, ₂, ½) -> plain digits; superscripts
            # stay for units (m², km³)
            plain = unicodedata.normalize("NFKC", c).replace("⁄", "/")
            if plain and all(ch.isdigit() or ch == "/" for ch in plain) and plain.isascii():
                c = (" " if out and out[-1][-1:].isdigit() else "") + plain
        out.append(c)
    return "".join(out)


# --- number words -----------------------------------------------------------------------

_ZH_DIGITS: Final = "零一二三四五六七八九"
_EN_DIGITS: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_ZH_LIANG_BEFORE: Final = tuple(sorted(
    set("个位只本次件条天年点岁倍种台辆张把棵名块斤周项家间层份分米克秒瓶杯双碗盘盒箱袋包支枝朵颗粒片根对副篇首部场"
        "届轮局回趟遍顿声下口排行列队组批门所座栋幢套匹头艘架款类样封册卷集幕道笔枚盏顶具扇面幅页章节段句步圈眼拳脚刀针"
        "滴串束捆桶罐壶勺碟户处人成亿万千元角毛升吨尺寸亩晚夜餐代辈群伙帮剂听盆锅沓摞缸筐篮瓣阵番遭枪炮轴曲辑桩宗起例"
        "则题栏格株丛簇挂窝胎任堵峰羽团堆摊尊杆柄室厅卫打通桌席堂票尾科帧站季")
    | {"公里", "公斤", "千克", "小时", "分钟", "美元", "欧元", "英镑", "日元", "港元", "周年", "个月", "星期", "厘米",
       "毫米", "毫升", "千米", "公顷", "平方米", "立方米", "英里", "英尺", "磅", "加仑", "刻钟"},
    key=len, reverse=True))
"""Measure words (and 千/万/亿) after which a lone 2 is read 两 rather than 二 (2瓶 -> 两瓶)."""
_ZH_ER_BEFORE: Final = ("号", "楼", "路", "级", "年级", "班", "两", "月", "日", "线", "手", "维", "等", "次元", "季度")
"""Words after which a lone 2 stays 二 although they start like a measure word: labels and
ranks (2号, 2楼, 2路, 2级, 2年级, 2等奖), the month (2月), and 2两 (二两, never 两两)."""
_MAX_CARDINAL_DIGITS: Final = 16


def zh_digits(s: str, one: str = "一") -> str:
    """Read digits one by one in Chinese (``'2024'`` -> 二零二四); ``one`` replaces 一 (幺 in phone
    numbers). Non-digits are skipped."""
    return "".join(one if d == "1" else _ZH_DIGITS[int(d)] for d in s if d.isdigit())


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


def _decimal(num: str) -> Decimal:
    try:
        return Decimal(num.replace(",", ""))
    except InvalidOperation:  # the patterns only hand over digits; kept for safety
        return Decimal(0)


def _plain_decimal(d: Decimal) -> str:
    """A Decimal without exponent or trailing zeros: 1.50E+6 -> '1500000'."""
    return format(d.normalize(), "f")


# --- tables -----------------------------------------------------------------------------

_MONTHS_EN: Final = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
                     "October", "November", "December")
_MONTH_ABBR: Final = {m[:3]: i + 1 for i, m in enumerate(_MONTHS_EN)} | {"Sept": 9}
_MONTH_RE: Final = ("(?:" + "|".join(sorted([*_MONTHS_EN, *_MONTH_ABBR], key=len, reverse=True)) + r")\b")


@dataclass(frozen=True)
class Unit:
    """A unit symbol's readings: Chinese, English singular and plural; ``liang``: a count of 2
    before it reads 两."""

    zh: str
    en_one: str
    en_many: str
    liang: bool = True


UNITS: Final[dict[str, Unit]] = {
    "km/h": Unit("公里每小时", "kilometer per hour", "kilometers per hour"),
    "m/s": Unit("米每秒", "meter per second", "meters per second"),
    "mph": Unit("英里每小时", "mile per hour", "miles per hour"),
    "km²": Unit("平方公里", "square kilometer", "square kilometers"),
    "m²": Unit("平方米", "square meter", "square meters"),
    "cm²": Unit("平方厘米", "square centimeter", "square centimeters"),
    "m³": Unit("立方米", "cubic meter", "cubic meters"),
    "km": Unit("公里", "kilometer", "kilometers"), "cm": Unit("厘米", "centimeter", "centimeters"),
    "mm": Unit("毫米", "millimeter", "millimeters"), "nm": Unit("纳米", "nanometer", "nanometers"),
    "mi": Unit("英里", "mile", "miles"), "ft": Unit("英尺", "foot", "feet"),
    "kg": Unit("千克", "kilogram", "kilograms"), "mg": Unit("毫克", "milligram", "milligrams"),
    "lbs": Unit("磅", "pound", "pounds"), "lb": Unit("磅", "pound", "pounds"),
    "oz": Unit("盎司", "ounce", "ounces"),
    "ml": Unit("毫升", "milliliter", "milliliters"), "mL": Unit("毫升", "milliliter", "milliliters"),
    "°C": Unit("摄氏度", "degree Celsius", "degrees Celsius", liang=False),
    "℃": Unit("摄氏度", "degree Celsius", "degrees Celsius", liang=False),
    "°F": Unit("华氏度", "degree Fahrenheit", "degrees Fahrenheit", liang=False),
    "℉": Unit("华氏度", "degree Fahrenheit", "degrees Fahrenheit", liang=False),
    "°": Unit("度", "degree", "degrees", liang=False),
    "hrs": Unit("小时", "hour", "hours"), "hr": Unit("小时", "hour", "hours"),
    "min": Unit("分钟", "minute", "minutes"), "sec": Unit("秒", "second", "seconds"),
    "ms": Unit("毫秒", "millisecond", "milliseconds"),
    "kHz": Unit("千赫兹", "kilohertz", "kilohertz"), "MHz": Unit("兆赫兹", "megahertz", "megahertz"),
    "GHz": Unit("吉赫兹", "gigahertz", "gigahertz"), "Hz": Unit("赫兹", "hertz", "hertz"),
    "KB": Unit("KB", "kilobyte", "kilobytes"), "MB": Unit("MB", "megabyte", "megabytes"),
    "GB": Unit("GB", "gigabyte", "gigabytes"), "TB": Unit("TB", "terabyte", "terabytes"),
    "kWh": Unit("千瓦时", "kilowatt hour", "kilowatt hours"), "kW": Unit("千瓦", "kilowatt", "kilowatts"),
    "MWh": Unit("兆瓦时", "megawatt hour", "megawatt hours"), "MW": Unit("兆瓦", "megawatt", "megawatts"),
    "GWh": Unit("吉瓦时", "gigawatt hour", "gigawatt hours"), "GW": Unit("吉瓦", "gigawatt", "gigawatts"),
    "TWh": Unit("太瓦时", "terawatt hour", "terawatt hours"), "dB": Unit("分贝", "decibel", "decibels"),
    "μg/m³": Unit("微克每立方米", "microgram per cubic meter", "micrograms per cubic meter"),
    "mg/m³": Unit("毫克每立方米", "milligram per cubic meter", "milligrams per cubic meter"),
    "mg/L": Unit("毫克每升", "milligram per liter", "milligrams per liter"),
    "μg": Unit("微克", "microgram", "micrograms"), "μm": Unit("微米", "micrometer", "micrometers"),
    "mAh": Unit("毫安时", "milliamp hour", "milliamp hours"),
    "Gbps": Unit("吉比特每秒", "gigabit per second", "gigabits per second"),
    "Mbps": Unit("兆比特每秒", "megabit per second", "megabits per second"),
    "kbps": Unit("千比特每秒", "kilobit per second", "kilobits per second"),
}
"""Unit symbols read after a number; they may follow the number after one space."""
GLUED_UNITS: Final[dict[str, Unit]] = {
    "m": Unit("米", "meter", "meters"), "g": Unit("克", "gram", "grams"), "L": Unit("升", "liter", "liters"),
    "h": Unit("小时", "hour", "hours"), "s": Unit("秒", "second", "seconds"), "W": Unit("瓦", "watt", "watts"),
    "V": Unit("伏", "volt", "volts"),
}
"""One-letter unit symbols, read as units only when written right after the number (5m, 10s)."""


@dataclass(frozen=True)
class Currency:
    """A currency's readings; ``minor``: English name of the hundredth (None: read decimals)."""

    zh: str
    en_one: str
    en_many: str
    minor_one: str | None = None
    minor_many: str | None = None


CURRENCIES: Final[dict[str, Currency]] = {
    "USD": Currency("美元", "dollar", "dollars", "cent", "cents"),
    "EUR": Currency("欧元", "euro", "euros", "cent", "cents"),
    "GBP": Currency("英镑", "pound", "pounds", "penny", "pence"),
    "HKD": Currency("港元", "Hong Kong dollar", "Hong Kong dollars", "cent", "cents"),
    "CNY": Currency("元", "yuan", "yuan"),
    "JPY": Currency("日元", "yen", "yen"),
    "TWD": Currency("新台币", "New Taiwan dollar", "New Taiwan dollars", "cent", "cents"),
    "AUD": Currency("澳元", "Australian dollar", "Australian dollars", "cent", "cents"),
    "CAD": Currency("加元", "Canadian dollar", "Canadian dollars", "cent", "cents"),
    "SGD": Currency("新加坡元", "Singapore dollar", "Singapore dollars", "cent", "cents"),
}
_CURRENCY_OF: Final = {"$": "USD", "US$": "USD", "HK$": "HKD", "¥": "CNY", "€": "EUR", "£": "GBP", "NT$": "TWD",
                       "A$": "AUD", "AU$": "AUD", "C$": "CAD", "CA$": "CAD", "S$": "SGD", "TWD": "TWD", "AUD": "AUD",
                       "CAD": "CAD", "SGD": "SGD",
                       "RMB": "CNY", "CNY": "CNY", "USD": "USD", "EUR": "EUR", "GBP": "GBP", "HKD": "HKD",
                       "JPY": "JPY"}
_MULTIPLIERS: Final = {"k": (Decimal(10**3), "thousand"), "m": (Decimal(10**6), "million"),
                       "mn": (Decimal(10**6), "million"), "million": (Decimal(10**6), "million"),
                       "b": (Decimal(10**9), "billion"), "bn": (Decimal(10**9), "billion"),
                       "billion": (Decimal(10**9), "billion"), "thousand": (Decimal(10**3), "thousand"),
                       "t": (Decimal(10**12), "trillion"), "tn": (Decimal(10**12), "trillion"),
                       "trillion": (Decimal(10**12), "trillion"),
                       "万": (Decimal(10**4), "ten thousand"), "亿": (Decimal(10**8), "hundred million")}

SYMBOL_WORDS: Final[dict[str, tuple[str, str]]] = {
    "&": ("和", "and"), "@": ("艾特", "at"), "+": ("加", "plus"), "=": ("等于", "equals"),
    "×": ("乘以", "times"), "÷": ("除以", "divided by"), "±": ("正负", "plus or minus"),
    "≈": ("约等于", "approximately"), "≠": ("不等于", "is not equal to"),
    "≤": ("小于等于", "less than or equal to"), "≥": ("大于等于", "greater than or equal to"),
    "%": ("百分号", "percent"), "‰": ("千分号", "per mille"), "°": ("度", "degrees"),
    "℃": ("摄氏度", "degrees Celsius"), "℉": ("华氏度", "degrees Fahrenheit"),
    "$": ("美元", "dollars"), "¥": ("元", "yuan"), "€": ("欧元", "euros"), "£": ("英镑", "pounds"),
    "№": ("编号", "number"), "→": ("到", "to"),
}
"""Symbols read as words wherever they stand (Chinese, English). ``#`` is read only before a
number (``#1``); elsewhere (``#话题#``) it is silent."""
GREEK_NAMES: Final[dict[str, tuple[str, str]]] = {
    "α": ("阿尔法", "alpha"), "β": ("贝塔", "beta"), "γ": ("伽马", "gamma"), "δ": ("德尔塔", "delta"),
    "Δ": ("德尔塔", "delta"), "ε": ("艾普西隆", "epsilon"), "θ": ("西塔", "theta"), "λ": ("兰姆达", "lambda"),
    "μ": ("缪", "mu"), "π": ("派", "pi"), "σ": ("西格玛", "sigma"), "Σ": ("西格玛", "sigma"),
    "φ": ("斐", "phi"), "ω": ("欧米伽", "omega"), "Ω": ("欧米伽", "omega"),
}
"""Greek letters read by their names (Chinese, English): ChatTTS' normaliser would delete them.
``μ`` before a unit is part of the unit (``μg`` -> 微克)."""
_BETWEEN_NUMBERS: Final[dict[str, tuple[str, str]]] = {
    "<": ("小于", "less than"), ">": ("大于", "greater than"), "*": ("乘", "times"), "/": ("除以", "divided by"),
    "^": ("的次方", "to the power of"),
}
"""Symbols read as operators only between two numbers (3 < 5, 4*2); elsewhere they are
pauses (``<`` ``>`` ``/``) or unspeakable (``*`` ``^``)."""

_COMMA_MARKS: Final = set(",;:()[]{}<>|~、，；：（）【】〔〕—–-/")
_END_MARKS: Final = set(".!?。！？")
_SILENT_MARKS: Final = set("\"'`“”‘’«»‹›「」『』《》〈〉")
"""Quotes and title marks: no sound and no pause (two titles in a row, ``》《``, are a list: 、)."""

# --- context words ------------------------------------------------------------------------
# Words near an entity that decide between two readings. Each list is searched in the same
# sentence only (up to the nearest 。！？ or line break), with control tokens ignored.

SCORE_BEFORE: Final = ("总比分", "大比分", "小比分", "比分为", "比分是", "比分", "比数", "首局", "次局", "决胜局", "局",
                       "半场", "全场", "终场", "比例为", "比例是", "比例", "配比", "以")
"""Written right before ``a-b`` or ``a:b`` (spaces, 为/是 between allowed), they make it a score
or ratio read with 比 (比分3:2, 首局25-23, 以2-1)."""
SCORE_AFTER: Final = ("获胜", "取胜", "战胜", "击败", "打败", "力克", "横扫", "险胜", "完胜", "大胜", "小胜",
                      "惨败", "告负", "落败", "不敌", "负于", "输给", "败给", "战平", "打平", "逆转", "落后", "领先",
                      "晋级", "淘汰", "胜", "负", "赢", "输", "败")
"""Written right after ``a-b`` or ``a:b``, they make it a score (4-0获胜, 3:1击败)."""
SCORE_SENTENCE: Final = (*SCORE_AFTER, "比分", "比赛", "首局", "半场", "全场", "决赛", "对阵", "进球", "球队")
"""Anywhere in the sentence, they make a hyphen between two integers a score rather than a
range (他4-0获胜，从0-3追到3-3), unless a unit or measure word follows it (比赛还剩3-5分钟)."""
DURATION_BEFORE: Final = ("用时", "耗时", "成绩", "时长", "历时", "净时间", "完赛")
"""Written right before ``h:mm:ss``, they make it a duration (成绩2:03:45: 两小时零三分四十五秒)."""
PACE_BEFORE: Final = ("配速",)
"""Written right before ``m:ss``, they make it minutes and seconds (配速5:30 -> 五分三十秒)."""
COUNTDOWN_BEFORE: Final = ("倒计时", "剩余时间", "剩余", "还剩下", "还剩", "仅剩", "只剩", "剩下")
"""Written right before ``mm:ss``, they make it a countdown read as minutes and seconds
(倒计时05:00 -> 五分钟, 剩余时间01:30 -> 一分三十秒). 还有 does so only before ``00:ss``
(距开赛还有00:30 -> 三十秒): 还有10:30的航班 is a clock time."""
DAY_PARTS: Final = ("凌晨", "早上", "早晨", "清晨", "上午", "中午", "下午", "傍晚", "晚上", "夜里", "夜间", "深夜",
                    "午夜")
"""Written right before a time with am/pm (下午2:30pm), they already say which half of the
day it is: am/pm is not read a second time."""
IDENTIFIER_BEFORE: Final = ("电话", "手机", "手机号", "座机", "传真", "热线", "客服", "拨打", "致电", "呼叫", "号码",
                            "卡号", "账号", "帐号", "单号", "编号", "工号", "学号", "尾号", "验证码", "密码", "邮编",
                            "QQ号", "QQ", "微信号", "身份证号码", "身份证号", "身份证", "分机号", "分机", "拨",
                            "车次", "航班", "航班号", "房间号", "订单")
"""Written right before a number of three or more digits (spaces, ``:``, 是/为 between
allowed), they make it an identifier read digit by digit with 幺 (拨打110, 验证码385921)."""
TEMPERATURE_BEFORE: Final = ("气温", "温度", "低温", "高温", "最低", "最高", "体温", "水温", "室温", "温差")
"""Before ``-N度`` in the same clause, they make it a temperature: 零下 N 度."""
_SENTENCE_END: Final = re.compile(r"[。！？!?\n]|\.(?=\s|$)")


# --- the scanner --------------------------------------------------------------------------

_NUM: Final = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
_SIGN: Final = r"(?:(?<![A-Za-z0-9.])[-+−])"


def _alt(units: dict[str, Unit]) -> str:
    return "|".join(re.escape(u) for u in sorted(units, key=len, reverse=True))


def _time_re(p: str) -> str:
    """A clock time h:mm(:ss) with named groups ``<p>_h``, ``<p>_m``, ``<p>_s``."""
    return (rf"(?<![\d.])(?<!\d:)(?P<{p}_h>[01]?\d|2[0-3]|24(?=:00))"
            rf":(?P<{p}_m>[0-5]\d)(?::(?P<{p}_s>[0-5]\d))?(?![\d:])")


_TLD: Final = "com|net|org|cn|io|ai|edu|gov|info|co|uk|de|jp|me|tv|cc|app|dev"
_URL_TAIL: Final = r"[A-Za-z0-9\-._~/?#=&%+:]*[A-Za-z0-9/]"
_RULES: Final = [
    ("tag", r"\[(?P<tag>[A-Za-z]+(?:_[A-Za-z]+)*(?:_\d+)?)\]"),
    ("email", r"(?<![A-Za-z0-9._%+-])(?P<email>[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})"),
    ("url", rf"(?P<url>(?:https?://|www\.){_URL_TAIL}"
            rf"|(?<![A-Za-z0-9.@/_-])(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+(?:{_TLD})(?![A-Za-z0-9-])"
            rf"(?:/{_URL_TAIL})?)"),
    ("drange", r"(?<![\d.])(?P<da_y>\d{4})(?P<da_sep>[-/.])(?P<da_m>1[0-2]|0?[1-9])(?P=da_sep)"
               r"(?P<da_d>3[01]|[12]\d|0?[1-9])\s?(?P<dr_sep>[-~–—])\s?"
               r"(?:(?P<db_y>\d{4})(?P=da_sep))?"
               r"(?P<db_m>1[0-2]|0?[1-9])(?P=da_sep)(?P<db_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)"),
    ("mdrange", r"(?<![\d/.])(?P<ma_m>\d{1,2})/(?P<ma_d>\d{1,2})\s?(?P<mr_sep>[-~–—]|到|至)\s?"
                r"(?P<mb_m>\d{1,2})/(?P<mb_d>\d{1,2})(?![\d/])"),
    ("ymd", r"(?<![\d.])(?P<ymd_y>\d{4})(?P<ymd_sep>[-/.])(?P<ymd_m>1[0-2]|0?[1-9])(?P=ymd_sep)"
            r"(?P<ymd_d>3[01]|[12]\d|0?[1-9])(?!\d|\.\d)"),
    ("mdy", r"(?<![\d/])(?P<mdy_m>1[0-2]|0?[1-9])/(?P<mdy_d>3[01]|[12]\d|0?[1-9])/(?P<mdy_y>\d{4})(?![\d/])"),
    ("md", rf"\b(?P<md_mon>{_MONTH_RE})\.?\s+(?P<md_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?(?![\dA-Za-z])"
           r"(?:,?\s+(?P<md_y>\d{4})(?!\d))?"),
    ("dm", rf"\b(?P<dm_d>3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dm_mon>{_MONTH_RE})"
           r"(?:(?<=\b[A-Z][a-z]{2})\.(?!\s*$)|(?<=Sept)\.)?"
           r"(?:,?\s+(?P<dm_y>\d{4})(?!\d))?"),
    ("trange", _time_re("ta") + r"(?P<tr_sep>\s?[-~–—]\s?|至|到)" + _time_re("tb")),
    ("time", _time_re("t") + r"(?:\s?(?P<t_ap>[AaPp])\.?[Mm](?:\.(?=\S| [a-z]))?(?![A-Za-z]))?"
             r"(?P<t_unit>分(?![钟别享析之配为成组批])|秒|整|点钟|点(?![名评击赞菜餐燃亮播头数滴]))?"),
    ("ratio", r"(?<![\d.])(?<!\d:)(?P<ra_a>\d{1,3}):(?P<ra_b>\d{1,3})(?![\d:])"),
    ("hap", r"(?<![\d:.])(?P<hap_h>1[0-2]|0?[1-9])\s?(?P<hap_ap>[AaPp])\.?[Mm](?:\.(?=\S| [a-z]))?(?![A-Za-z])"),
    ("phone", r"(?P<phone>(?<![\d+])(?:\+?86[-\s]?)?1[3-9]\d(?:[-\s]?\d{4}){2}(?!\d)"
              r"|(?<!\d)0\d{2,3}-\d{7,8}(?!\d)"
              r"|(?<!\d)0\d{2,3}-\d{3,4}[-\s]\d{4}(?!\d)"
              r"|\(0\d{1,3}\)[-\s]?(?:\d{7,8}|\d{3,4}[-\s]\d{4})(?!\d)"
              r"|(?<![\d+])[48]00[-\s]?\d{3}[-\s]?\d{4}(?!\d)"
              r"|(?<![\d+-])\d{3,4}(?:-\d{3,4}){2,}(?![\d-])"
              r"|(?<![\d*])\d{3}\*{3,4}\d{4}(?![\d*])"
              r"|(?<![\d+])(?:\+?1[-.\s])?(?:\(\d{3}\)\s?|\d{3}[-.])\d{3}[-.]\d{4}(?!\d)"
              r"|\+\d{1,3}(?:[-\s]\d{1,4}){2,5}(?!\d)"
              r"|\+\d{1,3}[-\s]\d{1,4}[-\s]\d{5,8}(?!\d))"),
    ("groups", r"(?<![\d.,])(?P<groups>\d{2,4}(?: \d{2,4}){2,})(?![\d]|[.,]\d)"),
    ("hm", r"(?<![\d.])(?P<hm_h>\d+)\s?h(?:rs?)?\s?(?P<hm_m>\d+)\s?(?:mins?|m)(?![A-Za-z0-9])"),
    ("money", r"(?P<mp_neg>(?<![A-Za-z0-9.])-)?"
              r"(?P<mp_cur>(?:US|HK|NT|AU?|CA?|S)\$|[$¥€£]|(?:USD|CNY|RMB|EUR|GBP|HKD|JPY|TWD|AUD|CAD|SGD)\s?)"
              rf"(?P<mp_amt>{_NUM})(?:\s?[-~–—]\s?(?:(?:US|HK|NT|AU?|CA?|S)\$|[$¥€£])?(?P<mp_amt2>{_NUM}))?"
              r"(?:\s?(?P<mp_mult>万|亿|(?:thousand|million|billion|trillion)(?![A-Za-z])"
              r"|(?:[kKmMbBtT]|[mMbBtT]n)(?![A-Za-z])))?"
              r"(?P<mp_unit>元(?![素旦首宵件老气帅])|块(?![头状])|美元|欧元|英镑|港元|港币|日元)?"),
    ("yuan", rf"(?P<ms_amt>{_NUM})\s?(?P<ms_cur>元(?![素旦首宵件老气帅])|块(?![头状]))"),
    ("coded", rf"(?P<cd_amt>{_NUM})\s?(?P<cd_code>USD|EUR|GBP|CNY|RMB|HKD|JPY|TWD|AUD|CAD|SGD)(?![A-Za-z])"),
    ("times", rf"(?<![A-Za-z0-9.])(?P<x_num>{_NUM})[x×](?![A-Za-z0-9])"),
    ("twentyfour", r"(?<![\d/])24/7(?![\d/])"),
    ("perunit", rf"(?<=[\u4e00-\u9fa5A-Za-z²³\d])/(?P<pu_unit>{_alt(UNITS)}|{_alt(GLUED_UNITS)})(?![A-Za-z0-9])"),
    ("decade", r"(?<![\d.])(?P<dec>\d{3}0)s(?![A-Za-z])|(?<![A-Za-z0-9])'(?P<dec2>\d0)s(?![A-Za-z])"
               r"|(?<![A-Za-z0-9.'])(?P<dec3>[1-9]0)s(?![A-Za-z])"),
    ("kilo", rf"(?<![A-Za-z0-9.])(?P<kk_a>{_NUM})(?:(?P<kk_ka>[kKw])?\s?(?P<kk_sep>[-~–—])\s?(?P<kk_b>{_NUM}))?"
             r"(?P<kk_k>[kKw])(?![A-Za-z0-9])"),
    ("range", rf"(?P<r_sign>(?<![A-Za-z0-9.])[-−])?(?<![\d.])(?P<r_a>{_NUM})(?P<r_pa>[%‰])?"
              rf"(?P<r_ua>(?:{_alt(UNITS)})(?=\s?[~–—-]\s?[-−]?\d))?"
              rf"(?P<r_sep>\s?[~–—]\s?|-|\s?[至到]\s?(?=[-−]\d))(?P<r_bsign>[-−])?(?P<r_b>{_NUM})(?![\d])"
              rf"(?P<r_suf>\s?[%‰]|\s?(?:{_alt(UNITS)})(?![A-Za-z0-9])|(?:{_alt(GLUED_UNITS)})(?![A-Za-z0-9]))?"),
    ("percent", rf"(?P<pc_sign>{_SIGN})?(?P<pc_num>{_NUM})\s?(?P<pc_sym>[%‰])"),
    ("unit", rf"(?P<u_sign>{_SIGN})?(?P<u_num>{_NUM})(?:\s?(?P<u_unit>{_alt(UNITS)})"
             rf"|(?P<u_glued>{_alt(GLUED_UNITS)}))(?![A-Za-z0-9])"),
    ("fraction", r"(?<![\d/.])(?P<fr_a>\d+)/(?P<fr_b>\d+)(?![\d/])"),
    ("ordinal", r"(?<![\d.])(?P<ord>\d+)(?:st|nd|rd|th)(?![A-Za-z])"),
    ("numero", r"(?<![A-Za-z])(?:No|NO|no)\.\s?(?P<no_num>\d+)(?![\d.])"),
    ("dotted", r"(?<![\d.])(?P<dot>\d+(?:\.\d+){2,})(?![\d])"),
    ("number", rf"(?P<n_sign>{_SIGN})?(?P<n_num>{_NUM})(?P<n_plus>\+(?![\d+]))?"),
]
_SCANNER: Final = re.compile("|".join(f"(?P<k_{kind}>{pattern})" for kind, pattern in _RULES))
_TAG_SCANNER: Final = re.compile(f"(?P<k_tag>{_RULES[0][1]})")
_INTRINSIC: Final[dict[str, Lang]] = {"md": "en", "dm": "en", "ordinal": "en", "yuan": "zh"}
"""Kinds whose language is fixed by their own words (English month names, 3rd; 元). 5pm is
read in the language around it (下午5pm见 -> 下午五点见), as 5:30pm is."""


@dataclass
class _Context:
    """The folded text being normalised, the same text with tag-shaped spans blanked (so that
    the letters of ``[laugh]`` do not count as English), and the fallback language."""

    text: str
    default: Lang
    view: str = ""
    library: bool = False

    def __post_init__(self) -> None:
        self.view = re.sub(r"\[[A-Za-z_0-9]+\]", lambda m: " " * len(m.group(0)), self.text)

    def lang(self, start: int, end: int, counts: bool = False) -> Lang:
        return context_language(self.view, start, end, self.default, counts)


def dominant_language(text: str) -> Lang:
    """'zh' when the text has at least as many Chinese characters as English words (also when
    it has neither), else 'en'."""
    cjk = sum(1 for c in text if _is_cjk(c))
    words = len(re.findall(r"[A-Za-z]+", text))
    return "zh" if cjk >= words else "en"


CONTEXT_CHARS: Final = 80
"""How far :func:`context_language` looks for a Chinese character or Latin letter, each side."""
_CLAUSE_BREAKS: Final = set(",;:!?。，；：！？\n") | {"."}


_MODEL_NAME: Final = re.compile(r"(?<![A-Za-z])[A-Za-z]*[A-Z][A-Za-z]* ?$")
"""A Latin word with a capital letter right before a number (one space allowed)."""


def context_language(text: str, start: int, end: int, default: Lang, counts: bool = False) -> Lang:
    """The language in which to read ``text[start:end]`` (a number, a symbol, a mark).

    Latin letters glued to the span (the ``G`` of ``5G``, the ``mp`` of ``mp3``) are skipped,
    then the nearest Chinese character or Latin letter on each side decides:

    1. a Chinese character right after the span (``3个``) makes it Chinese;
    2. else, for a count (``counts``: a plain number) in mostly Chinese text, a capitalised
       Latin name right before or after it (``iPhone 15 Pro``, ``Windows 11``, ``骁龙8 Gen``)
       makes it Chinese: model numbers inside Chinese are read in Chinese;
    3. else, for a count, a word right after it or after one space in the same clause decides:
       a number is read in the language of what it counts (``和5 pears`` reads "five pears");
    4. else a Chinese character right before it (``第3``) makes it Chinese;
    5. else the nearer one within the same clause (no ``,;:!?。`` in between; ties go right);
    6. else the nearer one anywhere (ties go left);
    7. else ``default``.

    Each side is searched up to ``CONTEXT_CHARS`` characters away.
    """
    i = start - 1
    while i >= 0 and _is_latin(text[i]):
        i -= 1
    j = end
    while j < len(text) and _is_latin(text[j]):
        j += 1

    def scan(pos: int, step: int) -> tuple[Lang | None, int, bool]:
        gap, crossed = 0, False
        while 0 <= pos < len(text) and gap < CONTEXT_CHARS:
            c = text[pos]
            s = _script(c)
            if s is not None:
                return s, gap, crossed
            if c in _CLAUSE_BREAKS and not (c == "." and 0 < pos < len(text) - 1
                                            and text[pos - 1].isdigit() and text[pos + 1].isdigit()):
                crossed = True
            gap += 1
            pos += step
        return None, gap, crossed

    left, lgap, lcross = scan(i, -1)
    right, rgap, rcross = scan(j, 1)
    if right == "zh" and rgap == 0:
        return "zh"
    if counts and default == "zh" and (_MODEL_NAME.search(text, max(0, start - 40), start)
                                       or re.match(r" ?[A-Z]", text[end:end + 2])):
        return "zh"
    if counts and right is not None and not rcross and rgap <= 1:
        return right
    if left == "zh" and lgap == 0:
        return "zh"
    same = [(g, 0 if side == "right" else 1, lang) for side, lang, g, crossed in
            (("left", left, lgap, lcross), ("right", right, rgap, rcross)) if lang is not None and not crossed]
    if same:
        return min(same)[2]
    anywhere = [(g, 0 if side == "left" else 1, lang) for side, lang, g in
                (("left", left, lgap), ("right", right, rgap)) if lang is not None]
    if anywhere:
        return min(anywhere)[2]
    return default


# --- verbalisers ----------------------------------------------------------------------------

def _takes_liang(after: str) -> bool:
    """Whether a count written before ``after`` reads 两 for 2: ``after`` starts with a measure
    word of :data:`_ZH_LIANG_BEFORE` and not with a label of :data:`_ZH_ER_BEFORE`."""
    after = after.lstrip()
    return not after.startswith(_ZH_ER_BEFORE) and after.startswith(_ZH_LIANG_BEFORE)


def _liang(words: str, after: str) -> str:
    """二 -> 两 before a measure word (2个 -> 两个, but 2号 -> 二号)."""
    if words == "二" and _takes_liang(after):
        return "两"
    return words


def _zh_int_plain(n: int) -> str:
    return zh_number(str(n))


def _zh_date(y: str | None, m: int, d: int | None) -> str:
    out = (zh_digits(y) + "年") if y else ""
    out += _zh_int_plain(m) + "月"
    if d is not None:
        out += _zh_int_plain(d) + "日"
    return out


def _en_date(y: str | None, m: int, d: int | None) -> str:
    out = _MONTHS_EN[m - 1]
    if d is not None:
        out += " " + en_ordinal(d)
    if y:
        out += ", " + en_year(int(y))
    return out


def _month_number(name: str) -> int:
    if name in _MONTHS_EN:
        return _MONTHS_EN.index(name) + 1
    return _MONTH_ABBR[name]


def _time(lang: Lang, h: int, m: int, s: int | None, ap: str | None, whole: bool = True) -> str:
    """A clock time: 十点三十分 / ten thirty. ``whole``: a Chinese time on the hour reads 整
    (九点整); inside a range it does not (九点到十七点)."""
    ap = ap.lower() if ap else None
    s = s or None  # 9:00:00 reads as 9:00
    if lang == "zh":
        out = ("上午" if ap == "a" else "下午" if ap == "p" and h < 12 else "")
        out += ("两" if h == 2 else _zh_int_plain(h)) + "点"
        if m == 0 and s is None:
            return out + ("整" if whole else "")
        out += ("零分" if m == 0 else ("零" if m < 10 else "") + _zh_int_plain(m) + "分")
        if s is not None:
            out += ("零" if s < 10 else "") + _zh_int_plain(s) + "秒"
        return out
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
    """h:mm:ss as a duration: 两小时零三分四十五秒 / two hours three minutes forty five seconds."""
    if lang == "zh":
        out = _liang(_zh_int_plain(h), "个") + "小时"
        out += ("零" if 0 < m < 10 else "") + (_zh_int_plain(m) + "分" if m else "")
        if s:
            out += ("零" if s < 10 and not m else "") + _zh_int_plain(s) + "秒"
        return out
    parts = [f"{en_int(h)} {'hour' if h == 1 else 'hours'}"]
    if m:
        parts.append(f"{en_int(m)} {'minute' if m == 1 else 'minutes'}")
    if s:
        parts.append(f"{en_int(s)} {'second' if s == 1 else 'seconds'}")
    return " ".join(parts)


ID_CARD_DIGITS: Final = 18
"""A Chinese resident ID number: read in groups of 6 (region), 8 (birth date) and 4."""
LONG_IDENTIFIER_DIGITS: Final = 12
"""An unseparated integer this long is an identifier (card, order number), never a cardinal."""


def _digit_groups(digits: str) -> list[str]:
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


def _read_groups(lang: Lang, groups: list[str], plus: bool = False) -> str:
    """Digit groups read digit by digit (1 as 幺 in Chinese) with a pause between groups."""
    if lang == "zh":
        return ("加" if plus else "") + "，".join(zh_digits(g, one="幺") for g in groups)
    return ("plus " if plus else "") + ", ".join(en_digits(g) for g in groups)


def _phone(lang: Lang, raw: str) -> str:
    plus = raw.lstrip().startswith("+")
    if "*" in raw:  # 138****5678: the masked digits are read as stars
        head, stars, tail = re.match(r"(\d+)(\*+)(\d+)", raw).groups()  # type: ignore[union-attr]
        star = "星" if lang == "zh" else "star"
        mask = star * len(stars) if lang == "zh" else " ".join([star] * len(stars))
        sep = "，" if lang == "zh" else ", "
        return sep.join([_read_groups(lang, [head]), mask, _read_groups(lang, [tail])])
    groups = [g for g in re.split(r"[^\d]+", raw) if g]
    if len(groups) == 1:
        groups = _digit_groups(groups[0])
    elif len(groups) == 2 and groups[0] == "86" and len(groups[1]) == 11:
        groups = ["86", *_digit_groups(groups[1])]
    return _read_groups(lang, groups, plus)


def _money(lang: Lang, neg: bool, code: str, amount: str, mult: str | None) -> str:
    cur = CURRENCIES[code]
    value = _decimal(amount)
    scale = _MULTIPLIERS.get(mult.lower() if mult.isascii() else mult) if mult else None
    if lang == "zh":
        if mult in ("万", "亿"):  # read as written: ¥3.5万 -> 三点五万元
            out = _liang(zh_number(amount), mult) + mult + cur.zh
        elif scale is not None:
            total = value * scale[0]
            words = zh_number(_plain_decimal(total))
            out = words + cur.zh
        elif code == "CNY" and "." in amount:
            out = _yuan_jiao_fen(amount, "元", "角")
        else:
            out = _liang(zh_number(_plain_decimal(value) if "." in amount else amount), cur.zh) + cur.zh
        return ("负" if neg else "") + out
    if scale is not None and mult in ("万", "亿"):  # Chinese myriads have no English word
        out = f"{en_number(_plain_decimal(value * scale[0]))} {cur.en_many}"
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
    """12.50 -> 十二元五角, 3.05 -> 三元零五分, 0.5 -> 五角 (CNY with at most two decimals)."""
    whole, _, frac = amount.replace(",", "").partition(".")
    if len(frac) > 2:
        return zh_number(amount) + major_word
    frac = (frac + "00")[:2]
    jiao, fen = int(frac[0]), int(frac[1])
    out = ""
    if int(whole) or (not jiao and not fen):
        out += zh_number(whole) + major_word
    if jiao:
        out += _ZH_DIGITS[jiao] + tenth_word
    elif fen and out:
        out += "零"
    if fen:
        out += _ZH_DIGITS[fen] + "分"
    return out


def _fraction(lang: Lang, a: int, b: int) -> str:
    if lang == "zh":
        return f"{_zh_int_plain(b)}分之{_zh_int_plain(a)}"
    if b == 0:
        return f"{en_int(a)} over zero"
    if b == 2:
        return "one half" if a == 1 else f"{en_int(a)} halves"
    if b == 4:
        return "one quarter" if a == 1 else f"{en_int(a)} quarters"
    if b <= 100 and a <= 100 and b > 2:
        return f"{en_int(a)} {en_ordinal(b)}" + ("" if a == 1 else "s")
    return f"{en_int(a)} over {en_int(b)}"


def _unit_reading(lang: Lang, unit: Unit, num: str) -> str:
    if lang == "zh":
        words = zh_number(num)
        return (_liang(words, "个") if unit.liang else words) + unit.zh
    value = _decimal(num)
    return f"{en_number(num)} {unit.en_one if value == 1 else unit.en_many}"


def _decade(lang: Lang, year: str) -> str:
    if lang == "zh":
        return zh_digits(year) + "年代"
    words = en_int(int(year)) if len(year) == 2 else en_year(int(year))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _email(lang: Lang, raw: str) -> str:
    words = {"zh": {".": "点", "@": "艾特", "_": "下划线", "-": "杠", "+": "加", "%": "百分号"},
             "en": {".": "dot", "@": "at", "_": "underscore", "-": "dash", "+": "plus", "%": "percent"}}[lang]
    out: list[str] = []
    for part in re.findall(r"[A-Za-z]+|\d+|.", raw):
        if part.isdigit():
            out.append(zh_digits(part) if lang == "zh" else en_digits(part))
        elif part in words:
            out.append(words[part])
        elif part.isalpha():
            out.append(part)
    return " ".join(out)


def _url(lang: Lang, raw: str) -> str:
    body = re.sub(r"^https?://", "", raw)
    words = {"zh": {".": "点", "/": "斜杠", "-": "杠", "_": "下划线", ":": "冒号", "?": "问号", "=": "等于",
                    "&": "和", "#": "井号", "~": "波浪号", "%": "百分号", "+": "加"},
             "en": {".": "dot", "/": "slash", "-": "dash", "_": "underscore", ":": "colon", "?": "question mark",
                    "=": "equals", "&": "and", "#": "hash", "~": "tilde", "%": "percent", "+": "plus"}}[lang]
    out: list[str] = []
    for part in re.findall(r"[A-Za-z]+|\d+|.", body):
        if part.isdigit():
            out.append(zh_digits(part) if lang == "zh" else en_digits(part))
        elif part.isalpha():
            out.append(part)
        elif part in words:
            out.append(words[part])
    return " ".join(out)


# --- the normaliser -------------------------------------------------------------------------

@dataclass
class _Out:
    """Output pieces and the bookkeeping of one :func:`normalize` call."""

    pieces: list[str]
    dropped: list[str]
    speed: int | None = None
    last_lang: Lang | None = None
    """Language of the last spoken output, which punctuation after it follows."""

    def drop(self, item: str) -> None:
        if item not in self.dropped:
            self.dropped.append(item)

    def words(self, lang: Lang, text: str) -> None:
        self.pieces.append(text if lang == "zh" else f" {text} ")
        self.last_lang = lang

    def letter(self, c: str) -> None:
        self.pieces.append(c)
        self.last_lang = _script(c)


def normalize(text: str, library: bool = True) -> NormalizedText:
    """Verbalise ``text`` for ChatTTS (see the module docstring).

    ``library``: read the Chinese-context entities of :data:`LIBRARY_KINDS` with WeTextProcessing
    (:mod:`chattts_serving.text.wetext`) where it reads them as the corpus expects; False:
    our rules alone (the profile knob ``[frontend] wetext``).

    Returns a :class:`NormalizedText` whose ``text`` holds only Chinese characters of
    U+4E00..U+9FA5, Latin letters, spaces, ``，。、,.`` and control tokens.

    Raises:
        TextNormError: a numbered control token outside its range (``[break_9]``).
    """
    return _normalize(text, library, _SCANNER)


def punctuate(text: str) -> NormalizedText:
    """Only the formatting part of :func:`normalize`: width folding, control tokens, pause
    marks, spoken symbols and reported characters, without reading any entity (digits and
    entity symbols left in ``text`` are reported as not spoken). Used to score the WeTextProcessing
    library alone on the corpus (``python -m chattts_serving.text.normalize_report``).

    Raises:
        TextNormError: a numbered control token outside its range.
    """
    return _normalize(text, False, _TAG_SCANNER)


def _normalize(text: str, library: bool, scanner: re.Pattern[str]) -> NormalizedText:
    folded = fold_width(text)
    ctx = _Context(folded, dominant_language(folded), library=library)
    out = _Out([], [])
    pos = 0
    while (m := scanner.search(folded, pos)) is not None:
        if m.start() > pos:
            _plain(ctx, pos, m.start(), out)
        kind = (m.lastgroup or "k_").removeprefix("k_")
        if m.group(0)[:1] in ("-", "−") and _AFTER_QUANTITY.search(ctx.view[max(0, m.start() - 4):m.start()]):
            # not a minus sign but a range dash after a quantity with a Chinese unit (5月1日-5月5日)
            lang = ctx.lang(m.start(), m.start() + 1)
            out.words(lang, "到" if lang == "zh" else "to")
            pos = m.start() + 1
            continue
        _entity(ctx, kind, m, out)
        pos = m.end()
    if pos < len(folded):
        _plain(ctx, pos, len(folded), out)
    result = _tidy("".join(out.pieces))
    dropped = sorted(out.dropped, key=lambda d: folded.find(d) if d in folded else len(folded))
    return NormalizedText(result, out.speed, tuple(dropped), split_segments(result))


NEAR_CHARS: Final = 40
"""How far each side of an entity its reading looks for context words (within the sentence)."""


def _near(view: str, start: int, end: int) -> tuple[str, str]:
    """The text before and after ``view[start:end]`` within its sentence (at most
    :data:`NEAR_CHARS` each side; control tokens are blanks in ``view``)."""
    before = view[max(0, start - NEAR_CHARS):start]
    cuts = list(_SENTENCE_END.finditer(before))
    if cuts:
        before = before[cuts[-1].end():]
    after = view[end:end + NEAR_CHARS]
    cut = _SENTENCE_END.search(after)
    return before, after[:cut.start()] if cut else after


def _entity(ctx: _Context, kind: str, m: re.Match[str], out: _Out) -> None:
    g = m.group
    if kind == "tag":
        _tag(ctx, m, out)
        return
    lang = _INTRINSIC.get(kind) or ctx.lang(m.start(), m.end(), counts=kind in ("number", "dotted"))
    before, after = _near(ctx.view, m.start(), m.end())
    words = None
    if ctx.library and lang == "zh" and kind in LIBRARY_KINDS and _library_may_read(kind, g, before, after):
        from .wetext import read_zh

        words = read_zh(m.group(0))
        if words is not None and not _library_reading_fits(kind, g, words, before, after):
            words = None
    if words is None:
        words = _HANDLERS[kind](lang, g, before, after)
    out.words(lang, words)


def _library_may_read(kind: str, g: Callable[[str], str], before: str, after: str) -> bool:
    """Guards on the spans of :data:`LIBRARY_KINDS` the corpus shows the library reading wrongly."""
    if kind == "percent":  # the library reads -2% as 百分之负二 and 5‰ as 五千分号
        return not g("pc_sign") and g("pc_sym") == "%"
    if kind == "ratio":  # 45:30秒 and 倒计时59:59 are minutes and seconds, not a ratio
        return not _mm_ss(g("ra_a"), g("ra_b"), before, after)
    return True


def _library_reading_fits(kind: str, g: Callable[[str], str], words: str, before: str, after: str) -> bool:
    """Whether the library's reading is of the sort our context words choose: it reads a/b
    with a of 10 to 12 as a date (11/12 -> 十一月十二日, also in 大约11/12的时间) and the others
    as fractions (6/30, also in 截止6/30), so a fraction must read 分之 and a date 月."""
    if kind == "fraction":
        return ("月" in words) == _zh_slash_date(g("fr_a"), g("fr_b"), before, after)
    return True


def _tag(ctx: _Context, m: re.Match[str], out: _Out) -> None:
    name = m.group("tag")
    if name in CONTROL_WORDS:
        out.pieces.append(f"[{name}]")
        return
    if name in RESERVED_TOKENS:
        out.drop(f"[{name}]")
        out.pieces.append(" ")
        return
    base, _, num = name.rpartition("_")
    if base in CONTROL_NUMBERED and num.isdigit():
        n, count = int(num), CONTROL_NUMBERED[base]
        if not 0 <= n < count:
            raise TextNormError(f"control token [{name}] is out of range: [{base}_N] takes N in 0..{count - 1}")
        if base == "speed":
            if out.speed is None:
                out.speed = n
            out.pieces.append(" ")
        else:
            out.pieces.append(f"[{base}_{n}]")
        return
    # not a ChatTTS token: brackets are pauses, the word inside is read
    _plain(ctx, m.start(), m.end(), out)


# --- readings of each kind ------------------------------------------------------------------
# Each handler gets the language, the match's groups and the text before and after the match
# within its sentence (control tokens blanked), and returns the words.

def _h_ymd(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    y, mo, d = g("ymd_y"), int(g("ymd_m")), int(g("ymd_d"))
    return _zh_date(y, mo, d) if lang == "zh" else _en_date(y, mo, d)


def _h_mdy(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    y, mo, d = g("mdy_y"), int(g("mdy_m")), int(g("mdy_d"))
    return _zh_date(y, mo, d) if lang == "zh" else _en_date(y, mo, d)


def _h_md(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return _en_date(g("md_y"), _month_number(g("md_mon")), int(g("md_d")))


def _h_dm(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    article = "" if re.search(r"\bthe\s*$", before, re.IGNORECASE) else "the "
    out = f"{article}{en_ordinal(int(g('dm_d')))} of {_MONTHS_EN[_month_number(g('dm_mon')) - 1]}"
    return out + (f", {en_year(int(g('dm_y')))}" if g("dm_y") else "")


def _ends_with(before: str, words: tuple[str, ...], skip: str = " ") -> bool:
    return before.rstrip(skip).endswith(words)


_AFTER_QUANTITY: Final = re.compile(r"\d[\u4e00-\u9fa5]{1,3} *$")
"""The end of a quantity written with a Chinese unit (5月1日, 2020年): a dash after it is a range."""


def _score_near(before: str, after: str) -> bool:
    """A score word right before (比分, 以, 首局 ...) or right after (获胜, 领先 ...)."""
    return _ends_with(before, SCORE_BEFORE, " 为是:") or after.lstrip().startswith(SCORE_AFTER)


def _score_sentence(before: str, after: str) -> bool:
    return any(w in before or w in after for w in SCORE_SENTENCE)


def _score(lang: Lang, a: str, b: str) -> str:
    """A score or ratio: 三比二 (never 两) / three to two."""
    return f"{zh_number(a)}比{zh_number(b)}" if lang == "zh" else f"{en_number(a)} to {en_number(b)}"


def _countdown(before: str, mm: str) -> bool:
    """``mm:ss`` after a countdown word (:data:`COUNTDOWN_BEFORE`; 还有 only before 00:ss)."""
    return _ends_with(before, COUNTDOWN_BEFORE, " :为是") or (mm == "00" and _ends_with(before, ("还有",), " :"))


def _minutes_seconds(lang: Lang, m: int, s: int, unit_follows: bool = False) -> str:
    """``mm:ss`` as minutes and seconds: 五分三十秒, 三十秒, on the minute 五分钟 (五分 when
    ``unit_follows``: the 秒 written after it is read next) / five minutes thirty seconds."""
    if lang == "zh":
        if not m:
            return _zh_int_plain(s) + ("" if unit_follows else "秒")
        if not s and not unit_follows:
            return _liang(_zh_int_plain(m), "分钟") + "分钟"
        return _zh_int_plain(m) + "分" + ("零" if s < 10 else "") + _zh_int_plain(s) + ("" if unit_follows else "秒")
    parts = [f"{en_int(m)} {'minute' if m == 1 else 'minutes'}"] if m else []
    if s or not m:
        parts.append(f"{en_int(s)} {'second' if s == 1 else 'seconds'}")
    return " ".join(parts)


def _h_time(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """A clock time, or what its context makes of ``a:b``: a score (比分为21:19), a duration
    (成绩2:03:45), a pace (配速5:30), minutes and seconds (``10:30秒``, 倒计时05:00). A unit
    written after it that the reading already says (17:20分, 15:16:36秒, 12:00点, 9:30点) is
    read once; am/pm after a day part (下午2:30pm) is not read again."""
    h, m, sec, unit = int(g("t_h")), int(g("t_m")), g("t_s"), g("t_unit") or ""
    s = int(sec) if sec else None
    if s is None and not g("t_ap") and _score_near(before, after[len(unit):] if unit else after):
        return _score(lang, g("t_h"), g("t_m")) + unit  # 比分为21:19
    if s is not None and _ends_with(before, DURATION_BEFORE, " :"):
        return _duration(lang, h, m, s) + ("" if unit == "秒" else unit)  # 成绩2:03:45
    if s is None and lang == "zh" and _ends_with(before, PACE_BEFORE, " :为是"):
        return f"{_zh_int_plain(h)}分{_zh_int_plain(m)}秒"  # 配速5:30
    if s is None and not g("t_ap") and (unit == "秒" or (unit in ("", "整") and _countdown(before, g("t_h")))):
        return _minutes_seconds(lang, h, m) + ("" if unit == "秒" else unit)  # 10:30秒, 倒计时05:00
    ap: str | None = g("t_ap")
    if ap and lang == "zh" and _ends_with(before, DAY_PARTS):
        ap = None  # 下午2:30pm: 下午 is said once
    on_hour = m == 0 and s is None
    words = _time(lang, h, m, s, ap, whole=not (on_hour and unit in ("整", "点", "点钟")))
    if lang == "zh":
        if unit == "整":
            return words + "整"
        if unit == "点钟":
            return words + ("钟" if on_hour else "")  # 10:00点钟 -> 十点钟
        # 17:20分, 15:16:36秒, 12:00点: the unit the reading already says is written once
        if (unit == "分" and s is None) or (unit == "秒" and s is not None) or unit == "点":
            return words
    return words + unit


def _h_trange(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    sides = []
    for p in ("ta", "tb"):
        sec = g(f"{p}_s")
        sides.append(_time(lang, int(g(f"{p}_h")), int(g(f"{p}_m")), int(sec) if sec else None, None, whole=False))
    sep = g("tr_sep").strip()
    if lang == "zh":
        return sides[0] + ("至" if sep == "至" else "到") + sides[1]
    return f"{sides[0]} to {sides[1]}"


def _h_ratio(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """``a:b`` that is no clock time: a ratio or score (三比二), or minutes and seconds before
    秒 or after a countdown word (45:30秒 -> 四十五分三十, the 秒 read next; 倒计时59:59)."""
    a, b = g("ra_a"), g("ra_b")
    if _mm_ss(a, b, before, after):
        return _minutes_seconds(lang, int(a), int(b), unit_follows=after.startswith("秒"))
    return _score(lang, a, b)


def _mm_ss(a: str, b: str, before: str, after: str) -> bool:
    """Whether ``a:b`` (no clock time) is minutes and seconds: two-digit seconds under 60
    followed by 秒 or after a countdown word."""
    return len(b) == 2 and int(b) < 60 and int(a) < 1000 and (after.startswith("秒") or _countdown(before, a))


def _h_hap(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """5pm: five PM / 下午五点 (五点 after a day part: 下午5pm)."""
    ap: str | None = g("hap_ap")
    if lang == "zh" and _ends_with(before, DAY_PARTS):
        ap = None
    return _time(lang, int(g("hap_h")), 0, None, ap, whole=False)


def _h_phone(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return _phone(lang, g("phone"))


def _h_groups(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return _read_groups(lang, g("groups").split())


def _h_hm(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    h, m = g("hm_h"), g("hm_m")
    if lang == "zh":
        return _liang(zh_number(h), "个") + "小时" + zh_number(m) + "分钟"
    return f"{en_number(h)} {'hour' if h == '1' else 'hours'} {en_number(m)} {'minute' if m == '1' else 'minutes'}"


_CURRENCY_WORDS: Final = {"CNY": ("元", "块"), "USD": ("美元",), "EUR": ("欧元",), "GBP": ("英镑",),
                          "HKD": ("港元", "港币"), "JPY": ("日元",), "TWD": (), "AUD": (), "CAD": (), "SGD": ()}


def _h_money(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """An amount after its currency sign or code, or a range of two (¥100-200, $3-5万: the
    currency once, after the second amount). A currency word written after it that the
    reading already says (¥100元, €1.2亿元, $5亿美元) is read once."""
    code = _CURRENCY_OF[g("mp_cur").strip()]
    amount, unit = g("mp_amt"), g("mp_unit")
    if g("mp_amt2"):
        words = _money_range(lang, bool(g("mp_neg")), code, amount, g("mp_amt2"), g("mp_mult"))
    elif lang == "zh" and code == "CNY" and "." in amount and not g("mp_mult") and after.lstrip().startswith("/"):
        words = zh_number(amount) + "元"  # ¥7.5/升: a price per unit reads the decimal
    else:
        words = _money(lang, bool(g("mp_neg")), code, amount, g("mp_mult"))
    if unit and unit not in _CURRENCY_WORDS[code] and not (unit in ("元", "块") and CURRENCIES[code].zh.endswith("元")):
        words += unit  # not the currency's own word: keep it
    return words  # ¥100元: the unit is written twice, read once


def _money_range(lang: Lang, neg: bool, code: str, a: str, b: str, mult: str | None) -> str:
    """¥100-200 -> 一百到二百元, $3-5万 -> 三到五万美元, $10-20 -> ten to twenty dollars: both
    amounts read as numbers (decimals with 点, never 元角分), the multiplier and the currency
    once at the end."""
    cur = CURRENCIES[code]
    scale = _MULTIPLIERS.get(mult.lower() if mult.isascii() else mult) if mult else None
    if lang == "zh":
        if mult in ("万", "亿"):
            return ("负" if neg else "") + f"{_liang(zh_number(a), mult)}到{_liang(zh_number(b), mult)}{mult}{cur.zh}"
        if scale is not None:  # $3-5m: three to five million, read in 万
            a, b = _plain_decimal(_decimal(a) * scale[0]), _plain_decimal(_decimal(b) * scale[0])
        return ("负" if neg else "") + f"{_liang(zh_number(a), cur.zh)}到{_liang(zh_number(b), cur.zh)}{cur.zh}"
    if mult in ("万", "亿") and scale is not None:
        a, b = _plain_decimal(_decimal(a) * scale[0]), _plain_decimal(_decimal(b) * scale[0])
        tail = cur.en_many
    else:
        tail = f"{scale[1]} {cur.en_many}" if scale is not None else cur.en_many
    return ("minus " if neg else "") + f"{en_number(a)} to {en_number(b)} {tail}"


def _h_yuan(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    amount, word = g("ms_amt"), g("ms_cur")
    if "." in amount and not after.lstrip().startswith("/"):
        return _yuan_jiao_fen(amount, word, "角" if word == "元" else "毛")
    return _liang(zh_number(amount), "个") + word  # 7.5元/升: a price per unit reads the decimal


_DECADE_BEFORE: Final = ("the", "early", "late", "mid", "in")


def _h_coded(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """100 USD, 500 RMB: an amount before its currency code."""
    return _money(lang, False, _CURRENCY_OF[g("cd_code")], g("cd_amt"), None)


def _h_times(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """3x, 2×: 三倍 / three times."""
    num = g("x_num")
    return _liang(zh_number(num), "倍") + "倍" if lang == "zh" else f"{en_number(num)} times"


def _h_twentyfour(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """24/7: round the clock, never a fraction."""
    return "全天候" if lang == "zh" else "twenty four seven"


def _h_perunit(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """/m², /kg after an amount with a unit (100元/m²): 每平方米 / per square meter."""
    symbol = g("pu_unit")
    unit = UNITS.get(symbol) or GLUED_UNITS[symbol]
    return "每" + unit.zh if lang == "zh" else "per " + unit.en_one


def _h_decade(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    short = g("dec3")
    if short and not (lang == "en" and re.search(rf"\b(?:{'|'.join(_DECADE_BEFORE)})\s*$", before.lower())):
        return _unit_reading(lang, GLUED_UNITS["s"], short)  # 80s without "the": eighty seconds
    return _decade(lang, g("dec") or g("dec2") or short)


KILO_SENTENCE: Final = ("薪", "工资", "收入", "月入", "年入", "预算", "价", "奖金", "年终奖", "元", "块", "钱", "租",
                        "待遇", "税前", "税后", "存款", "费", "赚", "涨", "粉丝", "阅读", "播放", "点赞")
"""In the clause of a number with a capital K, they make the K a thousand (月薪15K) and a small w
ten thousand (月入2w); without them a capital K is a letter (4K电视, 8K屏幕). A small k after a
number in Chinese is always 千."""


def _zh_thousands(num: str, letter: str = "k") -> str:
    """N k (N w) in Chinese: N thousand (ten thousand) read the way it is said, the last unit
    left out after a higher one (12k -> 一万二, 1.5k -> 一千五, 8k -> 八千, 20k -> 两万, 1.5w ->
    一万五)."""
    words = zh_number(_plain_decimal(_decimal(num) * (10000 if letter == "w" else 1000)))
    m = re.fullmatch(r"(.*[万千])([一二三四五六七八九])([千百])", words)
    if m and {"万": "千", "千": "百"}[m.group(1)[-1]] == m.group(3):
        return m.group(1) + m.group(2)
    return words


def _h_kilo(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """8k, 8k-12k, 8-12K, 2w: a number of thousands (薪资8k-12k -> 八千到一万二) or of ten
    thousands (月入2w -> 两万) in Chinese when the k is small or a word of :data:`KILO_SENTENCE`
    is in the clause; else the number and the letter (4K电视 -> 四K, 功率10w -> 十w, and in
    English: 5k -> five k)."""
    a, b, k = g("kk_a"), g("kk_b"), g("kk_k")
    clause = _clause(before) + re.split(r"[，,；;]", after)[0]
    if lang == "zh" and (k == "k" or any(w in clause for w in KILO_SENTENCE)):
        return _zh_thousands(a, g("kk_ka") or k) + ("到" + _zh_thousands(b, k) if b else "")
    read = zh_number if lang == "zh" else en_number
    letter = k if lang == "zh" else f" {k}"
    if not b:
        return read(a) + letter
    sep = "到" if lang == "zh" else " to "
    return read(a) + (letter if g("kk_ka") else "") + sep + read(b) + letter


def _range_side(lang: Lang, num: str, year: bool) -> str:
    if year:
        return zh_digits(num) if lang == "zh" else en_year(int(num))
    return zh_number(num) if lang == "zh" else en_number(num)


def _h_range(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """``a-b`` / ``a~b``: a range (三到五天), a score (四比零获胜), a year range or a local phone
    number (555-0123); see :data:`SCORE_SENTENCE` for how a score and a range are told apart."""
    a, b, suf = g("r_a"), g("r_b"), (g("r_suf") or "").strip()
    pct = suf in ("%", "‰") or g("r_pa") is not None
    four = len(a) == 4 and len(b) == 4 and a.isdigit() and b.isdigit()
    measured = pct or bool(suf) or bool(g("r_ua")) or _takes_liang(after) or after.lstrip().startswith(_RANGE_UNITS)
    years = four and 1000 <= int(a) < int(b) <= 2100 and int(b) - int(a) <= 100  # 2024-2025赛季
    year = four and not suf and (after.startswith("年") or (years and not measured) if lang == "zh"
                                 else 1000 <= int(a) <= 2099)
    plain = (g("r_sep") == "-" and not measured and not g("r_sign") and not g("r_bsign") and a.isdigit()
             and b.isdigit())
    if plain and len(a) == 3 and len(b) == 4 and (
            lang == "en" or b.startswith("0") or _ends_with(before, IDENTIFIER_BEFORE, " :是为")):
        return _read_groups(lang, [a, b])  # 555-0123: a local phone number, not a range
    if plain and not year and len(a) <= 3 and len(b) <= 3 and (
            int(a) >= int(b) or _score_near(before, after) or _score_sentence(before, after)):
        return _score(lang, a, b)
    signs = ["", ""]
    if g("r_sign") or g("r_bsign"):  # -5~3℃: 零下五到三摄氏度; -10~-5℃: 零下十到零下五摄氏度
        temperature = (g("r_ua") or suf) in _TEMPERATURE_UNITS or _temperature_degrees(lang, before, after)
        minus = ("零下" if temperature else "负") if lang == "zh" else "minus "
        signs = [minus if g("r_sign") and not _said_below(before) else "", minus if g("r_bsign") else ""]
    return _range_words(lang, a, b, g("r_pa"), g("r_ua"), suf, year, after, signs,
                        "至" if g("r_sep").strip() == "至" else "到")


def _temperature_degrees(lang: Lang, before: str, after: str) -> bool:
    """A signed number before 度 after a temperature word of the clause (气温-3度, 温差-5~-1度)."""
    return lang == "zh" and after.lstrip().startswith("度") and any(w in _clause(before) for w in TEMPERATURE_BEFORE)


def _said_below(before: str) -> bool:
    """零下 written right before a minus sign (零下-3℃): the sign is not read a second time."""
    return before.rstrip().endswith("零下")


def _range_words(lang: Lang, a: str, b: str, pa: str | None, ua: str | None, suf: str, year: bool,
                 after: str, signs: list[str] | None = None, to: str = "到") -> str:
    """The reading of a range ``a`` to ``b`` with its percent sign (``pa`` after ``a`` or as
    ``suf``), unit (``ua`` after ``a``, ``suf`` after ``b``) or year reading; ``signs``: the
    words for a minus sign before each side (负, 零下, minus), empty for none; ``to``: 到, or 至
    where it is written (-10至-5℃)."""
    sa, sb = signs or ("", "")
    pct = suf in ("%", "‰") or pa is not None
    sym = suf if suf in ("%", "‰") else pa or "%"
    unit = UNITS.get(suf) or GLUED_UNITS.get(suf)
    unit_a = UNITS.get(ua or "")
    if lang == "zh":
        if pct:
            head = "百分之" if sym == "%" else "千分之"
            return f"{sa}{head}{zh_number(a)}{to}{sb}{head}{zh_number(b)}"
        if unit_a is not None:  # 5℃~10℃
            return f"{sa}{_unit_reading(lang, unit_a, a)}{to}{sb}{_unit_reading(lang, unit or unit_a, b)}"
        left, right = _range_side(lang, a, year), _range_side(lang, b, year)
        if unit is None and _takes_liang(after):  # 2-3个 -> 两到三个, 1-2天 -> 一到两天
            left, right = _liang(left, after), _liang(right, after)
        return f"{sa}{left}{to}{sb}{right}" + (unit.zh if unit else "")
    out = f"{sa}{_range_side(lang, a, year)} to {sb}{_range_side(lang, b, year)}"
    if pct:
        return out + (" percent" if sym == "%" else " per mille")
    return out + (f" {unit.en_many}" if unit else "")


_RANGE_UNITS: Final = ("个", "天", "年", "月", "日", "号", "周", "岁", "次", "人", "分钟", "小时", "秒", "元",
                       "倍", "成", "层", "公里", "米", "斤", "名", "场", "局", "届", "%", "‰", "万", "亿", "千", "百",
                       "平方")
"""Chinese words after ``a-b`` that make it a quantity range, never a score."""


def _h_percent(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    sign = (g("pc_sign") or "").replace("−", "-")
    num = g("pc_num")
    if lang == "zh":
        head = "百分之" if g("pc_sym") == "%" else "千分之"
        return ("负" if sign == "-" else "正" if sign == "+" else "") + head + zh_number(num)
    tail = " percent" if g("pc_sym") == "%" else " per mille"
    return ("minus " if sign == "-" else "plus " if sign == "+" else "") + en_number(num) + tail


_TEMPERATURE_UNITS: Final = ("℃", "°C", "℉", "°F")


def _h_unit(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    sign = (g("u_sign") or "").replace("−", "-")
    symbol = g("u_unit")
    unit = UNITS[symbol] if symbol else GLUED_UNITS[g("u_glued")]
    words = _unit_reading(lang, unit, g("u_num"))
    if sign == "-" and lang == "zh" and _said_below(before):
        pass  # 零下-3℃: 零下 is written, the sign is not read again
    elif sign == "-":
        below = lang == "zh" and symbol in _TEMPERATURE_UNITS  # -5℃: 零下五摄氏度
        words = ("零下" if below else "负" if lang == "zh" else "minus ") + words
    elif sign == "+":
        words = ("正" if lang == "zh" else "plus ") + words
    return words


_EN_DATE_BEFORE: Final = ("on", "by", "due", "until", "till", "since", "from", "before", "after", "date", "dated")


FRACTION_BEFORE: Final = ("大约", "大概", "约占", "占比", "比重", "比例", "约", "占", "超过", "将近", "接近", "近",
                          "不到", "不足", "仅有", "仅", "只有", "达到", "达", "的", "其中", "增长到", "增加到",
                          "提高到", "上升到", "升到", "下降到", "降低到", "减少到", "降到", "乘以", "除以", "等于",
                          "加上", "减去")
"""Written right before ``a/b`` in Chinese (为/是 between allowed), they make it a fraction
(大约11/12的时间, 占总数的2/5, 约为1/3)."""
FRACTION_AFTER: Final = re.compile(
    r"的(?:人|时间|用户|学生|老师|人口|概率|几率|比例|份额|部分|面积|员工|家庭|企业|公司|患者|受访者|网友|样本|收入|"
    r"工作|精力|预算|市场|选民|居民|土地|资金|成本|观众|玩家|股份|情况|可能)|以上|以下|左右|之多|之一|之间|强|弱")
"""Written right after ``a/b`` (or a range of two), they make it a fraction (12/25的人, 3/5以上),
as does a measure word (3/4杯水)."""
DATE_BEFORE: Final = ("截止到", "截止日期", "截止", "截至", "直到", "直至", "定于", "将于", "定在", "到", "至", "于",
                      "从", "自", "日期为", "日期是", "日期", "期限", "有效期至", "有效期", "每年", "今年", "明年",
                      "去年", "节是", "节", "生日是", "生日", "纪念日", "今天", "明天", "昨天", "后天", "前天")
"""Written right before ``a/b`` in Chinese (是/为 between allowed), they make it a month and day
(截止12/31, 于3/5, 明天是3/5), as does a weekday (周二3/5)."""
DATE_AFTER: Final = ("之前", "之后", "以前", "以后", "前", "后", "起", "开始", "截止", "到期", "当天", "那天", "当日",
                     "晚上", "晚", "上午", "下午", "中午", "早上", "凌晨", "举行", "举办", "开幕", "发布", "上映",
                     "上线", "生效", "出发", "放假", "过期", "开业", "开学", "周", "星期", "(周", "（周")
"""Written right after ``a/b`` (or a range of two), also after an adverb of
:data:`_DATE_ADVERBS`, they make it a month and day (12/31前, 3/5举行, 3/5正式上线)."""
_DATE_ADVERBS: Final = ("正式", "将会", "准时", "如期", "统一", "全面")
_WEEKDAY_END: Final = re.compile(r"(?:周|星期|礼拜)[一二三四五六日天]\s?[(（]?\s?$")


_FESTIVAL: Final = re.compile(r"(?:(?!的)[\u4e00-\u9fa5]){0,3}节(?![课目奏约省能点拍])|元旦|除夕|大促")
"""A festival or sale day right after m/d (3/8妇女节, 5/1劳动节, 1/1元旦, 6/18大促): a date."""


def _zh_slash_kind(a: str, b: str, before: str, after: str) -> Literal["date", "fraction", "either"]:
    """What context words make of ``a/b`` in Chinese: a fraction (:data:`FRACTION_BEFORE`; after
    it :data:`FRACTION_AFTER` or a measure word), a date (:data:`DATE_BEFORE`,
    :data:`DATE_AFTER`), ``either`` when no word decides. Words before it are looked at first,
    then words after; a/b that is no month and day is a fraction."""
    if not (1 <= int(a) <= 12 and 1 <= int(b) <= 31):
        return "fraction"
    after = after.lstrip()
    if _ends_with(before, FRACTION_BEFORE, " 为是"):
        return "fraction"
    if _ends_with(before, DATE_BEFORE, " :：是为") or _WEEKDAY_END.search(before):
        return "date"
    if (after.startswith(DATE_AFTER) or (after[:2] in _DATE_ADVERBS and after[2:].startswith(DATE_AFTER))
            or _FESTIVAL.match(after)):
        return "date"
    if FRACTION_AFTER.match(after) or _takes_liang(after):
        return "fraction"
    return "either"


def _zh_slash_date(a: str, b: str, before: str, after: str) -> bool:
    """Whether ``a/b`` in Chinese is a month and day rather than a fraction: as context words
    say (:func:`_zh_slash_kind`), else a date when it is written with a leading zero (03/05),
    has a day over 12 (12/25: no fraction has such a denominator in running text) or a month
    not less than its day (10/1, 11/11: an improper fraction is rare); else a fraction (3/5)."""
    kind = _zh_slash_kind(a, b, before, after)
    if kind != "either":
        return kind == "date"
    return a.startswith("0") or b.startswith("0") or int(b) > 12 or int(a) >= int(b)


def _en_slash_date(a: str, b: str, before: str) -> bool:
    """English: m/d is a date when zero-padded (03/05) or after on/by/until/... (on 3/5)."""
    return 1 <= int(a) <= 12 and 1 <= int(b) <= 31 and (
        a.startswith("0") or b.startswith("0") or _ends_with(before.lower(), _EN_DATE_BEFORE))


def _h_fraction(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """``a/b``: a fraction (五分之三) or, as its context says, a month and day (US order in
    English: on 3/5; 截止12/31 in Chinese, see :func:`_zh_slash_date`)."""
    a, b = g("fr_a"), g("fr_b")
    if _zh_slash_date(a, b, before, after) if lang == "zh" else _en_slash_date(a, b, before):
        return _zh_date(None, int(a), int(b)) if lang == "zh" else _en_date(None, int(a), int(b))
    return _fraction(lang, int(a), int(b))


def _h_mdrange(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """``a/b-c/d``: two months and days (3/5-3/8 -> 三月五日到三月八日) or two fractions
    (1/3-1/2的人 -> 三分之一到二分之一). Context words decide as for one (:func:`_zh_slash_kind`);
    without them it is a date range when the dates run forward and the fractions do not
    (3/5-3/8), or when either side alone reads as a date (12/24-12/26)."""
    a1, b1, a2, b2 = g("ma_m"), g("ma_d"), g("mb_m"), g("mb_d")
    sep = g("mr_sep").strip()
    valid = all(1 <= int(m) <= 12 and 1 <= int(d) <= 31 for m, d in ((a1, b1), (a2, b2)))
    # the dates run forward while the fractions do not grow: 3/5-3/8
    forward = (int(a1), int(b1)) < (int(a2), int(b2)) and int(a1) * int(b2) >= int(a2) * int(b1)
    if lang == "zh":
        kind = _zh_slash_kind(a1, b1, before, after) if valid else "fraction"
        if kind == "either":
            kind = _zh_slash_kind(a2, b2, "", after)
        date = kind == "date" or (kind == "either" and (
            forward or _zh_slash_date(a1, b1, "", "") or _zh_slash_date(a2, b2, "", "")))
    else:
        date = valid and (_en_slash_date(a1, b1, before) or forward)
    if date:
        sides = [_zh_date(None, int(m), int(d)) if lang == "zh" else _en_date(None, int(m), int(d))
                 for m, d in ((a1, b1), (a2, b2))]
    else:
        sides = [_fraction(lang, int(x), int(y)) for x, y in ((a1, b1), (a2, b2))]
    if lang == "zh":
        return sides[0] + ("至" if sep == "至" else "到") + sides[1]
    return f"{sides[0]} to {sides[1]}"


def _h_drange(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """``2024.3.5-2024.3.8``, ``2024/3/5-3/8``: a range of dates, read 到 / to; a second date
    without its year is read without it."""
    first = (g("da_y"), int(g("da_m")), int(g("da_d")))
    second = (g("db_y"), int(g("db_m")), int(g("db_d")))
    if lang == "zh":
        return _zh_date(*first) + "到" + _zh_date(*second)
    return _en_date(*first) + " to " + _en_date(*second)


def _h_ordinal(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return en_ordinal(int(g("ord")))


def _h_numero(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    """No.1 / No.12345678: 第一 / number one; three or more digits are an identifier."""
    num = g("no_num")
    if len(num) >= 3:
        return _read_groups(lang, _digit_groups(num))
    return "第" + zh_number(num) if lang == "zh" else "number " + en_number(num)


def _h_dotted(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    parts = g("dot").split(".")
    if len(parts) == 4 and all(len(p) <= 3 and int(p) <= 255 for p in parts):  # an IPv4 address
        if lang == "zh":
            return "点".join(zh_digits(p) for p in parts)
        return " dot ".join(en_digits(p) for p in parts)
    if lang == "zh":
        return "点".join(zh_number(p) for p in parts)
    return " point ".join(en_number(p) for p in parts)


_DATE_WORDS: Final = ("月", "日", "号", "点", "时", "分", "秒")


def _h_number(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    sign = (g("n_sign") or "").replace("−", "-")
    num, plus = g("n_num"), bool(g("n_plus"))
    if lang == "zh":
        words = _zh_count(num, before, after.lstrip())
        if sign == "-" and _said_below(before):
            return words  # 零下-3度
        if sign == "-" and _temperature_degrees(lang, before, after):
            return "零下" + words  # 温度-3.5度
        return ("负" if sign == "-" else "正" if sign == "+" else "") + words + ("多" if plus else "")
    if not sign and len(num) == 4 and num.isdigit() and 1100 <= int(num) <= 2099 and _year_context(before):
        return en_year(int(num))
    if num.isdigit() and (len(num) >= LONG_IDENTIFIER_DIGITS or (len(num) >= 3 and before[-1:].isupper())):
        return _read_groups(lang, _digit_groups(num))  # a card number, CA981
    words = en_number(num)
    return ("minus " if sign == "-" else "plus " if sign == "+" else "") + words + (" plus" if plus else "")


def _zh_count(num: str, before: str, after: str) -> str:
    """A plain number in Chinese, by what surrounds it: an identifier (拨打110, a card number,
    four or more digits glued to a capital letter: G1234, RTX4090) digit by digit with 幺; a
    year (2024年, 24年3月, 公元前221年) or a generation (80后) digit by digit; a date part
    without its leading zero (03月); else a cardinal, with 两 before a measure word."""
    digits = num.isdigit()
    listed = re.search(r"\d{3,}\s*(?:或者|或是|或|和|及|、|/)\s*$", before)  # 拨打12345或12315
    if listed and len(num) >= 3 and _ends_with(before[:listed.start() + 1], IDENTIFIER_BEFORE, " :是为0123456789"):
        return "，".join(zh_digits(grp, one="幺") for grp in _digit_groups(num))
    if digits and len(num) == ID_CARD_DIGITS - 1 and after[:1] in ("X", "x"):
        return "，".join(zh_digits(grp, one="幺") for grp in (num[:6], num[6:14], num[14:]))  # ID ending in X
    if digits and (len(num) >= LONG_IDENTIFIER_DIGITS or (len(num) >= 4 and before[-1:].isupper())
                   or (len(num) >= 3 and not _takes_liang(after) and not after.startswith(_RANGE_UNITS)
                       and _ends_with(before.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), IDENTIFIER_BEFORE, " :是为"))):
        return "，".join(zh_digits(grp, one="幺") for grp in _digit_groups(num))
    if digits and after.startswith("年") and (
            (len(num) == 4 and 1100 <= int(num) <= 2199) or (len(num) == 2 and re.match(r"年\s?\d", after))
            or (len(num) <= 4 and before.rstrip().endswith(("公元", "公元前")))):
        return zh_digits(num)
    if digits and len(num) == 4 and 1900 <= int(num) <= 2099 and after.startswith(_YEAR_LABELS):
        return zh_digits(num)  # 2024赛季, 2024款, 2024版
    if digits and len(num) == 2 and re.match(r"后(?![悔来面边续期天年果退])", after):
        return zh_digits(num)  # 80后, 95后, 00后: generations
    if digits and num.startswith("0") and len(num) <= 2 and after.startswith(_DATE_WORDS):
        num = num.lstrip("0") or "0"  # 03月05日
    if before.rstrip().endswith("第"):
        return zh_number(num)  # 第2名: an ordinal, never 两
    return _liang(zh_number(num), after)


_YEAR_LABELS: Final = ("赛季", "款", "版", "财年", "年度", "届")
"""After a four-digit number from 1900 to 2099 they make it a year read digit by digit."""


def _clause(before: str) -> str:
    """The part of ``before`` after its last comma or semicolon."""
    return re.split(r"[，,；;]", before)[-1]


_YEAR_WORDS: Final = {"in", "since", "by", "until", "till", "from", "year", "of", "during", "before", "after",
                      "early", "late", "mid", *_MONTHS_EN, *_MONTH_ABBR}


def _year_context(before: str) -> bool:
    """English: a 4-digit number after 'in', 'since', a month name, ... is a year, and so is
    the second of 'from 2010 to 2020' / 'between 2010 and 2020'."""
    if re.search(r"\b(?:from|between)\s+\d{4}\s+(?:to|and|until|till)\s*$", before, re.IGNORECASE):
        return True
    words = re.findall(r"[A-Za-z]+", before)
    return bool(words) and before.rstrip(" ,").endswith(words[-1]) and (
        words[-1] in _YEAR_WORDS or words[-1].lower() in _YEAR_WORDS)


def _h_email(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return _email(lang, g("email"))


def _h_url(lang: Lang, g: Callable[[str], str], before: str, after: str) -> str:
    return _url(lang, g("url"))


_HANDLERS: Final[dict[str, Callable[[Lang, Callable[[str], str], str, str], str]]] = {
    "drange": _h_drange, "mdrange": _h_mdrange, "ymd": _h_ymd, "mdy": _h_mdy, "md": _h_md, "dm": _h_dm,
    "trange": _h_trange, "time": _h_time,
    "ratio": _h_ratio, "hap": _h_hap, "phone": _h_phone, "groups": _h_groups, "hm": _h_hm, "money": _h_money,
    "yuan": _h_yuan, "coded": _h_coded, "times": _h_times, "twentyfour": _h_twentyfour, "perunit": _h_perunit,
    "decade": _h_decade, "kilo": _h_kilo, "range": _h_range, "percent": _h_percent, "unit": _h_unit,
    "fraction": _h_fraction, "ordinal": _h_ordinal, "numero": _h_numero, "dotted": _h_dotted, "number": _h_number,
    "email": _h_email, "url": _h_url,
}
LIBRARY_KINDS: Final[frozenset[str]] = frozenset({"ymd", "fraction", "percent", "ratio"})
"""Entity kinds whose Chinese reading is WeTextProcessing's when the library is on, chosen by
measurement on the corpus: every corpus instance of these kinds in Chinese context (7 dates
2024-03-05/2024/3/5/2024.3.5, 5 fractions, 13 percentages without sign, 9 ratios) is read
as expected by the library on the span alone. Not routed, because the corpus shows the
library wrong on them: plain numbers (两 before 台/倍/次/种..., 第两名, years, identifiers),
ranges and scores (4-0 -> 四减零, 10-20% -> 十月二日...), times (3:30分 -> 三比三零分,
0:30 -> 零比三十), time ranges (0:00-6:00), phone numbers and digit groups, money (¥88.8元 ->
八元八点八元), units (GWh, mAh, 零下), signed percentages and ‰. A span the library leaves
with digits or symbols, or on which it fails, is read by our rules."""


def _neighbour(text: str, pos: int, step: int) -> str:
    while 0 <= pos < len(text) and text[pos] == " ":
        pos += step
    return text[pos] if 0 <= pos < len(text) else ""


_RANGE_MARKS: Final = "-~–—"
_WEEKDAY: Final = re.compile(r"(?:周|星期|礼拜)[一二三四五六日天]")


def _range_mark(text: str, i: int) -> bool:
    """A dash or tilde that joins two quantities written with Chinese units (5月1日-5月5日,
    2020年-2024年) or two weekdays (周一～周五): read 到."""
    prev, nxt = _neighbour(text, i - 1, -1), _neighbour(text, i + 1, 1)
    if nxt.isdigit() and _is_cjk(prev):
        return any(ch.isdigit() for ch in text[max(0, i - 4):i])
    return bool(_WEEKDAY.search(text[max(0, i - 3):i]) and _WEEKDAY.match(text, i + 1))


def _after_myriad(text: str, i: int) -> bool:
    """A plus sign right after a number written with 万/亿/千/百 (1万+, 10亿+) and before no
    number: "more than", read 多."""
    return (re.search(r"\d[百千万亿]$", text[max(0, i - 2):i]) is not None
            and not _neighbour(text, i + 1, 1).isdigit())


def _per_unit(text: str, i: int) -> bool:
    """A slash between a unit after a number and another unit (7.5元/升, 80次/分钟): read 每."""
    prev, nxt = _neighbour(text, i - 1, -1), _neighbour(text, i + 1, 1)
    return ((_is_cjk(prev) or _is_latin(prev) or prev in "²³" or prev.isdigit()) and _is_cjk(nxt)
            and any(ch.isdigit() for ch in text[max(0, i - 8):i]))


def _plain(ctx: _Context, start: int, end: int, out: _Out) -> None:
    """Text between matches: letters and Chinese characters kept, punctuation mapped to pauses
    in the local language, spoken symbols and Greek letters read, the rest reported as dropped."""
    text = ctx.text
    for i in range(start, end):
        c = text[i]
        if _is_cjk(c):
            if c > LAST_SPOKEN_CJK:  # not in ChatTTS' vocabulary
                out.drop(c)
                out.pieces.append(" ")
            else:
                out.letter(c)
        elif _is_latin(c):
            out.letter(c)
        elif c == "\n":
            out.pieces.append("。" if _mark_lang(ctx, i, out) == "zh" else ".")
        elif c.isspace():
            out.pieces.append(" ")
        elif c == "》" and text[i + 1:i + 2] == "《":
            out.pieces.append("、")  # 《红楼梦》《西游记》: a list of titles
        elif c in _SILENT_MARKS:
            continue
        elif c in _BETWEEN_NUMBERS and _neighbour(text, i - 1, -1).isdigit() and _neighbour(text, i + 1, 1).isdigit():
            zh, en = _BETWEEN_NUMBERS[c]
            out.words(ctx.lang(i, i + 1), zh if ctx.lang(i, i + 1) == "zh" else en)
        elif c in _RANGE_MARKS and _range_mark(text, i):
            lang = ctx.lang(i, i + 1)
            out.words(lang, "到" if lang == "zh" else "to")
        elif c == "~" and _neighbour(text, i + 1, 1).isdigit() and not _neighbour(text, i - 1, -1).isdigit():
            lang = ctx.lang(i, i + 1)
            out.words(lang, "约" if lang == "zh" else "about")  # ~100人: about
        elif c == "/" and _per_unit(text, i):
            out.words("zh", "每")
        elif c == "+" and _after_myriad(text, i):
            out.words("zh", "多")  # 1万+人: 一万多人, as 6000+ reads 六千多
        elif c in ("-", "_") and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.pieces.append(" ")  # e-mail, snake_case: a word break
        elif c == "#":
            if _neighbour(text, i + 1, 1).isdigit():
                lang = ctx.lang(i, i + 1)
                out.words(lang, "井号" if lang == "zh" else "number")
            # elsewhere (#话题#) silent
        elif c in SYMBOL_WORDS or c in GREEK_NAMES:
            lang = ctx.lang(i, i + 1)
            zh, en = SYMBOL_WORDS.get(c) or GREEK_NAMES[c]
            out.words(lang, zh if lang == "zh" else en)
        elif c in _END_MARKS:
            out.pieces.append("。" if _mark_lang(ctx, i, out) == "zh" else ".")
        elif c in _COMMA_MARKS:
            if c == "、" and _mark_lang(ctx, i, out) == "zh":
                out.pieces.append("、")
            else:
                out.pieces.append("，" if _mark_lang(ctx, i, out) == "zh" else ",")
        elif unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue  # variation selectors, joiners, combining marks: part of the character before
        else:
            out.drop(c)
            out.pieces.append(" ")


def _mark_lang(ctx: _Context, i: int, out: _Out) -> Lang:
    """Punctuation belongs to the clause it closes: the language of the last spoken output
    decides (the context's when nothing was spoken yet)."""
    return out.last_lang or ctx.lang(i, i + 1)


_PUNCT_RUN: Final = re.compile(r"[，。、,.](?:[ ]*[，。、,.])+")
_CJK_OR_MARK: Final = "\u4e00-\u9fff，。、"


def _collapse_marks(m: re.Match[str]) -> str:
    run = m.group(0).replace(" ", "")
    zh = any(c in "，。、" for c in run)
    if any(c in "。." for c in run):
        return "。" if zh else "."
    return "，" if zh else ","


def _tidy(text: str) -> str:
    """Collapse spaces and repeated pause marks, drop spaces inside Chinese, strip edges."""
    text = _PUNCT_RUN.sub(_collapse_marks, text)
    text = re.sub(r"[ ]+", " ", text)
    text = re.sub(rf"(?<=[{_CJK_OR_MARK}]) (?=[{_CJK_OR_MARK}])", "", text)
    text = re.sub(r" (?=[，。、,.])", "", text)
    text = re.sub(r"(?<=[，。、]) ", "", text)
    text = re.sub(r"([,.])(?=[A-Za-z])", r"\1 ", text)
    text = re.sub(r"^[\s，。、,.]+", "", text)
    text = re.sub(r"[\s，、,]+$", "", text)
    text = re.sub(r"(?<=\]) (?=[\u4e00-\u9fff])|(?<=[\u4e00-\u9fff]) (?=\[)", "", text)
    return text.strip()


def split_segments(text: str) -> tuple[Segment, ...]:
    """Split text into runs of Chinese (``zh``) and English (``en``).

    Chinese characters start or continue a ``zh`` run, Latin letters an ``en`` run; everything
    else (spaces, digits, marks, control tokens) joins the current run, or the first run when
    it comes before any letter. Text without letters is one ``zh`` run; ``''`` gives ``()``.
    """
    segments: list[list[str]] = []
    langs: list[Lang] = []
    pending = ""
    i = 0
    while i < len(text):
        tag = CONTROL_TOKEN.match(text, i)
        if tag:
            piece, i = tag.group(0), tag.end()
            lang = None
        else:
            piece, i = text[i], i + 1
            lang = _script(piece)
        if lang is None:
            if segments:
                segments[-1].append(piece)
            else:
                pending += piece
            continue
        if not langs or langs[-1] != lang:
            langs.append(lang)
            segments.append([pending + piece])
            pending = ""
        else:
            segments[-1].append(piece)
    if pending:  # no letter at all
        return (Segment("zh", pending),)
    return tuple(Segment(lang, "".join(parts)) for lang, parts in zip(langs, segments))


_SPEED_TOKEN: Final = re.compile(r"\[speed_(\d)\]")


def speed_of(text: str) -> int | None:
    """N of the first valid ``[speed_N]`` token (N in 0..9) in ``text``, or None."""
    m = _SPEED_TOKEN.search(text)
    return int(m.group(1)) if m else None


def carry_speed(segments: list[str]) -> list[str]:
    """Give every sentence segment of one text the speed of that text's first ``[speed_N]``.

    :func:`normalize` moves the first ``[speed_N]`` of the text it sees into the prompt; when a
    long text is split into segments that are prepared one by one, a token written (or
    prepended by the gateway for OpenAI's ``speed``) at the start would otherwise only reach
    the first segment. Returns new segments, each prefixed with that token (unchanged when the
    text has none).
    """
    for seg in segments:
        n = speed_of(seg)
        if n is not None:
            return [f"[speed_{n}]{s}" for s in segments]
    return list(segments)


RAW_LENGTH_FACTOR: Final = 2
"""Text may be this many times the character limit long counting control tokens."""


def length_error(text: str, max_chars: int) -> str | None:
    """The refusal message when ``text`` is over the limit, else None: characters are counted
    without ChatTTS control tokens and without whitespace at both ends (a text file's final
    newline does not count); with control tokens the raw text may be ``RAW_LENGTH_FACTOR``
    times the limit. Used by every entry point and the front end, so all count alike."""
    spoken = len(CONTROL_TOKEN.sub("", text).strip())
    if spoken > max_chars or len(text) > RAW_LENGTH_FACTOR * max_chars:
        return f"text has {spoken} characters; the limit is {max_chars}"
    return None
