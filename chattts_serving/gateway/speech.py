"""The speech service: request validation, speed mapping and the encoded audio stream.

Nothing here knows HTTP: :class:`EncodedStream` turns one Triton synthesis stream (an async
generator of :class:`~chattts_serving.client.StreamPart`) into bytes of the requested format,
and :func:`sse_event` frames them as OpenAI's speech events.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Final, Literal

import anyio.to_thread
import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from .. import contract
from ..audio import formats as audio_format
from ..audio import rates as audio_rates
from ..audio.reference import RecordingError, load_recording
from ..client import StreamPart, SynthesisRequest
from ..text.normalize import CONTROL_NUMBERED, DEFAULT_SPEED
from ..text.request_text import length_error
from .errors import INVALID_REQUEST, ApiError
from .timings import SegmentClock, SentenceTiming

SPEECH_PATH: Final = "/v1/audio/speech"
"""OpenAI's speech route, the request this module validates."""
MIN_SPEED: Final = 0.25
MAX_SPEED: Final = 4.0
RESPONSE_FORMATS: Final = ("mp3", "opus", "aac", "flac", "wav", "pcm", "float32", "mulaw", "alaw")
"""OpenAI's six formats plus ``float32`` (raw little-endian float samples) and G.711's
``mulaw`` and ``alaw`` (8 kHz telephone audio), extensions."""
NO_VOICE: Final = "none"
"""``voice`` (case-insensitive) for no speaker vector at all, with ``reference_audio`` or
``spk_smp`` only: the prompt has ``[empty_spk]`` (ChatTTS' zero-shot use, ``spk_emb=None``).
Reserved at the gateway: a voices-file voice named ``none`` is not reachable through it."""


MAX_RECORDING_BYTES: Final = 16 * 1024 * 1024
"""Largest reference recording accepted (file bytes), uploaded or per request: 30 s of 48 kHz
32-bit stereo WAV is 11.5 MB."""


def _invalid_recording(message: str, param: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", INVALID_REQUEST, param=param, code="invalid_value")


def recording_bytes(value: str, param: str = "reference_audio") -> bytes:
    """The file bytes of a recording sent as text: base64, or a ``data:`` URL of base64.

    Raises:
        ApiError: 400 (``param``) for a URL (the gateway fetches nothing), a ``data:`` URL
            that is not base64, text that is not base64, or more than
            :data:`MAX_RECORDING_BYTES`.
    """
    text = value.strip()
    if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.I):
        raise _invalid_recording("URLs are not fetched by this server; send base64 or a data: URL", param)
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if ";base64" not in head:
            raise _invalid_recording("a data: URL must be base64", param)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid_recording("must be base64 of a recording (WAV, MP3, FLAC, Ogg, ...: any format FFmpeg "
                                 "decodes) or a data: URL of one", param) from None
    if len(raw) > MAX_RECORDING_BYTES:
        raise _invalid_recording(f"the recording is {len(raw)} bytes; at most {MAX_RECORDING_BYTES}", param)
    return raw


def decode_recording(raw: bytes, param: str = "reference_audio") -> tuple[np.ndarray, int]:
    """A recording's file bytes decoded (:func:`~chattts_serving.audio.reference.load_recording`:
    any format FFmpeg decodes, channels averaged): the one path of uploaded voices and
    per-request references. Raises ApiError 400 (``param``) naming why it cannot be read."""
    if not raw:
        raise _invalid_recording("the recording is empty", param)
    try:
        return load_recording(raw)
    except RecordingError as exc:
        raise _invalid_recording(str(exc), param) from None


@functools.lru_cache(maxsize=4)
def reference_recording(value: str, param: str = "reference_audio") -> tuple[np.ndarray, int]:
    """``reference_audio`` (or vLLM-Omni's ``ref_audio``) as (samples, rate):
    :func:`recording_bytes` then :func:`decode_recording`. The last few are kept (read-only),
    so that a WebSocket stream, which sends the reference with every sentence, decodes it once.
    Raises ApiError 400 (``param``)."""
    audio, rate = decode_recording(recording_bytes(value, param), param)
    audio.setflags(write=False)
    return audio, rate


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


