"""vLLM-Omni's streaming-text TTS dialect on ``/v1/audio/speech/stream``, and the dispatcher
that tells it from this gateway's own dialect (:mod:`.ws`) by the client's first message.

The dialect, as vLLM-Omni's handler and docs define it (``serving_speech_stream.py`` and
``docs/serving/speech_api.md``, "Streaming Text Input (WebSocket)"; docs/protocols.md
in this repository has the table)::

    client: {"type": "session.config", ...}        first (again between utterances to change it)
            {"type": "input.text", "text": "..."}  text chunks
            {"type": "input.done"}                 end of utterance: flush, keep the connection
            {"type": "input.cancel"}               barge-in: stop the utterance now
            {"type": "session.close"}              end of the connection
    server: {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format"}
            <binary frames: the sentence's audio>
            {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
            {"type": "session.done", "utterance_index", "total_sentences"}
            {"type": "audio.cancelled", "utterance_index", "sentence_index", "reason"}
            {"type": "error", "message"}

``split_granularity`` (``none``, the default: the utterance is one sentence, synthesised at
``input.done``; ``sentence``; ``clause``) decides where text becomes a request;
``stream_audio`` false sends each sentence as one complete file (one frame), true as raw
chunks as they are made. Each sentence is one ``chattts`` request with the session's fields,
synthesised by :class:`.stream_core.StreamCore` (lookahead, bounded queues, cancels on
close, the gateway's stream limit and metrics). Extensions: ``audio.done`` (and ``audio.start``)
carry the sentence's place in the utterance's delivered audio (``start_samples``,
``duration_samples``, ``start_s``, ``duration_s``, ``sample_rate_hz``); ``error`` carries
``code`` and ``kind``; every ``/v1/audio/speech`` field (``sample_rate``, ``temperature``, ...)
is accepted in ``session.config``.

Barge-in (``input.cancel``, ``audio.cancelled``: the names of vLLM-Omni's barge-in RFC,
vllm-project/vllm-omni#1480): the utterance's syntheses are cancelled, its queued sentences
dropped, no frame or event of it follows ``audio.cancelled``, which replaces its
``session.done`` and says what was sent (:func:`.timings.interruption_fields`); the session
keeps its config and the next ``input.text`` starts the next utterance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections import deque
from typing import Any, Final

import anyio
import numpy as np
from fastapi import WebSocket

from .. import contract
from ..audio import rates as audio_rates
from ..audio.rates import resampled_length
from ..client import ClientError, StreamPart, SynthesisRequest
from ..errors import ErrorKind
from ..text.sentences import SentenceSplitter
from .errors import INVALID_REQUEST, ApiError, from_client_error
from .omni_config import Session, blame_speaker, parse_config
from .speech import NO_VOICE, OFFLOADED_FORMATS, SpeechRequest, reference_recording
from .state import GatewayState
from .stream_core import (
    CAUSE_ORDER,
    RETRYABLE_CLOSES,
    START_PROBE_TEXT,
    ClientGone,
    Close,
    Sentence,
    StreamCore,
    StreamEnd,
    encoded,
    first_cause,
)
from .timings import DeliveryClock, SentenceTiming, interruption_fields

log = logging.getLogger("chattts_serving.gateway.omni_ws")

CONFIG_TYPE: Final = "session.config"
"""The first message of a vLLM-Omni client: it selects this dialect."""
MAX_CONFIG_BYTES: Final = 4 * 1024 * 1024
"""Largest ``session.config`` (it may carry a reference recording), as vLLM-Omni's."""
MAX_TEXT_BYTES: Final = 128 * 1024
"""Largest other message, as vLLM-Omni's."""
MAX_HELD_MESSAGES: Final = 256
"""Messages read after ``input.done`` while the utterance is still spoken (they wait for its
end, as vLLM-Omni's sequential handler has them wait); beyond it the socket is not read."""
CANCEL_REASON: Final = "client_cancel"
"""``audio.cancelled``'s ``reason`` for an ``input.cancel``."""
CLAUSE_MARKS: Final = "，、；：,;:"
"""Where ``split_granularity`` 'clause' also cuts (ASCII ones only before white space, so
never inside ``1,234`` or ``10:30``)."""


