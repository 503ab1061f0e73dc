"""vLLM-Omni's ``session.config`` (:mod:`.omni_ws`): what a client may configure, and the
request every sentence of the session is sent with (:func:`parse_config`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from ..audio import formats as audio_format
from .errors import INVALID_REQUEST, ApiError
from .settings import GatewaySettings
from .speech import NO_VOICE, SpeechRequest, build_request, output_format, reference_recording

STREAM_FORMATS: Final = ("pcm", "float32", "mulaw", "alaw")
"""Formats ``stream_audio`` sends in chunks (raw samples; vLLM-Omni allows ``pcm`` only)."""


class OmniConfig(BaseModel):
    """``session.config`` (vLLM-Omni's ``StreamingSpeechSessionConfig``, then this gateway's
    extensions, which are ``/v1/audio/speech``'s fields). Unknown fields are ignored.

    Accepted and without effect on ChatTTS: ``task_type`` (``VoiceDesign`` needs
    instructions, which ChatTTS does not take), ``language`` (ChatTTS reads Chinese and
    English as they come), ``x_vector_only_mode``, ``initial_codec_chunk_frames``,
    ``non_streaming_mode`` (Qwen3-TTS knobs). Refused: ``word_timestamps`` true (ChatTTS gives
    no word-level timing), ``speaker_embedding`` (send a ChatTTS spk_emb string as ``voice``),
    ``ref_audio`` as a URL (the gateway fetches nothing).
    """

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    voice: str | None = None
    speaker: str | None = None
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
    language: str | None = None
    instructions: str | None = None
    response_format: str = "wav"
    speed: float | None = Field(default=1.0, ge=0.25, le=4.0)
    max_new_tokens: int | None = Field(default=None, ge=1)
    ref_audio: str | None = None
    ref_text: str | None = None
    speaker_embedding: list[float] | None = None
    stream_audio: StrictBool = False
    word_timestamps: StrictBool = False
    seed: int | None = None
    split_granularity: Literal["none", "sentence", "clause"] = "none"


@dataclasses.dataclass(frozen=True)
class Session:
    """A validated ``session.config``: the request fields every sentence is sent with, and how
    the text is cut and the audio sent."""

    body: SpeechRequest
    default_voice: bool
    """No voice and no reference: the server's default voice (an empty ``voice`` input)."""
    split: str
    stream_audio: bool
    info: audio_format.FormatInfo


def parse_config(msg: dict[str, Any], cfg: GatewaySettings) -> Session:
    """A ``session.config`` message as a :class:`Session`.

    Raises ApiError (400, its ``param`` the field at fault) for an invalid config, an unknown
    model (404), or a field ChatTTS cannot honour (see :class:`OmniConfig`).
    """
    fields = {k: v for k, v in msg.items() if k != "type"}
    try:
        conf = OmniConfig.model_validate(fields)
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = [str(p) for p in problem.get("loc", ())]
        raise ApiError(400, f"Invalid session config: {loc[0] if loc else 'config'}: {problem.get('msg')}",
                       INVALID_REQUEST, param=loc[0] if loc else None, code="invalid_value") from None
    if conf.word_timestamps:
        raise ApiError(400, "word_timestamps: ChatTTS gives no word-level timing; sentence timings come on audio.done "
                       "(start_samples, duration_samples)", INVALID_REQUEST, param="word_timestamps",
                       code="unsupported_parameter")
    if conf.speaker_embedding is not None:
        raise ApiError(400, "speaker_embedding: send a ChatTTS spk_emb string as voice instead", INVALID_REQUEST,
                       param="speaker_embedding", code="unsupported_parameter")
    if conf.stream_audio and conf.response_format not in STREAM_FORMATS:
        raise ApiError(400, f"Invalid session config: stream_audio=true requires response_format "
                       f"{' or '.join(repr(f) for f in STREAM_FORMATS)}, got {conf.response_format!r}",
                       INVALID_REQUEST, param="response_format", code="invalid_value")
    reference = None
    if conf.ref_audio is not None:
        reference_recording(conf.ref_audio, "ref_audio")  # decoded (and kept) now: a bad one is refused here
        reference = conf.ref_audio
    voice = conf.voice if conf.voice is not None else conf.speaker
    known = set(OmniConfig.model_fields)
    extra = {k: v for k, v in fields.items() if k not in known}
    request = {**extra, "model": conf.model or cfg.models[0], "input": "-", "response_format": conf.response_format,
               "speed": None if conf.speed in (None, 1.0) else float(conf.speed), "seed": conf.seed,
               "max_new_tokens": conf.max_new_tokens, "instructions": conf.instructions,
               "reference_audio": reference, "reference_text": conf.ref_text}
    default_voice = voice is None and reference is None and extra.get("spk_smp") is None
    request["voice"] = voice if voice is not None else (NO_VOICE if not default_voice else "0")
    try:
        body = SpeechRequest.model_validate({k: v for k, v in request.items() if v is not None})
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = [str(p) for p in problem.get("loc", ())]
        raise ApiError(400, f"Invalid session config: {loc[0] if loc else 'config'}: {problem.get('msg')}",
                       INVALID_REQUEST, param=loc[0] if loc else None, code="invalid_value") from None
    if body.stream_format != "audio":
        raise ApiError(400, "stream_format: not used on the WebSocket stream", INVALID_REQUEST,
                       param="stream_format", code="unsupported_parameter")
    build_request(body, cfg.models, cfg.max_input_chars)  # the model, the voice, instructions: refused now
    return Session(body, default_voice, conf.split_granularity, conf.stream_audio, output_format(body))


def blame_speaker(error: ApiError, msg: dict[str, Any]) -> ApiError:
    """``error`` with ``param`` ``speaker`` where the config named its voice so (``voice``
    is the field the request was checked by)."""
    if error.param != "voice" or msg.get("voice") is not None or msg.get("speaker") is None:
        return error
    return ApiError(error.status, error.message, error.type, param="speaker", code=error.code, kind=error.kind)
