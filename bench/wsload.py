"""Text at LLM speed through the gateway's WebSocket (``/v1/audio/speech/stream``).

Each client replays a text of a few sentences as an LLM would write it: one token per delta at
``tokens_per_s`` (a token: one CJK character, or one word with the white space after it, or a
run of white space: :func:`tokens_of`), then ``end``. Per sentence it records the time from
the delta that holds the sentence's last character (as the gateway's
:class:`~chattts_serving.text.sentences.SentenceSplitter` cuts it) to the sentence's first
audio frame; per sentence, the start buffer its playback needs to have no gap when it starts
at the sentence's first frame (:func:`~bench.stats.needed_buffer_s` over the
sentence's frames). At 20 tokens/s natural speech lags the text (about 4 to 5 Chinese
characters or 2.5 English words per second of speech), so such a gap is the synthesis falling
behind, not the text. The benchmark fixes each sentence's audio at exactly ``tokens`` tokens
(min = max), so a short sentence's audio may end before the next one is written; the
connection's buffer over all its frames, which includes that wait for text, is reported beside.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from chattts_serving import contract
from chattts_serving.text.sentences import SentenceSplitter

from .gatewayload import GatewayStartError, _f, _fmt, _level, gateway_process
from .stats import REALTIME_TOLERANCE_S, needed_buffer_s, percentile, phase_section

WS_PATH: Final = "/v1/audio/speech/stream"
WS_LEVELS: Final = (1, 8)
TOKENS_PER_S: Final = 20.0
"""Deltas per second of the replayed text: an LLM's output speed."""
WS_FIGURES: Final = ("ws_sentence_latency_p50_s_c1", "ws_sentence_latency_p95_s_c8", "ws_gapless_fraction_c8")
"""bench.json figures: sentence-complete to first audio p50 at concurrency 1 and p95 at 8 (s),
and the share of sentences at 8 whose playback from their first frame has no gap (needed start
buffer within the real-time tolerance)."""
_TOKEN: Final = re.compile(r"[\u3000-\u9fff\uff00-\uffef]|[^\s\u3000-\u9fff\uff00-\uffef]+\s*|\s+")


def tokens_of(text: str) -> list[str]:
    """``text`` as LLM-like tokens, in order and complete (their concatenation is ``text``):
    a CJK character or full-width mark, a word (a run without white space or CJK) with the
    white space after it, or a run of white space."""
    return _TOKEN.findall(text)


def last_deltas(deltas: Sequence[str]) -> list[int]:
    """For each sentence the gateway will cut from ``"".join(deltas)``, the index of the delta
    holding its last character. (The gateway releases a sentence whose end may still grow,
    ``。`` before a closing quote, when the next character arrives: a sentence's latency
    includes that wait.)"""
    text = "".join(deltas)
    ends = [0]
    for d in deltas:
        ends.append(ends[-1] + len(d))
    out: list[int] = []
    pos = 0
    splitter = SentenceSplitter()
    for sentence in splitter.feed(text) + splitter.end():
        start = text.find(sentence, pos)
        last = start + len(sentence) - 1
        pos = last + 1
        out.append(next(i for i in range(len(deltas)) if ends[i] <= last < ends[i + 1]))
    return out


