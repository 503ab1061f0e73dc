"""Sentences of text that arrives in pieces: the WebSocket stream's incremental splitter.

The sentence ends are the entry model's (:data:`~chattts_serving.text.segments.SENTENCE_END_MARKS`,
and ``.`` before white space), read one character at a time so that how the text was cut into
deltas never changes where it is cut into sentences.
"""

from __future__ import annotations

import re
from typing import Final

from .segments import SENTENCE_END_MARKS

CLOSING_MARKS: Final = "\"'”’」』）)】]》〉"
"""Closing quotes and brackets that stay with the sentence end they follow (``他说：“好。”``)."""
ABBREVIATIONS: Final = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "vs", "e.g", "i.e", "fig", "approx"})
"""Words whose full stop does not end a sentence before white space (``Mr. Smith``), lower case."""
_WORD_BEFORE_DOT: Final = re.compile(r"([A-Za-z.]+)[.]$")


class SentenceSplitter:
    """Cuts text that arrives in pieces (deltas of any size) into sentences as they complete.

    The rules are :func:`~chattts_serving.text.segments.split_segments`' sentence ends
    (:data:`~chattts_serving.text.segments.SENTENCE_END_MARKS`, and ``.`` before white space,
    so never inside ``3.5``), refined for text that is spoken one sentence at a time: a run
    of end marks (``?!``, ``。。。``) and the closing quotes or brackets after it
    (:data:`CLOSING_MARKS`) stay with the sentence; the full stop of an abbreviation
    (:data:`ABBREVIATIONS`) does not end one; a sentence longer than ``max_chars`` characters
    is cut after its last pause (``，、；,`` or a space), else hard. White space between
    sentences is not part of either; white-space-only sentences are never released.

    The splitter reads character by character, so the sentences depend only on the text and on
    where :meth:`flush` was called, never on how the text was cut into deltas: feeding
    ``"3."`` then ``"5"`` gives what ``"3.5"`` gives. A sentence whose end is still open
    (``"。"`` may be followed by ``"”"``; ``"."`` by a digit) is held until the next character,
    :meth:`flush` or :meth:`end` decides it.
    """

    def __init__(self, max_chars: int = 400) -> None:
        if max_chars < 8:
            raise ValueError(f"max_chars must be >= 8, got {max_chars}")
        self.max_chars = max_chars
        self._cur: list[str] = []
        self._state = "text"  # text | end (after end marks) | dot (after a full stop)

    @property
    def pending(self) -> str:
        """The text held back: the unfinished sentence (possibly empty)."""
        return "".join(self._cur)

    def feed(self, delta: str) -> list[str]:
        """Add ``delta`` (any length, possibly empty) and return the sentences it completed, in order."""
        out: list[str] = []
        for ch in delta:
            self._step(ch, out)
        return out

    def flush(self) -> list[str]:
        """End the sentence in progress now (the client's ``flush``, an idle timeout): returns it
        (``[]`` when only white space is held)."""
        out: list[str] = []
        self._emit(out)
        return out

    def end(self) -> list[str]:
        """The end of the text: the same as :meth:`flush`."""
        return self.flush()

    def _emit(self, out: list[str]) -> None:
        text = "".join(self._cur).strip()
        self._cur = []
        self._state = "text"
        if text:
            out.append(text)

    def _step(self, ch: str, out: list[str]) -> None:
        state = self._state
        if state == "end":
            if ch in SENTENCE_END_MARKS or ch in CLOSING_MARKS:
                self._cur.append(ch)
                return
            self._emit(out)
        elif state == "dot":
            if ch == "." or ch in CLOSING_MARKS:
                self._cur.append(ch)
                return
            if ch in SENTENCE_END_MARKS:
                self._cur.append(ch)
                self._state = "end"
                return
            if ch.isspace():
                word = _WORD_BEFORE_DOT.search("".join(self._cur[-12:]))
                if word is None or word.group(1).lower() not in ABBREVIATIONS:
                    self._emit(out)
                    return
            self._state = "text"
        if not self._cur and ch.isspace():
            return  # white space between sentences belongs to neither
        self._cur.append(ch)
        if ch in SENTENCE_END_MARKS:
            self._state = "end"
        elif ch == ".":
            self._state = "dot"
        elif len(self._cur) >= self.max_chars:
            self._cut_long(out)

    def _cut_long(self, out: list[str]) -> None:
        text = "".join(self._cur)
        cut = max(max(text.rfind(c) for c in "，、；,"), text.rfind(" "))
        cut = cut + 1 if cut > 0 else len(text)
        self._cur = list(text[cut:].lstrip())
        head = text[:cut].strip()
        if head:
            out.append(head)


def split_sentences(text: str, max_chars: int = 400) -> list[str]:
    """The sentences :class:`SentenceSplitter` releases for ``text`` given whole and ended."""
    splitter = SentenceSplitter(max_chars)
    return splitter.feed(text) + splitter.end()
