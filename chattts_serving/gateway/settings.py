"""Gateway settings, parsed once and typed: :class:`GatewaySettings`, a pydantic-settings model.

Each knob is a field with its environment variable (:class:`Env`) and, unless it is a secret,
a command-line flag named after it (``stream_max_s``: ``--stream-max-s``); :data:`OPTIONS` lists
them for ``__main__`` and the docs. A value given as text (a variable, a flag) is parsed by the
field's own validator, so a variable and a flag mean the same thing; the flag wins.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

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


@dataclass(frozen=True)
class Env:
    """A field's environment variable, and whether it has a command-line flag too (a secret
    has none: a command line is visible to every local user)."""

    name: str
    flag: bool = True


@dataclass(frozen=True)
class Option:
    """One knob as the command line and the docs show it: its field, flag, variable and help."""

    field: str
    flag: str
    env: str
    help: str


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


_LEAST: Final = {"max_input_chars": 1, "max_streams": 1, "ws_queue_chunks": 1, "ws_lookahead": 0, "retry_after_s": 0,
                  "ws_max_sentence_chars": 8, "max_body_bytes": 65536}
"""The least value of each whole-number knob (a sentence needs room for a few words; a body
room for a text of the longest input)."""

_ENVIRONMENT: ContextVar[Mapping[str, str] | None] = ContextVar("gateway_settings_environment", default=None)
"""The environment :meth:`GatewaySettings.from_env` reads (None: settings built from values
alone read none)."""


class _Environment(PydanticBaseSettingsSource):
    """Each knob's variable from a mapping, as text (blank: unset), and the two keys: the API
    key (stripped; empty: none) and Triton's inference key
    (:func:`~chattts_serving.client.keys.inference_key_from_env`)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        var = variable(field)
        text = self.env.get(var, "") if var is not None else ""
        return (text if text.strip() else None), field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            if name == "triton_inference_key":
                try:
                    key = inference_key_from_env(self.env)
                except (ValueError, OSError) as exc:
                    raise ValueError(f"${INFERENCE_KEY_ENV}: {exc}") from None
                if key:
                    values[name] = key
                continue
            text, _, _ = self.get_field_value(field, name)
            if text is not None:
                values[name] = text.strip() if name == "api_key" else text
        return values


