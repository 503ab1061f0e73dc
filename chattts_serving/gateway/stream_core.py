"""What both WebSocket dialects of ``/v1/audio/speech/stream`` share: the close codes, the
connection's ending, and the core that synthesises sentences with bounded lookahead.

:class:`StreamCore` is one connection's machinery, whatever its dialect: the admission of its
stream (:meth:`.state.GatewayState.admit`, once, at the start), the server's check of a start
or config (``validate_only``), each sentence's Triton stream pulled into a bounded queue with
at most ``1 + ws_lookahead`` in synthesis (:meth:`StreamCore._schedule`), sends bounded by
``ws_send_timeout_s``, and one ending for every way a connection ends
(:meth:`StreamCore._run_to_end`). Our dialect (:mod:`.ws`) and vLLM-Omni's (:mod:`.omni_ws`)
add their messages and events; :mod:`.dialects` tells them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread
from fastapi import WebSocket, WebSocketDisconnect
from fastapi.websockets import WebSocketState

from ..client import ClientError, StreamPart, SynthesisRequest
from ..errors import ErrorKind
from ..text.sentences import SentenceSplitter
from .drain import shutting_down
from .errors import INVALID_REQUEST, SERVER_ERROR, ApiError, from_client_error
from .speech import SpeechRequest, build_request
from .state import GatewayState, Slot

log = logging.getLogger("chattts_serving.gateway.ws")

SUBPROTOCOL: Final = "chattts.v1"
"""The WebSocket subprotocol the server selects when the client offers it (browsers must be
answered with one of the protocols they offered)."""
BEARER_PROTOCOL: Final = "bearer."
"""Prefix of the subprotocol carrying the API key (``bearer.<key>``): browsers cannot set an
``Authorization`` header on a WebSocket, so they offer ``["chattts.v1", "bearer.<key>"]``. The
key is never taken from the URL, where access logs would keep it."""
START_PROBE_TEXT: Final = "-"
"""The text of the start's check on the server (``validate_only``): any text serves, since the
check takes it as a piece that may have nothing to speak; the sentences are checked as they come."""
MAX_QUEUED_SENTENCES: Final = 64
"""Complete sentences waiting for synthesis; beyond it the text read waits in the inbox."""


class Close(IntEnum):
    """The close codes the server sends (RFC 6455)."""

    NORMAL = 1000
    """``done`` was sent: every sentence was spoken."""
    UNSUPPORTED = 1003
    """A binary message from the client (only JSON text messages are understood)."""
    INVALID_DATA = 1007
    """A message that is not JSON, of an unknown type, or with invalid fields."""
    POLICY = 1008
    """Missing or wrong API key; a client that took no audio for ``ws_send_timeout_s``; no
    message for ``stream_idle_timeout_s`` before ``end``."""
    SERVER_ERROR = 1011
    """A failure inside the gateway or the pipeline."""
    SERVICE_RESTART = 1012
    """The gateway is stopping (its drain after SIGTERM, :mod:`.drain`): a ``start`` that came
    too late, or a stream still running when the drain timeout passed; retry (another instance)."""
    TRY_AGAIN = 1013
    """Busy (the gateway's ``--max-streams`` or Triton's admission), a stage unavailable, or a
    deadline: retry later."""


RETRYABLE_CLOSES: Final = (Close.TRY_AGAIN, Close.SERVICE_RESTART)
"""The close codes whose ``error`` event says ``retryable: true``."""

CLOSE_FOR_KIND: Final = {ErrorKind.INVALID: Close.INVALID_DATA, ErrorKind.BUSY: Close.TRY_AGAIN,
                         ErrorKind.UNAVAILABLE: Close.TRY_AGAIN, ErrorKind.DEADLINE: Close.TRY_AGAIN,
                         ErrorKind.CANCELLED: Close.NORMAL, ErrorKind.INTERNAL: Close.SERVER_ERROR}


class StreamEnd(Exception):
    """Ends a connection: ``error`` (None for a normal end) is sent as an ``error`` event first,
    then the socket is closed with ``code``."""

    def __init__(self, code: Close, error: ApiError | None = None) -> None:
        super().__init__(error.message if error is not None else code.name)
        self.code = code
        self.error = error


class ClientGone(Exception):
    """The client closed the socket (or the connection dropped)."""


def event(type_: str, **fields: Any) -> str:
    """One JSON event: ``{"type": type_, **fields}``."""
    return json.dumps({"type": type_, **fields}, ensure_ascii=False, separators=(",", ":"))


def error_fields(error: ApiError, retryable: bool) -> dict[str, Any]:
    """The fields of an ``error`` event: ``kind`` (:class:`~chattts_serving.errors.ErrorKind`),
    OpenAI's ``code`` and ``param``, the ``message``, and ``retryable`` (true exactly when the
    close code is 1013: busy, unavailable, deadline from the backend; or 1012: the gateway drains)."""
    return {"kind": error.kind.value, "code": error.code, "param": error.param, "message": error.message,
            "retryable": retryable}


def offered_key(websocket: WebSocket) -> str | None:
    """The API key the client sent: ``Authorization: Bearer <key>``, else a ``bearer.<key>``
    subprotocol; None when neither."""
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for proto in websocket.scope.get("subprotocols") or ():
        if proto.startswith(BEARER_PROTOCOL):
            return proto[len(BEARER_PROTOCOL):]
    return None


@dataclass
class Sentence:
    """One sentence in synthesis: its index, text, and the queue of what its stream produced
    (:class:`StreamPart`, then None at the end, or the error that ended it)."""

    index: int
    text: str
    queue: asyncio.Queue[StreamPart | ClientError | ApiError | None]
    released_at: float
    """``time.perf_counter()`` when the splitter released the sentence."""


CAUSE_ORDER: tuple[tuple[type[BaseException], ...], ...] = ((StreamEnd, ApiError), (ClientGone, WebSocketDisconnect))
"""Which ending of a task group speaks for it: an end of the stream first, then the client
going away (:func:`first_cause`)."""


def first_cause(group: BaseException, order: tuple[tuple[type[BaseException], ...], ...] = CAUSE_ORDER
                ) -> BaseException:
    """The exception that ended a connection's task group: among its leaves, the first of the
    first kinds in ``order`` found, else the first of any kind."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        inner_group = getattr(exc, "exceptions", None)
        if isinstance(inner_group, tuple):
            for inner in inner_group:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for kinds in order:
        for exc in leaves:
            if isinstance(exc, kinds):
                return exc
    return leaves[0]


