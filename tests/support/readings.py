"""What a normalised reading must hold, shared by the text tests: nothing left unread, nothing
dropped."""

from __future__ import annotations

import re

from chattts_serving.text import normalize as textnorm
from chattts_serving.text.normalize import NormalizedText

SPOKEN = re.compile(r"[\u4e00-\u9fa5A-Za-z，。、,. ]*")
"""What a reading may hold besides control tokens: Chinese characters, Latin letters, ChatTTS'
pauses and spaces (no digit or symbol left unread)."""


def assert_read(text: str, result: NormalizedText) -> None:
    """Only speakable characters left, nothing dropped."""
    spoken = textnorm.CONTROL_TOKEN.sub("", result.text)
    assert SPOKEN.fullmatch(spoken), f"unread in {text!r}: {result.text!r}"
    assert result.dropped == (), f"{text!r} dropped {result.dropped}"


def read(text: str, library: bool) -> str:
    """``text``'s reading (with or without WeTextProcessing), which holds nothing unread and
    drops nothing (:func:`assert_read`)."""
    result = textnorm.normalize(text, library=library)
    assert_read(text, result)
    return result.text
