"""Arithmetic: an equation of numbers and operators (``9 - 4 = 5``, ``3×4=12``) reads its
operators as words: 减 / minus, 加 / plus, 乘以 / times, 除以 / divided by, 等于 / equals. A dash
between two numbers is a minus only in an equation; elsewhere it is a range or a score
(:mod:`.ranges`)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import NUM, Groups, Kind, alt, alt_words
from .numbers import en_number, zh_number
from .tables import UNITS

_OPERATORS: Final = {"+": ("加", "plus"), "-": ("减", "minus"), "−": ("减", "minus"), "×": ("乘以", "times"),
                     "*": ("乘以", "times"), "/": ("除以", "divided by"), "÷": ("除以", "divided by"),
                     "=": ("等于", "equals"), "x": ("乘以", "times")}
_TOKEN: Final = re.compile(rf"(?P<num>(?<![\d.])[-−]?{NUM})|(?P<op>[-−+×*/÷=]|(?<= )x(?= ))")


def _read_arithmetic(lang: Lang, g: Groups, before: str, after: str) -> str:
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


ARITHMETIC: Final = Kind(
    "arithmetic",
    rf"(?P<arith>(?<![\d.A-Za-z])[-−]?{NUM}(?:(?:\s*[-−+×*/÷]\s*| x )[-−]?{NUM})+\s*=\s*(?:[-−]?{NUM}(?![\d.]))?)",
    _read_arithmetic, first=r"[-−\d]")


# --- formulas: letters, powers and roots inside a sentence --------------------------

_SUPERSCRIPTS: Final = {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8",
                        "⁹": "9", "ⁿ": "n", "⁻": "-"}
"""Superscript exponents (fold_width keeps them): x², 10⁻³, aⁿ."""
_ROOTS: Final = {"√": ("根号", "the square root of"), "∛": ("三次根号", "the cube root of"),
                 "∜": ("四次根号", "the fourth root of")}
_RELATIONS: Final = {"=": ("等于", "equals"), "≠": ("不等于", "is not equal to"),
                     "≤": ("小于等于", "is less than or equal to"),
                     "≥": ("大于等于", "is greater than or equal to"), "<": ("小于", "is less than"),
                     ">": ("大于", "is greater than"), "≈": ("约等于", "is approximately")}
_FORMULA_OPS: Final = {**{k: v for k, v in _OPERATORS.items() if k != "="}, "±": ("正负", "plus or minus")}

_SUP: Final = r"(?:⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+|ⁿ|\^[-−]?\d{1,3}(?![\d.])|\^n(?![A-Za-z]))"
"""An exponent: superscript digits, or a caret and the power (10^6, 2^-3, x^n)."""
_VAR: Final = r"(?<![A-Za-z\d.])[A-Za-z](?![A-Za-z\d])"
"""A variable: one Latin letter that is no part of a word (a, x), not glued to a number's end."""
_NUMV: Final = rf"{NUM}(?:(?!(?:[cdkm]?m)[²³])[A-Za-z]{{1,2}}(?![A-Za-z]))?"
"""A number, perhaps times one or two variables (2a, 3x, 2ab; 5m² and 3cm³ are units)."""
_OP: Final = r"\s?[-+×*/÷±]\s?"
_REL: Final = r"\s?[=≠≤≥<>≈]\s?"
_ROOT: Final = r"[√∛∜]"
_INNER: Final = rf"{_ROOT}?(?:{_NUMV}|{_VAR}){_SUP}?"
_VARS: Final = rf"(?<![A-Za-z\d.])(?!(?:[cdkm]?m|ft|in|mi|yd)[²³])[A-Za-z]{{2}}(?={_SUP})"
"""Two variables under one exponent (E = mc²); km², cm³ and ft² are units."""
_FUNC: Final = rf"(?<![A-Za-z\d.])[a-z]\((?:[A-Za-z]|{NUM})\)"
"""A function of one argument: f(x), g(2)."""
_PLAIN: Final = rf"(?:{_FUNC}|{_NUMV}|{_VAR}|{_VARS}|\([-±]?{_INNER}(?:{_OP}{_INNER})*\))"
_ATOM: Final = rf"{_ROOT}?{_PLAIN}{_SUP}?"
_SPECIAL: Final = rf"(?:{_ROOT}{_PLAIN}{_SUP}?|{_PLAIN}{_SUP})"
"""An operand with a root or an exponent: what makes a run of letters and numbers a formula."""
_OPREL: Final = rf"(?:{_OP}|{_REL})"
_REST: Final = rf"(?:{_OPREL}[-±]?{_ATOM})*"
_FORMULA: Final = (rf"[-±]?(?:{_ATOM}{_OPREL})*?{_SPECIAL}{_REST}"
                   rf"|[-±]?(?:{_ATOM}{_OP})*?{_VAR}{_SUP}?{_REL}[-±]?{_ATOM}{_REST}"
                   rf"|[-±]?(?:{_ATOM}{_OP})*?{_ATOM}{_REL}[-±]?{_VAR}{_REST}"
                   rf"|{_FUNC}{_REST}")
