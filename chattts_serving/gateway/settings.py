"""Gateway settings, parsed once (environment and command line)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

ENV_API_KEY: Final = "CHATTTS_API_KEY"
"""Environment variable holding the API key; unset or empty: no authentication."""
ENV_TRITON_URL: Final = "CHATTTS_TRITON_URL"
"""Environment variable with Triton's gRPC ``host:port`` (the ``--triton-url`` default)."""

DEFAULT_MODELS: Final = ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""Model names accepted in requests; all are served by ChatTTS (the OpenAI names are aliases
so that OpenAI clients work unchanged)."""


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway reaches Triton and what it accepts.

    triton_url: Triton's gRPC endpoint, ``host:port``. api_key: required bearer token, or None
    for no authentication. max_input_chars: longest ``input`` accepted, in characters (OpenAI:
    4096). stream_timeout_s: deadline of one synthesis stream, in seconds. max_streams:
    streams relayed at once (each holds a worker thread while it waits for audio); more wait.
    health_timeout_s: deadline of the readiness probe to Triton, in seconds. models: accepted
    ``model`` values.
    """

    triton_url: str = "127.0.0.1:8001"
    api_key: str | None = None
    max_input_chars: int = 4096
    stream_timeout_s: float = 300.0
    max_streams: int = 64
    health_timeout_s: float = 2.0
    models: tuple[str, ...] = field(default=DEFAULT_MODELS)

    def __post_init__(self) -> None:
        if self.max_input_chars < 1:
            raise ValueError(f"max_input_chars must be >= 1, got {self.max_input_chars}")
        if self.stream_timeout_s <= 0 or self.health_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {self.max_streams}")
        if not self.models:
            raise ValueError("at least one model name is needed")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
        """Settings with ``api_key`` from ``$CHATTTS_API_KEY`` and ``triton_url`` from
        ``$CHATTTS_TRITON_URL`` (when set), then ``overrides`` (None values ignored)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        key = env.get(ENV_API_KEY, "").strip()
        if key:
            values["api_key"] = key
        url = env.get(ENV_TRITON_URL, "").strip()
        if url:
            values["triton_url"] = url
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
