"""The gateway's routes, thin: each reads its request, calls a service and shapes the answer.

``speech`` (``POST /v1/audio/speech``, :mod:`..relay`), ``voices`` (the voices, saved ones
included, and ``/v1/models``), ``stream`` (the WebSocket, :mod:`..dialects`), ``health``
(readiness, liveness, Prometheus metrics) and ``page`` (the demo page at ``/``).
"""

from . import health, page, speech, stream, voices

ROUTERS = (speech.router, voices.router, stream.router, health.router, page.router)
"""Every router, in the order the application includes them."""
