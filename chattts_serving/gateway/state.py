"""The gateway's state, one object per application (``app.state.gateway``), and its one
admission decision.

:class:`GatewayState` holds what every route and stream shares: the settings, the one
:class:`~chattts_serving.client.AioStreamClient` (one gRPC channel to Triton, opened in the
application's lifespan), the admission watch, the voices, the metrics, the drain and the count
of streams relayed now. :meth:`GatewayState.admit` is where the gateway decides "server busy":
a speech request asks it once, at its door (:class:`.middleware.AdmissionDoor`, before its body
is read), and a WebSocket stream once, at its start; an admitted one holds a :class:`Slot`
until it ends.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection, Request

from ..client import AioStreamClient
from ..client.admission_watch import AdmissionWatch
from ..text.voices import OPENAI_VOICES, VoiceBook
from .drain import Drain, shutting_down
from .errors import AUTHENTICATION, REQUEST_ID_HEADER, ApiError, busy_refusal
from .metrics import GatewayMetrics
from .saved_voices import SavedVoices
from .settings import GatewaySettings
from .speech import SPEECH_PATH
from .voice_store import VoiceStore


def voice_list(book: VoiceBook) -> list[dict[str, str]]:
    """``{"id", "name"}`` for every named voice; the built-in OpenAI names first, in OpenAI's
    order, then the voices file's in alphabetical order."""
    names = [n for n in OPENAI_VOICES if book.get(n) is not None]
    names += [n for n in book.names() if n not in OPENAI_VOICES]
    return [{"id": n, "name": n} for n in names]


class Slot:
    """One stream the gateway relays, counted (``GatewayState.streams``, the in-flight gauge)
    from its admission to :meth:`release`; releasing twice does nothing."""

    def __init__(self, state: GatewayState) -> None:
        self._state: GatewayState | None = state
        state.streams += 1
        state.metrics.in_flight.inc()

    def release(self) -> None:
        state, self._state = self._state, None
        if state is not None:
            state.streams -= 1
            state.metrics.in_flight.dec()


class GatewayState:
    """What the gateway's routes and streams share (module docstring).

    Raises :class:`~chattts_serving.text.voices.VoiceError` when the voices file is malformed.
    """

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.book = VoiceBook.load(settings.voices_file) if settings.voices_file is not None else VoiceBook()
        self.voices = voice_list(self.book)
        """The named voices ``GET /v1/audio/voices`` lists before the saved ones."""
        self.saved = SavedVoices(VoiceStore(settings.voice_store), self.book)
        self.metrics = GatewayMetrics()
        self.streams = 0
        """Streams relayed now (speech responses and WebSocket streams), each a :class:`Slot`."""
        self.drain = Drain(lambda: self.streams)
        self._client: AioStreamClient | None = None
        self.watch: AdmissionWatch | None = None
        """Triton's admission watch while the application runs (None when switched off)."""

    @staticmethod
    def of(conn: HTTPConnection) -> GatewayState:
        """The state of the application serving ``conn`` (a request or a WebSocket)."""
        state: GatewayState = conn.app.state.gateway
        return state

    @property
    def client(self) -> AioStreamClient:
        """The shared Triton client (open while the application runs)."""
        if self._client is None:
            raise RuntimeError("the gateway's Triton client is open only while the application runs")
        return self._client

    async def open(self) -> None:
        """Open the Triton client and start the admission watch (the lifespan's start)."""
        cfg = self.settings
        self._client = AioStreamClient(cfg.triton_url, inference_key=cfg.triton_inference_key or "")
        if cfg.admission_watch:
            self.watch = AdmissionWatch(cfg.triton_url, shared=self._client.grpc_client,
                                        inference_key=cfg.triton_inference_key or "")
            self.watch.start()

    async def close(self) -> None:
        """Stop the watch, close the client and the store of saved voices (the lifespan's end)."""
        try:
            if self.watch is not None:
                watch, self.watch = self.watch, None
                await watch.close()
            if self._client is not None:
                client, self._client = self._client, None
                await client.close()
        finally:
            self.saved.store.close()

    def admit(self) -> Slot:
        """The admission decision, the gateway's only one: a slot for one more stream, or the
        503 the gateway answers itself without calling Triton: it drains (:mod:`.drain`), it
        relays ``max_streams`` streams, or the admission watch reports every stream slot taken
        (:func:`.errors.busy_refusal`). Decided and counted with no await between, so that
        streams admitted at once never exceed the limit. Raises that ApiError."""
        if self.drain.draining:
            raise shutting_down()
        refusal = busy_refusal(self.streams, self.settings.max_streams, self.watch)
        if refusal is not None:
            raise refusal
        return Slot(self)

    def accepts_key(self, offered: str | None) -> bool:
        """Whether ``offered`` is the API key (always, when none is set)."""
        key = self.settings.api_key
        if key is None:
            return True
        return offered is not None and hmac.compare_digest(offered.encode(), key.encode())

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether ``headers`` carry ``Authorization: Bearer <key>`` (always, when no key is set)."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return self.accepts_key(token.strip() if scheme.lower() == "bearer" else None)

    def error_response(self, path: str, exc: ApiError, request_id: str | None = None) -> JSONResponse:
        """The JSON answer of ``exc`` (OpenAI's error body; ``WWW-Authenticate`` on a 401,
        ``Retry-After`` on a 503, ``X-Request-Id`` where the request has one: the client's, or
        the one the gateway gave it), counted as an error before audio on the speech path."""
        if path == SPEECH_PATH:
            self.metrics.error(exc.kind, "before_audio")
        headers = {REQUEST_ID_HEADER: request_id} if request_id else {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if exc.status == 503:
            headers["Retry-After"] = str(self.settings.retry_after_s)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def authorize(request: Request) -> None:
    """The dependency of every ``/v1`` route: 401 without the API key (when one is set)."""
    if not GatewayState.of(request).authorized(request.headers):
        raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                       AUTHENTICATION, code="invalid_api_key")


def state_of(request: Request) -> GatewayState:
    """The dependency that hands a route the application's :class:`GatewayState`."""
    return GatewayState.of(request)


Gateway = Annotated[GatewayState, Depends(state_of)]
"""A route parameter of this type receives the application's :class:`GatewayState`."""