"""A formula: operands and operators with a root or an exponent somewhere (a²-b²=0, √3, 2³),
or a variable on one side of a relation (x=5, a≤b, 3<x)."""
_FTOKEN: Final = re.compile(rf"(?P<num>{NUM})|(?P<sup>{_SUP})|(?P<var>[A-Za-z])|(?P<root>{_ROOT})|(?P<open>\()"
                            r"|(?P<close>\))|(?P<rel>[=≠≤≥<>≈])|(?P<op>[-+×*/÷±])")


_SUP_AT: Final = re.compile(_SUP)
_RESULT_OF: Final = {"+": "的和", "-": "的差", "×": "的积", "*": "的积", "/": "的商", "÷": "的商"}
"""What a bracket of one operator is called before its power: (a+b)² reads a加b的和的平方."""


def _power(lang: Lang, sup: str) -> str:
    """²: 的平方 / squared; ³: 的立方 / cubed; ⁿ: 的n次方 / to the n; ⁻³: 的负三次方 / to the power of minus three."""
    caret = sup.startswith("^")
    exp = sup[1:].replace("−", "-") if caret else "".join(_SUPERSCRIPTS[c] for c in sup)
    if lang == "zh":  # 10^3米 is 十的三次方米: 的立方 before 米 would say cubic metres
        return ({"2": "的平方"} if caret else {"2": "的平方", "3": "的立方"}).get(exp) or "的" + (
            exp if exp == "n" else zh_number(exp)) + "次方"
    return {"2": "squared", "3": "cubed", "n": "to the n"}.get(exp) or "to the power of " + en_number(exp)