async def encoded(offload: bool, work: Callable[[], bytes]) -> bytes:
    """``work()`` (an encoder's step), in a worker thread when ``offload`` (the lossy formats)."""
    return await anyio.to_thread.run_sync(work) if offload else work()


class StreamCore:
    """One WebSocket connection's machinery, shared by both dialects (module docstring).

    A dialect implements :meth:`run` (inside :meth:`_run_to_end`) and :meth:`_request` (a
    sentence's Triton request), and says which splitter cuts its text (``splitter``)."""

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self.ws, self.state = websocket, state
        self.cfg, self.metrics, self.drain = state.settings, state.metrics, state.drain
        self.request_id = uuid.uuid4().hex
        self._checks = itertools.count()
        """Configurations checked so far (a vLLM-Omni session may be configured again)."""
        self.splitter: Any = SentenceSplitter(self.sentence_chars)
        """What cuts the utterance's text into sentences (a dialect may choose another)."""
        self.sentences: asyncio.Queue[tuple[str, float] | None] = asyncio.Queue(MAX_QUEUED_SENTENCES)
        self.jobs: asyncio.Queue[Sentence | None] = asyncio.Queue()
        self.slots = asyncio.Semaphore(1 + self.cfg.ws_lookahead)
        self.audio_s = 0.0
        """Audio of the utterance sent so far, seconds."""
        self.total_audio_s = 0.0
        """Audio of the connection's earlier utterances, seconds."""
        self.count = 0
        """Sentences of the utterance sent so far."""
        self.audio_started = False
        """Whether any audio frame has been sent (errors after it count as ``mid_stream``)."""
        self.sent_at = time.monotonic()
        """``time.monotonic()`` of the last message sent to the client: a client that sends
        nothing while it is still being sent audio is not idle."""
        self.spoken: list[str] = []
        """The utterance's sentences wholly sent (passed over: dropped or refused), in order."""
        self.cutting: Sentence | None = None
        """The sentence being sent now (None between sentences)."""
        self._slot: Slot | None = None
        """This connection's stream slot once admitted (:meth:`_admit`)."""

    @property
    def sentence_chars(self) -> int:
        """The longest sentence sent as one request, characters."""
        return min(self.cfg.ws_max_sentence_chars, self.cfg.max_input_chars)

    async def run(self) -> None:
        """Serve the connection to its end (the dialect's)."""
        raise NotImplementedError

    def _request(self, body: SpeechRequest, job: Sentence) -> SynthesisRequest:
        """The ``chattts`` request of sentence ``job`` (the dialect's request ids and voice)."""
        raise NotImplementedError

    def _drained(self) -> StreamEnd:
        """The end of a connection the drain refuses or stops: ``server_shutting_down``, 1012."""
        log.info("stream %s: ended by the drain", self.request_id)
        return StreamEnd(Close.SERVICE_RESTART, shutting_down())

    def _admit(self) -> None:
        """Ask for this connection's stream slot, once, at its start (:meth:`.state.GatewayState.admit`,
        before the server's check awaits, so that the limit holds for starts at once; given back
        by :meth:`_run_to_end`). Raises StreamEnd (1012 while draining, else 1013 busy)."""
        if self.drain.draining:
            raise self._drained()
        try:
            self._slot = self.state.admit()
        except ApiError as refusal:
            raise StreamEnd(Close.TRY_AGAIN, refusal) from None

    def _new_utterance(self) -> None:
        """Empty the sentence queues and the utterance's counts for its next utterance."""
        self.sentences = asyncio.Queue(MAX_QUEUED_SENTENCES)
        self.jobs = asyncio.Queue()
        self.slots = asyncio.Semaphore(1 + self.cfg.ws_lookahead)
        self.total_audio_s += self.audio_s
        self.audio_s, self.count, self.spoken, self.cutting = 0.0, 0, [], None

    async def _run_to_end(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` and end the connection by how it ended, for both dialects:
        :class:`StreamEnd` closes with its code (its error event first, counted by kind and by
        whether audio had started); the client gone is ``cancelled``; anything else is logged
        and closes 1011 with an internal error. The stream slot ``body`` took (:meth:`_admit`) is
        given back and every outcome counted once."""
        status = "cancelled"
        try:
            await body()
        except StreamEnd as end:
            status = "ok" if end.error is None else "error"
            if end.error is not None:
                self.metrics.error(end.error.kind, "mid_stream" if self.audio_started else "before_audio")
                if end.error.kind == ErrorKind.BUSY:
                    log.info("stream %s: busy", self.request_id)
            await self._close(end)
        except (ClientGone, WebSocketDisconnect):
            status = "cancelled"
        except Exception:
            log.exception("stream %s failed", self.request_id)
            status = "error"
            self.metrics.error(ErrorKind.INTERNAL, "mid_stream" if self.audio_started else "before_audio")
            await self._close(StreamEnd(Close.SERVER_ERROR, ApiError(500, "internal error", SERVER_ERROR,
                                                                     code="internal_error", kind=ErrorKind.INTERNAL)))
        finally:
            if self._slot is not None:
                slot, self._slot = self._slot, None
                slot.release()
                self.metrics.audio.inc(self.total_audio_s + self.audio_s)
            if status != "error":
                self.metrics.requests.labels(status=status).inc()

    async def _validate(self, probe: SynthesisRequest) -> None:
        """Have the server check the start's fields (a ``validate_only`` request: nothing is
        generated). Raises ApiError with the server's verdict (invalid: 1007; busy: 1013); an
        unknown voice's names the saved voices too (:meth:`.saved_voices.SavedVoices.explain`)."""
        check = next(self._checks)
        suffix = "start" if check == 0 else f"config-{check}"  # every request id of the server's log unique
        request = dataclasses.replace(probe, request_id=f"{self.request_id}-{suffix}", validate_only=True)
        try:
            async with contextlib.aclosing(self.state.client.stream(
                    request, idle_timeout_s=self.cfg.stream_idle_timeout_s,
                    max_duration_s=self.cfg.stream_max_s)) as parts:
                async for _ in parts:
                    pass
        except ClientError as exc:
            raise await self.state.saved.explain(from_client_error(exc, self.cfg.triton_url)) from None

    async def _close(self, end: StreamEnd) -> None:
        """Send the error event (if any) and close with ``end.code``; a client that is gone or
        takes nothing is left as it is (bounded by ``ws_send_timeout_s``)."""
        if self.ws.client_state != WebSocketState.CONNECTED:
            return
        with contextlib.suppress(Exception), anyio.move_on_after(self.cfg.ws_send_timeout_s):
            if end.error is not None:
                await self.ws.send_text(self._end_event(end.error, end.code))
            await self.ws.close(int(end.code), reason=end.code.name.lower())

    def _end_event(self, error: ApiError, code: Close) -> str:
        """The ``error`` event sent before closing with ``code`` (our dialect's; ``retryable``
        for 1012 and 1013)."""
        return event("error", **error_fields(error, code in RETRYABLE_CLOSES))

    async def _send_text(self, text: str) -> None:
        await self._send(functools.partial(self.ws.send_text, text))

    async def _send(self, send: Callable[[], Any]) -> None:
        """Send one message; a client that has not taken it after ``ws_send_timeout_s`` ends
        the connection (1008)."""
        try:
            with anyio.fail_after(self.cfg.ws_send_timeout_s):
                await send()
            self.sent_at = time.monotonic()
        except TimeoutError:
            raise StreamEnd(Close.POLICY, ApiError(
                408, f"the client took no audio for {self.cfg.ws_send_timeout_s:g} s: stream cancelled",
                INVALID_REQUEST, code="slow_reader", kind=ErrorKind.DEADLINE)) from None
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise ClientGone() from None

    async def _queue(self, sentences: list[str]) -> None:
        now = time.perf_counter()
        for s in sentences:
            await self.sentences.put((s, now))

    # --- synthesis ------------------------------------------------------------------------

    async def _schedule(self, body: SpeechRequest, tg: anyio.abc.TaskGroup) -> None:
        """Start each sentence's synthesis as soon as it is complete and a lookahead slot is free."""
        index = 0
        while True:
            item = await self.sentences.get()
            if item is None:
                await self.jobs.put(None)
                return
            await self.slots.acquire()
            job = Sentence(index, item[0], asyncio.Queue(self.cfg.ws_queue_chunks), item[1])
            tg.start_soon(self._produce, body, job)
            await self.jobs.put(job)
            index += 1

    def _build(self, body: SpeechRequest, text: str) -> SynthesisRequest:
        """The ``chattts`` request of ``body``'s fields with ``text`` as ``input``. Raises
        ApiError (:func:`.speech.build_request`)."""
        return build_request(body.model_copy(update={"input": text}), self.cfg.models, self.cfg.max_input_chars)

    async def _produce(self, body: SpeechRequest, job: Sentence) -> None:
        """Pull one sentence's Triton stream into its bounded queue (a full queue pauses the pull)."""
        try:
            request = self._request(body, job)
            async with contextlib.aclosing(self.state.client.stream(
                    request, idle_timeout_s=self.cfg.stream_idle_timeout_s,
                    max_duration_s=self.cfg.stream_max_s)) as parts:
                async for part in parts:
                    await job.queue.put(part)
        except (ClientError, ApiError) as exc:
            await job.queue.put(exc)
            return
        await job.queue.put(None)
