"""The speech service: request validation, speed mapping and the encoded audio stream.

Nothing here knows HTTP: :class:`EncodedStream` turns one Triton synthesis stream into bytes
of the requested format, and :func:`sse_event` frames them as OpenAI's speech events.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import contract
from ..audio import formats as audio_format
from ..client import StreamPart, SynthesisRequest, iter_parts
from ..text.normalize import CONTROL_NUMBERED, DEFAULT_SPEED, length_error
from .errors import INVALID_REQUEST, ApiError

MIN_SPEED: Final = 0.25
MAX_SPEED: Final = 4.0
RESPONSE_FORMATS: Final = ("mp3", "opus", "aac", "flac", "wav", "pcm", "float32")
"""OpenAI's six formats plus ``float32`` (raw little-endian float samples, an extension)."""


def speed_to_token(speed: float) -> int:
    """OpenAI ``speed`` (0.25 to 4, 1 = normal) -> N of ChatTTS' ``[speed_N]`` token (0..9).

    ChatTTS has ten speed tokens with ``[speed_5]`` as its default; the mapping is logarithmic
    in ``speed``, 2.5 steps per halving below 1 and 2 steps per doubling above, rounded:

    | speed | 0.25 | 0.35 | 0.5 | 0.75 | 1 | 1.25 | 1.5 | 2 | 3 | 4 |
    |---|---|---|---|---|---|---|---|---|---|---|
    | N | 0 | 1 | 3 | 4 | 5 | 6 | 6 | 7 | 8 | 9 |

    How much faster each step speaks is learned by the model, not specified; the tokens are
    ordered. Raises ValueError outside [0.25, 4].
    """
    if not MIN_SPEED <= speed <= MAX_SPEED or math.isnan(speed):
        raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
    octaves = math.log2(speed)
    n = DEFAULT_SPEED + (2.5 if octaves < 0 else 2.0) * octaves
    return max(0, min(CONTROL_NUMBERED["speed"] - 1, math.floor(n + 0.5)))


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form ``{"id": "..."}``."""

    id: str


class SpeechRequest(BaseModel):
    """Body of ``POST /v1/audio/speech`` (OpenAI's fields, then this server's extensions).

    Extensions (optional, passed to the ``chattts`` model, which validates them): ``seed``
    (sampler seed: same input, voice and seed give the same audio), ``temperature``,
    ``top_p``, ``top_k``, ``repetition_penalty``, ``max_new_tokens``, ``min_new_tokens``,
    ``vocoder`` ('hidden' or 'codes'), ``lookahead_tokens``, ``refine_text`` (ChatTTS'
    refine-text stage first), ``refine_prompt``.
    """

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: Annotated[str | int | VoiceRef, Field(union_mode="left_to_right")]
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "float32"] = "mp3"
    speed: Annotated[float, Field(ge=MIN_SPEED, le=MAX_SPEED)] | None = None
    stream_format: Literal["sse", "audio"] = "audio"
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    vocoder: str | None = None
    lookahead_tokens: int | None = None
    refine_text: bool | None = None
    refine_prompt: str | None = None

    @property
    def voice_string(self) -> str:
        """The voice as the ``chattts`` model takes it (seed digits, name or spk_emb string)."""
        v = self.voice
        if isinstance(v, VoiceRef):
            return v.id
        return str(v)


def build_request(req: SpeechRequest, models: tuple[str, ...], max_input_chars: int) -> SynthesisRequest:
    """Validate ``req`` beyond its schema and turn it into a Triton :class:`SynthesisRequest`.

    ``speed`` becomes a ``[speed_N]`` token in front of the text (the front end moves the first
    such token into the prompt, so it wins over one written in the input).

    Raises:
        ApiError: unknown model (404), input empty or longer than ``max_input_chars`` (400),
            empty voice (400), non-empty ``instructions`` (400; ChatTTS takes no instructions).
    """
    if req.model not in models:
        raise ApiError(404, f"The model '{req.model}' does not exist; available: {', '.join(models)}",
                       INVALID_REQUEST, param="model", code="model_not_found")
    too_long = length_error(req.input, max_input_chars)
    if too_long:
        raise ApiError(400, f"input: {too_long}", INVALID_REQUEST, param="input", code="string_above_max_length")
    if not req.input.strip():
        raise ApiError(400, "input is empty", INVALID_REQUEST, param="input", code="invalid_value")
    voice = req.voice_string.strip()
    if not voice:
        raise ApiError(400, "voice is empty", INVALID_REQUEST, param="voice", code="invalid_value")
    if req.instructions and req.instructions.strip():
        raise ApiError(400, "instructions are not supported by ChatTTS; use control tokens such as [laugh] "
                       "or [uv_break] in the input instead", INVALID_REQUEST, param="instructions",
                       code="unsupported_parameter")
    text = req.input
    if req.speed is not None:
        text = f"[speed_{speed_to_token(req.speed)}]" + text
    return SynthesisRequest(text=text, voice=voice, seed=req.seed, temperature=req.temperature, top_p=req.top_p,
                            top_k=req.top_k, repetition_penalty=req.repetition_penalty,
                            max_new_tokens=req.max_new_tokens, min_new_tokens=req.min_new_tokens,
                            vocoder=req.vocoder, lookahead_tokens=req.lookahead_tokens,
                            refine_text=req.refine_text, refine_prompt=req.refine_prompt)


class EncodedStream:
    """One synthesis streamed from Triton and encoded on the fly. Blocking; not thread-safe
    (one caller at a time, e.g. one worker thread after another).

    ``url``: Triton gRPC ``host:port``; ``fmt``: a key of ``audio_format.FORMATS``;
    ``timeout_s``: deadline of the whole stream in seconds.
    """

    def __init__(self, url: str, request: SynthesisRequest, fmt: str, timeout_s: float) -> None:
        self.encoder = audio_format.new_encoder(fmt)
        self._chunks: Iterator[StreamPart] = iter_parts(url, request, timeout_s=timeout_s)
        self.samples = 0
        """Samples received so far (at ``contract.SAMPLE_RATE_HZ``)."""
        self.info: dict[str, Any] = {}
        """The server's ``info`` objects merged (``request_id``, ``dropped``, ...; see
        ``contract.INFO_HEADER_KEYS``): complete for the header once the first audio arrived."""
        self.done = False

    def next_bytes(self) -> bytes | None:
        """Wait for the next audio chunk and return its encoded bytes (the encoder's remainder
        at the end of the stream); None once everything was returned.

        Raises :class:`chattts_serving.client.ClientError` when Triton reports an error.
        """
        while not self.done:
            try:
                part = next(self._chunks)
            except StopIteration:
                self.done = True
                return self.encoder.finish()
            if part.info:
                self.info.update(part.info)
            if not part.audio.size:
                continue
            self.samples += int(part.audio.size)
            data = self.encoder.encode(part.audio)
            if data:
                return data
        return None

    def close(self) -> None:
        """Stop the synthesis if it is still running (cancels the Triton request)."""
        self.done = True
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    @property
    def audio_tokens(self) -> int:
        """GPT tokens the audio so far corresponds to (512 samples each, rounded up)."""
        return -(-(self.samples + contract.HOP_SAMPLES) // contract.SAMPLES_PER_TOKEN) if self.samples else 0


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON on a ``data:`` line."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta_event(data: bytes) -> bytes:
    """OpenAI's ``speech.audio.delta`` event: ``audio`` is base64 of the next encoded bytes."""
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


def done_event(input_chars: int, audio_tokens: int) -> bytes:
    """OpenAI's ``speech.audio.done`` event. ``usage.input_tokens`` counts input characters
    (the gateway does not see the model's tokenizer); ``output_tokens`` counts GPT audio tokens
    (46.875 per second of audio)."""
    return sse_event({"type": "speech.audio.done",
                      "usage": {"input_tokens": input_chars, "output_tokens": audio_tokens,
                                "total_tokens": input_chars + audio_tokens}})


def error_event(error: ApiError) -> bytes:
    """An ``error`` event ending an SSE stream that failed after it started."""
    return sse_event({"type": "error", **error.body()})
