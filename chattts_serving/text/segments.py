"""Sentence segmentation of a request's text: the pieces the GPT generates one after another.

Two ways (the request's ``segmentation``, :class:`chattts_serving.contract.Segmentation`):

* ``streaming`` (:func:`split_segments`): a long text is split at sentence ends so that each
  GPT sequence stays short and the first sentence's audio can start before the rest is
  generated. Very short pieces are merged into the one before, so that a stream does not
  stall on a string of one-word sequences. Both limits are profile knobs
  (``frontend.max_segment_chars``, ``frontend.merge_segment_chars``).
* ``chattts`` (:func:`split_like_chattts`, :func:`chattts_groups`): the pieces ChatTTS 0.2.5's
  ``Chat.infer`` synthesises, and the groups it generates and vocodes together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from .normalize.base import CONTROL_TOKEN
from .normalize.context import NO_SENTENCE_END, NUMBER_MARKS
from .normalize.letters import TITLES

SENTENCE_END_MARKS: Final = "。！？!?；;\n"
"""Characters after which a sentence ends (a ``.`` ends one only before white space)."""
_SENTENCE_END: Final = re.compile(rf"(?<=[{re.escape(SENTENCE_END_MARKS)}])|(?<=[.](?=\s))")
"""A sentence ends after ``。！？!?；;`` or a newline, or after ``.`` followed by white space
(not inside ``3.5`` or ``e.g.x``)."""
_CUT_MARKS: Final = "，、；"
"""Full-width pauses at which an over-long sentence may be cut."""
MARKUP_CHARS: Final = "#>*-+•·▪‣◦●○■□–—_~`|"
"""Markdown and list decoration: heading and quote marks, bullets, emphasis, code, rules."""
_ORDINAL: Final = re.compile(r"[(（]?(?:\d{1,3}|[A-Za-z]|[ivxlcdmIVXLCDM]{1,6}|[一二三四五六七八九十百]{1,4})"
                             r"[.)、．）。:：]?[)）]?")
"""A list item's number or letter with its punctuation: ``1.``, ``2)``, ``(3)``, ``a.``, ``iv.``, ``一、``."""
NO_BREAK_ABBREVIATIONS: Final = frozenset(w.lower() for w in (*TITLES, "St", *NO_SENTENCE_END))
"""Words whose full stop ends no sentence before white space (``Mr. Smith``, ``e.g. today``), lower
case: the normaliser's titles (read Mister, Doctor, ...) and abbreviations it never ends a sentence
with. Cutting there made ``Mr.`` a segment of its own, spoken apart and joined to the name."""
_WORD_BEFORE_DOT: Final = re.compile(r"(?<![A-Za-z.])([A-Za-z]+(?:\.[A-Za-z]+)*)[.]\s*$")
_INLINE_MARKER: Final = re.compile(r"(?<=[：:；;，,])\s*\d{1,2}[.．]\s*$")
"""An inline list's number written at the end of the clause that introduces the list
(``我们一起看看：1.``): the ``. `` after it is no sentence end, the number is the next item's."""


_NUMBER_MARK_DOT: Final = re.compile(rf"(?<![A-Za-z.])(?:{'|'.join(NUMBER_MARKS)})[.]\s*$")


def number_mark_end(text: str) -> bool:
    """Whether ``text`` ends with the full stop of a mark written before a number (``No.``,
    ``p.``, ``pp.``): no sentence end when a digit follows (``Symphony No. 5``), else one
    (``I said no. Then``)."""
    return _NUMBER_MARK_DOT.search(text) is not None


def abbreviation_end(text: str) -> bool:
    """Whether ``text`` ends with the full stop of an abbreviation of
    :data:`NO_BREAK_ABBREVIATIONS` (``Ask Mr.``, ``e.g.``), white space after it allowed."""
    m = _WORD_BEFORE_DOT.search(text)
    return m is not None and m.group(1).lower() in NO_BREAK_ABBREVIATIONS


def inline_marker_start(text: str) -> int | None:
    """Where the number of an inline list item starts when ``text`` ends with one after a colon,
    semicolon or comma (``看看：1.`` -> the index of ``1``), else None."""
    m = _INLINE_MARKER.search(text)
    return None if m is None else m.start() + len(m.group(0)) - len(m.group(0).lstrip())


def markup_only(text: str) -> bool:
    """Whether ``text`` holds nothing but list or markdown decoration (``1.``, ``2)``, ``-``,
    ``*``, ``•``, ``##``, ``>``, ``**1.**``): a fragment that belongs to the words after it."""
    core = text.strip().strip(MARKUP_CHARS + " \t\n")
    return not core or _ORDINAL.fullmatch(core) is not None


@dataclass(frozen=True, kw_only=True)
class SegmentRules:
    """max_chars: longest segment generated as one GPT sequence, in characters;
    merge_chars: a piece is merged into the segment before it while both together have at
    most this many characters (0: never merge)."""

    max_chars: int = 120
    merge_chars: int = 30


