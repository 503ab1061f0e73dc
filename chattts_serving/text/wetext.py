"""WeTextProcessing's runtime (PyPI ``wetext``, Apache-2.0) as one reader of Chinese entities.

:func:`chattts_serving.text.normalize.normalize` finds every entity (number, date, time, ...) with its
own scanner and decides its language and kind. For the Chinese-context kinds listed in
:data:`chattts_serving.text.normalize.LIBRARY_KINDS` (those the normalisation corpus shows the
library reads correctly) it asks :func:`read_zh` for the reading of the entity's span instead of
its own verbaliser; everywhere else (English, and the kinds the corpus shows the library reading
wrongly) our rules read. :func:`library_alone` is the library on whole sentences, for the
per-category comparison of ``python -m chattts_serving.text.normalize_report``.

The library bundles its FSTs (no download, no pynini); one ``Normalizer`` per language is built
on first use and kept for the life of the process. Each call runs the FSTs, far slower than our
readers, so it is asked only about the spans of the routed kinds, never whole sentences while
serving.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Final, Literal

_LOCK: Final = threading.Lock()
_NORMALIZERS: dict[str, Any] = {}

_ASCII_LEFT: Final = re.compile(r"[0-9%‰$¥€£:/+\-=~.,A-Za-z]")
"""Characters that must not survive a reading: a span the library left partly unread."""
_TAG: Final = re.compile(r"\[[A-Za-z]+(?:_[A-Za-z0-9]+)*\]")
"""A bracketed token such as ``[uv_break]`` or ``[Stts]``, handed through unread."""


def library(lang: Literal["zh", "en", "auto"] = "zh") -> Any:
    """The library's text normaliser (``wetext.Normalizer(lang=..., operator="tn")``), built once
    per language and cached. Raises ImportError when ``wetext`` is not installed."""
    with _LOCK:
        norm = _NORMALIZERS.get(lang)
        if norm is None:
            from wetext import Normalizer

            norm = Normalizer(lang=lang, operator="tn")
            _NORMALIZERS[lang] = norm
        return norm


def preload() -> bool:
    """Build the Chinese normaliser now (about 1 s: imports and FSTs) rather than on the first
    request; False when ``wetext`` is not installed (our rules then read everything)."""
    try:
        library("zh")
    except ImportError:
        return False
    return True


def read_zh(span: str, left: str = "", right: str = "") -> str | None:
    """The library's Chinese reading of ``span`` (an entity such as ``2024-03-05``), read with
    ``left`` and ``right`` (neighbouring Chinese characters that may change the reading, e.g.
    the measure word after a number) around it; None when the library left digits or symbols
    unread, changed the neighbours, or is not installed (the caller then reads it itself)."""
    try:
        norm = library("zh")
    except ImportError:
        return None
    try:
        with _LOCK:  # kaldifst objects are shared: one call at a time
            out = str(norm.normalize(left + span + right))
    except Exception:  # the library fails on some inputs (e.g. AssertionError on '+86 138...')
        return None
    if not (out.startswith(left) and out.endswith(right)):
        return None
    words = out[len(left):len(out) - len(right)] if right else out[len(left):]
    if not words or _ASCII_LEFT.search(words):
        return None
    return words


def library_alone(text: str) -> str:
    """The library alone on ``text``: ``wetext`` on each run of text between bracketed tokens
    (which it would otherwise read), in the language it would pick for the whole text (Chinese
    when any Chinese character is in it, as its ``lang="auto"`` does), the whitespace around each
    run kept. What the library leaves unread stays as it is; the caller maps punctuation and
    reports the rest."""
    norm = library("zh" if re.search(r"[\u4e00-\u9fff]", text) else "en")
    out: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        out.append(_whole(norm, text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_whole(norm, text[pos:]))
    return "".join(out)


def _whole(norm: Any, piece: str) -> str:
    if not piece.strip():
        return piece
    lead, tail = piece[:len(piece) - len(piece.lstrip())], piece[len(piece.rstrip()):]
    try:
        with _LOCK:
            return lead + str(norm.normalize(piece)) + tail
    except Exception:  # the library fails on some inputs: that piece stays unread
        return piece
