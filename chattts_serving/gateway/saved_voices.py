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

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..audio.reference import RecordingError, SpkSmpError, check_transcript, decode_spk_smp, encode_spk_smp
from ..client import AioStreamClient, ClientError
from ..errors import ErrorKind, quoted
from ..text.voices import MAX_VOICE_SEED, VoiceBook
from .errors import INVALID_REQUEST, SERVER_ERROR, ApiError, from_client_error
from .speech import MAX_RECORDING_BYTES, NO_VOICE, Text, decode_recording, recording_bytes
from .voice_store import NAME_PATTERN, DuplicateVoice, SavedVoice, StoreUnavailable, VoiceStore

FILE_FIELDS: Final = ("audio_sample", "file", "audio", "reference_audio", "ref_audio")
"""Form fields that may carry the recording file: ``audio_sample`` (OpenAI's
``audio.voices.create``, vLLM-Omni's upload form), then the usual aliases."""
TRANSCRIPT_FIELDS: Final = ("reference_text", "ref_text", "transcript")
"""Form fields that may carry the recording's transcript (ours, vLLM-Omni's, an alias)."""
IGNORED_FIELDS: Final = ("consent", "speaker_description")
"""Accepted and not used: OpenAI's consent recording id (this server keeps no consent
recordings) and vLLM-Omni's free-text description."""
ACCEPTED_FORMS: Final = (
    "POST /v1/audio/voices takes a multipart form (audio_sample: the recording file, any format FFmpeg decodes; "
    "name; reference_text: the words spoken in it; e.g. curl -F audio_sample=@me.wav -F name=me "
    "-F reference_text=...) or a JSON object (name, reference_audio: base64 of the recording, reference_text; "
    "or spk_smp, spk_emb or seed)")
"""The two bodies the route takes, for the 400 of a body that is neither."""
SHOWN_SAVED_NAMES: Final = 8
"""Saved names an unknown-voice error lists (:meth:`SavedVoices.explain`)."""


class VoiceUpload(BaseModel):
    """Body of ``POST /v1/audio/voices``: ``name`` and exactly one of ``reference_audio``
    (base64 of a recording in any format FFmpeg reads, with ``reference_text``, its
    transcript), ``spk_smp`` (ChatTTS' audio-prompt string, with ``reference_text``),
    ``spk_emb`` (a ChatTTS speaker string) or ``seed``; ``speaker`` (a seed or spk_emb string)
    optionally speaks with a recording or spk_smp (without it: no speaker vector, ChatTTS'
    zero-shot use). ``ref_audio``/``ref_text`` (vLLM-Omni's names) are accepted too, and so are
    ``type`` ``audio_sample`` and :data:`IGNORED_FIELDS` (OpenAI's and vLLM-Omni's forms)."""

    model_config = ConfigDict(extra="forbid")

    name: Text
    type: Text | None = None
    consent: Text | None = None
    speaker_description: Text | None = None
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


def _not_found(name: str) -> ApiError:
    return ApiError(404, f"no saved voice named {quoted(name)}", INVALID_REQUEST, param="name", code="voice_not_found")


def unavailable(exc: StoreUnavailable) -> ApiError:
    """The 503 of a store that cannot be reached: that it is unavailable, and to try again
    (where it is and what its driver said went to the log: ``voice_store_unavailable``)."""
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


def _validation_error(exc: ValidationError) -> ApiError:
    """The 400 of an upload :class:`VoiceUpload` refuses: its first problem, ``param`` the field."""
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    param = loc[0] if loc else None
    return ApiError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", INVALID_REQUEST, param=param,
                    code="invalid_value")


def _neither(got: str) -> ApiError:
    return ApiError(400, f"{ACCEPTED_FORMS}; got {got}", INVALID_REQUEST, code="invalid_body")


