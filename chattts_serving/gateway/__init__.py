"""OpenAI-compatible speech gateway: ``POST /v1/audio/speech`` in front of Triton.

The gateway validates an OpenAI speech request, streams the synthesis from the ``chattts``
model over Triton's gRPC streaming API (:func:`chattts_serving.client.iter_chunks`), encodes
the audio chunks into the requested format as they arrive (:mod:`chattts_serving.audio.formats`)
and sends them as chunked bytes or as OpenAI's ``speech.audio.delta`` server-sent events.

Run it with ``python -m chattts_serving.gateway --triton-url 127.0.0.1:8001 --port 8080``.
"""

from .app import create_app
from .settings import GatewaySettings
from .speech import speed_to_token

__all__ = ["GatewaySettings", "create_app", "speed_to_token"]
