"""``POST /v1/audio/voices``: a voice saved once, computed once, and used by name
(:mod:`.voice_store` says where it is kept and who reads it).

:func:`prepare_voice` checks an upload and computes what ChatTTS needs: a recording is sent to
the front-end model (``chattts_frontend``), which checks it (duration, rate, transcript: the
profile's ``[reference]`` limits) and encodes it with the DVAE encoder; its codes are stored as
ChatTTS' ``spk_smp`` string. :func:`resolve` turns a saved name in a speech request into those
inputs, once per request (a WebSocket stream resolves at its start, so a voice deleted while a
stream speaks with it does not cut the stream).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, StrictInt

from ..audio.reference import (
    RecordingError,
    SpkSmpError,
    check_transcript,
    decode_spk_smp,
    encode_spk_smp,
    load_recording,
)
from ..client import AioStreamClient, ClientError
from ..errors import ErrorKind
from ..text.voices import MAX_VOICE_SEED, VoiceBook
from .errors import INVALID_REQUEST, SERVER_ERROR, ApiError, from_client_error
from .speech import NO_VOICE, Text
from .voice_store import NAME_PATTERN, DuplicateVoice, SavedVoice, StoreUnavailable, VoiceStore

MAX_UPLOAD_BYTES = 16 * 1024 * 1024
"""Largest recording accepted (decoded bytes): 30 s of 48 kHz 32-bit stereo is 11.5 MB."""


class VoiceUpload(BaseModel):
    """Body of ``POST /v1/audio/voices``: ``name`` and exactly one of ``reference_audio``
    (base64 of a recording in any format FFmpeg reads, with ``reference_text``, its
    transcript), ``spk_smp`` (ChatTTS' audio-prompt string, with ``reference_text``),
    ``spk_emb`` (a ChatTTS speaker string) or ``seed``; ``speaker`` (a seed or spk_emb string)
    optionally speaks with a recording or spk_smp (without it: no speaker vector, ChatTTS'
    zero-shot use). ``ref_audio``/``ref_text`` (vLLM-Omni's names) are accepted too."""

    model_config = ConfigDict(extra="forbid")

    name: Text
    reference_audio: Text | None = None
    reference_text: Text | None = None
    ref_audio: Text | None = None
    ref_text: Text | None = None
    spk_smp: Text | None = None
    spk_emb: Text | None = None
    seed: StrictInt | None = None
    speaker: Text | StrictInt | None = None


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param=param, code="invalid_value")


def unavailable(exc: StoreUnavailable) -> ApiError:
    """The 503 of a store that cannot be reached."""
    return ApiError(503, str(exc), SERVER_ERROR, code="voice_store_unavailable", kind=ErrorKind.UNAVAILABLE)


def check_name(name: str, book: VoiceBook) -> str:
    """The lower-cased saved-voice name. Raises ApiError: 400 for a malformed or reserved
    name, 409 for one of the built-in or voices-file names."""
    n = name.strip()
    if not NAME_PATTERN.fullmatch(n):
        raise _invalid(f"name must match {NAME_PATTERN.pattern} (a letter first, at most 64 characters)", "name")
    if n.lower() == NO_VOICE:
        raise _invalid(f"'{NO_VOICE}' is reserved (no speaker vector)", "name")
    if book.get(n) is not None:
        raise ApiError(409, f"'{n}' is a built-in or voices-file voice", INVALID_REQUEST, param="name",
                       code="voice_exists")
    return n.lower()


async def prepare_voice(upload: VoiceUpload, book: VoiceBook, client: AioStreamClient, url: str) -> SavedVoice:
    """Check ``upload`` and compute what ChatTTS needs (module docstring).

    Raises ApiError: 400 naming the field (no source or several, a missing transcript, a
    recording FFmpeg cannot read or the front end refuses, a bad spk_smp, spk_emb, seed or
    speaker), 409 (a built-in name), 503 (Triton unreachable).
    """
    name = check_name(upload.name, book)
    audio_b64 = upload.reference_audio if upload.reference_audio is not None else upload.ref_audio
    transcript = upload.reference_text if upload.reference_text is not None else upload.ref_text
    sources = [k for k, v in (("reference_audio", audio_b64), ("spk_smp", upload.spk_smp),
                              ("spk_emb", upload.spk_emb), ("seed", upload.seed)) if v is not None]
    if len(sources) != 1:
        raise _invalid("send exactly one of reference_audio (with reference_text), spk_smp (with reference_text), "
                       f"spk_emb or seed; got {', '.join(sources) or 'none'}", sources[1] if sources[1:] else "name")
    source = sources[0]
    speaker = None if upload.speaker is None else str(upload.speaker).strip()
    if speaker is not None and source not in ("reference_audio", "spk_smp"):
        raise _invalid("speaker goes with reference_audio or spk_smp only", "speaker")
    try:
        if source == "seed":
            assert upload.seed is not None
            if not 0 <= upload.seed <= MAX_VOICE_SEED:
                raise _invalid(f"seed must be in [0, {MAX_VOICE_SEED}]", "seed")
            return SavedVoice(name, "seed", speaker=str(upload.seed))
        if source == "spk_emb":
            assert upload.spk_emb is not None
            await client.audio_prompt(voice=upload.spk_emb.strip())  # the front end decodes it or refuses
            return SavedVoice(name, "spk_emb", speaker=upload.spk_emb.strip())
        if speaker is not None:
            await client.audio_prompt(voice=speaker)
        if transcript is None or not transcript.strip():
            raise _invalid(f"{source} needs reference_text, the words spoken in the recording", "reference_text")
        if source == "spk_smp":
            assert upload.spk_smp is not None
            try:
                decode_spk_smp(upload.spk_smp)
                check_transcript(transcript)
            except SpkSmpError as exc:
                raise _invalid(str(exc), "spk_smp") from None
            except RecordingError as exc:
                raise _invalid(str(exc), "reference_text") from None
            return SavedVoice(name, "spk_smp", speaker=speaker, spk_smp=upload.spk_smp.strip(), transcript=transcript)
        assert audio_b64 is not None
        try:
            raw = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("reference_audio must be base64 of a recording", "reference_audio") from None
        if len(raw) > MAX_UPLOAD_BYTES:
            raise _invalid(f"reference_audio is {len(raw)} bytes; at most {MAX_UPLOAD_BYTES}", "reference_audio")
        try:
            audio, rate = await anyio.to_thread.run_sync(load_recording, raw)
        except RecordingError as exc:
            raise _invalid(f"reference_audio: {exc}", "reference_audio") from None
        codes = await client.audio_prompt(voice=speaker or "", reference_audio=audio, reference_rate_hz=rate,
                                          reference_text=transcript, no_speaker=speaker is None)
        if not len(codes):
            raise ApiError(500, "the front end returned no audio prompt for the recording", SERVER_ERROR,
                           code="internal_error", kind=ErrorKind.INTERNAL)
        return SavedVoice(name, "recording", speaker=speaker, spk_smp=encode_spk_smp(codes), transcript=transcript,
                          source_sha256=hashlib.sha256(raw).hexdigest(),
                          source_s=round(audio.size / rate, 3))
    except ClientError as exc:
        error = from_client_error(exc, url)
        if error.kind == ErrorKind.INVALID:
            field = {"voice": "speaker" if source in ("reference_audio", "spk_smp") else source,
                     "reference_audio": "reference_audio", "reference_sample_rate_hz": "reference_audio",
                     "reference_text": "reference_text", "input": "reference_text"}.get(error.param or "", source)
            raise _invalid(error.message, field) from None
        raise error from None


async def save(store: VoiceStore, voice: SavedVoice) -> SavedVoice:
    """Insert ``voice``. Raises ApiError 409 (the name is taken) or 503 (store unavailable)."""
    try:
        return await anyio.to_thread.run_sync(store.add, voice)
    except DuplicateVoice as exc:
        raise ApiError(409, str(exc), INVALID_REQUEST, param="name", code="voice_exists") from None
    except StoreUnavailable as exc:
        raise unavailable(exc) from None


async def lookup(store: VoiceStore, name: str) -> SavedVoice | None:
    """The saved voice ``name``, or None. Raises ApiError 503 (store unavailable)."""
    try:
        return await anyio.to_thread.run_sync(store.get, name)
    except StoreUnavailable as exc:
        raise unavailable(exc) from None


def may_be_saved(voice: str | None, book: VoiceBook) -> bool:
    """Whether ``voice`` could name a saved voice: a name (not a seed, not a spk_emb string)
    that is neither built in, in the voices file, nor :data:`~.speech.NO_VOICE`."""
    if voice is None:
        return False
    v = voice.strip()
    return bool(NAME_PATTERN.fullmatch(v)) and v.lower() != NO_VOICE and book.get(v) is None


@dataclass(frozen=True)
class SavedVoices:
    """The store and the names it must not shadow (built-in and voices-file voices)."""

    store: VoiceStore
    book: VoiceBook

    async def resolve(self, fields: dict[str, Any], voice_key: str = "voice",
                      text_key: str = "reference_text") -> dict[str, Any]:
        """:func:`resolve` with this store and book."""
        return await resolve(fields, self.store, self.book, voice_key, text_key)


async def resolve(fields: dict[str, Any], store: VoiceStore, book: VoiceBook, voice_key: str = "voice",
                  text_key: str = "reference_text") -> dict[str, Any]:
    """``fields`` (a speech request's, or a WebSocket start or config message) with a saved
    voice's name replaced by what it stands for (:meth:`SavedVoice.request_fields`; the
    transcript under ``text_key``); unchanged when ``voice_key`` names no saved voice.

    Raises ApiError: 400 when the request brings its own recording or spk_smp as well as a
    saved voice that has one, 503 when the store is unavailable.
    """
    voice = fields.get(voice_key)
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not may_be_saved(voice, book):
        return fields
    saved = await lookup(store, voice)
    if saved is None:
        return fields  # the server answers for an unknown name
    resolved = saved.request_fields()
    if "spk_smp" in resolved and any(fields.get(k) is not None for k in
                                     ("reference_audio", "ref_audio", "spk_smp")):
        raise _invalid(f"voice '{voice}' is a saved voice with its own recording; do not send another", voice_key)
    out = {**fields, voice_key: resolved.pop("voice")}
    if "reference_text" in resolved:
        out[text_key] = resolved.pop("reference_text")
    out.update(resolved)
    return out
