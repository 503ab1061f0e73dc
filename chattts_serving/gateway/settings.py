"""Gateway settings, parsed once: each knob is a field of :class:`GatewaySettings`, a command-line
flag and an environment variable (:data:`OPTIONS`); the flag wins over the variable."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..client.keys import INFERENCE_KEY_ENV, inference_key_from_env
from ..text.voices import ENV_VOICES, default_voices_path
from .voice_store import ENV_VOICE_STORE, default_store_url

ENV_API_KEY: Final = "CHATTTS_API_KEY"
"""Environment variable holding the API key; unset or empty: no authentication."""
ENV_TRITON_URL: Final = "CHATTTS_TRITON_URL"
"""Environment variable with Triton's gRPC ``host:port`` (the ``--triton-url`` default)."""

DEFAULT_MODELS: Final = ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""Model names accepted in requests; all are served by ChatTTS (the OpenAI names are aliases
so that OpenAI clients work unchanged)."""


def _optional_seconds(text: str) -> float | None:
    """A duration in seconds; '', 'none' or 0 mean no limit (None)."""
    value = text.strip().lower()
    if value in ("", "none"):
        return None
    seconds = float(value)
    return None if seconds == 0 else seconds


def _switch(text: str) -> bool:
    """An on/off knob: true/false, on/off, yes/no, 1/0 (any case). Raises ValueError otherwise."""
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _origins(text: str) -> tuple[str, ...]:
    """Comma-separated origins (``https://app.example.com,http://localhost:3000``, or ``*``)."""
    return tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())


