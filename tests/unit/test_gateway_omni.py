"""vLLM-Omni's streaming-text dialect on ``/v1/audio/speech/stream`` against the real gateway
and a real tritonserver.

:class:`DocClient` is written from vLLM-Omni's documentation of the protocol only (its
``docs/serving/speech_api.md``, "Streaming Text Input (WebSocket)": client ``session.config``,
``input.text``, ``input.done``, ``session.close``; server ``audio.start``, binary frames,
``audio.done``, ``session.done``, ``error``), not from this gateway's code. The same path
still speaks this gateway's own dialect when the first message is ``start``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from chattts_serving.gateway.omni_ws import ClauseSplitter


@dataclass
class Sentence:
    start: dict[str, Any]
    frames: list[bytes] = field(default_factory=list)
    done: dict[str, Any] | None = None


@dataclass
class Utterance:
    sentences: list[Sentence] = field(default_factory=list)
    done: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)


class DocClient:
    """A client of the documented protocol: send a config, text chunks and input.done; collect
    audio.start / binary frames / audio.done per sentence until session.done."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def utterance(self, chunks: list[str]) -> Utterance:
        for c in chunks:
            await self.send(type="input.text", text=c)
        await self.send(type="input.done")
        return await self.collect()

    async def collect(self) -> Utterance:
        u = Utterance()
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), 120)
            if isinstance(msg, bytes):
                u.sentences[-1].frames.append(msg)
                continue
            event = json.loads(msg)
            if event["type"] == "audio.start":
                u.sentences.append(Sentence(event))
            elif event["type"] == "audio.done":
                assert u.sentences[-1].start["sentence_index"] == event["sentence_index"]
                u.sentences[-1].done = event
            elif event["type"] == "session.done":
                u.done = event
                return u
            elif event["type"] == "error":
                u.errors.append(event)


def test_clause_splitting_cuts_after_pauses_but_not_inside_numbers() -> None:
    s = ClauseSplitter(400)
    out = s.feed("价格是1,234元，好吗？Yes, it is: 10:30 sharp") + s.end()
    assert out == ["价格是1,234元，", "好吗？", "Yes,", "it is:", "10:30 sharp"]
