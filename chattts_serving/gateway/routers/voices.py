"""The voices (``/v1/audio/voices``: list, save, show, delete, :mod:`..saved_voices`) and the
model names (``/v1/models``); all need the API key when one is set."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from ..errors import INVALID_REQUEST, ApiError
from ..saved_voices import created, prepare_voice, read_upload, save
from ..state import Gateway, authorize

router = APIRouter(dependencies=[Depends(authorize)])


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "chattts-serving"}


@router.get("/v1/models")
async def models(state: Gateway) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(m) for m in state.settings.models]}


@router.get("/v1/models/{model_id}")
async def model(model_id: str, state: Gateway) -> dict[str, Any]:
    if model_id not in state.settings.models:
        raise ApiError(404, f"The model '{model_id}' does not exist", INVALID_REQUEST, param="model",
                       code="model_not_found")
    return _model_card(model_id)


@router.get("/v1/audio/voices")
@router.get("/v1/voices", include_in_schema=False)
async def list_voices(state: Gateway) -> dict[str, Any]:
    """Every voice name ``voice`` accepts (``{"voices": [{"id", "name"}]}``, the shape Open
    WebUI reads): the built-in names, the voices file's, then the saved ones, which
    ``saved_voices`` describes (:meth:`.voice_store.SavedVoice.describe`). Integer seeds and
    ChatTTS ``spk_emb`` strings are accepted too and not listed. 503 when the store of
    saved voices is unavailable."""
    return await state.saved.listing(state.voices)


@router.post("/v1/audio/voices", status_code=201)
async def save_voice(request: Request, state: Gateway) -> dict[str, Any]:
    """Save a voice under a name (:mod:`..saved_voices`), from a multipart form (the
    recording as a file: OpenAI's ``audio.voices.create``, vLLM-Omni's form, ``curl -F``)
    or a JSON object (base64): 201 with OpenAI's ``Voice`` fields and ``voice``, its
    description; 400 for a bad upload, 409 for a name taken, 503 when Triton or the store
    is unavailable."""
    upload, recording, field = await read_upload(request)
    voice = await prepare_voice(upload, state.book, state.client, state.settings.triton_url, recording, field)
    return created(await save(state.saved.store, voice))


@router.get("/v1/audio/voices/{name}")
async def get_voice(name: str, state: Gateway) -> dict[str, Any]:
    """A saved voice with the Triton inputs it stands for (``inputs``: ``voice``, and
    ``spk_smp`` with ``reference_text`` for an audio prompt), for clients of the Triton door."""
    return await state.saved.shown(name)


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, state: Gateway) -> dict[str, Any]:
    """Remove a saved voice: 200, or 404 when there is none of that name; requests already
    speaking with it finish with it."""
    return await state.saved.delete(name)
