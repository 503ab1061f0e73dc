"""Sentence segmentation of a request's text: the pieces the GPT generates one after another.

A long text is split at sentence ends so that each GPT sequence stays short (ChatTTS too
splits its input at ``。``) and the first sentence's audio can start before the rest is
generated. Very short pieces are merged into the one before, so that a stream does not stall
on a string of one-word sequences. Both limits are profile knobs
(``frontend.max_segment_chars``, ``frontend.merge_segment_chars``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_SENTENCE_END: Final = re.compile(r"(?<=[。！？!?；;\n])|(?<=[.](?=\s))")
"""A sentence ends after ``。！？!?；;`` or a newline, or after ``.`` followed by white space
(not inside ``3.5`` or ``e.g.x``)."""
_CUT_MARKS: Final = "，、；"
"""Full-width pauses at which an over-long sentence may be cut."""


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
    (``，、；``) or after ", " when it has one (never inside "1,234" or "3 km"), else hard.
    Returns ``[text]`` when no segment has anything but white space."""
    pieces = [p for p in _SENTENCE_END.split(text) if p]
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
    return [seg for seg in out if seg.strip()] or [text]