async def read_upload(request: Request) -> tuple[VoiceUpload, bytes | None, str]:
    """The body of ``POST /v1/audio/voices``, a multipart (or urlencoded) form or a JSON
    object: (the upload's fields, the recording file's bytes when a form carried one, the
    field that carried the recording, for errors).

    Raises ApiError 400: a body that is neither (naming both, :data:`ACCEPTED_FORMS`),
    JSON that does not parse, a form field that is unknown, a second file, a file over
    :data:`~.speech.MAX_RECORDING_BYTES`, a form with no recording nor another source (the
    file field blamed), ``type`` other than ``audio_sample``.
    """
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        try:
            async with request.form(max_files=4, max_fields=64, max_part_size=2 * MAX_RECORDING_BYTES) as form:
                return await _form_upload(form)
        except HTTPException as exc:  # python-multipart's refusal of a malformed form
            raise ApiError(400, f"the multipart form cannot be read: {exc.detail}. {ACCEPTED_FORMS}",
                           INVALID_REQUEST, code="invalid_body") from None
    body = await request.body()
    if ctype not in ("application/json", "") and not ctype.endswith("+json"):
        raise _neither(f"Content-Type {ctype}")
    if not body.strip():
        raise _neither("an empty body")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if ctype == "":
            raise _neither("a body without Content-Type that is not JSON") from None
        raise ApiError(400, f"the body is not valid JSON: {exc}. {ACCEPTED_FORMS}", INVALID_REQUEST,
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise _neither(f"JSON {type(data).__name__}, not an object")
    _check_type(data.get("type"), data)
    try:
        upload = VoiceUpload.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    return upload, None, "reference_audio"


def _check_type(kind: Any, fields: Any) -> None:
    """OpenAI's ``type``: only ``audio_sample`` (the default); a voice designed from a text
    ``prompt`` is refused: ChatTTS has no such model."""
    if (kind is not None and kind != "audio_sample") or "prompt" in fields:
        raise ApiError(400, "ChatTTS cannot design a voice from a text prompt: upload a recording (type "
                       "'audio_sample') with its transcript", INVALID_REQUEST, param="type",
                       code="unsupported_parameter")


async def _form_upload(form: FormData) -> tuple[VoiceUpload, bytes | None, str]:
    """:func:`read_upload` for a form: the file (one, in a :data:`FILE_FIELDS` field), text
    fields as the JSON body's (a transcript under any of :data:`TRANSCRIPT_FIELDS`, ``seed``
    as digits)."""
    files = [(k, v) for k, v in form.multi_items() if isinstance(v, UploadFile)]
    for key, _ in files:
        if key not in FILE_FIELDS:
            raise ApiError(400, f"{key}: send the recording file as audio_sample (or {', '.join(FILE_FIELDS[1:])})",
                           INVALID_REQUEST, param=key, code="invalid_value")
    if len(files) > 1:
        raise _invalid(f"send one recording file; got {len(files)} ({', '.join(k for k, _ in files)})", files[1][0])
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            continue
        if key in fields:
            raise _invalid(f"{key} is sent twice", key)
        fields[key] = value
    if "speaker_embedding" in fields:
        raise ApiError(400, "speaker_embedding: send a ChatTTS spk_emb string as spk_emb instead", INVALID_REQUEST,
                       param="speaker_embedding", code="unsupported_parameter")
    _check_type(fields.get("type"), fields)
    for alias in TRANSCRIPT_FIELDS[1:]:
        if alias in fields and "reference_text" not in fields:
            fields["reference_text"] = fields.pop(alias)
    if "seed" in fields:
        seed = str(fields["seed"]).strip()
        if not seed.lstrip("-").isdigit():
            raise _invalid(f"seed must be an integer in [0, {MAX_VOICE_SEED}]", "seed")
        fields["seed"] = int(seed)
    for key in ("audio_sample", "file", "audio"):
        if key in fields:
            raise _invalid(f"{key} must be the recording file itself (curl -F {key}=@me.wav), not text", key)
    try:
        upload = VoiceUpload.model_validate(fields)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if not files:
        if not any(getattr(upload, k) is not None for k in ("reference_audio", "ref_audio", "spk_smp", "spk_emb",
                                                             "seed")):
            raise _invalid("the form carries no recording: send the file as audio_sample (curl -F "
                           "audio_sample=@me.wav; openai-python: audio_sample=open('me.wav', 'rb')) with "
                           "reference_text, its transcript", "audio_sample")
        return upload, None, "reference_audio"
    key, file = files[0]
    data = await file.read(MAX_RECORDING_BYTES + 1)
    if len(data) > MAX_RECORDING_BYTES:
        raise _invalid(f"the recording is over {MAX_RECORDING_BYTES} bytes", key)
    if not data:
        raise _invalid("the recording file is empty", key)
    return upload, data, key


async def prepare_voice(upload: VoiceUpload, book: VoiceBook, client: AioStreamClient, url: str,
                        recording: bytes | None = None, recording_param: str = "reference_audio") -> SavedVoice:
    """Check ``upload`` and compute what ChatTTS needs (module docstring). ``recording``: the
    file of a form (:func:`read_upload`), sent in its field ``recording_param``.

    Raises ApiError: 400 naming the field (no source or several, a missing transcript, a
    recording FFmpeg cannot read or the front end refuses, a bad spk_smp, spk_emb, seed or
    speaker), 409 (a built-in name), 503 (Triton unreachable).
    """
    name = check_name(upload.name, book)
    audio_b64 = upload.reference_audio if upload.reference_audio is not None else upload.ref_audio
    transcript = upload.reference_text if upload.reference_text is not None else upload.ref_text
    has_audio = recording is not None or audio_b64 is not None
    sources = [k for k, v in (("reference_audio", has_audio or None), ("spk_smp", upload.spk_smp),
                              ("spk_emb", upload.spk_emb), ("seed", upload.seed)) if v is not None]
    if len(sources) != 1 or (recording is not None and audio_b64 is not None):
        raise _invalid("send exactly one of reference_audio (with reference_text), spk_smp (with reference_text), "
                       f"spk_emb or seed; got {', '.join(sources) or 'none'}",
                       sources[1] if sources[1:] else recording_param)
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
            raise _invalid(f"{recording_param if source == 'reference_audio' else source} needs reference_text, "
                           "the words spoken in the recording (openai-python: extra_body={'reference_text': ...})",
                           "reference_text")
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
        raw = recording if recording is not None else recording_bytes(str(audio_b64), recording_param)
        audio, rate = await anyio.to_thread.run_sync(decode_recording, raw, recording_param)
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
                     "reference_audio": recording_param, "reference_sample_rate_hz": recording_param,
                     "reference_text": "reference_text", "input": "reference_text"}.get(error.param or "", source)
            if source == "spk_emb" and error.param == "voice":  # the front end's words are about a voice
                raise _invalid(f"spk_emb {quoted(upload.spk_emb or '')} is not a ChatTTS spk_emb string (a seed "
                               "goes in seed)", "spk_emb") from None
            raise _invalid(error.message, field) from None
        raise error from None


