"""Markdown decoration an LLM writes (``**bold**``, ``*斜体*``, ``__bold__``, ``* item``) is left
out on purpose: not spoken, and not reported as unspoken text either (issue 42); a ``*`` that
decorates nothing is still reported."""

from __future__ import annotations

import pytest

from chattts_serving.text.normalize import normalize


@pytest.mark.parametrize("text, spoken", [
    ("这是**重点**内容。This is **bold** text.", "这是重点内容。This is bold text."),
    ("*斜体*和__粗体__。", "斜体和粗体。"),
    ("* item one\n* item two", "item one. item two"),
    ("***very*** good", "very good"),
])
def test_markdown_decoration_is_not_unspoken(text: str, spoken: str) -> None:
    result = normalize(text)
    assert result.text == spoken and result.dropped == ()


@pytest.mark.parametrize("text", ["a * b", "rated 5* hotel"])
def test_a_star_that_decorates_nothing_is_still_reported(text: str) -> None:
    assert "*" in normalize(text).dropped


def test_stars_with_a_meaning_are_still_read() -> None:
    assert normalize("3*4=12").text == "三乘以四等于十二" and normalize("138****5678").dropped == ()