def split_segments(text: str, rules: SegmentRules = SegmentRules()) -> list[str]:
    """Split ``text`` at sentence ends into segments of at most ``rules.max_chars``
    characters, in order, nothing dropped (whitespace-only pieces are merged into the segment
    before them). A sentence longer than ``max_chars`` is cut after a full-width pause
    (``，、；``) or after ", " when it has one (never inside "1,234" or "3 km"), else hard. A
    list marker or other decoration alone (:func:`markup_only`: ``1.`` before its item), also
    one written inline at the end of the clause before it (``看看：1. 打开设置。``,
    :func:`inline_marker_start`), starts the segment after it instead of ending the one before,
    so its language is its item's; an abbreviation's full stop (``Mr. Smith``) ends nothing,
    nor does a number mark's before a number (``No. 5``, ``p. 12``). A segment with no word in
    it (``🎉`` after a long sentence) goes with the one before.
    Returns ``[text]`` when no segment has anything but white space."""
    pieces: list[str] = []
    held = ""  # list or markdown decoration alone ("1.", "-"), "Mr.": it goes with the words after it
    parts = [p for p in _SENTENCE_END.split(text) if p]
    for i, p in enumerate(parts):
        piece = held + p
        before_number = i + 1 < len(parts) and parts[i + 1].lstrip()[:1].isdigit()
        if piece.strip() and (markup_only(piece) or abbreviation_end(piece)
                              or (before_number and number_mark_end(piece))):
            held = piece
            continue
        cut = inline_marker_start(piece)
        pieces.append(piece if cut is None else piece[:cut])
        held = "" if cut is None else piece[cut:]
    if held:
        pieces.append(held)
    out: list[str] = []
    limit = rules.max_chars
    for piece in pieces:
        while len(piece) > limit:
            cut = max(max(piece.rfind(c, 0, limit) for c in _CUT_MARKS), piece.rfind(", ", 0, limit - 1))
            cut = cut + 1 if cut > 0 else limit
            out.append(piece[:cut])
            piece = piece[cut:]
        if out and (not piece.strip() or len(out[-1]) + len(piece) <= rules.merge_chars):
            out[-1] += piece
        else:
            out.append(piece)
    return _with_words([seg for seg in out if seg.strip()]) or [text]


def _has_words(text: str) -> bool:
    """Whether ``text`` holds a letter, a digit or a Chinese character outside control tokens."""
    return any(c.isalnum() for c in CONTROL_TOKEN.sub("", text))


def _with_words(segments: list[str]) -> list[str]:
    """``segments`` with every one that holds no word (``🎉``, ``:)``, a hard cut's run of emoji)
    joined to the one before it, or to the one after it when it comes first: alone it has
    nothing to speak and the front end would refuse the request; with its words it is reported
    unspoken. Only a text with no word anywhere stays one wordless segment."""
    out: list[str] = []
    for seg in segments:
        if out and (not _has_words(seg) or not _has_words(out[-1])):
            out[-1] += seg
        else:
            out.append(seg)
    return out


def join_normalized(parts: list[str]) -> str:
    """The normalised texts of a request's segments as one text: a space between two English
    ones (``Here it is.`` + ``Next``), none in Chinese; ``"".join`` glued ``...,`` to ``Smith``."""
    out = ""
    for part in parts:
        if out and part and re.match(r"[A-Za-z]", part) and re.search(r"[A-Za-z,.]$", out):
            out += " "
        out += part
    return out


_CHATTTS_SPLIT: Final = re.compile(r"(?<=。)|(?<=\.\s)")
"""ChatTTS 0.2.5 ``Chat.infer``'s split pattern: after ``。`` and after ``.`` + one whitespace."""
MAX_SPLIT_BATCH: Final = 4
"""``Chat.infer``'s ``max_split_batch`` default: pieces generated (and vocoded) together."""


def split_like_chattts(text: str) -> list[str]:
    """The pieces ChatTTS 0.2.5's ``Chat.infer(text, split_text=True)`` synthesises, in order.

    A text holding a newline is split at every ``\\n`` and nothing else, and every piece is
    kept, empty ones included (``"a\\n\\nb"`` gives ``["a", "", "b"]``). Otherwise it is
    split after every ``。`` and after every ``.`` followed by one whitespace character, which
    stays with the piece before (``"Hi. You."`` gives ``["Hi. ", "You."]``; ``"3.5"`` and a
    final ``"end."`` are not split), and empty pieces are dropped. Pieces are not stripped or
    normalised: ChatTTS normalises each piece afterwards (``Chat._infer``). An empty text gives
    ``[]`` (``Chat.infer`` then returns ``[]``).
    """
    if "\n" in text:
        return text.split("\n")
    return [t for t in _CHATTTS_SPLIT.split(text) if t]


def chattts_groups(n_pieces: int, max_split_batch: int = MAX_SPLIT_BATCH) -> list[range]:
    """Indices of the pieces ``Chat._infer`` generates and vocodes together: consecutive groups
    of ``max_split_batch``. Inside a group ChatTTS' ``_decode_to_wavs`` right-pads every
    piece's hidden states (or codes) with zeros to the group's longest piece before the
    vocoder, so a shorter piece's audio is that of the padded window (its tail is what the
    vocoder makes of zeros, and its last ~50 tokens hear the zeros through the convolutions).
    Raises ValueError for ``max_split_batch < 1``."""
    if max_split_batch < 1:
        raise ValueError(f"max_split_batch must be >= 1, got {max_split_batch}")
    return [range(i, min(i + max_split_batch, n_pieces)) for i in range(0, n_pieces, max_split_batch)]
