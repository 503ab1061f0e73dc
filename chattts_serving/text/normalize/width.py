"""Width folding: full-width, accented, circled and compatibility characters to the forms the
readers and ChatTTS know."""

from __future__ import annotations

import unicodedata
from typing import Final

from .base import LAST_SPOKEN_CJK, is_latin

_LIGATURES: Final = {"ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D",
                     "ł": "l", "Ł": "L", "ı": "i", "…": "...", "−": "-", "﹣": "-", "‐": "-", "‑": "-",
                     "\u00a0": " ", "\t": " ", "\r": "", "·": " ", "・": " ", "‧": " ", "∙": " ",
                     "•": " ", "〇": "零", "〜": "~", "µ": "μ",
                     "㎡": "m²", "㎥": "m³", "㎢": "km²", "㎞": "km", "㎏": "kg", "㎎": "mg", "㎝": "cm", "㎜": "mm",
                     "㎖": "ml", "㎐": "Hz", "㎑": "kHz", "㎒": "MHz", "㎓": "GHz", "㎾": "kW", "㏈": "dB"}
"""Characters folded to a readable form: ligatures and dashes to ASCII, 〇 (U+3007, outside the
CJK block ChatTTS keeps) to 零, the CJK square unit symbols to the units they stand for."""


MIDDLE_DOTS: Final = "·・‧∙•"
"""Middle dots: between two digits a date separator (kept as ``·``), elsewhere a word break
(约翰·史密斯)."""


def _ideograph_form(c: str) -> str | None:
    """The CJK ideograph a Kangxi radical, CJK compatibility or enclosed ideograph stands for
    (its NFKC form: ``⼈`` -> 人, ``㊣`` -> 正), None for any other character."""
    if "\u4e00" <= c <= "\u9fff" or c.isascii():
        return None
    plain = unicodedata.normalize("NFKC", c)
    return plain if len(plain) == 1 and "\u4e00" <= plain <= LAST_SPOKEN_CJK else None


def fold_width(text: str) -> str:
    """Full-width ASCII (U+FF01..U+FF5E) to half-width, the ideographic space to a space, ``￥``
    to ``¥``, accented Latin letters to their base letter (``é`` -> ``e``), subscript and
    fraction digits to ASCII (``₂`` -> 2, ``½`` -> 1/2; a circled ``①`` stays: a list number), a
    few ligatures, dashes and unit
    symbols to ASCII (``㎡`` -> m², ``〇`` -> 零), Kangxi radicals and compatibility or enclosed
    ideographs to the ideograph they stand for (``⼈`` -> 人, ``㊣`` -> 正), a middle dot between
    two digits to ``·`` (2019·2·10) and elsewhere to a space. Chinese punctuation
    outside the full-width block (``。、「」``) is kept."""
    out: list[str] = []
    text = unicodedata.normalize("NFC", text)
    for i, c in enumerate(text):
        o = ord(c)
        if c in MIDDLE_DOTS and out and out[-1][-1:].isdigit() and text[i + 1:i + 2].isdigit():
            c = "·"  # 2019·2·10, 5·12: a date's separator, read by the date kinds
        elif 0xFF01 <= o <= 0xFF5E:
            c = chr(o - 0xFEE0)
        elif o == 0x3000:
            c = " "
        elif o == 0xFFE5:
            c = "¥"
        elif o == 0xFFE6:
            c = "₩"
        elif c in _LIGATURES:
            c = _LIGATURES[c]
        elif (ideograph := _ideograph_form(c)) is not None:
            c = ideograph
        elif 0xC0 <= o < 0x250 and c.isalpha():
            base = unicodedata.normalize("NFKD", c)[0]
            if is_latin(base):
                c = base
        elif (unicodedata.category(c) == "No" and c not in "¹²³" and not "\u2460" <= c <= "\u249b"
              and not "\u2070" <= c <= "\u2079"):
            # subscript and fraction digits (₂, ½) -> plain digits; superscripts stay for units
            # (m², km³) and exponents (x⁴), circled numbers (①) for the list kind
            plain = unicodedata.normalize("NFKC", c).replace("⁄", "/")
            if plain and all(ch.isdigit() or ch == "/" for ch in plain) and plain.isascii():
                c = (" " if out and out[-1][-1:].isdigit() else "") + plain
        out.append(c)
    return "".join(out)
