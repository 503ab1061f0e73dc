"""The gateway's Prometheus metrics (``GET /metrics``), one registry per application.

| metric | type | labels | meaning |
|---|---|---|---|
| ``tts_gateway_requests_total`` | counter | ``status`` ok, error, cancelled | speech requests finished |
| ``tts_gateway_errors_total`` | counter | ``kind``, ``phase`` | errors by kind (below) |
| ``tts_gateway_time_to_first_audio_seconds`` | histogram | | request received to first encoded audio bytes ready |
| ``tts_gateway_request_duration_seconds`` | histogram | | request received to end of a successful stream |
| ``tts_gateway_audio_seconds_total`` | counter | | seconds of audio relayed |
| ``tts_gateway_streams_in_flight`` | gauge | | speech streams being relayed now |
| ``tts_gateway_degraded_requests_total`` | counter | ``door`` speech, ws | responses made degraded (ws: sentences) |

``kind`` is an :class:`~chattts_serving.errors.ErrorKind` value (401 and 404 count as
``invalid``, an unreachable Triton as ``unavailable``); ``phase`` is ``before_audio`` (answered
with the kind's HTTP status) or ``mid_stream`` (a stream cut after its audio had started). A
client that disconnects is ``status="cancelled"`` and no error.
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..contract import LATENCY_BUCKETS_S
from ..errors import ErrorKind

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
"""Media type of :meth:`GatewayMetrics.render` (Prometheus text format)."""

Phase = Literal["before_audio", "mid_stream"]
DOORS: Final = ("speech", "ws")
"""The gateway's doors, as the ``door`` label names them: ``POST /v1/audio/speech`` and the
WebSocket ``/v1/audio/speech/stream``."""


class GatewayMetrics:
    """The gateway's metric families in their own registry (so that several applications in
    one process, as in the tests, never collide). Every error kind is pre-created at 0, so a
    rate over it exists before the first error."""

    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: nothing here reads them (process-wide switch)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tts_gateway_requests", "Speech requests finished, by status (ok, error, cancelled).",
                                ["status"], registry=r)
        self.errors = Counter("tts_gateway_errors", "Speech request errors by kind (chattts_serving.errors."
                              "ErrorKind) and phase (before_audio: answered with its HTTP status; mid_stream: "
                              "cut after audio started).", ["kind", "phase"], registry=r)
        self.ttfa = Histogram("tts_gateway_time_to_first_audio_seconds", "Request received to first encoded "
                              "audio bytes ready to send, seconds.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.duration = Histogram("tts_gateway_request_duration_seconds", "Request received to end of a "
                                  "successful stream, seconds.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.audio = Counter("tts_gateway_audio_seconds", "Seconds of audio relayed to clients.", registry=r)
        self.in_flight = Gauge("tts_gateway_streams_in_flight", "Speech streams being relayed now.", registry=r)
        self.ws_sentence_first_audio = Histogram(
            "tts_gateway_ws_sentence_first_audio_seconds", "WebSocket stream: a sentence complete in the text "
            "received to its first audio frame sent, seconds.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.degraded = Counter("tts_gateway_degraded_requests", "Responses the server made in its degraded mode "
                                "(X-Degraded on speech, degraded: true on WebSocket sentences), by door (speech, ws; "
                                "a WebSocket counts each sentence).", ["door"], registry=r)
        for door in DOORS:
            self.degraded.labels(door=door)
        for status in ("ok", "error", "cancelled"):
            self.requests.labels(status=status)
        for kind in ErrorKind:
            for phase in ("before_audio", "mid_stream"):
                self.errors.labels(kind=kind.value, phase=phase)

    def error(self, kind: ErrorKind, phase: Phase) -> None:
        """Count one failed request of ``kind``."""
        self.requests.labels(status="error").inc()
        self.errors.labels(kind=ErrorKind(kind).value, phase=phase).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)
