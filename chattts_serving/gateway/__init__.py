"""OpenAI-compatible speech gateway in front of Triton: ``POST /v1/audio/speech``, the voices,
the WebSocket stream ``/v1/audio/speech/stream``, health, metrics and a demo page.

Shaped as routers, services and settings: :mod:`.routers` are thin routes; the services hold
the logic (:mod:`.relay` streams one speech response, its chunks encoded as they arrive by
:mod:`.speech`; :mod:`.dialects` serves the WebSocket in this gateway's dialect, :mod:`.ws`,
or vLLM-Omni's, :mod:`.omni_ws`, both on :mod:`.stream_core`; :mod:`.saved_voices` lists,
saves and resolves voices); :mod:`.settings` is one pydantic-settings model, each knob a flag
and an environment variable. Everything shares one :class:`~.state.GatewayState`: the Triton
client (:class:`~chattts_serving.client.AioStreamClient`, gRPC streaming), the metrics, the
drain and the one admission decision (:meth:`~.state.GatewayState.admit`).

Run it with ``python -m chattts_serving.gateway --triton-url 127.0.0.1:8001 --port 8080``.
"""

from .app import create_app
from .settings import GatewaySettings
from .speech import speed_to_token

__all__ = ["GatewaySettings", "create_app", "speed_to_token"]