class GatewaySettings(BaseSettings):
    """How the gateway reaches Triton and what it accepts (each field's description says what
    it sets; the WebSocket stream's knobs start with ``ws_``).

    Built from values (``GatewaySettings(triton_url=...)``) it reads no environment but the
    defaults' own (``$CHATTTS_VOICES``, ``$CHATTTS_VOICE_STORE``); :meth:`from_env` reads every
    knob's variable. ``api_key``: required bearer token, or None for no authentication
    (``$CHATTTS_API_KEY`` only). ``triton_inference_key``: the key Triton's inference needs
    (sent as ``triton-grpc-protocol-chattts-inference-key`` metadata), or None
    (``$CHATTTS_INFERENCE_KEY`` or the file ``$CHATTTS_INFERENCE_KEY_FILE`` only).
    ``models``: accepted ``model`` values. ``admission_watch`` False: every speech request
    within ``max_streams`` goes to Triton (the gateway's own limit is decided before reading
    either way, :mod:`.state`).

    Raises ValueError (pydantic's ValidationError) for a value that does not parse or is out of range.
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    triton_url: Annotated[str, Env(ENV_TRITON_URL)] = Field(
        "127.0.0.1:8001", description="Triton gRPC host:port (127.0.0.1:8001)")
    max_input_chars: Annotated[int, Env("CHATTTS_GATEWAY_MAX_INPUT_CHARS")] = Field(
        4096, description="longest input in characters, control tokens not counted (4096, OpenAI's limit)")
    stream_idle_timeout_s: Annotated[float, Env("CHATTTS_GATEWAY_STREAM_IDLE_TIMEOUT_S")] = Field(
        90.0, description="a stream fails when no chunk has come from Triton for this long, s (90)")
    stream_max_s: Annotated[float | None, Env("CHATTTS_GATEWAY_STREAM_MAX_S")] = Field(
        None, description="optional cap on a whole stream, s; 0 or none: no cap (default: none)")
    send_timeout_s: Annotated[float, Env("CHATTTS_GATEWAY_SEND_TIMEOUT_S")] = Field(
        30.0, description="HTTP speech: a client that takes no audio for this long is cut off and its synthesis "
        "cancelled, s (30)")
    max_body_bytes: Annotated[int, Env("CHATTTS_GATEWAY_MAX_BODY_BYTES")] = Field(
        32 * 1024 * 1024, description="largest request body, bytes; beyond it 413 before it is read whole (32 MiB: a "
        "16 MiB recording in base64 and the text)")
    max_streams: Annotated[int, Env("CHATTTS_GATEWAY_MAX_STREAMS")] = Field(
        256, description="streams relayed at once; beyond it: 503 server busy at once (256)")
    admission_watch: Annotated[bool, Env("CHATTTS_GATEWAY_ADMISSION_WATCH")] = Field(
        True, description="follow Triton's admission watch and answer 503 server busy without calling Triton while "
        "every stream slot is taken (true)")
    retry_after_s: Annotated[int, Env("CHATTTS_GATEWAY_RETRY_AFTER_S")] = Field(
        1, description="Retry-After of 503 answers (busy, unavailable, deadline), whole seconds (1)")
    health_timeout_s: Annotated[float, Env("CHATTTS_GATEWAY_HEALTH_TIMEOUT_S")] = Field(
        2.0, description="deadline of /health's readiness call to Triton, s (2)")
    cors_origins: Annotated[tuple[str, ...], Env("CHATTTS_GATEWAY_CORS_ORIGINS")] = Field(
        (), description="comma-separated browser origins allowed to call the API, or '*' (default: none, CORS off)")
    voices_file: Annotated[Path | None, Env(ENV_VOICES)] = Field(
        default_factory=default_voices_path, description="voices file listed by /v1/audio/voices: the server's "
        "(default: $CHATTTS_VOICES, else voices/voices.toml)")
    voice_store: Annotated[str, Env(ENV_VOICE_STORE)] = Field(
        default_factory=default_store_url, description="SQLAlchemy URL of the saved voices (POST /v1/audio/voices): "
        "sqlite:///path or postgresql+psycopg://user:password@host/db (default: a SQLite file in "
        "~/.local/share/chattts-serving)")
    ws_idle_flush_s: Annotated[float, Env("CHATTTS_GATEWAY_WS_IDLE_FLUSH_S")] = Field(
        1.0, description="WebSocket stream: an unfinished sentence is spoken after no text came for this long, s (1)")
    ws_lookahead: Annotated[int, Env("CHATTTS_GATEWAY_WS_LOOKAHEAD")] = Field(
        1, description="WebSocket stream: sentences synthesised ahead of the one being sent (1)")
    ws_queue_chunks: Annotated[int, Env("CHATTTS_GATEWAY_WS_QUEUE_CHUNKS")] = Field(
        8, description="WebSocket stream: audio chunks held per sentence before reading from Triton pauses (8)")
    ws_send_timeout_s: Annotated[float, Env("CHATTTS_GATEWAY_WS_SEND_TIMEOUT_S")] = Field(
        30.0, description="WebSocket stream: a client that takes no audio for this long is cut off (1008), s (30)")
    ws_max_sentence_chars: Annotated[int, Env("CHATTTS_GATEWAY_WS_MAX_SENTENCE_CHARS")] = Field(
        400, description="WebSocket stream: a sentence longer than this is cut at its last pause, characters (400)")
    drain_timeout_s: Annotated[float, Env("CHATTTS_GATEWAY_DRAIN_TIMEOUT_S")] = Field(
        30.0, description="at SIGTERM/SIGINT, streams in flight may run this long before they are ended, s; 0: end "
        "them at once (30)")
    api_key: Annotated[str | None, Env(ENV_API_KEY, flag=False)] = None
    triton_inference_key: Annotated[str | None, Env(INFERENCE_KEY_ENV, flag=False)] = None
    models: tuple[str, ...] = DEFAULT_MODELS

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The values given win over the environment of :meth:`from_env`; no other source."""
        env = _ENVIRONMENT.get()
        return (init_settings,) if env is None else (init_settings, _Environment(settings_cls, env))

    # --- text forms (a variable, a flag) -------------------------------------------------------

    @field_validator("triton_url", "voice_store", mode="before")
    @classmethod
    def _stripped(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("stream_max_s", mode="before")
    @classmethod
    def _no_cap(cls, value: Any) -> Any:
        return _optional_seconds(value) if isinstance(value, str) else value

    @field_validator("admission_watch", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        return _switch(value) if isinstance(value, str) else value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origin_list(cls, value: Any) -> Any:
        return _origins(value) if isinstance(value, str) else value

    # --- ranges --------------------------------------------------------------------------------

    @field_validator("stream_idle_timeout_s", "health_timeout_s", "stream_max_s", "ws_idle_flush_s",
                     "ws_send_timeout_s", "send_timeout_s")
    @classmethod
    def _seconds(cls, value: float | None, info: Any) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{info.field_name} must be > 0 seconds, got {value}")
        return value

    @field_validator(*_LEAST)
    @classmethod
    def _at_least(cls, value: int, info: Any) -> int:
        if value < _LEAST[info.field_name]:
            raise ValueError(f"{info.field_name} must be >= {_LEAST[info.field_name]}, got {value}")
        return value

    @field_validator("drain_timeout_s")
    @classmethod
    def _drain(cls, value: float) -> float:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"drain_timeout_s must be >= 0 seconds, got {value}")
        return value

    @field_validator("models")
    @classmethod
    def _some_model(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one model name is needed")
        return value

    # --- building ------------------------------------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
        """Settings from the environment (``env``, default ``os.environ``: each knob's variable
        that is set, and the keys), then ``overrides`` (field values, e.g. from flags).

        Raises ValueError naming the variable when one does not parse or is out of range.
        """
        return cls.load(env, {}, **overrides)

    @classmethod
    def load(cls, env: Mapping[str, str] | None, flags: Mapping[str, str], **overrides: object) -> GatewaySettings:
        """:meth:`from_env` with ``flags`` (field -> the flag's text) between the environment
        and ``overrides``. Raises ValueError naming the flag or variable whose text is wrong."""
        token = _ENVIRONMENT.set(os.environ if env is None else env)
        try:
            return cls(**{**flags, **overrides})  # type: ignore[arg-type]
        except ValidationError as exc:
            raise _named(exc, _ENVIRONMENT.get() or {}, flags, overrides) from None
        finally:
            _ENVIRONMENT.reset(token)


def variable(field: FieldInfo) -> str | None:
    """A field's environment variable (its :class:`Env`), None for one without."""
    return next((m.name for m in field.metadata if isinstance(m, Env)), None)


def _options() -> Iterator[Option]:
    for name, field in GatewaySettings.model_fields.items():
        env = next((m for m in field.metadata if isinstance(m, Env)), None)
        if env is not None and env.flag:
            yield Option(name, "--" + name.replace("_", "-"), env.name, field.description or "")


OPTIONS: Final = tuple(_options())
"""Every knob with a flag, in the order ``--help`` lists them (``CHATTTS_API_KEY`` and Triton's
inference key, ``CHATTTS_INFERENCE_KEY`` or the file ``CHATTTS_INFERENCE_KEY_FILE``, are read
from the environment only: a secret on a command line is visible to every local user)."""


def _named(exc: ValidationError, env: Mapping[str, str], flags: Mapping[str, str],
           overrides: Mapping[str, object]) -> ValueError:
    """``exc`` as one ValueError whose message starts with where the wrong text came from:
    ``--max-streams 'x': ...`` or ``$CHATTTS_GATEWAY_MAX_STREAMS='x': ...`` (a value given
    as such keeps pydantic's message)."""
    problem = exc.errors()[0]
    name = str(problem["loc"][0]) if problem.get("loc") else ""
    field = GatewaySettings.model_fields.get(name)
    error = (problem.get("ctx") or {}).get("error")
    message = str(error) if error is not None else str(problem.get("msg", "invalid"))
    if name in overrides or field is None:
        return ValueError(str(exc))
    if name in flags:
        return ValueError(f"--{name.replace('_', '-')} {flags[name]!r}: {message}")
    var = variable(field)
    return ValueError(f"${var}={env.get(var or '', '')!r}: {message}")
