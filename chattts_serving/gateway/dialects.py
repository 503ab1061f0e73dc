"""``/v1/audio/speech/stream``'s door: the handshake, the API key, and the dialect the first
message speaks (vLLM-Omni's ``session.config``: :mod:`.omni_ws`; anything else ours: :mod:`.ws`).

A client without the API key (when one is set) goes to our dialect unread, which refuses it;
a saved voice named in our ``start`` is resolved here, once for the stream (vLLM-Omni's
config resolves its own, :meth:`.omni_ws.OmniStream._parse`). While the gateway drains the
handshake is refused (:func:`refuse_handshake`), and a connection still waiting for its first
message when the drain begins is ended (``error``, close 1012).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, cast

import anyio
from fastapi import WebSocket

from .drain import shutting_down
from .errors import ApiError
from .omni_ws import CONFIG_TYPE, MAX_CONFIG_BYTES, OmniStream
from .state import GatewayState
from .stream_core import CLOSE_FOR_KIND, SUBPROTOCOL, Close, error_fields, event, offered_key
from .ws import WS_PATH, SpeechStream


async def refuse_handshake(websocket: WebSocket, state: GatewayState, exc: ApiError) -> None:
    """Answer a WebSocket handshake with the HTTP error ``exc`` (OpenAI's body, ``Retry-After``
    on a 503); a server without the denial extension gets the ``error`` event and close 1012."""
    state.metrics.error(exc.kind, "before_audio")
    response = state.error_response(WS_PATH, exc)
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:  # no "websocket.http.response" extension
        await websocket.accept()
        await websocket.send_text(event("error", **error_fields(exc, True)))
        await websocket.close(int(Close.SERVICE_RESTART), reason="service_restart")


class _Replay:
    """The accepted socket handed to :class:`.ws.SpeechStream` after its first message was
    read here: ``accept`` does nothing more, the first ``receive`` returns that message (or
    raises the TimeoutError of a client that sent none in time), the rest is the socket's."""

    def __init__(self, websocket: WebSocket, first: dict[str, Any] | None) -> None:
        self._ws = websocket
        self._first = first

    async def accept(self, subprotocol: str | None = None) -> None:
        return None

    async def receive(self) -> dict[str, Any]:
        first, self._first = self._first, None
        if first is None:
            return cast(dict[str, Any], await self._ws.receive())
        if first.get("type") == "timeout":
            raise TimeoutError()
        return first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)


def _start_message(message: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON object of our dialect's ``start`` message, else None."""
    try:
        data = json.loads(message.get("text") or "")
    except (json.JSONDecodeError, TypeError):
        return None
    return data if isinstance(data, dict) and data.get("type") == "start" else None


def _dialect(message: dict[str, Any]) -> str:
    """'omni' when the first message is a ``session.config``, else 'chattts'."""
    text = message.get("text")
    if not isinstance(text, str):
        return "chattts"
    if len(text) > MAX_CONFIG_BYTES:  # too large to parse: its type is enough to refuse it in its dialect
        return "omni" if f'"{CONFIG_TYPE}"' in text else "chattts"
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return "chattts"
    return "omni" if isinstance(data, dict) and data.get("type") == CONFIG_TYPE else "chattts"


async def serve_stream(websocket: WebSocket, state: GatewayState) -> None:
    """Serve one ``/v1/audio/speech/stream`` connection in the dialect its first message
    speaks (module docstring): ``session.config`` is vLLM-Omni's (:class:`.omni_ws.OmniStream`),
    anything else this gateway's own (:class:`.ws.SpeechStream`, which answers a malformed
    first message)."""
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    cfg, saved = state.settings, state.saved
    authorized = state.accepts_key(offered_key(websocket))
    first: dict[str, Any] | None = None
    if authorized:
        first = {"type": "timeout"}
        with anyio.move_on_after(cfg.stream_idle_timeout_s), state.drain.idle() as waiting:
            first = cast(dict[str, Any], await websocket.receive())
        if waiting.cancelled_caught:  # the drain began: end it, in our dialect's words (a superset of Omni's)
            with contextlib.suppress(Exception):
                await websocket.send_text(event("error", **error_fields(shutting_down(), True)))
                await websocket.close(int(Close.SERVICE_RESTART), reason="service_restart")
            return
        if first.get("type") == "websocket.disconnect":
            return
        if _dialect(first) == "omni":
            size = len(first["text"].encode("utf-8", "surrogatepass"))
            config = json.loads(first["text"]) if size <= MAX_CONFIG_BYTES else {"type": CONFIG_TYPE}
            await OmniStream(websocket, state, config, first_bytes=size).run()
            return
        if (start := _start_message(first)) is not None:
            try:
                resolved = await saved.resolve(start)
            except ApiError as exc:
                code = CLOSE_FOR_KIND[exc.kind]
                with contextlib.suppress(Exception):
                    await websocket.send_text(event("error", **error_fields(exc, code == Close.TRY_AGAIN)))
                    await websocket.close(int(code), reason=code.name.lower())
                return
            if resolved is not start:
                first = {**first, "text": json.dumps(resolved, ensure_ascii=False)}
    await SpeechStream(cast(WebSocket, _Replay(websocket, first)), state).run()
