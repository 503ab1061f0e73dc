"""The WebSocket ``/v1/audio/speech/stream``: text deltas in, sentence by sentence audio out,
in this gateway's dialect (:mod:`..ws`) or vLLM-Omni's (:mod:`..omni_ws`), told apart by the
first message (:mod:`..dialects`)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..dialects import refuse_handshake, serve_stream
from ..drain import shutting_down
from ..state import GatewayState
from ..ws import WS_PATH

router = APIRouter()


@router.websocket(WS_PATH)
async def speech_stream(websocket: WebSocket) -> None:
    """One stream; while the gateway drains, the handshake is refused with 503 and ``Retry-After``."""
    state = GatewayState.of(websocket)
    if state.drain.draining:
        await refuse_handshake(websocket, state, shutting_down())
        return
    with state.drain.connection():
        await serve_stream(websocket, state)
