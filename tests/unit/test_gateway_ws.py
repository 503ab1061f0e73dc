"""The incremental sentence splitter of ``/v1/audio/speech/stream``
(chattts_serving/text/sentences.py), no server: deltas cut anywhere give the sentences of the
whole text; numbers, abbreviations and closing quotes; an over-long sentence cut at a pause; an
LLM's list markers and markdown kept with their words. The WebSocket over a real gateway and
tritonserver: tests/server/test_gateway_ws.py."""

from __future__ import annotations

import random
import re

import pytest

from chattts_serving.text.sentences import SentenceSplitter, markup_only, split_sentences

TEXTS = [
    "今天是2024年3月5日，气温25.5℃。他说：“好的。”然后走了！？明天见",
    "Mr. Smith paid $3.50 for it. Really?! \"Yes.\" The rate was 3.5% (approx. 4). Done",
    "第一句话。Second one... third; 第4句：价格是1,234.56元！\n最后一句",
    "e.g. this one, and i.e. that one. 没有句号的结尾？Dr. No. 9:30 a.m. 结束",
]


def _feed(parts: list[str]) -> list[str]:
    s = SentenceSplitter()
    out = [sentence for p in parts for sentence in s.feed(p)]
    return out + s.end()


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_cut_at_every_position_give_the_sentences_of_the_whole_text(text: str) -> None:
    whole = split_sentences(text)
    assert len(whole) >= 3
    for i in range(len(text) + 1):
        assert _feed([text[:i], text[i:]]) == whole, f"cut at {i}: {text[:i]!r} | {text[i:]!r}"
    rng = random.Random(5)
    for _ in range(30):  # many cuts at once, one character per delta included
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) - 1)))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert _feed(parts) == whole
    assert _feed(list(text)) == whole
    # nothing is lost: the sentences are the text without the white space between them
    assert re.sub(r"\s", "", "".join(whole)) == re.sub(r"\s", "", text)


def test_sentence_rules_numbers_abbreviations_and_closing_quotes() -> None:
    assert split_sentences(TEXTS[0]) == ["今天是2024年3月5日，气温25.5℃。", "他说：“好的。”", "然后走了！？", "明天见"]
    assert split_sentences(TEXTS[1]) == ["Mr. Smith paid $3.50 for it.", "Really?!", '"Yes."',
                                         "The rate was 3.5% (approx. 4).", "Done"]
    s = SentenceSplitter()
    assert s.feed("It costs 3.") == [] and s.pending == "It costs 3."  # "3." may become "3.5"
    assert s.feed("5 dollars. Next") == ["It costs 3.5 dollars."]
    assert s.feed("。") == [] and s.feed("x") == ["Next。"]  # held until the next character decides
    assert s.flush() == ["x"] and s.flush() == []


def test_an_over_long_sentence_is_cut_at_its_last_pause() -> None:
    text = "这是一个很长的句子，" * 10
    out = split_sentences(text, max_chars=25)
    assert all(len(p) <= 25 for p in out) and "".join(out) == text
    assert all(p.endswith("，") for p in out)


LLM_REPLIES = [
    ("Here are the steps:\n1. Open Settings.\n2. Click Network.",
     ["Here are the steps:", "1. Open Settings.", "2. Click Network."]),
    ("步骤如下：\n1. 打开设置。\n2. 点击网络。\n3) 选择无线局域网。",
     ["步骤如下：", "1. 打开设置。", "2. 点击网络。", "3) 选择无线局域网。"]),
    ("## Summary\n- **Fast**: it streams.\n* Cheap.\n• Open source.",
     ["## Summary", "- **Fast**: it streams.", "* Cheap.", "• Open source."]),
    ("**Note.** Save your work first. Then run `make test.` and `ls -la`. Done!",
     ["**Note.**", "Save your work first.", "Then run `make test.` and `ls -la`.", "Done!"]),
    ("> He said \"Stop.\" Then he left.", ['> He said "Stop."', "Then he left."]),
    ("好的，没问题！😀", ["好的，没问题！😀"]),
    ("Sure thing!🎉✨\n\n1.\nOpen the app. 👍", ["Sure thing!🎉✨", "1. Open the app.", "👍"]),
    ("第一步：打开设置。\n(2) 点击“网络”。", ["第一步：打开设置。", "(2) 点击“网络”。"]),
]


def _llm_tokens(text: str) -> list[str]:
    """The text as an LLM streams it: one CJK character, or one word with its trailing
    white space, per delta (what the page and the benchmark send)."""
    return re.findall(r"[\u3000-\u9fff\uff00-\uffef]|[^\s\u3000-\u9fff\uff00-\uffef]+\s*|\s+", text)


@pytest.mark.parametrize("text, expected", LLM_REPLIES, ids=[t[:20] for t, _ in LLM_REPLIES])
def test_llm_replies_keep_list_markers_and_markdown_with_their_words(text: str, expected: list[str]) -> None:
    """List markers (``1.``, ``2)``, ``(2)``, ``-``, ``*``, ``•``), headings, emphasis, code
    spans, quotes and a trailing emoji stay with the words they belong to, whether the reply
    comes word by word or whole: ``1.`` alone was a sentence of its own, read in Chinese."""
    assert split_sentences(text) == expected
    assert _feed(_llm_tokens(text)) == expected
    assert _feed(list(text)) == expected
    assert not any(markup_only(sentence) for sentence in expected)


def test_decoration_alone_is_still_spoken_when_nothing_follows() -> None:
    """A held list marker is released by flush and end: nothing the client sent is lost."""
    s = SentenceSplitter()
    assert s.feed("Options:\n1. ") == ["Options:"] and s.pending.strip() == "1."
    assert s.flush() == ["1."]
    assert split_sentences("- ") == ["-"]
