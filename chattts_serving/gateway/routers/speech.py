"""``POST /v1/audio/speech``: OpenAI's speech request, synthesised by :func:`..relay.synthesise`.

Its admission was decided at the door (:class:`..middleware.AdmissionDoor`) before the body
was read."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from ..relay import synthesise
from ..speech import SPEECH_PATH, SpeechRequest
from ..state import Gateway, authorize

router = APIRouter(dependencies=[Depends(authorize)])


@router.post(SPEECH_PATH, response_model=None)
async def speech(body: SpeechRequest, http_request: Request, state: Gateway) -> Response:
    """Synthesise ``input`` and stream it: chunked bytes of ``response_format``
    (``stream_format`` 'audio') or ``speech.audio.delta`` events ('sse')."""
    return await synthesise(state, body, http_request)
