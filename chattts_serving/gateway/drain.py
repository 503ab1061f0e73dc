"""The drain: what the gateway does between SIGTERM (or SIGINT) and its exit.

At the signal the gateway stops taking speech requests (a new one gets 503
``server_shutting_down`` with ``Retry-After``; a new WebSocket handshake the same 503; ``GET
/health`` reports not ready) while the streams in flight run on. When they have all ended, or
after ``drain_timeout_s``, the rest are ended explicitly (WebSocket: an ``error`` event and close
1012; SSE: an ``error`` event; a raw audio body: cut without its last chunk) and the process
exits 0. :class:`Drain` is the application's side (the flag, the registry of what a drain
interrupts, the count of what it waits for); :class:`DrainingServer` is uvicorn's server with the
signals taken over, so that the drain runs before uvicorn's own shutdown (which would close every
WebSocket with 1012 at once and wait on HTTP streams without a bound).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Final

import anyio
import uvicorn

from ..errors import ErrorKind
from .errors import SERVER_ERROR, ApiError

log = logging.getLogger("chattts_serving.gateway")

SHUTTING_DOWN: Final = "server_shutting_down"
"""OpenAI error ``code`` of every refusal and every explicit end the drain makes."""
END_GRACE_S: Final = 5.0
"""After the drain timeout: how long the streams get to send their end (error event, close)
before uvicorn's own shutdown closes what is left."""
EXIT_GRACE_S: Final = 5
"""uvicorn's ``timeout_graceful_shutdown`` after the drain: connections still open then (a client
that takes nothing) are closed and their tasks cancelled."""


def shutting_down() -> ApiError:
    """The 503 of a request refused, or a stream ended, because the gateway is stopping."""
    return ApiError(503, "the gateway is shutting down: retry, another instance will serve it", SERVER_ERROR,
                    code=SHUTTING_DOWN, kind=ErrorKind.UNAVAILABLE)


class Drain:
    """The application's drain state (one per application, :attr:`.state.GatewayState.drain`).

    ``draining``: set at the signal; speech requests are refused from then on. ``expired``: set
    when the drain timeout passed; streams still running end themselves. Waits that are no
    stream yet (a WebSocket before its ``start``, a vLLM-Omni session between utterances) run in
    :meth:`idle` scopes, cancelled when the drain begins; streams run in :meth:`active` scopes,
    cancelled when it expires. ``streams`` gives the gateway's count of streams now
    (:class:`.state.GatewayState`); :meth:`connection` counts WebSocket connections besides.
    """

    def __init__(self, streams: Callable[[], int] = lambda: 0) -> None:
        self.streams = streams
        self.draining = False
        self.expired = False
        self.connections = 0
        self._idle: set[anyio.CancelScope] = set()
        self._active: set[anyio.CancelScope] = set()

    @property
    def in_flight(self) -> int:
        """Streams and WebSocket connections still open (nonzero while anything is)."""
        return self.streams() + self.connections

    def describe(self) -> str:
        """What is in flight, for the log."""
        return f"{self.streams()} streams, {self.connections} WebSocket connections"

    def begin(self) -> None:
        """Stop taking requests: refuse new ones, end the idle waits."""
        self.draining = True
        for scope in list(self._idle):
            scope.cancel()

    def expire(self) -> None:
        """The drain timeout passed: end every stream still running."""
        self.begin()
        self.expired = True
        for scope in list(self._active):
            scope.cancel()

    @contextmanager
    def idle(self) -> Iterator[anyio.CancelScope]:
        """A scope for a wait that is no request yet, cancelled when the drain begins (at once
        if it has); the caller checks ``scope.cancelled_caught``."""
        with self._registered(self._idle, self.draining) as scope:
            yield scope

    @contextmanager
    def active(self) -> Iterator[anyio.CancelScope]:
        """A scope for a stream's work, cancelled when the drain expires (at once if it has)."""
        with self._registered(self._active, self.expired) as scope:
            yield scope

    @contextmanager
    def _registered(self, scopes: set[anyio.CancelScope], now: bool) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            if now:
                scope.cancel()
            scopes.add(scope)
            try:
                yield scope
            finally:
                scopes.discard(scope)

    @contextmanager
    def connection(self) -> Iterator[None]:
        """Count a WebSocket connection as in flight while it is open."""
        self.connections += 1
        try:
            yield
        finally:
            self.connections -= 1

    async def settled(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight (True) or ``timeout_s`` passed (False)."""
        end = time.monotonic() + timeout_s
        while self.in_flight > 0:
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.05)
        return True


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM and SIGINT start the drain (:class:`Drain`) instead of
    uvicorn's shutdown, which follows once the drain is over: a second signal ends the streams
    at once (``expire``), a signal after the drain is uvicorn's own. A drained stop exits 0
    (the signal is not raised again, as uvicorn does with those it handled itself)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup (the app's lifespan, the sockets), then everything built so far
        (modules, the app, its client) is moved out of the cyclic collector's sight
        (``gc.freeze``): a full collection then scans only what requests made since, instead of
        pausing every request in flight for tens of ms (the gateway's refusals under a burst
        waited for them: docs/performance.md, "The gateway's busy answers")."""
        self._loop = asyncio.get_running_loop()
        logging.getLogger("uvicorn.error").addFilter(_quiet_cut_responses)
        await super().startup(sockets=sockets)
        gc.collect()
        gc.freeze()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or not self.started or self.should_exit:
            super().handle_exit(sig, frame)  # before serving, or after the drain: uvicorn's own
            return
        self._loop.call_soon_threadsafe(self._signalled, signal.Signals(sig).name)

    def _signalled(self, name: str) -> None:
        if self._drain_task is None:
            log.warning("%s: draining: new requests refused; in flight (%s) given up to %g s", name,
                        self.drain.describe(), self.timeout_s)
            self.drain.begin()
            logging.getLogger("uvicorn.error").addFilter(_quiet_denials)
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())
        else:
            log.warning("%s again: ending what is in flight now (%s)", name, self.drain.describe())
            self.drain.expire()

    async def _drain_then_exit(self) -> None:
        try:
            if not await self.drain.settled(self.timeout_s) and not self.drain.expired:
                log.warning("drain timeout (%g s): ending what is in flight (%s)", self.timeout_s,
                            self.drain.describe())
            self.drain.expire()
            if not await self.drain.settled(END_GRACE_S):
                log.warning("still in flight after %g s (%s): uvicorn closes it", END_GRACE_S, self.drain.describe())
            else:
                log.warning("drained: exiting")
        finally:
            self.should_exit = True


def _quiet_denials(record: logging.LogRecord) -> bool:
    """Drop uvicorn's error line after each WebSocket handshake the drain refused with its 503
    (uvicorn 0.54's websockets protocol logs it for every denial response)."""
    return record.getMessage() != "ASGI callable returned without completing handshake."


def _quiet_cut_responses(record: logging.LogRecord) -> bool:
    """Drop uvicorn's error line after an audio body the gateway cut on purpose (a failure
    after the first audio, the drain's expiry, a client that reads nothing): the response
    returns unfinished so that the client sees a truncated body, and the gateway has logged
    why already (:class:`.relay.RelayResponse`)."""
    return record.getMessage() != "ASGI callable returned without completing response."