def _read_formula(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A formula read in the language of its sentence, never in English for its letters alone
    (已知a²-b²=0: a的平方减b的平方等于零; √3: 根号三); a sign where an operand is expected is
    负 / minus, numbers are cardinals (never 两)."""
    zh = lang == "zh"
    words: list[str] = []
    expect = True  # an operand comes next: a - here is a sign
    group_ops: list[str] = []  # the operators inside the open bracket
    formula = g("formula")
    for m in _FTOKEN.finditer(formula):
        kind, tok = m.lastgroup, m.group(0)
        if kind == "num":
            words.append(zh_number(tok) if zh else en_number(tok))
            expect = False
        elif kind == "var":
            words.append(tok)
            expect = False
        elif kind == "sup":
            words.append(_power(lang, tok))
        elif kind == "root":
            words.append(_ROOTS[tok][not zh] + ("下" if zh and m.end() < len(g("formula"))
                                                 and g("formula")[m.end()] == "(" else ""))
        elif kind == "open" and m.start() > 0 and formula[m.start() - 1].isalpha():
            words.append("" if zh else "of")  # f(x): f of x
        elif kind == "open":
            words.append("" if zh else "the quantity")
            expect, group_ops = True, []
        elif kind == "close":
            expect = False
            if zh and _SUP_AT.match(formula, m.end()) and len(set(group_ops)) == 1:
                words.append(_RESULT_OF.get(group_ops[0], ""))  # (a+b)²: a加b的和的平方
        elif kind == "rel":
            words.append(_RELATIONS[tok][not zh])
            expect = True
        elif expect and tok in "-±":
            words.append({"-": ("负", "minus"), "±": ("正负", "plus or minus")}[tok][not zh])
        else:
            words.append(_FORMULA_OPS[tok][not zh])
            group_ops.append(tok)
            expect = True
    return ("" if zh else " ").join(w for w in words if w)


FORMULA: Final = Kind(
    "formula",
    rf"(?P<formula>(?<![\dA-Za-z.^])(?:{_FORMULA})(?![\dA-Za-z^]))",
    _read_formula, first=r"[-±\dA-Za-z(√∛∜]", letters_neutral=True)


def _read_scientific(lang: Lang, g: Groups, before: str, after: str) -> str:
    """Scientific notation, the E read as times ten to a power: 1.5e-3 -> 一点五乘以十的负三次方 / one
    point five times ten to the power of minus three (as 1.5×10⁻³ reads), never the letter."""
    mantissa, power = g("sc_m"), _power(lang, "^" + g("sc_x").lstrip("+"))
    unit = UNITS[g("sc_unit")] if g("sc_unit") else None
    if lang == "zh":
        return f"{zh_number(mantissa)}乘以十{power}" + (unit.zh if unit else "")
    return f"{en_number(mantissa)} times ten {power}" + (f" {unit.en_many}" if unit else "")


SCIENTIFIC: Final = Kind(
    "scientific",
    r"(?<![A-Za-z0-9.#-])(?P<sc_m>\d(?:\.\d+)?)[eE](?P<sc_x>[-+−]?\d{1,3})"
    rf"(?:\s?(?P<sc_unit>{alt(UNITS)}))?(?![A-Za-z0-9]|\.\d)",
    _read_scientific, first=r"\d")
"""One digit before the point, as the notation writes it (1e6, 6.02e23, 3E8): 12E5 and 0x3E8 are no such numbers."""


# --- named functions: sin(30°), log(100), sqrt(16) -------------------------------------

_FUNCTIONS: Final = {"sin": ("正弦", "sine of"), "cos": ("余弦", "cosine of"), "tan": ("正切", "tangent of"),
                     "cot": ("余切", "cotangent of"), "sec": ("正割", "secant of"), "csc": ("余割", "cosecant of"),
                     "arcsin": ("反正弦", "arcsine of"), "arccos": ("反余弦", "arccosine of"),
                     "arctan": ("反正切", "arctangent of"), "log": ("对数", "log of"), "lg": ("常用对数", "log of"),
                     "ln": ("自然对数", "natural log of"), "exp": ("e的指数", "e to the power of"),
                     "sqrt": ("根号", "the square root of")}
"""A function's name said as its word (the letters sin, cos and tan are no English words to
read: "sin" would be the word sin), Chinese / English."""
_TRIG: Final = ("sin", "cos", "tan", "cot", "sec", "csc")


def _read_math_function(lang: Lang, g: Groups, before: str, after: str) -> str:
    """sin(30°), cos 45°, log(100), ln(x), sqrt(16): the function's word and its argument
    (正弦三十度 / sine of thirty degrees), no pause for the brackets."""
    name = g("mf_name") or g("mf_trig")
    arg = g("mf_arg") if g("mf_name") else g("mf_deg")
    zh = lang == "zh"
    sign, num = ("负" if zh else "minus ") if arg[:1] in "-−" else "", arg.lstrip("-−").rstrip("°")
    if num.isalpha():
        words = num
    else:
        words = zh_number(num) if zh else en_number(num)
        if arg.endswith("°"):
            words += "度" if zh else (" degree" if num == "1" else " degrees")
    word = _FUNCTIONS[name][not zh]
    return f"{word}{sign}{words}" if zh else f"{word} {sign}{words}"


MATH_FUNCTION: Final = Kind(
    "math_function",
    rf"(?<![A-Za-z])(?:(?P<mf_name>{alt_words(_FUNCTIONS)})\((?P<mf_arg>[-−]?(?:{NUM}°?|[A-Za-z]))\)"
    rf"|(?P<mf_trig>{alt_words(_TRIG)}) ?(?P<mf_deg>[-−]?{NUM}°))(?![A-Za-z0-9])",
    _read_math_function, first=r"[acelst]", letters_neutral=True)
"""A named function of one number or variable in brackets, or a trigonometric one of degrees
without them (sin30°, cos 45°): sine, never the word sin."""


# --- factorials: 5! in a calculation -------------------------------------------------------


def _read_factorial(lang: Lang, g: Groups, before: str, after: str) -> str:
    """5! = 120, 3! times 2: 五的阶乘 / five factorial, never a number and an exclamation."""
    num = g("fc_num") or g("fc_num2")
    return f"{zh_number(num)}的阶乘" if lang == "zh" else f"{en_number(num)} factorial"


_FACTORIAL_NEXT: Final = (r"\s*(?:[-−+×*/÷=]\s*[\d(]|(?:equals|is|times|plus|minus|divided|over)\s+\d"
                          r"|(?:equals|times|divided by)\b|等于|乘|除以|加|减)")
FACTORIAL: Final = Kind(
    "factorial",
    rf"(?<![A-Za-z0-9.!])(?P<fc_num>\d{{1,3}})!(?![!=])(?={_FACTORIAL_NEXT})"
    r"|(?:(?<==)|(?<== )|(?<=equals )|(?<=等于))(?P<fc_num2>\d{1,3})!(?![!=])",
    _read_factorial, first=r"\d")
"""Only in a calculation (an operator, equals or times after it, or an equals sign before it):
I got 5! at a sentence's end is an exclamation."""
