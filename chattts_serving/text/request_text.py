"""The front end's helpers on a request's raw text, before normalisation: the length limit
every entry point applies alike, and the ``[speed_N]`` token carried to every segment of a
text (the normaliser moves the first one it sees into the prompt)."""

from __future__ import annotations

import re
from typing import Final

from .normalize.base import CONTROL_TOKEN

_SPEED_TOKEN: Final = re.compile(r"\[speed_(\d)\]")


def speed_of(text: str) -> int | None:
    """N of the first valid ``[speed_N]`` token (N in 0..9) in ``text``, or None."""
    m = _SPEED_TOKEN.search(text)
    return int(m.group(1)) if m else None


def carry_speed(segments: list[str]) -> list[str]:
    """Give every sentence segment of one text the speed of that text's first ``[speed_N]``.

    The normaliser moves the first ``[speed_N]`` of the text it sees into the prompt; when a
    long text is split into segments that are prepared one by one, a token written (or
    prepended by the gateway for OpenAI's ``speed``) at the start would otherwise only reach
    the first segment. Returns new segments, each prefixed with that token (unchanged when the
    text has none).
    """
    for seg in segments:
        n = speed_of(seg)
        if n is not None:
            return [f"[speed_{n}]{s}" for s in segments]
    return list(segments)


RAW_LENGTH_FACTOR: Final = 2
"""Text may be this many times the character limit long counting control tokens."""


def length_error(text: str, max_chars: int) -> str | None:
    """The refusal message when ``text`` is over the limit, else None: characters are counted
    without ChatTTS control tokens and without whitespace at both ends (a text file's final
    newline does not count); with control tokens the raw text may be ``RAW_LENGTH_FACTOR``
    times the limit. Used by every entry point and the front end, so all count alike."""
    spoken = len(CONTROL_TOKEN.sub("", text).strip())
    if spoken > max_chars:
        return f"text has {spoken} characters; the limit is {max_chars}"
    if len(text) > RAW_LENGTH_FACTOR * max_chars:
        return (f"text has {len(text)} characters with its control tokens; the limit is "
                f"{RAW_LENGTH_FACTOR * max_chars} with them ({max_chars} without)")
    return None