def _unicode_text(value: str) -> str:
    """``value`` if it encodes as UTF-8; a JSON string may hold a lone surrogate escape
    (``"\\ud83d"``), which no UTF-8 text can carry. Raises ValueError naming its position."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text: lone surrogate {value[exc.start]!a} at character "
                         f"{exc.start}") from None
    return value


Text = Annotated[str, AfterValidator(_unicode_text)]
"""A string that can be sent as UTF-8 (lone surrogates refused with 400)."""

_RANGES: Final = {p.name: p for p in (*contract.SAMPLING_PARAMS, *contract.STREAM_PARAMS)}


def _param(name: str) -> Any:
    """The pydantic field of a numeric extension, with the contract's range for ``name``
    (:data:`chattts_serving.contract.SAMPLING_PARAMS`): out-of-range values are refused here
    with 400, never wrapped into the tensor's dtype. The server's profile may cap further."""
    spec = _RANGES[name]
    return Field(default=None, ge=spec.low if spec.low_inclusive else None,
                 gt=None if spec.low_inclusive else spec.low, le=spec.high,
                 allow_inf_nan=False if spec.triton_dtype == "TYPE_FP32" else None)


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form ``{"id": "..."}``."""

    id: Text


class SpeechRequest(BaseModel):
    """Body of ``POST /v1/audio/speech`` (OpenAI's fields, then this server's extensions).

    Types are strict (``"speed": "fast"``, ``"top_k": true`` or ``"seed": "3"`` are refused),
    strings must be valid Unicode, numbers within the contract's ranges. Extensions (optional,
    passed to the ``chattts`` model): ``seed`` (sampler seed: same input, voice and seed give
    the same audio), ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``,
    ``max_new_tokens``, ``min_new_tokens``, ``vocoder`` ('hidden' or 'codes'),
    ``lookahead_tokens``, ``refine_text`` (ChatTTS' refine-text stage first), ``refine_prompt``,
    ``segmentation`` ('streaming' or 'chattts'), ``language`` ('auto', 'zh' or 'en': the
    language of numbers, units and symbols the text gives no context for), ``reference_audio``
    (a reference recording: base64 or a ``data:`` URL of a file in any format FFmpeg decodes; a
    voice of the server's voices file may bring its own, by name in ``voice``),
    ``reference_text`` (its transcript), ``spk_smp`` (a ChatTTS audio-prompt string instead of
    a recording), ``sample_rate`` (Hz, for pcm, wav, float32: one of
    :data:`~chattts_serving.audio.rates.OUTPUT_RATES_HZ`), ``container`` ('raw' or 'wav', for
    pcm, mulaw, alaw), ``sentence_timings`` (where each sentence starts in the audio:
    ``speech.sentence`` events with ``stream_format`` 'sse', else a JSON body with the audio).
    ``voice`` is required, except with ``reference_audio`` or ``spk_smp``: omitted (or null, or
    :data:`NO_VOICE`) there, the prompt has no speaker vector (ChatTTS' zero-shot use).
    Unknown fields are ignored, as OpenAI's clients may send newer ones, and named
    (:attr:`ignored_fields`): a misspelt extension is not silently taken for its default.
    """

    model_config = ConfigDict(extra="allow")

    model: Text
    input: Text
    voice: Annotated[Text | StrictInt | VoiceRef, Field(union_mode="left_to_right")] | None = None
    instructions: Text | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "float32", "mulaw", "alaw"] = "mp3"
    sample_rate: StrictInt | None = None
    container: Literal["raw", "wav"] | None = None
    speed: Annotated[StrictFloat, Field(ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)] | None = None
    stream_format: Literal["sse", "audio"] = "audio"
    seed: StrictInt | None = _param("seed")
    temperature: StrictFloat | None = _param("temperature")
    top_p: StrictFloat | None = _param("top_p")
    top_k: StrictInt | None = _param("top_k")
    repetition_penalty: StrictFloat | None = _param("repetition_penalty")
    max_new_tokens: StrictInt | None = _param("max_new_tokens")
    min_new_tokens: StrictInt | None = _param("min_new_tokens")
    vocoder: Text | None = None
    lookahead_tokens: StrictInt | None = _param("lookahead_tokens")
    refine_text: StrictBool | None = None
    refine_prompt: Text | None = None
    segmentation: Text | None = None
    reference_audio: Text | None = None
    reference_text: Text | None = None
    spk_smp: Text | None = None
    language: Text | None = None
    sentence_timings: StrictBool | None = None

    @property
    def ignored_fields(self) -> list[str]:
        """The body's fields this server does not know (kept only to be named), sorted."""
        return sorted(self.model_extra or ())

    @property
    def voice_string(self) -> str | None:
        """The voice as the ``chattts`` model takes it (seed digits, name or spk_emb string);
        None when ``voice`` is omitted or null."""
        v = self.voice
        if v is None:
            return None
        if isinstance(v, VoiceRef):
            return v.id
        return str(v)