class ClauseSplitter:
    """:class:`~chattts_serving.text.sentences.SentenceSplitter` that also cuts after a
    clause mark (:data:`CLAUSE_MARKS`): ``split_granularity`` 'clause'."""

    def __init__(self, max_chars: int) -> None:
        self._sentences = SentenceSplitter(max_chars)
        self._after_ascii_mark = False

    @property
    def pending(self) -> str:
        return self._sentences.pending

    def feed(self, delta: str) -> list[str]:
        out: list[str] = []
        for ch in delta:
            if self._after_ascii_mark and ch.isspace():
                out += self._sentences.flush()
            self._after_ascii_mark = False
            out += self._sentences.feed(ch)
            if ch in CLAUSE_MARKS and self._sentences.pending:
                if ch.isascii():
                    self._after_ascii_mark = True
                else:
                    out += self._sentences.flush()
        return out

    def flush(self) -> list[str]:
        self._after_ascii_mark = False
        return self._sentences.flush()

    def end(self) -> list[str]:
        return self.flush()


class _Whole:
    """``split_granularity`` 'none': the utterance is one sentence, released at ``input.done``."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    @property
    def pending(self) -> str:
        return "".join(self._parts)

    def feed(self, delta: str) -> list[str]:
        self._parts.append(delta)
        return []

    def flush(self) -> list[str]:
        text, self._parts = "".join(self._parts).strip(), []
        return [text] if text else []

    def end(self) -> list[str]:
        return self.flush()


class _Close(Exception):
    """``session.close``: end the connection normally."""


class OmniStream(StreamCore):
    """One vLLM-Omni-dialect connection (module docstring): utterances one after the other on
    one socket; within an utterance, sentences synthesised by :class:`.stream_core.StreamCore`
    and sent in order with this dialect's events."""

    def __init__(self, websocket: WebSocket, state: GatewayState, first: dict[str, Any], first_bytes: int = 0) -> None:
        super().__init__(websocket, state)
        self.first = first
        self.first_bytes = first_bytes
        """The first message's size: past :data:`MAX_CONFIG_BYTES` it is refused unread."""
        self.session: Session | None = None
        self.utterance = 0
        self.delivered = 0
        """Samples (at the delivered rate) of the utterance's sentences sent so far."""
        self.held: deque[dict[str, Any]] = deque()
        """Messages read after ``input.done`` during the utterance, for after it."""
        self.received: list[str] = []
        """The utterance's text as sent."""
        self.cancelled = False
        """The utterance was cancelled (``input.cancel``)."""
        self.sent_all = False
        """The utterance's last sentence was sent (a cancel then changes nothing)."""
        self.cut_clock: DeliveryClock | None = None
        """What was sent of the sentence being sent (``stream_audio``)."""

    async def run(self) -> None:
        """Serve the connection to its end (accepted already by :func:`.dialects.serve_stream`)."""
        await self._run_to_end(self._session)

    async def _session(self) -> None:
        """The session from its config to its end, which it raises (:class:`StreamEnd`)."""
        try:
            if self.drain.draining:
                raise self._drained()
            if self.first_bytes > MAX_CONFIG_BYTES:
                raise _too_large(self.first_bytes)
            session = await self._parse(self.first)
            self._admit()  # the one admission decision, before the server's check awaits
            await self._check(session, self.first)
            self.session = session
            await self._serve()
        except ApiError as exc:
            raise StreamEnd(_close_for(exc), exc) from None
        except _Close:
            raise StreamEnd(Close.NORMAL) from None

    def _end_event(self, error: ApiError, code: Close) -> str:
        """This dialect's ``error`` event (``retryable: true`` before 1012 or 1013, or for a 503)."""
        return _error_event(error, retryable=code in RETRYABLE_CLOSES or error.status == 503)

    async def _error(self, error: ApiError, **extra: Any) -> None:
        """A non-fatal ``error`` event: the connection goes on."""
        self.metrics.errors.labels(kind=error.kind.value, phase="mid_stream").inc()
        await self._send_text(_error_event(error, **extra))

    # --- messages -----------------------------------------------------------------------------

    async def _message(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next JSON object from the client; None (after a non-fatal error event) for one
        that is malformed. Raises ClientGone, TimeoutError."""
        with anyio.fail_after(timeout_s):
            msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            raise ClientGone()
        raw = msg.get("text")
        if raw is None:
            await self._error(_invalid("binary messages are not understood: send JSON text messages"))
            return None
        size = len(raw.encode("utf-8", "surrogatepass"))
        if size > MAX_CONFIG_BYTES:
            await self._error(_too_large(size))
            return None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            await self._error(_invalid("Invalid JSON message", code="invalid_json"))
            return None
        if not isinstance(data, dict):
            await self._error(_invalid("WebSocket messages must be JSON objects"))
            return None
        if data.get("type") != CONFIG_TYPE and len(raw) > MAX_TEXT_BYTES:
            await self._error(_invalid("input.text message too large"))
            return None
        return data

    def _idle(self) -> StreamEnd:
        return StreamEnd(Close.POLICY, ApiError(
            408, "Idle timeout: no message received", INVALID_REQUEST, code="idle_timeout", kind=ErrorKind.DEADLINE))

    async def _next_message(self) -> dict[str, Any]:
        """The client's next message (those held during the last utterance first); its silence
        for the idle timeout ends the stream."""
        if self.held:
            return self.held.popleft()
        while True:
            try:
                msg = await self._message(self.cfg.stream_idle_timeout_s)
            except TimeoutError:
                raise self._idle() from None
            if msg is not None:
                return msg

    async def _serve(self) -> None:
        """Between utterances: a config replaces the session's, text starts an utterance,
        ``input.done`` alone is an empty one, ``session.close`` ends the connection. Once the
        gateway drains, the session ends (``error``, close 1012) instead of waiting for the next
        utterance."""
        while True:
            if self.drain.draining:
                raise self._drained()
            with self.drain.idle() as waiting:
                msg = await self._next_message()
            if waiting.cancelled_caught:
                raise self._drained()
            kind = msg.get("type")
            if kind == CONFIG_TYPE:
                try:
                    self.session = await self._config(msg)
                except ApiError as exc:
                    await self._error(exc)  # the previous config stays
            elif kind == "input.text":
                text = msg.get("text", "")
                if not isinstance(text, str):
                    await self._error(_invalid("input.text requires a string value", "text"))
                elif text:
                    await self._utterance(text)
            elif kind == "input.done":
                await self._send_json(type="session.done", utterance_index=self.utterance, total_sentences=0)
                self.utterance += 1
            elif kind == "input.cancel":
                if await self._cancel_ok(msg):  # nothing is playing: nothing was sent
                    await self._send_json(type="audio.cancelled", utterance_index=self.utterance, reason=CANCEL_REASON,
                                          **interruption_fields(self._rate(), 0, "", [], None, None, 0))
            elif kind == "session.close":
                raise _Close()
            else:
                await self._error(_invalid(f"Unknown message type: {kind}", "type"))

    def _rate(self) -> int:
        return self.session.info.sample_rate_hz if self.session is not None else contract.SAMPLE_RATE_HZ

    async def _cancel_ok(self, msg: dict[str, Any]) -> bool:
        """Whether an ``input.cancel`` is well formed (it takes no fields); if not, an ``error``
        says so and the session goes on as if it had not come."""
        extra = sorted(k for k in msg if k != "type")
        if extra:
            await self._error(_invalid(f"input.cancel takes no fields, got {extra[0]!r}", extra[0]))
        return not extra

    async def _config(self, msg: dict[str, Any]) -> Session:
        """A config checked whole (:meth:`_parse`, then :meth:`_check`), as our dialect's
        ``start`` is. Raises ApiError."""
        session = await self._parse(msg)
        await self._check(session, msg)
        return session

    async def _parse(self, msg: dict[str, Any]) -> Session:
        """:func:`parse_config` after a saved voice's name was resolved (once per config), a
        reference recording decoded off the event loop. Raises ApiError."""
        key = "voice" if msg.get("voice") is not None else "speaker"
        msg = await self.state.saved.resolve(msg, key, "ref_text")
        if msg.get(key) == NO_VOICE and key == "speaker":
            msg = {**msg, "voice": NO_VOICE}
        if isinstance(msg.get("ref_audio"), str):  # decoded (and kept) in a worker thread; refused in parse_config
            with contextlib.suppress(ApiError):
                await anyio.to_thread.run_sync(reference_recording, msg["ref_audio"], "ref_audio")
        try:
            return parse_config(msg, self.cfg)
        except ApiError as exc:
            raise blame_speaker(exc, msg) from None

    async def _check(self, session: Session, msg: dict[str, Any]) -> None:
        """The server's check of a config (``validate_only``, nothing generated: a voice it does
        not know, a parameter beyond its limits such as ``max_new_tokens`` above the
        profile's cap, a reference it refuses), the check our dialect's ``start`` gets
        (:meth:`.stream_core.StreamCore._validate`). An unknown voice's error names the saved ones.
        Raises ApiError."""
        probe = self._probe(session)
        try:
            await self._validate(probe)
        except ApiError as exc:
            raise blame_speaker(exc, msg) from None

    def _probe(self, session: Session) -> SynthesisRequest:
        request = self._build(session.body, START_PROBE_TEXT)
        return dataclasses.replace(request, voice="" if session.default_voice else request.voice)

    async def _send_json(self, **fields: Any) -> None:
        await self._send_text(json.dumps(fields, ensure_ascii=False, separators=(",", ":")))

    # --- one utterance --------------------------------------------------------------------------

    async def _utterance(self, first: str) -> None:
        """From the first ``input.text`` to ``input.done``: every sentence synthesised and sent,
        then ``session.done``."""
        session = self.session
        assert session is not None
        if self.drain.draining:  # a new utterance is a new request: refused
            raise self._drained()
        if session.split == "sentence":
            self.splitter = SentenceSplitter(self.sentence_chars)
        elif session.split == "clause":
            self.splitter = ClauseSplitter(self.sentence_chars)
        else:
            self.splitter = _Whole()
        self._new_utterance()
        self.delivered, self.received, self.cut_clock = 0, [], None
        self.cancelled = self.sent_all = False
        with self.drain.active() as running:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read_utterance, first, tg.cancel_scope)
                    tg.start_soon(self._schedule, session.body, tg)
                    await self._send_utterance(session)
                    self.sent_all = True
                    tg.cancel_scope.cancel()
            except Exception as group:  # anyio's ExceptionGroup
                if not hasattr(group, "exceptions"):
                    raise
                raise first_cause(group, ((_Close,), *CAUSE_ORDER)) from None
        if running.cancelled_caught:
            raise self._drained()
        if self.cancelled:
            await self._send_json(type="audio.cancelled", utterance_index=self.utterance, reason=CANCEL_REASON,
                                  **self._cancellation(session))
            log.info("stream %s: utterance %d cancelled", self.request_id, self.utterance)
        else:
            await self._send_json(type="session.done", utterance_index=self.utterance, total_sentences=self.count)
        self.utterance += 1

    def _cancellation(self, session: Session) -> dict[str, Any]:
        """``audio.cancelled``'s fields: the sentences sent whole, and of the one cut what was
        sent (with ``stream_audio``; a whole-file sentence is sent only once complete)."""
        cut = self.cutting
        cut_samples = self.cut_clock.samples if cut is not None and self.cut_clock is not None else 0
        return interruption_fields(session.info.sample_rate_hz, self.delivered + cut_samples, "".join(self.received),
                                   self.spoken, cut.index if cut is not None else None,
                                   cut.text if cut is not None else None, cut_samples)

    async def _read_utterance(self, first: str, scope: anyio.CancelScope) -> None:
        """The utterance's messages: text to its end (``input.done``), then, while it is
        spoken, an ``input.cancel`` (other messages are held for after it). An
        ``input.cancel`` cancels ``scope``, the utterance's."""
        self.received.append(first)
        await self._queue(self.splitter.feed(first))
        done = False
        while True:
            if done and len(self.held) >= MAX_HELD_MESSAGES:
                await anyio.sleep_forever()  # the utterance's end cancels this
            msg = await self._message(None) if done else await self._next_message()
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "input.cancel" and not (done and self.held):  # else it comes after held ones
                if await self._cancel_ok(msg) and not self.sent_all:
                    self.cancelled = True
                    scope.cancel()
                    return
                continue
            if done:
                self.held.append(msg)  # the next utterance's, or for between utterances
            elif kind == "input.text":
                text = msg.get("text", "")
                if not isinstance(text, str):
                    await self._error(_invalid("input.text requires a string value", "text"))
                    continue
                self.received.append(text)
                await self._queue(self.splitter.feed(text))
            elif kind == "input.done":
                await self._queue(self.splitter.end())
                await self.sentences.put(None)
                done = True
            elif kind == CONFIG_TYPE:
                await self._error(_invalid("session.config cannot be applied while an utterance is in progress; "
                                           "send input.done first", "type"))
            elif kind == "session.close":
                raise _Close()
            else:
                await self._error(_invalid(f"Unknown message type: {kind}", "type"))

    def _request(self, body: SpeechRequest, job: Sentence) -> SynthesisRequest:
        request = self._build(body, job.text)
        assert self.session is not None
        voice = "" if self.session.default_voice else request.voice
        return dataclasses.replace(request, voice=voice, request_id=f"{self.request_id}-{self.utterance}-{job.index}")

    async def _send_utterance(self, session: Session) -> None:
        while (job := await self.jobs.get()) is not None:
            self.cutting = job
            self.cut_clock = DeliveryClock(session.info.sample_rate_hz, session.body.response_format,
                                           session.body.container)
            try:
                await self._send_omni_sentence(job, session)
            finally:
                self.slots.release()
            self.cutting = None
            self.count += 1

    async def _send_omni_sentence(self, job: Sentence, session: Session) -> None:
        """``audio.start``, the sentence's audio (one file, or raw chunks with
        ``stream_audio``), ``audio.done``; a failed sentence gets ``error`` before its
        ``audio.done`` (``error`` true) and the utterance goes on."""
        info = session.info
        fmt = session.body.response_format
        offload = fmt in OFFLOADED_FORMATS
        start = {"type": "audio.start", "utterance_index": self.utterance, "sentence_index": job.index,
                 "sentence_text": job.text, "format": fmt}
        if session.stream_audio:
            start.update(sample_rate=info.sample_rate_hz, channels=1)
        rate = info.sample_rate_hz
        start.update(start_samples=self.delivered, start_s=round(self.delivered / rate, 4))
        await self._send_json(**start)
        encoder = audio_rates.new_output_encoder(fmt, session.body.sample_rate, session.body.container) \
            if session.stream_audio else None
        whole: list[np.ndarray] = []
        total_bytes = 0
        capped = False  # the sentence ended at max_new_tokens (the server's final info)
        samples = 0
        failure: ApiError | None = None
        first_audio: float | None = None

        async def send(data: bytes, fed_24k: int = 0) -> None:
            nonlocal total_bytes
            if self.cut_clock is not None and encoder is not None:
                self.cut_clock.sent(data, fed_24k)
            if data:
                self.audio_started = True
                total_bytes += len(data)
                with anyio.CancelScope(shield=True):  # a frame is sent whole or not at all (a cancel waits)
                    await self._send(functools.partial(self.ws.send_bytes, data))

        while True:
            item: StreamPart | ClientError | ApiError | None = await job.queue.get()
            if isinstance(item, (ClientError, ApiError)):
                failure = item if isinstance(item, ApiError) else from_client_error(item, self.cfg.triton_url)
                break
            if item is None:
                break
            capped = capped or bool(item.info and item.info.get("capped_segments"))
            if not item.audio.size:
                continue
            if first_audio is None:
                first_audio = time.perf_counter() - job.released_at
                self.metrics.ws_sentence_first_audio.observe(first_audio)
            samples += int(item.audio.size)
            if encoder is not None:
                await send(await encoded(offload, functools.partial(encoder.encode, item.audio)), int(item.audio.size))
            else:
                whole.append(item.audio)
        if failure is None:
            if encoder is not None:
                await send(await encoded(offload, encoder.finish))
            elif samples:
                audio = np.concatenate(whole)
                await send(await encoded(offload, functools.partial(
                    audio_rates.encode_output, fmt, audio, session.body.sample_rate, session.body.container)))
        else:
            await self._error(failure, utterance_index=self.utterance, sentence_index=job.index,
                              **({"partial_audio": True, "action": "discard"} if total_bytes else {}))
        # each sentence is its own file or stream (own resampler): its length at the delivered rate
        timing = SentenceTiming(job.index, self.delivered, resampled_length(samples, rate), rate)
        self.spoken.append(job.text)  # sent whole (or passed over): nothing of it is cut any more
        self.cutting, self.cut_clock = None, None
        self.delivered += timing.duration_samples
        self.audio_s += samples / contract.SAMPLE_RATE_HZ
        await self._send_json(type="audio.done", utterance_index=self.utterance, sentence_index=job.index,
                              total_bytes=total_bytes, error=failure is not None, capped=capped, **timing.fields())


def _invalid(message: str, param: str | None = None, code: str = "invalid_message") -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param=param, code=code)


def _error_event(error: ApiError, **extra: Any) -> str:
    """vLLM-Omni's ``error`` event: ``message``, plus ``code``, ``kind``, ``param`` and
    ``retryable`` (true for a 503: busy, stopping, restarting or failing; the same utterance
    may succeed later or elsewhere)."""
    return json.dumps({"type": "error", "message": error.message, "code": error.code, "kind": error.kind.value,
                       "param": error.param, "retryable": error.status == 503, **extra}, ensure_ascii=False,
                      separators=(",", ":"))


def _too_large(size: int) -> ApiError:
    return _invalid(f"WebSocket message too large: {size} bytes, the limit is {MAX_CONFIG_BYTES}")


def _close_for(error: ApiError) -> Close:
    return {ErrorKind.INVALID: Close.INVALID_DATA, ErrorKind.INTERNAL: Close.SERVER_ERROR}.get(error.kind,
                                                                                               Close.TRY_AGAIN)
