"""Readings a listener notices at once (issue #43) through a real tritonserver: codes in running
text, maths in a Chinese sentence, blood pressure, midnight, a signed 百分之, titles before names
with a date or a second abbreviation, inline numbered lists; the WebSocket's sentence events for
the title and list cases in both dialects. In process: tests/unit/test_textnorm_listeners.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from chattts_serving.client import SynthesisRequest, synthesize_offline, synthesize_stream
from chattts_serving.gateway import GatewaySettings
from chattts_serving.text.segments import join_normalized
from tests.server.test_gateway_omni import CONFIG, DocClient, Utterance, run
from tests.server.test_gateway_ws import START, _converse
from tests.support.servers import Server, running_gateway

READINGS = [
    ("车牌粤B·67890的车停在这里。", "auto", "车牌粤B六七八九零的车停在这里。"),
    ("我住5号楼2306。", "auto", "我住五号楼二三零六。"),
    ("宁德时代（300750）今天涨停。", "auto", "宁德时代，三零零七五零，今天涨停。"),
    ("已知a²-b²=0，求a。", "zh", "已知a的平方减b的平方等于零，求a。"),
    ("已知a²-b²=0，求a。", "auto", "已知a的平方减b的平方等于零，求a。"),
    ("√3约等于1.732。", "zh", "根号三约等于一点七三二。"),
    ("血压135/85mmHg。", "auto", "血压一百三十五，八十五毫米汞柱。"),
    ("The store is open until 24:00.", "auto", "The store is open until midnight."),
    ("同比-百分之5。", "auto", "同比负百分之五。"),
    ("Mr. Smith agreed on March 5, 2024.", "auto", "Mister Smith agreed on March fifth, twenty twenty four."),
    ("Ask Mr. Smith and Dr. Brown, e.g. today.", "auto", "Ask Mister Smith and Doctor Brown, for example today."),
    ("好的！我们一起看看：1. 打开设置。2. 点击保存。", "auto", "好的。我们一起看看，一，打开设置。二，点击保存。"),
]


@pytest.mark.parametrize("text, language, expected", READINGS)
def test_the_server_reads_as_a_listener_expects(triton_server: Server, text: str, language: str,
                                                expected: str) -> None:
    """Streaming (gRPC) and offline (HTTP) doors: the normalised text of every segment, joined."""
    req = SynthesisRequest(text=text, language=language, max_new_tokens=4, min_new_tokens=4)
    for info in (synthesize_stream(triton_server.grpc_url, req, timeout_s=120).info,
                 synthesize_offline(triton_server.http_url, req, timeout_s=120).info):
        assert join_normalized(info["normalized_text"]) == expected, info["normalized_text"]


@pytest.fixture(scope="module")
def gateway_url(triton_server: Server) -> Iterator[str]:
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, ws_lookahead=0)) as url:
        yield url


WS_SENTENCES = [
    ("Mr. Smith agreed on March 5, 2024. Ask Mr. Smith and Dr. Brown, e.g. today.",
     [("Mr. Smith agreed on March 5, 2024.", "Mister Smith agreed on March fifth, twenty twenty four."),
      ("Ask Mr. Smith and Dr. Brown, e.g. today.", "Ask Mister Smith and Doctor Brown, for example today.")]),
    ("好的！我们一起看看：1. 打开设置。2. 点击保存。",
     [("好的！", "好的。"), ("我们一起看看：", "我们一起看看"), ("1. 打开设置。", "一，打开设置。"),
      ("2. 点击保存。", "二，点击保存。")]),
    ("Here are the steps: 1. Open Settings. 2. Click Save.",
     [("Here are the steps:", "Here are the steps"), ("1. Open Settings.", "one, Open Settings."),
      ("2. Click Save.", "two, Click Save.")]),
]


@pytest.mark.parametrize("text, sentences", WS_SENTENCES)
def test_websocket_sentences_keep_titles_and_list_numbers_with_their_words(gateway_url: str, text: str,
                                                                          sentences: list[tuple[str, str]]) -> None:
    """The gateway's own dialect, the text sent in pieces of three characters: each
    ``sentence_start`` carries the sentence and what the server read."""
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    msgs: list[Any] = [{**START, "max_new_tokens": 4, "min_new_tokens": 4},
                       *({"type": "text", "text": p} for p in pieces), {"type": "end"}]
    conv = asyncio.run(_converse(gateway_url, msgs, key=None))
    starts = [e for e in conv.events if e["type"] == "sentence_start"]
    assert [(e["text"], e["normalized_text"]) for e in starts] == sentences, conv.events


@pytest.mark.parametrize("text, sentences", [(t, [s for s, _ in ss]) for t, ss in WS_SENTENCES])
def test_omni_sentence_granularity_keeps_list_numbers_with_their_items(gateway_url: str, text: str,
                                                                      sentences: list[str]) -> None:
    """vLLM-Omni's dialect with ``split_granularity: "sentence"``: the same sentences."""
    async def script(c: DocClient, ws: Any) -> Utterance:
        await c.send(**{**CONFIG, "max_new_tokens": 4}, response_format="pcm", split_granularity="sentence")
        return await c.utterance([text[i:i + 4] for i in range(0, len(text), 4)])

    u = run(gateway_url, script)
    assert not u.errors and [x.start["sentence_text"] for x in u.sentences] == sentences