def speaker_voice(req: SpeechRequest) -> str:
    """The ``voice`` input for Triton: the request's voice, stripped; ``''`` for no speaker
    vector (``voice`` omitted, null or :data:`NO_VOICE`, allowed only with ``reference_audio``
    or ``spk_smp``: the ``chattts`` model then builds an ``[empty_spk]`` prompt, as it does for
    a recording sent without a voice).

    Raises:
        ApiError: 400 (param ``voice``) for a voice that is omitted or ``none`` without a
            reference, or empty.
    """
    voice = req.voice_string
    if voice is None or voice.strip().lower() == NO_VOICE:
        if req.reference_audio is None and req.spk_smp is None:
            raise ApiError(400, f"voice is required (a voice name, a seed or a ChatTTS spk_emb string); it may be "
                           f"omitted or '{NO_VOICE}' only with reference_audio or spk_smp, for a prompt without "
                           f"a speaker vector", INVALID_REQUEST, param="voice", code="invalid_value")
        return ""
    if not voice.strip():
        raise ApiError(400, f"voice is empty (omit it or send '{NO_VOICE}' with reference_audio or spk_smp for "
                       "no speaker vector)", INVALID_REQUEST, param="voice", code="invalid_value")
    return voice.strip()


def build_request(req: SpeechRequest, models: tuple[str, ...], max_input_chars: int) -> SynthesisRequest:
    """Validate ``req`` beyond its schema and turn it into a Triton :class:`SynthesisRequest`.

    ``speed`` becomes a ``[speed_N]`` token in front of the text (the front end moves the first
    such token into the prompt, so it wins over one written in the input).

    ``reference_audio`` (base64 or a ``data:`` URL of a recording in any format FFmpeg decodes:
    :func:`reference_recording`) becomes the recording's samples and sample rate; the server
    checks them (duration, rate) and its transcript. ``voice``: see
    :func:`speaker_voice` (omitted or ``none`` with a reference: no speaker vector).

    Raises:
        ApiError: unknown model (404), input empty or longer than ``max_input_chars`` (400),
            empty voice, or none without ``reference_audio`` / ``spk_smp`` (400), non-empty
            ``instructions`` (400; ChatTTS takes no instructions),
            ``reference_audio`` that is not base64 of a recording FFmpeg decodes (400).
    """
    if req.model not in models:
        raise ApiError(404, f"The model '{req.model}' does not exist; available: {', '.join(models)}",
                       INVALID_REQUEST, param="model", code="model_not_found")
    too_long = length_error(req.input, max_input_chars)
    if too_long:
        raise ApiError(400, f"input: {too_long}", INVALID_REQUEST, param="input", code="string_above_max_length")
    if not req.input.strip():
        raise ApiError(400, "input is empty", INVALID_REQUEST, param="input", code="invalid_value")
    voice = speaker_voice(req)
    if req.instructions and req.instructions.strip():
        raise ApiError(400, "instructions are not supported by ChatTTS; use control tokens such as [laugh] "
                       "or [uv_break] in the input instead", INVALID_REQUEST, param="instructions",
                       code="unsupported_parameter")
    text = req.input
    if req.speed is not None:
        text = f"[speed_{speed_to_token(req.speed)}]" + text
    audio, rate = None, None
    if req.reference_audio is not None:
        audio, rate = reference_recording(req.reference_audio)
    return SynthesisRequest(text=text, voice=voice, seed=req.seed, temperature=req.temperature, top_p=req.top_p,
                            top_k=req.top_k, repetition_penalty=req.repetition_penalty,
                            max_new_tokens=req.max_new_tokens, min_new_tokens=req.min_new_tokens,
                            vocoder=req.vocoder, lookahead_tokens=req.lookahead_tokens,
                            refine_text=req.refine_text, refine_prompt=req.refine_prompt,
                            segmentation=req.segmentation, reference_audio=audio, reference_sample_rate_hz=rate,
                            reference_text=req.reference_text, spk_smp=req.spk_smp, language=req.language)


def output_format(req: SpeechRequest) -> audio_format.FormatInfo:
    """What ``req`` delivers: its ``response_format`` at its ``sample_rate`` in its
    ``container`` (:func:`chattts_serving.audio.rates.output_info`).

    Raises:
        ApiError: 400 for a combination the formats refuse (a rate outside
            :data:`~chattts_serving.audio.rates.OUTPUT_RATES_HZ`, a rate for mp3, aac, flac
            or opus other than their own, G.711 at another rate than 8000, ``container``
            'wav' for a format that is not pcm or G.711); ``param`` names the field.
    """
    try:
        return audio_rates.output_info(req.response_format, req.sample_rate, req.container)
    except audio_format.FormatError as exc:
        param = "container" if req.container is not None and "container" in str(exc) else "sample_rate"
        raise ApiError(400, f"{param}: {exc}", INVALID_REQUEST, param=param, code="invalid_value") from None


OFFLOADED_FORMATS: Final = frozenset(name for name, info in audio_format.FORMATS.items()
                                      if info.bit_rate_bps is not None)