@dataclass(frozen=True)
class Option:
    """One knob: its :class:`GatewaySettings` field, command-line flag, environment variable,
    parser of the text form (raises ValueError) and help text."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], object]
    help: str


OPTIONS: Final = (
    Option("triton_url", "--triton-url", ENV_TRITON_URL, str.strip, "Triton gRPC host:port (127.0.0.1:8001)"),
    Option("max_input_chars", "--max-input-chars", "CHATTTS_GATEWAY_MAX_INPUT_CHARS", int,
           "longest input in characters, control tokens not counted (4096, OpenAI's limit)"),
    Option("stream_idle_timeout_s", "--stream-idle-timeout-s", "CHATTTS_GATEWAY_STREAM_IDLE_TIMEOUT_S", float,
           "a stream fails when no chunk has come from Triton for this long, s (90)"),
    Option("stream_max_s", "--stream-max-s", "CHATTTS_GATEWAY_STREAM_MAX_S", _optional_seconds,
           "optional cap on a whole stream, s; 0 or none: no cap (default: none)"),
    Option("max_streams", "--max-streams", "CHATTTS_GATEWAY_MAX_STREAMS", int,
           "streams relayed at once; beyond it: 503 server busy at once (256)"),
    Option("admission_watch", "--admission-watch", "CHATTTS_GATEWAY_ADMISSION_WATCH", _switch,
           "follow Triton's admission watch and answer 503 server busy without calling Triton while every "
           "stream slot is taken (true)"),
    Option("retry_after_s", "--retry-after-s", "CHATTTS_GATEWAY_RETRY_AFTER_S", int,
           "Retry-After of 503 answers (busy, unavailable, deadline), whole seconds (1)"),
    Option("health_timeout_s", "--health-timeout-s", "CHATTTS_GATEWAY_HEALTH_TIMEOUT_S", float,
           "deadline of /health's readiness call to Triton, s (2)"),
    Option("cors_origins", "--cors-origins", "CHATTTS_GATEWAY_CORS_ORIGINS", _origins,
           "comma-separated browser origins allowed to call the API, or '*' (default: none, CORS off)"),
    Option("voices_file", "--voices-file", ENV_VOICES, Path,
           "voices file listed by /v1/audio/voices: the server's (default: $CHATTTS_VOICES, else "
           "voices/voices.toml)"),
    Option("voice_store", "--voice-store", ENV_VOICE_STORE, str.strip,
           "SQLAlchemy URL of the saved voices (POST /v1/audio/voices): sqlite:///path or "
           "postgresql+psycopg://user:password@host/db (default: a SQLite file in ~/.local/share/chattts-serving)"),
    Option("ws_idle_flush_s", "--ws-idle-flush-s", "CHATTTS_GATEWAY_WS_IDLE_FLUSH_S", float,
           "WebSocket stream: an unfinished sentence is spoken after no text came for this long, s (1)"),
    Option("ws_lookahead", "--ws-lookahead", "CHATTTS_GATEWAY_WS_LOOKAHEAD", int,
           "WebSocket stream: sentences synthesised ahead of the one being sent (1)"),
    Option("ws_queue_chunks", "--ws-queue-chunks", "CHATTTS_GATEWAY_WS_QUEUE_CHUNKS", int,
           "WebSocket stream: audio chunks held per sentence before reading from Triton pauses (8)"),
    Option("ws_send_timeout_s", "--ws-send-timeout-s", "CHATTTS_GATEWAY_WS_SEND_TIMEOUT_S", float,
           "WebSocket stream: a client that takes no audio for this long is cut off (1008), s (30)"),
    Option("ws_max_sentence_chars", "--ws-max-sentence-chars", "CHATTTS_GATEWAY_WS_MAX_SENTENCE_CHARS", int,
           "WebSocket stream: a sentence longer than this is cut at its last pause, characters (400)"),
    Option("drain_timeout_s", "--drain-timeout-s", "CHATTTS_GATEWAY_DRAIN_TIMEOUT_S", float,
           "at SIGTERM/SIGINT, streams in flight may run this long before they are ended, s; 0: end them at "
           "once (30)"),
)
"""Every knob with its flag and environment variable (``CHATTTS_API_KEY`` and Triton's inference
key, ``CHATTTS_INFERENCE_KEY`` or the file ``CHATTTS_INFERENCE_KEY_FILE``, are read from the
environment only: a secret on a command line is visible to every local user)."""


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway reaches Triton and what it accepts.

    triton_url: Triton's gRPC endpoint, ``host:port``. api_key: required bearer token, or None
    for no authentication. triton_inference_key: the key Triton's inference needs (sent as
    ``triton-grpc-protocol-chattts-inference-key`` metadata), or None when Triton needs none.
    max_input_chars: longest ``input`` accepted, in characters (OpenAI:
    4096). stream_idle_timeout_s: a stream fails when Triton has sent nothing for this many
    seconds. stream_max_s: optional cap on a whole stream in seconds (None: none; the idle
    timeout alone ends a stalled stream, so the longest legal input is never cut). max_streams:
    streams relayed at once; one more is answered 503 at once. admission_watch: follow the
    server's admission watch (:class:`~chattts_serving.client.admission_watch.AdmissionWatch`) and
    answer 503 before reading a speech request while every stream slot of every server behind
    ``triton_url`` is taken (False: every request within ``max_streams`` goes to Triton; the
    gateway's own limit is decided before reading either way). retry_after_s: the Retry-After
    header of 503 answers, whole seconds. health_timeout_s: deadline of the readiness call to
    Triton, in seconds. cors_origins: origins browsers may call from ('*' for any); empty: no
    CORS. voices_file: the voices file ``GET /v1/audio/voices`` lists (None: built-in names
    only). models: accepted ``model`` values. voice_store: the SQLAlchemy URL of the saved
    voices (:mod:`.voice_store`; SQLite by default, PostgreSQL for replicas that share them).

    The WebSocket stream (``/v1/audio/speech/stream``): ws_idle_flush_s: an unfinished sentence
    is synthesised after no text arrived for this many seconds. ws_lookahead: sentences whose
    synthesis runs ahead of the one being sent (0: one at a time). ws_queue_chunks: audio chunks
    held per sentence; when full, the gateway stops reading that sentence's Triton stream.
    ws_send_timeout_s: a client that takes no audio for this many seconds is cut off (its
    syntheses cancelled, close 1008). ws_max_sentence_chars: longest sentence, characters.

    drain_timeout_s: at SIGTERM or SIGINT new requests are refused at once and the streams in
    flight run on for up to this many seconds; then the rest are ended with a retryable error
    (:mod:`.drain`). 0: end them at once.

    Raises ValueError for a value out of range.
    """

    triton_url: str = "127.0.0.1:8001"
    api_key: str | None = None
    triton_inference_key: str | None = None
    max_input_chars: int = 4096
    stream_idle_timeout_s: float = 90.0
    stream_max_s: float | None = None
    max_streams: int = 256
    admission_watch: bool = True
    retry_after_s: int = 1
    health_timeout_s: float = 2.0
    cors_origins: tuple[str, ...] = ()
    voices_file: Path | None = field(default_factory=default_voices_path)
    models: tuple[str, ...] = field(default=DEFAULT_MODELS)
    voice_store: str = field(default_factory=default_store_url)
    ws_idle_flush_s: float = 1.0
    ws_lookahead: int = 1
    ws_queue_chunks: int = 8
    ws_send_timeout_s: float = 30.0
    ws_max_sentence_chars: int = 400
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_input_chars < 1:
            raise ValueError(f"max_input_chars must be >= 1, got {self.max_input_chars}")
        for name in ("stream_idle_timeout_s", "health_timeout_s", "stream_max_s", "ws_idle_flush_s",
                     "ws_send_timeout_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {self.max_streams}")
        if self.ws_lookahead < 0 or self.ws_queue_chunks < 1 or self.ws_max_sentence_chars < 8:
            raise ValueError("ws_lookahead must be >= 0, ws_queue_chunks >= 1 and ws_max_sentence_chars >= 8")
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise ValueError(f"drain_timeout_s must be >= 0 seconds, got {self.drain_timeout_s}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        if not self.models:
            raise ValueError("at least one model name is needed")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
        """Settings from the environment (each :data:`OPTIONS` variable that is set, and
        ``$CHATTTS_API_KEY``), then ``overrides`` (field values as given, e.g. from flags).

        Raises ValueError naming the variable when one does not parse or is out of range.
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        key = env.get(ENV_API_KEY, "").strip()
        if key:
            values["api_key"] = key
        try:
            inference_key = inference_key_from_env(env)
        except (ValueError, OSError) as exc:
            raise ValueError(f"${INFERENCE_KEY_ENV}: {exc}") from None
        if inference_key:
            values["triton_inference_key"] = inference_key
        for opt in OPTIONS:
            text = env.get(opt.env, "")
            if not text.strip():
                continue
            try:
                values[opt.field] = opt.parse(text)
            except ValueError as exc:
                raise ValueError(f"${opt.env}={text!r}: {exc}") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
