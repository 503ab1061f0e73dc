"""Tables: month names, units, currencies, multipliers, spoken symbols, Greek letters and the
punctuation classes."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from .base import Lang
from .numbers import en_number, liang, to_decimal, zh_number

MONTHS_EN: Final = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
                     "October", "November", "December")
MONTH_ABBR: Final = {m[:3]: i + 1 for i, m in enumerate(MONTHS_EN)} | {"Sept": 9}
MONTH_RE: Final = ("(?:" + "|".join(sorted([*MONTHS_EN, *MONTH_ABBR], key=len, reverse=True)) + r")\b")


WEEKDAYS_EN: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEEKDAY_ABBR: Final = {"Mon": 0, "Tue": 1, "Tues": 1, "Wed": 2, "Thu": 3, "Thur": 3, "Thurs": 3, "Fri": 4, "Sat": 5,
                        "Sun": 6}
WEEKDAY_RE: Final = "(?:" + "|".join(sorted([*WEEKDAYS_EN, *_WEEKDAY_ABBR], key=len, reverse=True)) + r")\b"
"""An English weekday, written out or abbreviated (Mon, Tues, Thurs)."""


def weekday_name(name: str) -> tuple[str, int]:
    """The full English name of a weekday written out or abbreviated, and its index (Monday 0)."""
    index = WEEKDAYS_EN.index(name) if name in WEEKDAYS_EN else _WEEKDAY_ABBR[name]
    return WEEKDAYS_EN[index], index


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
    "cm³": Unit("立方厘米", "cubic centimeter", "cubic centimeters"),
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
    "mmHg": Unit("毫米汞柱", "millimeter of mercury", "millimeters of mercury", liang=False),
    "kPa": Unit("千帕", "kilopascal", "kilopascals"),
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
    """A currency's readings; ``minor``: English name of the hundredth (None: read decimals);
    ``written``: Chinese words for it that may be written after the amount as well (¥100元,
    ₩100韩元), read once."""

    zh: str
    en_one: str
    en_many: str
    minor_one: str | None = None
    minor_many: str | None = None
    written: tuple[str, ...] = ()


CURRENCIES: Final[dict[str, Currency]] = {
    "USD": Currency("美元", "dollar", "dollars", "cent", "cents", ("美元",)),
    "EUR": Currency("欧元", "euro", "euros", "cent", "cents", ("欧元",)),
    "GBP": Currency("英镑", "pound", "pounds", "penny", "pence", ("英镑",)),
    "HKD": Currency("港元", "Hong Kong dollar", "Hong Kong dollars", "cent", "cents", ("港元", "港币")),
    "CNY": Currency("元", "yuan", "yuan", written=("元", "块")),
    "JPY": Currency("日元", "yen", "yen", written=("日元",)),
    "TWD": Currency("新台币", "New Taiwan dollar", "New Taiwan dollars", "cent", "cents", ("新台币",)),
    "AUD": Currency("澳元", "Australian dollar", "Australian dollars", "cent", "cents", ("澳元",)),
    "CAD": Currency("加元", "Canadian dollar", "Canadian dollars", "cent", "cents", ("加元",)),
    "SGD": Currency("新加坡元", "Singapore dollar", "Singapore dollars", "cent", "cents", ("新加坡元",)),
    "KRW": Currency("韩元", "won", "won", written=("韩元",)),
    "INR": Currency("卢比", "rupee", "rupees", written=("卢比",)),
    "RUB": Currency("卢布", "ruble", "rubles", written=("卢布",)),
    "THB": Currency("泰铢", "baht", "baht", written=("泰铢",)),
    "VND": Currency("越南盾", "dong", "dong", written=("越南盾",)),
    "PHP": Currency("菲律宾比索", "Philippine peso", "Philippine pesos", written=("菲律宾比索", "比索")),
    "TRY": Currency("土耳其里拉", "lira", "lira", written=("土耳其里拉", "里拉")),
    "BRL": Currency("雷亚尔", "real", "reais", written=("雷亚尔",)),
    "CHF": Currency("瑞士法郎", "Swiss franc", "Swiss francs", written=("瑞士法郎", "法郎")),
    "MYR": Currency("林吉特", "ringgit", "ringgit", written=("林吉特",)),
    "ILS": Currency("新谢克尔", "shekel", "shekels", written=("新谢克尔", "谢克尔")),
    "UAH": Currency("格里夫纳", "hryvnia", "hryvnias", written=("格里夫纳",)),
    "NGN": Currency("奈拉", "naira", "naira", written=("奈拉",)),
    "MOP": Currency("澳门元", "pataca", "patacas", written=("澳门元",)),
}
CURRENCY_SIGNS: Final = {"$": "USD", "US$": "USD", "HK$": "HKD", "¥": "CNY", "€": "EUR", "£": "GBP", "NT$": "TWD",
                         "A$": "AUD", "AU$": "AUD", "C$": "CAD", "CA$": "CAD", "S$": "SGD", "₩": "KRW", "₹": "INR",
                         "₽": "RUB", "฿": "THB", "₫": "VND", "₱": "PHP", "₺": "TRY", "R$": "BRL", "₪": "ILS",
                         "₴": "UAH", "₦": "NGN", "MOP$": "MOP"}
"""Currency signs written before the amount (no space needed)."""
CURRENCY_CODES: Final = {**{code: code for code in CURRENCIES}, "RMB": "CNY", "Rs.": "INR", "Rs": "INR",
                         "RM": "MYR"}
"""Currency codes (and abbreviations) written before or after the amount, a space allowed."""
CURRENCY_OF: Final = {**CURRENCY_SIGNS, **CURRENCY_CODES}
"""Every written currency sign or code and the currency (key of :data:`CURRENCIES`) it stands for."""
MULTIPLIERS: Final = {"k": (Decimal(10**3), "thousand"), "m": (Decimal(10**6), "million"),
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
    "₩": ("韩元", "won"), "₹": ("卢比", "rupees"), "₽": ("卢布", "rubles"), "฿": ("泰铢", "baht"),
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
BETWEEN_NUMBERS: Final[dict[str, tuple[str, str]]] = {
    "<": ("小于", "less than"), ">": ("大于", "greater than"), "*": ("乘", "times"), "/": ("除以", "divided by"),
    "^": ("的次方", "to the power of"),
}
"""Symbols read as operators only between two numbers (3 < 5, 4*2); elsewhere they are
pauses (``<`` ``>`` ``/``) or unspeakable (``*`` ``^``)."""

COMMA_MARKS: Final = set(",;:()[]{}<>|~、，；：（）【】〔〕—–-/·")
END_MARKS: Final = set(".!?。！？")
SILENT_MARKS: Final = set("\"'`“”‘’«»‹›「」『』《》〈〉")
"""Quotes and title marks: no sound and no pause (two titles in a row, ``》《``, are a list: 、)."""


def month_number(name: str) -> int:
    if name in MONTHS_EN:
        return MONTHS_EN.index(name) + 1
    return MONTH_ABBR[name]


def unit_reading(lang: Lang, unit: Unit, num: str) -> str:
    if lang == "zh":
        words = zh_number(num)
        return (liang(words, "个") if unit.liang else words) + unit.zh
    value = to_decimal(num)
    return f"{en_number(num)} {unit.en_one if value == 1 else unit.en_many}"


TEMPERATURE_UNITS: Final = ("℃", "°C", "℉", "°F")