def created(voice: SavedVoice) -> dict[str, Any]:
    """The 201 body of a saved voice, read by every client that uploads: OpenAI's ``Voice``
    (``id``, ``object`` ``audio.voice``, ``name``, ``created_at``, ``type``), vLLM-Omni's
    (``success``, ``voice``) and ours (``voice``: :meth:`SavedVoice.describe`)."""
    return {"id": voice.name, "object": "audio.voice", "name": voice.name, "created_at": int(voice.created_at),
            "type": "audio_sample" if voice.kind == "recording" else voice.kind, "success": True,
            "voice": voice.describe()}


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

    async def listing(self, named: list[dict[str, str]]) -> dict[str, Any]:
        """``GET /v1/audio/voices``: ``voices``, the ``named`` ones then the saved ones (``{"id",
        "name"}`` each, the shape Open WebUI reads), and ``saved_voices``, the saved ones
        described (:meth:`.voice_store.SavedVoice.describe`). Raises ApiError 503 when the store
        is unavailable."""
        try:
            stored = await anyio.to_thread.run_sync(self.store.list)
        except StoreUnavailable as exc:
            raise unavailable(exc) from None
        return {"voices": named + [{"id": v.name, "name": v.name} for v in stored],
                "saved_voices": [v.describe() for v in stored]}

    async def shown(self, name: str) -> dict[str, Any]:
        """A saved voice described, with the Triton inputs it stands for (``inputs``). Raises
        ApiError 404 when there is none of that name."""
        voice = await lookup(self.store, name) if NAME_PATTERN.fullmatch(name) else None
        if voice is None:
            raise _not_found(name)
        return {**voice.describe(), "inputs": voice.request_fields()}

    async def delete(self, name: str) -> dict[str, Any]:
        """Remove a saved voice: OpenAI's deletion object. Raises ApiError 404 when there is
        none of that name, 503 when the store is unavailable."""
        try:
            gone = NAME_PATTERN.fullmatch(name) is not None and await anyio.to_thread.run_sync(self.store.delete,
                                                                                               name)
        except StoreUnavailable as exc:
            raise unavailable(exc) from None
        if not gone:
            raise _not_found(name)
        return {"id": name.lower(), "object": "audio.voice.deleted", "deleted": True, "name": name.lower()}

    async def explain(self, error: ApiError) -> ApiError:
        """``error`` with, when it is the server's unknown-voice refusal, the saved voices
        named too (the server knows only seeds, spk_emb strings and its voices file): a few
        saved names and how to list them all; ``error`` itself otherwise."""
        if error.kind != ErrorKind.INVALID or error.param != "voice" or "unknown voice" not in error.message:
            return error
        try:
            names = [v.name for v in await anyio.to_thread.run_sync(self.store.list)]
        except StoreUnavailable:
            names = None
        shown = ", ".join(names[:SHOWN_SAVED_NAMES]) + (", ..." if len(names) > SHOWN_SAVED_NAMES else "") \
            if names else ""
        saved = (f"; saved voices: {shown}" if shown else "; no voice is saved" if names is not None else "") + \
            " (GET /v1/audio/voices lists every voice; POST /v1/audio/voices saves one)"
        return ApiError(error.status, error.message + saved, error.type, param=error.param, code=error.code,
                        kind=error.kind)


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
