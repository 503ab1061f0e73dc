"""Sentences of text that arrives in pieces: the WebSocket stream's incremental splitter.

The sentence ends are the entry model's (:data:`~chattts_serving.text.segments.SENTENCE_END_MARKS`,
and ``.`` before white space), read one character at a time so that how the text was cut into
deltas never changes where it is cut into sentences. Text written by an LLM brings markdown:
list markers, headings, emphasis, code spans, quotes; they stay with the words they belong to
(:class:`SentenceSplitter`).
"""

from __future__ import annotations

import unicodedata
from typing import Final

from .segments import (
    NO_BREAK_ABBREVIATIONS,
    SENTENCE_END_MARKS,
    abbreviation_end,
    inline_marker_start,
    markup_only,
    number_mark_end,
)

CLOSING_MARKS: Final = "\"'”’」』）)】]》〉*_~"
"""Closing quotes, brackets and markdown emphasis that stay with the sentence end they follow
(``他说：“好。”``, ``**Done.**``)."""
ABBREVIATIONS: Final = NO_BREAK_ABBREVIATIONS
"""Words whose full stop does not end a sentence before white space (``Mr. Smith``), lower case:
the same as the HTTP segments' (:data:`~chattts_serving.text.segments.NO_BREAK_ABBREVIATIONS`)."""
TRAILING_CATEGORIES: Final = frozenset({"So", "Sk", "Mn", "Me", "Cf"})
"""Unicode categories that stay with the sentence end they follow: emoji and other symbols,
their modifiers, variation selectors and joiners (``好的！😀``: the emoji is reported unspoken
with its sentence instead of becoming a sentence of its own)."""


def _trailing(ch: str) -> bool:
    return ch in CLOSING_MARKS or unicodedata.category(ch) in TRAILING_CATEGORIES


class SentenceSplitter:
    """Cuts text that arrives in pieces (deltas of any size) into sentences as they complete.

    The rules are :func:`~chattts_serving.text.segments.split_segments`' sentence ends
    (:data:`~chattts_serving.text.segments.SENTENCE_END_MARKS`, newlines included, and ``.``
    before white space, so never inside ``3.5``), refined for text that is spoken one sentence
    at a time, as an LLM writes it:

    * a run of end marks (``?!``, ``。。。``) and what closes it (:data:`CLOSING_MARKS`: quotes,
      brackets, markdown emphasis ``**``) stay with the sentence, and so do symbols and emoji
      right after it (``好的！😀``: the front end reports them unspoken with their sentence;
      after a space they start the next one, and alone they are a fragment with nothing to
      speak, which the WebSocket stream reports as dropped);
    * the full stop of an abbreviation (:data:`ABBREVIATIONS`) does not end one, nor does that
      of a mark written before a number when a digit follows (``No. 5``, ``p. 12``);
    * an inline list's number written after the clause that introduces it (``看看：1. 打开``)
      starts the next sentence, with its item, instead of ending this one;
    * a fragment of list or markdown decoration alone (:func:`markup_only`: ``1.``, ``2)``,
      ``-``, ``•``, ``##``) is never a sentence: it is held and spoken with the words after it,
      so that ``1. Open Settings.`` is one sentence whose language is the item's (its line
      break becomes a space);
    * inside a code span (`` `...` ``, to the end of its line) end marks do not end a sentence;
    * a sentence longer than ``max_chars`` characters is cut after its last pause
      (``，、；,`` or a space), else hard.

    White space between sentences is not part of either; white-space-only sentences are never
    released. :meth:`flush` and :meth:`end` release whatever is held, decoration included.

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
        self._state = "text"  # text | end (after end marks) | dot (after a full stop) | mark (after "No. ")
        self._code = False  # inside a `code span`

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
        self._emit(out, force=True)
        return out

    def end(self) -> list[str]:
        """The end of the text: the same as :meth:`flush`."""
        return self.flush()

    def _emit(self, out: list[str], force: bool = False) -> bool:
        """Release the held sentence; unless ``force``, a fragment of decoration alone is kept
        (False) to be spoken with what follows."""
        text = "".join(self._cur).strip()
        if not force and text and markup_only(text):
            self._state = "text"
            return False
        self._cur = []
        self._state = "text"
        self._code = False
        if text:
            out.append(text)
        return True

    def _step(self, ch: str, out: list[str]) -> None:
        state = self._state
        if state == "end":
            if ch in SENTENCE_END_MARKS or _trailing(ch):
                self._cur.append(ch)
                return
            if self._release(out) and ch.isspace():
                return
        elif state == "dot":
            if ch == "." or _trailing(ch):
                self._cur.append(ch)
                return
            if ch in SENTENCE_END_MARKS and ch != "\n":
                self._cur.append(ch)
                self._state = "end"
                return
            if ch.isspace():
                held = "".join(self._cur)
                cut = inline_marker_start(held)
                if cut is not None:  # 看看：1. -> "看看：" now, "1. " with its item
                    head = held[:cut].strip()
                    if head:
                        out.append(head)
                    self._cur = [*held[cut:], " "]
                    self._state = "text"
                    return
                if number_mark_end(held[-16:]):  # No. 5: the next character decides
                    self._cur.append(ch)
                    self._state = "mark"
                    return
                if not abbreviation_end(held[-16:]):
                    self._release(out, spaced=True)
                    return
            self._state = "text"
        elif state == "mark":
            if ch.isspace():
                self._cur.append(ch)
                return
            self._state = "text"
            if not ch.isdigit():  # I said no. Then: the sentence ended at the space
                self._release(out, spaced=True)
        if not self._cur and ch.isspace():
            return  # white space between sentences belongs to neither
        self._cur.append(ch)
        if ch == "`":
            self._code = not self._code
        elif ch == "\n":
            self._code = False  # a code span ends with its line
        if self._code:
            if len(self._cur) >= self.max_chars:
                self._cut_long(out)
            return
        if ch in SENTENCE_END_MARKS:
            self._state = "end"
        elif ch == ".":
            self._state = "dot"
        elif len(self._cur) >= self.max_chars:
            self._cut_long(out)

    def _release(self, out: list[str], spaced: bool = False) -> bool:
        """The held sentence has ended (the next character starts another): release it (True),
        or, when it is decoration alone, keep it with one space before what follows (a line
        break after ``1.`` becomes that space; ``spaced``: white space ended it)."""
        spaced = spaced or bool(self._cur and self._cur[-1].isspace())
        if self._emit(out):
            return True
        while self._cur and self._cur[-1].isspace():
            self._cur.pop()
        if spaced:
            self._cur.append(" ")
        return False

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
