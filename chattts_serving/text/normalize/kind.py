"""What every entity kind is: a pattern and its reader, and the regex pieces patterns share.

A kind (a tagger and its verbaliser, in WeTextProcessing's terms) is one :class:`Kind`: the
pattern that finds it in text and the reader that turns a match into words. Each kind lives in
the module of its family (dates, times, money, ...); :mod:`.precedence` lists them in the
order the scanner tries them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from .base import Lang
from .tables import Unit

Groups = Callable[[str], str]
"""A match's ``group``: the text of a named group (None when it did not take part)."""
Reader = Callable[[Lang, Groups, str, str], str]
"""A kind's reader: (language, groups, text before, text after) -> words. ``before`` and
``after`` are the match's sentence around it (:func:`.context.near`), control tokens blanked."""


@dataclass(frozen=True)
class Kind:
    """One entity kind.

    name: the kind's name in words (the scanner's group ``k_<name>``, :data:`.precedence.KINDS`);
    pattern: its regex (named groups prefixed by the kind, unique over all kinds);
    read: its reader; lang: a language fixed by the kind's own words (English month names, 元),
    None to read it in the language of its context; counts: a plain count, whose language
    follows what it counts (:func:`.context.context_language`); library: WeTextProcessing may
    read it in Chinese context (:data:`.precedence.LIBRARY_KINDS`), where ``library_may_read``
    (groups, before, after) allows it and ``library_fits`` (groups, words, before, after)
    accepts the library's words; first: a regex class of the characters a match can start
    with, a guard the scanner checks before the pattern (most positions fail it at once);
    letters_neutral: the kind's own lone letters (a formula's variables) and those of its
    sentence do not make it English: its language is that of the words around it.
    """

    name: str
    pattern: str
    read: Reader
    lang: Lang | None = None
    counts: bool = False
    library: bool = False
    library_may_read: Callable[[Groups, str, str], bool] | None = None
    library_fits: Callable[[Groups, str, str, str], bool] | None = None
    first: str = ""
    letters_neutral: bool = False


NUM: Final = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
"""A decimal number, with or without thousands separators."""
SIGN: Final = r"(?:(?<![A-Za-z0-9.])[-+−])"
"""A sign before a number (not a hyphen after a word or a number)."""


def alt(units: dict[str, Unit]) -> str:
    """An alternation of the symbols of ``units``, longest first."""
    return "|".join(re.escape(u) for u in sorted(units, key=len, reverse=True))


def alt_words(words: Iterable[str]) -> str:
    """An alternation of ``words`` (escaped), longest first."""
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
