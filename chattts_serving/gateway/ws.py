"""``/v1/audio/speech/stream``: text that arrives as it is written, audio that leaves as it is made.

One WebSocket per utterance (or conversation turn). The client sends JSON text messages::

    {"type": "start", "voice": "alloy", "response_format": "pcm", "seed": 3, ...}   # first, once
    {"type": "text", "text": "Hello, wor"}                                           # any number
    {"type": "flush"}                                                                # optional
    {"type": "interrupt"}                                                            # barge-in
    {"type": "end"}                                                                  # last

The start message is checked whole before ``started``, as ``POST /v1/audio/speech`` checks a
request: the gateway's own checks, then the server's, by a ``validate_only`` request that
generates nothing (an unknown voice, a parameter outside the server's limits: one ``error`` and
close 1007; a full server: 1013). The gateway cuts the text into sentences as they complete
(:class:`~chattts_serving.text.sentences.SentenceSplitter`; a sentence also ends on ``flush``,
``end`` or after ``ws_idle_flush_s`` without text) and synthesises each as one ``chattts``
stream over the shared :class:`~chattts_serving.client.AioStreamClient`, with the start
message's fields (the same seed for every sentence): sentence *i*'s audio is what
``POST /v1/audio/speech`` returns for sentence *i* alone with those fields. Up to
``ws_lookahead`` sentences are synthesised ahead of the one being sent; audio is sent strictly
in sentence order, as binary frames of ``response_format`` (one encoder for the connection:
a WAV header comes once), between JSON events (:func:`event`): ``started``, then per sentence
``sentence_start`` / ``sentence_done`` (with ``unspoken``, ``dropped`` for a sentence with
nothing to speak, which is no error, and ``degraded`` when the server made it in its degraded
mode), then ``done`` (or ``error``), and the server closes with a code of :class:`Close`.

Back-pressure: each sentence holds at most ``ws_queue_chunks`` undelivered chunks; when that is
full the gateway stops reading its Triton stream, and at most ``1 + ws_lookahead`` sentences
are in synthesis, so a connection's memory is bounded whatever the client does. A client that
takes no frame for ``ws_send_timeout_s`` is cut off: its syntheses are cancelled and the
socket closed with 1008. Closing the socket cancels every synthesis of the connection in the
engine. While the gateway drains (:mod:`.drain`) a ``start`` is refused and a stream still
running at the drain timeout is ended, both with a retryable ``error`` and close 1012.

Barge-in: ``interrupt`` cancels the utterance being spoken (its Triton streams in flight are
cancelled, the sentences queued dropped, no frame of it follows) and is answered by
``interrupted``: what the client was sent (:func:`.timings.interruption_fields`). The
connection stays open with its start's fields; the next ``text`` begins a new utterance (a new
audio stream of the format: sentence indices and timings from 0, a WAV header again).

The machinery both dialects share (admission, lookahead, sends, the connection's end, the
close codes) is :mod:`.stream_core`; this module adds our dialect's messages and events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import unicodedata
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from fastapi import WebSocket
from pydantic import ValidationError

from .. import contract
from ..audio import rates as audio_rates
from ..client import ClientError, SynthesisRequest
from ..errors import NOTHING_SPEAKABLE, ErrorKind
from ..text.segments import join_normalized
from ..text.sentences import SentenceSplitter
from .errors import AUTHENTICATION, INVALID_REQUEST, ApiError, from_client_error
from .speech import OFFLOADED_FORMATS, SpeechRequest, output_format, speaker_voice
from .state import GatewayState
from .stream_core import (
    CLOSE_FOR_KIND,
    START_PROBE_TEXT,
    SUBPROTOCOL,
    ClientGone,
    Close,
    Sentence,
    StreamCore,
    StreamEnd,
    encoded,
    error_fields,
    event,
    first_cause,
    offered_key,
)
from .timings import DeliveryClock, SentenceTiming, interruption_fields

log = logging.getLogger("chattts_serving.gateway.ws")

WS_PATH: Final = "/v1/audio/speech/stream"
"""The WebSocket's route, both dialects' (:mod:`.dialects` tells them apart)."""
MAX_INBOX_CHARS: Final = 1 << 20
"""Text read from the socket and not yet cut into sentences (characters); beyond it the gateway stops
reading the socket (TCP back-pressure on a client that writes faster than the voice speaks).
The socket is read ahead of the synthesis so that an ``interrupt`` is seen at once."""


def unspoken_characters(text: str) -> list[str]:
    """The characters of ``text`` that are neither white space nor punctuation, each once, in
    order: what is reported unspoken for a sentence with nothing speakable (``😀😀。`` ->
    ``["😀"]``; the front end reports the characters of a speakable one itself)."""
    out: list[str] = []
    for ch in text:
        if not ch.isspace() and unicodedata.category(ch)[0] not in "PMC" and ch not in out:  # marks, joiners
            out.append(ch)
    return out


def invalid(message: str, param: str | None = None, code: str = "invalid_message") -> StreamEnd:
    """A malformed message: error event of kind invalid, close 1007."""
    return StreamEnd(Close.INVALID_DATA, ApiError(400, message, INVALID_REQUEST, param=param, code=code))


def parse_start(msg: dict[str, Any]) -> tuple[SpeechRequest, str]:
    """The start message as a :class:`~chattts_serving.gateway.speech.SpeechRequest` (``model``
    defaults to ``chattts``, ``response_format`` to ``pcm``; ``input``, when given, is the first
    text) and that first text.

    Raises :class:`StreamEnd` (invalid, 1007) naming the field that is wrong."""
    fields = {k: v for k, v in msg.items() if k != "type"}
    first = fields.pop("input", "")
    if not isinstance(first, str):
        raise invalid("input: must be a string", "input")
    if "stream_format" in fields:
        raise invalid("stream_format: not used on the WebSocket stream (audio comes as binary frames)",
                      "stream_format", code="unsupported_parameter")
    fields.setdefault("model", "chattts")
    fields.setdefault("response_format", "pcm")
    try:
        body = SpeechRequest.model_validate({**fields, "input": first or "-"})
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = [str(p) for p in problem.get("loc", ())]
        raise invalid(f"{loc[0] if loc else 'start'}: {problem.get('msg', 'invalid')}", loc[0] if loc else None,
                      code="invalid_value") from None
    return body, first


@dataclass
class _Turn:
    """One utterance of our dialect: from ``start`` (or an ``interrupt``) to ``done`` or the next
    ``interrupt``. The reader (:meth:`SpeechStream._receive`) files the client's messages in its
    inbox; the speaker (:meth:`SpeechStream._speak_turn`) cuts, synthesises and sends them
    inside ``scope``, which an interrupt cancels."""

    index: int
    splitter: SentenceSplitter
    inbox: deque[dict[str, Any]] = field(default_factory=deque)
    inbox_chars: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the inbox gains or loses a message."""
    received: list[str] = field(default_factory=list)
    """The text the client sent in this utterance."""
    ended: bool = False
    """``end`` was read."""
    flush_due: bool = False
    """Text was filed since the last flush: after ``ws_idle_flush_s`` without a message, flush."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    finished: bool = False
    """Every sentence was sent (an interrupt after it changes nothing: ``done`` follows)."""

    def put(self, msg: dict[str, Any], size: int) -> None:
        self.inbox.append(msg)
        self.inbox_chars += size
        self.changed.set()

    async def get(self) -> dict[str, Any]:
        while not self.inbox:
            self.changed.clear()
            await self.changed.wait()
        msg = self.inbox.popleft()
        self.inbox_chars -= len(msg.get("text") or "")
        self.changed.set()
        return msg


class SpeechStream(StreamCore):
    """One WebSocket connection of ``/v1/audio/speech/stream`` in our dialect (module
    docstring): reads the client's messages, synthesises sentences in order with bounded
    lookahead (:class:`.stream_core.StreamCore`), sends events and audio frames, and releases
    everything however the connection ends."""

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        super().__init__(websocket, state)
        self.samples_in = 0
        """Samples of audio (24 kHz) of the sentences sent so far: where the next one starts."""
        self.rate_hz = contract.SAMPLE_RATE_HZ
        """The delivered sample rate (the connection's encoder's)."""
        self.dropped: list[int] = []
        """Indices of the sentences with nothing to speak (an emoji, symbols), reported in ``done``."""
        self.unspoken: list[str] = []
        """What the connection's sentences could not speak, in order of first appearance."""
        self.degraded = 0
        """Sentences the server made in its degraded mode."""
        self.turn = _Turn(0, self.splitter)
        """The utterance the client's messages go to."""
        self.speaking = 0
        """The index of the utterance being spoken (in its sentences' request ids, so that every
        request id in the server's log is unique)."""
        self.turns: asyncio.Queue[_Turn] = asyncio.Queue(4)
        """The utterances to speak, in order (a new one after each interrupt; a client that
        interrupts again and again without reading the answers stops being read)."""
        self.clock: DeliveryClock | None = None
        """What the client has been sent of the utterance's audio stream."""
        self.cut_from = 0
        """``clock.samples`` when the sentence being sent began."""

    # --- the connection -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection to its end (never raises for anything the client does)."""
        offered = self.ws.scope.get("subprotocols") or []
        await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await self._run_to_end(self._serve_connection)

    async def _serve_connection(self) -> None:
        """The connection from its start to its end, which it raises (:class:`StreamEnd`)."""
        try:
            self._authorize()
            with self.drain.idle() as waiting:
                try:
                    start = await self._receive_message(self.cfg.stream_idle_timeout_s, start=True)
                except TimeoutError:
                    raise self._idle_timeout() from None
            if waiting.cancelled_caught or self.drain.draining:
                raise self._drained()
            body, first = parse_start(start)
            # the start is checked whole, as POST /v1/audio/speech checks a request: here what
            # the gateway checks (model, voice given, instructions, reference WAV), then, on
            # the server, what it checks (voice known, parameters within its limits, the
            # reference and refine prompt), all before "started"
            probe = self._build(body, START_PROBE_TEXT)
            speaker_voice(body)  # a missing or empty voice fails at the start, not on the first sentence
            info = output_format(body)  # a rate or container the format does not take: 1007 now
            self._admit()  # the one admission decision, before the check awaits
            await self._validate(probe)
            await self._send_text(event("started", request_id=self.request_id, format=info.name,
                                        sample_rate_hz=info.sample_rate_hz))
            with self.drain.active() as running:
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._receive, first)
                        await self._speak(body)
                        tg.cancel_scope.cancel()
                except Exception as group:  # anyio's ExceptionGroup (a backport's on Python 3.10)
                    if not hasattr(group, "exceptions"):
                        raise
                    raise first_cause(group) from None
            if running.cancelled_caught:
                raise self._drained()
            raise StreamEnd(Close.NORMAL)
        except ApiError as exc:
            raise StreamEnd(CLOSE_FOR_KIND[exc.kind], exc) from None

    def _authorize(self) -> None:
        if not self.state.accepts_key(offered_key(self.ws)):
            raise StreamEnd(Close.POLICY, ApiError(
                401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' or offer the subprotocol "
                "'bearer.<key>'", AUTHENTICATION, code="invalid_api_key"))

    # --- reading the client's messages ----------------------------------------------------

    async def _receive_message(self, timeout_s: float | None, start: bool = False) -> dict[str, Any]:
        """The next JSON object from the client (``start``: it must be the start message).

        Raises ClientGone, TimeoutError (no message within ``timeout_s``) or StreamEnd for a
        malformed message."""
        with anyio.fail_after(timeout_s):
            msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            raise ClientGone()
        if msg.get("text") is None:
            raise StreamEnd(Close.UNSUPPORTED, ApiError(400, "binary messages are not understood: send JSON text "
                                                        "messages", INVALID_REQUEST, code="invalid_message"))
        try:
            data = json.loads(msg["text"])
        except json.JSONDecodeError as exc:
            raise invalid(f"the message is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise invalid('every message is a JSON object with a "type"', "type")
        kind = data["type"]
        if start and kind == "interrupt":
            raise invalid('nothing to interrupt before "start": the first message must be {"type": "start", ...}',
                          "type")
        if start and kind != "start":
            raise invalid(f'the first message must be {{"type": "start", ...}}, not "{kind}"', "type")
        if not start and kind not in ("text", "flush", "end", "interrupt"):
            raise invalid(f'unknown message type "{kind}": expected text, flush, end or interrupt', "type")
        if kind == "interrupt" and (extra := sorted(k for k in data if k != "type")):
            raise invalid(f'interrupt takes no fields, got "{extra[0]}"', extra[0])
        return data

    async def _receive(self, first: str) -> None:
        """Read the client's messages into the current utterance's inbox (the speaker cuts
        them into sentences), ahead of the synthesis so that an ``interrupt`` acts at once:
        it cancels the utterance and opens the next. Text not followed by more for
        ``ws_idle_flush_s`` is flushed; after ``end`` the reader waits for an interrupt or
        the client to go."""
        if first:
            self._file(self.turn, {"type": "text", "text": first})
        await self.turns.put(self.turn)
        idle_s = self.cfg.stream_idle_timeout_s
        idle_wait: float | None = None  # what is left of the idle time after the last audio sent
        while True:
            turn = self.turn
            while turn.inbox_chars >= MAX_INBOX_CHARS:  # back-pressure: stop reading the socket
                turn.changed.clear()
                await turn.changed.wait()
            pending = turn.flush_due
            timeout = None if turn.ended else (self.cfg.ws_idle_flush_s if pending else idle_wait or idle_s)
            try:
                msg = await self._receive_message(timeout)
            except TimeoutError:
                if pending:  # the text held so far is a sentence now (a no-op when none is held)
                    self._file(turn, {"type": "flush"})
                    continue
                quiet_s = time.monotonic() - self.sent_at
                if quiet_s < idle_s:  # still being sent its audio (a long first text): not idle
                    idle_wait = idle_s - quiet_s
                    continue
                raise self._idle_timeout() from None
            idle_wait = None
            if msg["type"] == "interrupt":
                await self._interrupt()
                continue
            if turn.ended:
                raise invalid(f'"{msg["type"]}" after "end"', "type")
            if msg["type"] == "text":
                text = msg.get("text")
                if not isinstance(text, str):
                    raise invalid('"text" must be a string', "text")
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise invalid("text: not valid Unicode (a lone surrogate)", "text") from None
            self._file(turn, msg)

    @staticmethod
    def _file(turn: _Turn, msg: dict[str, Any]) -> None:
        text = msg.get("text") if msg["type"] == "text" else None
        if text is not None:
            turn.received.append(text)
        if msg["type"] == "end":
            turn.ended = True
        turn.flush_due = text is not None
        turn.put({"type": msg["type"], "text": text}, len(text or ""))

    async def _interrupt(self) -> None:
        """Cancel the current utterance (its syntheses, its queued sentences, its unsent audio)
        and open the next, to which the following messages go. The speaker answers."""
        old = self.turn
        self.splitter = SentenceSplitter(self.sentence_chars)
        self.turn = _Turn(old.index + (1 if old.received else 0), self.splitter)
        old.scope.cancel()
        await self.turns.put(self.turn)

    async def _cut(self, turn: _Turn) -> None:
        """Cut the utterance's text into sentences, in the order it came, until ``end``."""
        while True:
            msg = await turn.get()
            if msg["type"] == "text":
                await self._queue(turn.splitter.feed(msg["text"]))
            elif msg["type"] == "flush":
                await self._queue(turn.splitter.flush())
            else:
                await self._queue(turn.splitter.end())
                await self.sentences.put(None)
                return

    def _idle_timeout(self) -> StreamEnd:
        return StreamEnd(Close.POLICY, ApiError(
            408, f"no message from the client and no audio to it for {self.cfg.stream_idle_timeout_s:g} s "
            "before end", INVALID_REQUEST,
            code="idle_timeout", kind=ErrorKind.DEADLINE))

    # --- synthesis ------------------------------------------------------------------------

    def _request(self, body: SpeechRequest, job: Sentence) -> SynthesisRequest:
        """The ``chattts`` request of sentence ``job``: the start message's fields with the
        sentence as ``input``. Raises ApiError (:func:`.speech.build_request`)."""
        utterance = f"{self.speaking}-" if self.speaking else ""  # the first utterance's ids as before
        return dataclasses.replace(self._build(body, job.text), request_id=f"{self.request_id}-{utterance}{job.index}")

    async def _speak(self, body: SpeechRequest) -> None:
        """Speak the utterances in order: the one that plays to its end is followed by ``done``
        (and the close); an interrupted one by ``interrupted``. While the gateway drains, an
        interrupted connection ends (1012): its next utterance would be refused."""
        while True:
            turn = await self.turns.get()
            if await self._speak_turn(turn, body):
                return
            report = self._interruption(turn)
            log.info("stream %s: utterance %d interrupted at sentence %s", self.request_id, turn.index,
                     report["sentence_index"])
            await self._send_text(event("interrupted", utterance_index=turn.index, **report))
            if self.drain.draining:
                raise self._drained()

    def _interruption(self, turn: _Turn) -> dict[str, Any]:
        """The ``interrupted`` fields of ``turn`` (:func:`.timings.interruption_fields`)."""
        clock = self.clock
        delivered = clock.samples if clock is not None else 0
        cut = self.cutting
        return interruption_fields(self.rate_hz, delivered, "".join(turn.received), self.spoken,
                                   cut.index if cut is not None else None, cut.text if cut is not None else None,
                                   delivered - self.cut_from if cut is not None else 0)

    async def _speak_turn(self, turn: _Turn, body: SpeechRequest) -> bool:
        """One utterance: its sentences synthesised and sent in order (a new audio stream of the
        format), then ``done``: True. False when it was interrupted (its scope cancelled)."""
        fmt = body.response_format
        self.speaking = turn.index
        encoder = audio_rates.new_output_encoder(fmt, body.sample_rate, body.container)
        self.rate_hz = encoder.info.sample_rate_hz
        self.clock = DeliveryClock(self.rate_hz, fmt, body.container)
        encode = functools.partial(encoded, fmt in OFFLOADED_FORMATS)

        self._new_utterance()
        self.samples_in, self.degraded, self.dropped, self.unspoken, self.cut_from = 0, 0, [], [], 0
        with turn.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._cut, turn)
                tg.start_soon(self._schedule, body, tg)
                while (job := await self.jobs.get()) is not None:
                    self.cutting, self.cut_from = job, self.clock.samples
                    try:
                        await self._send_sentence(job, encoder, encode)
                    finally:
                        self.slots.release()
                    self.cutting = None
                    self.count += 1
                turn.finished = True
                tg.cancel_scope.cancel()
        if not turn.finished:
            return False
        tail = await encode(encoder.finish)
        if tail:
            await self._send(functools.partial(self.ws.send_bytes, tail))
        await self._send_text(event("done", sentences=self.count, audio_s=round(self.audio_s, 4),
                                    dropped_sentences=self.dropped, unspoken=self.unspoken,
                                    degraded_sentences=self.degraded))
        return True

    def _unspoken(self, chars: list[str]) -> None:
        for c in chars:
            if c not in self.unspoken:
                self.unspoken.append(c)

    async def _send_sentence(self, job: Sentence, encoder: Any, encode: Callable[..., Any]) -> None:
        info: dict[str, Any] = {}
        started = dropped = False
        samples = 0
        first_audio_ms: float | None = None
        while True:
            item = await job.queue.get()
            if isinstance(item, (ClientError, ApiError)):
                error = item if isinstance(item, ApiError) else from_client_error(item, self.cfg.triton_url)
                if error.kind != ErrorKind.INVALID:
                    raise StreamEnd(CLOSE_FOR_KIND[error.kind], error)
                if error.message.startswith(NOTHING_SPEAKABLE):
                    # an emoji or a symbol on its own: nothing to say, and nothing wrong either
                    dropped = True
                    unspoken = unspoken_characters(job.text)
                    await self._send_text(event("sentence_start", index=job.index, text=job.text, normalized_text="",
                                                unspoken=unspoken, dropped=True, degraded=False))
                    self._unspoken(unspoken)
                    break
                # this sentence cannot be spoken for another reason: say so, go on with the next
                self.metrics.errors.labels(kind=error.kind.value, phase="mid_stream").inc()
                await self._send_text(event("error", index=job.index, **error_fields(error, False)))
                break
            if item is not None and item.info:
                info.update(item.info)
            if not started and (item is None or item.audio.size):
                started = True
                normalized = info.get("normalized_text") or []
                degraded = bool(info.get("degraded"))
                if degraded:
                    self.degraded += 1
                    self.metrics.degraded.labels(door="ws").inc()
                unspoken = list(info.get("dropped") or [])
                self._unspoken(unspoken)
                at = SentenceTiming.between(job.index, self.samples_in, self.samples_in, self.rate_hz)
                await self._send_text(event(
                    "sentence_start", index=job.index, text=job.text,
                    normalized_text=join_normalized(normalized) if isinstance(normalized, list) else str(normalized),
                    unspoken=unspoken, dropped=False, degraded=degraded, start_samples=at.start_samples,
                    start_s=at.fields()["start_s"]))
            if item is None:
                break
            if not item.audio.size:
                continue
            if first_audio_ms is None:
                first_audio_ms = (time.perf_counter() - job.released_at) * 1000
                self.metrics.ws_sentence_first_audio.observe(first_audio_ms / 1000)
            samples += int(item.audio.size)
            data = await encode(functools.partial(encoder.encode, item.audio))
            if self.clock is not None:
                self.clock.sent(data, int(item.audio.size))
            if data:
                self.audio_started = True
                with anyio.CancelScope(shield=True):  # a frame is sent whole or not at all (an interrupt waits)
                    await self._send(functools.partial(self.ws.send_bytes, data))
        self.spoken.append(job.text)  # sent whole (or passed over): nothing of it is cut any more
        self.cutting = None
        audio_s = samples / contract.SAMPLE_RATE_HZ
        self.audio_s += audio_s
        if dropped:
            self.dropped.append(job.index)
        timing = SentenceTiming.between(job.index, self.samples_in, self.samples_in + samples, self.rate_hz)
        self.samples_in += samples
        await self._send_text(event("sentence_done", index=job.index, audio_s=round(audio_s, 4),
                                    first_audio_ms=None if first_audio_ms is None else round(first_audio_ms, 1),
                                    dropped=dropped, capped=bool(info.get("capped_segments")), **timing.fields()))


