"""List markers: the number of a list item (``1.``, ``1、``, ``2)``, ``(3)``, ``①``) written at
the start of the text or of a clause (after ``：；，`` or a sentence end), as LLMs write lists
inline (``我们一起看看：1. 打开设置。2. 点击保存。``): read as the number and a short pause,
一，打开设置 / one, Open Settings, never 一。 (a sentence of its own) nor a decimal."""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from .base import Lang
from .context import NO_END_ABBREVIATIONS, NUMBER_MARKS
from .kind import Groups, Kind
from .numbers import en_number, zh_number

_NOT_ABBREVIATION: Final = "".join(rf"(?<!\b{re.escape(a)}\. )" for a in (*NO_END_ABBREVIATIONS, *NUMBER_MARKS))
_BOUNDARY: Final = rf"(?:(?<![\s\S])|(?<=[。!?;:,\n、])|(?<=[。!?;:,\n] )|(?<=\. ){_NOT_ABBREVIATION})"
"""The start of the text or of a clause (full-width marks are folded to ASCII before this); an
abbreviation's dot (p. 12, ext. 12) starts none. After Chinese and a space, a bracketed number
starts an item too (1）打开设置 2）点击通用: an inline list), a number and a dot does not (共 5. 还有)."""
_AFTER_WORDS: Final = re.compile(r"[\u4e00-\u9fff] ?$")
"""Chinese right before an item's number: the item before it ends there, unpunctuated."""
CIRCLED: Final = "\u2460-\u249b"
"""Circled, parenthesised and dotted numbers ①..⑳, ⑴..⒇, ⒈..⒛: always a list item's number."""


def _read_list_item(lang: Lang, g: Groups, before: str, after: str) -> str:
    """The item's number with a pause after it (a circled one inside a clause, 见注①, without),
    and one before it where the item before it ended without a mark (1）打开设置 2）点击通用)."""
    circled = g("li_circ")
    num = (unicodedata.normalize("NFKC", circled).strip("().") if circled
           else g("li_num") or g("li_par") or g("li_num2") or g("li_par2"))
    words = zh_number(num) if lang == "zh" else en_number(num)
    inline = _AFTER_WORDS.search(before) is not None and (not circled or before.endswith(" "))
    at_start = not before.strip() or before.rstrip()[-1] in ";:,、" or inline
    if circled and not (at_start and after.strip()):
        return words
    pause = "，" if lang == "zh" else ","
    return (pause if inline else "") + words + pause  # 设置，二，点击: not 设置二


LIST_ITEM: Final = Kind(
    "list_item",
    rf"{_BOUNDARY}(?:(?P<li_num>[1-9]\d?)(?:\.(?=[ ]?[^\d\s.])|、(?!\d)|\)(?=[ ]?\S))|\((?P<li_par>[1-9]\d?)\))"
    r"|(?<=[\u4e00-\u9fff] )(?:(?P<li_num2>[1-9]\d?)\)(?=[ ]?\S)|\((?P<li_par2>[1-9]\d?)\))"
    rf"|(?P<li_circ>[{CIRCLED}])",
    _read_list_item, counts=True, first=rf"[\d({CIRCLED}]")