"""Formats encoded in a worker thread (the lossy codecs mp3, aac, opus): measured here
(2 busy cores) at 30 to 50 ms per 64-token chunk (1.4 s of audio), too long to hold the event
loop that relays every other stream. pcm, float32, wav and flac take at most about 1 ms per
such chunk and are encoded in the loop."""


class EncodedStream:
    """One synthesis streamed from Triton and encoded on the fly, for one consumer task.

    ``parts``: the stream (e.g. :meth:`chattts_serving.client.AioStreamClient.stream`), which
    this object closes; ``fmt``: a ``response_format``, delivered at ``sample_rate_hz`` in
    ``container`` (:func:`chattts_serving.audio.rates.new_output_encoder`; raises its
    FormatError). Sentence timings at the delivered rate: :attr:`sentences`.
    """

    def __init__(self, parts: AsyncGenerator[StreamPart, None], fmt: str, sample_rate_hz: int | None = None,
                 container: str | None = None) -> None:
        self.encoder = audio_rates.new_output_encoder(fmt, sample_rate_hz, container)
        self._offload = fmt in OFFLOADED_FORMATS
        self._parts = parts
        self.samples = 0
        """Samples received so far (at ``contract.SAMPLE_RATE_HZ``)."""
        self.clock = SegmentClock(self.encoder.info.sample_rate_hz)
        self.sentences: list[SentenceTiming] = []
        """Sentences whose audio is complete, not yet taken (:meth:`take_sentences`)."""
        self.info: dict[str, Any] = {}
        """The server's ``info`` objects merged (``request_id``, ``dropped``, ...; see
        ``contract.INFO_HEADER_KEYS``): complete for the header once the first audio arrived."""
        self.done = False

    async def _encode(self, audio: np.ndarray | None) -> bytes:
        work = self.encoder.finish if audio is None else (lambda: self.encoder.encode(audio))
        return await anyio.to_thread.run_sync(work) if self._offload else work()

    async def next_bytes(self) -> bytes | None:
        """Wait for the next audio chunk and return its encoded bytes (the encoder's remainder
        at the end of the stream); None once everything was returned.

        Raises :class:`chattts_serving.client.ClientError` when Triton reports an error or the
        stream times out.
        """
        while not self.done:
            try:
                part = await self._parts.__anext__()
            except StopAsyncIteration:
                self.done = True
                return await self._encode(None)
            if part.info:
                self.info.update(part.info)
                self.clock.update(part.info)
                self.sentences += self.clock.finished(self.samples, final=False)
            if not part.audio.size:
                continue
            self.samples += int(part.audio.size)
            data = await self._encode(part.audio)
            if data:
                return data
        self.sentences += self.clock.finished(self.samples, final=True)  # after the encoder's tail
        return None

    def take_sentences(self) -> list[SentenceTiming]:
        """The sentences completed since the last call (their audio is in what was returned)."""
        out, self.sentences = self.sentences, []
        return out

    async def aclose(self) -> None:
        """Stop the synthesis if it is still running (cancels the Triton request)."""
        self.done = True
        await self._parts.aclose()

    @property
    def audio_s(self) -> float:
        """Seconds of audio received so far."""
        return self.samples / contract.SAMPLE_RATE_HZ

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


def done_event(input_chars: int, audio_tokens: int, capped_segments: list[int] | None = None) -> bytes:
    """OpenAI's ``speech.audio.done`` event. ``usage.input_tokens`` counts input characters
    (the gateway does not see the model's tokenizer); ``output_tokens`` counts GPT audio tokens
    (46.875 per second of audio). ``capped_segments`` (an extension, only when some are): the
    sentences whose audio ended at ``max_new_tokens``, not at their end."""
    extra = {"capped_segments": capped_segments} if capped_segments else {}
    return sse_event({"type": "speech.audio.done",
                      "usage": {"input_tokens": input_chars, "output_tokens": audio_tokens,
                                "total_tokens": input_chars + audio_tokens}, **extra})


def sentence_event(timing: SentenceTiming) -> bytes:
    """A ``speech.sentence`` event (an extension, sent with ``sentence_timings``): one
    sentence's ``index``, ``text`` (normalised), ``start_samples``, ``duration_samples`` (at
    the delivered ``sample_rate_hz``), ``start_s`` and ``duration_s``; sent after the last
    ``speech.audio.delta`` that holds the sentence's audio."""
    return sse_event({"type": "speech.sentence", **timing.as_dict()})


def error_event(error: ApiError) -> bytes:
    """An ``error`` event ending an SSE stream that failed after it started: OpenAI's error
    object and ``retryable`` (true for a 503: the server was busy, stopping, restarting or
    failing, and the same request may succeed later or elsewhere)."""
    return sse_event({"type": "error", **error.body(), "retryable": error.status == 503})
