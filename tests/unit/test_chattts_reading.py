"""The ``chattts`` segmentation reads a piece as ChatTTS does (issue #32, item 4): where our
normalisation changes no spoken word, the text the GPT sees is what ChatTTS' own normaliser
(``Chat.normalizer``, the one ``Chat.infer`` runs) makes of the piece, so a mid-text ``？`` is
left out as ChatTTS leaves it out instead of becoming our ``。``; digits, symbols read aloud and
reserved tokens keep our reading. tests/unit/test_multisentence.py checks the audio against
``Chat.infer`` on such a text."""

from __future__ import annotations

from typing import Any

import pytest

from chattts_serving.runtime import Artifacts
from chattts_serving.text.frontend import FrontEnd
from chattts_serving.text.voices import VoiceBook

PLAIN_PIECES = ["你好吗？今天天气很好。", "真的吗？！太好了；我们走吧…", "他说：“你好”，然后走了。",
                "『红楼梦』和《西游记》？", "Hello, world! How are you? Fine; thanks.",
                "What?! “Really”… yes.", "你好吗？[uv_break]我很好。", "今天天气很好。", "？", "好的！！"]


@pytest.fixture(scope="module")
def frontend(small_artifacts: Artifacts) -> FrontEnd:
    return FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook())


@pytest.mark.parametrize("piece", PLAIN_PIECES)
def test_a_piece_our_pass_need_not_change_is_read_as_chattts_reads_it(frontend: FrontEnd, small_chat: Any,
                                                                      piece: str) -> None:
    upstream = small_chat.normalizer(piece, True, True).strip()
    assert frontend.prepare(piece, keep_unspeakable=True).normalized == upstream


def test_the_streaming_segmentation_keeps_our_punctuation(frontend: FrontEnd) -> None:
    assert frontend.prepare("你好吗？今天天气很好。").normalized == "你好吗。今天天气很好。"


@pytest.mark.parametrize("piece, ours", [("我有3个苹果？", "我有三个苹果。"), ("A&B公司？", "A和B公司。"),
                                         ("[Stts]你好？", "你好。")])
def test_a_piece_with_something_to_read_keeps_our_reading(frontend: FrontEnd, small_chat: Any, piece: str,
                                                          ours: str) -> None:
    """ChatTTS would delete the digit, the symbol, or keep the reserved token: ours reads them."""
    prepared = frontend.prepare(piece, keep_unspeakable=True)
    assert prepared.normalized == ours != small_chat.normalizer(piece, True, True).strip()