async def replay(url: str, text: str, *, voice: str, seed: int, tokens: int, tokens_per_s: float,
                 timeout_s: float) -> dict[str, Any]:
    """One connection replaying ``text`` (module docstring). Returns ``{"ok", "error",
    "sentence_latency_s": [...], "needed_buffer_s", "ttfa_s", "audio_s", "frames"}``; errors are
    recorded, never raised."""
    import websockets

    deltas = tokens_of(text)
    points = last_deltas(deltas)
    sent_at: list[float] = []
    frames: list[tuple[float, int, int]] = []  # (arrival, samples, sentence index)
    events: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    async def session() -> str | None:
        error: str | None = None
        async with websockets.connect(url.replace("http://", "ws://") + WS_PATH, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "voice": voice, "seed": seed, "response_format": "pcm",
                                      "max_new_tokens": tokens, "min_new_tokens": tokens}))

            async def send() -> None:
                for d in deltas:
                    sent_at.append(time.perf_counter())
                    await ws.send(json.dumps({"type": "text", "text": d}))
                    await asyncio.sleep(1.0 / tokens_per_s)
                sent_at.append(time.perf_counter())
                await ws.send(json.dumps({"type": "end"}))

            sender = asyncio.create_task(send())
            current = -1
            try:
                async for msg in ws:
                    if isinstance(msg, bytes):
                        frames.append((time.perf_counter(), len(msg) // 2, current))
                        continue
                    ev = json.loads(msg)
                    events.append(ev)
                    if ev["type"] == "sentence_start":
                        current = ev["index"]
                    elif ev["type"] == "error":
                        error = f"{ev['kind']}: {ev['message']}"
                    elif ev["type"] == "done":
                        break
            finally:
                sender.cancel()
        return error

    try:
        error = await asyncio.wait_for(session(), timeout_s)
    except Exception as exc:  # a benchmark reports failures; it does not die on them
        error = f"{type(exc).__name__}: {exc}"
    first_frame: dict[int, float] = {}
    for t, _n, i in frames:
        first_frame.setdefault(i, t)
    latency = [first_frame[i] - sent_at[p] for i, p in enumerate(points) if i in first_frame and p < len(sent_at)]
    samples = sum(n for _t, n, _i in frames)
    done = bool(events) and events[-1]["type"] == "done"
    in_sentence = [needed_buffer_s([t for t, _n, j in frames if j == i], [n for _t, n, j in frames if j == i])
                   for i in sorted(first_frame)]
    return {"ok": done and error is None, "error": error, "sentences": len(points), "sentence_latency_s": latency,
            "sentence_buffer_s": [b for b in in_sentence if b is not None],
            "needed_buffer_s": needed_buffer_s([t for t, _n, _i in frames], [n for _t, n, _i in frames]),
            "ttfa_s": frames[0][0] - t0 if frames else None, "audio_s": samples / contract.SAMPLE_RATE_HZ,
            "frames": len(frames)}


def _summary(conns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    lat = [x for c in conns for x in c["sentence_latency_s"]]
    buffers = [c["needed_buffer_s"] for c in conns if c["needed_buffer_s"] is not None]
    in_sentence = [b for c in conns for b in c["sentence_buffer_s"]]
    return {"connections": len(conns), "ok": sum(1 for c in conns if c["ok"]),
            "sentences": sum(c["sentences"] for c in conns), "sentences_with_audio": len(lat),
            "sentence_latency_p50_s": percentile(lat, 50), "sentence_latency_p95_s": percentile(lat, 95),
            "sentence_latency_max_s": max(lat) if lat else None,
            "needed_buffer_p50_s": percentile(buffers, 50), "needed_buffer_max_s": max(buffers) if buffers else None,
            "sentence_buffer_p50_s": percentile(in_sentence, 50),
            "sentence_buffer_max_s": max(in_sentence) if in_sentence else None,
            "gapless_fraction": (sum(1 for b in in_sentence if b <= REALTIME_TOLERANCE_S) / len(in_sentence)
                                 if in_sentence else None),
            "ttfa_p50_s": percentile([c["ttfa_s"] for c in conns if c["ttfa_s"] is not None], 50),
            "errors": sorted({c["error"] for c in conns if c["error"]})[:5]}


def run_ws_phase(grpc_url: str, sentences: Sequence[str], *, levels: Sequence[int] = WS_LEVELS, tokens: int,
                 voice: str, port: int, log_path: Path, sentences_per_text: int = 3,
                 tokens_per_s: float = TOKENS_PER_S, timeout_s: float = 600.0,
                 progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """At each level c, c connections at once each replay ``sentences_per_text`` benchmark
    sentences at ``tokens_per_s`` through a gateway started on ``port`` (after one unmeasured
    warm-up connection). Returns ``{"tokens_per_s", "tokens", "levels": [{"concurrency",
    **summary, "records"}]}``, or ``{"error": reason, "levels": []}`` when the gateway could
    not start."""
    def text_for(i: int) -> str:
        return "".join(sentences[(i * sentences_per_text + k) % len(sentences)] for k in range(sentences_per_text))

    async def level(url: str, c: int) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(replay(url, text_for(c * 100 + i), voice=voice, seed=3000 * c + i,
                                                  tokens=tokens, tokens_per_s=tokens_per_s, timeout_s=timeout_s)
                                           for i in range(c))))

    try:
        with gateway_process(grpc_url, port, log_path) as (url, _proc):
            asyncio.run(replay(url, sentences[0], voice=voice, seed=0, tokens=tokens, tokens_per_s=1000.0,
                               timeout_s=timeout_s))
            out = []
            for c in levels:
                conns = asyncio.run(level(url, c))
                summary = _summary(conns)
                out.append({"concurrency": c, **summary, "records": conns})
                p50, p95 = _fmt(summary["sentence_latency_p50_s"]), _fmt(summary["sentence_latency_p95_s"])
                progress(f"websocket c={c}: sentence done to first audio p50 {p50} s, p95 {p95} s; "
                         f"gapless {_fmt(summary['gapless_fraction'])}; ok {summary['ok']}/{c}")
            return {"tokens_per_s": tokens_per_s, "tokens": tokens, "sentences_per_text": sentences_per_text,
                    "levels": out}
    except GatewayStartError as exc:
        progress(f"websocket: {exc}")
        return {"error": str(exc), "levels": []}


def ws_figures(result: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The :data:`WS_FIGURES` of a :func:`run_ws_phase` result (None where a level is missing)."""
    return {"ws_sentence_latency_p50_s_c1": _level(result, 1).get("sentence_latency_p50_s"),
            "ws_sentence_latency_p95_s_c8": _level(result, 8).get("sentence_latency_p95_s"),
            "ws_gapless_fraction_c8": _level(result, 8).get("gapless_fraction")}


def ws_markdown(result: Mapping[str, Any]) -> list[str]:
    """The report's section on the WebSocket stream (empty when the phase did not run)."""
    ws, lines = phase_section(result, "ws",
                              "Text at LLM speed over the gateway's WebSocket (`/v1/audio/speech/stream`)")
    if ws is None:
        return lines
    lines += [f"Each connection replays {ws.get('sentences_per_text', 3)} sentences at {ws['tokens_per_s']:g} "
              f"tokens/s (a token: one CJK character or one word), {ws['tokens']} audio tokens per sentence. "
              "Latency: the delta holding a sentence's last character to its first audio frame. In-sentence "
              "buffer: the start buffer a sentence's playback from its first frame needs to have no gap; gapless: "
              "the share of sentences needing at most 10 ms. Connection buffer: the same over the whole "
              "connection, which also waits for text still being written.", "",
              "| c | ok | sentences | latency p50 s | p95 s | max s | in-sentence buffer p50 s | max s | gapless "
              "| connection buffer max s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for lv in ws["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['ok']}/{lv['connections']} | {lv['sentences']} | "
                     f"{_f(lv['sentence_latency_p50_s'])} | {_f(lv['sentence_latency_p95_s'])} | "
                     f"{_f(lv['sentence_latency_max_s'])} | {_f(lv['sentence_buffer_p50_s'])} | "
                     f"{_f(lv['sentence_buffer_max_s'])} | {_f(lv['gapless_fraction'], 2)} | "
                     f"{_f(lv['needed_buffer_max_s'])} |")
    errors = [e for lv in ws["levels"] for e in lv.get("errors", [])]
    if errors:
        lines += ["", "Errors: " + "; ".join(errors[:5])]
    return lines
