"""Locust load test of a running chattts-serving Triton server.

Four user classes, each a closed loop of whole utterances (weights 1:1:1:1; pick classes by
naming them on Locust's command line, e.g. ``GrpcStreamUser``; ``loadtest/run.sh`` runs the
gateway user only when ``CHATTTS_GATEWAY_PORT`` is set):

- ``GrpcStreamUser``: the decoupled ``chattts`` model over a gRPC stream. Reports two request
  types per stream: ``grpc:ttfa`` (send to first audio chunk) and ``grpc:total`` (send to the
  final response).
- ``SseStreamUser``: the same model over HTTP server-sent events
  (``/v2/models/chattts/generate_stream``): ``sse:ttfa`` and ``sse:total``.
- ``HttpOfflineUser``: ``chattts_offline`` over HTTP ``/infer`` (whole utterance, binary output):
  ``http:infer``.
- ``GatewaySpeechUser``: the OpenAI gateway's ``POST /v1/audio/speech`` (``response_format``
  pcm, streamed): ``gateway:ttfa`` (send to the first audio bytes) and ``gateway:total``.

Response lengths are audio bytes (float32 PCM: 4 bytes per sample at
``contract.SAMPLE_RATE_HZ``; 2 bytes for the gateway's 16-bit pcm). Chunks and audio seconds
per request type are counted and, at test stop, printed and written to
``$CHATTTS_AUDIO_SUMMARY`` (JSON) when that is set.

Environment: CHATTTS_HOST (127.0.0.1), CHATTTS_GRPC_PORT (8001), CHATTTS_HTTP_PORT (8000; the
HTTP users' host unless Locust's --host is given), CHATTTS_TEXT (one fixed text; default: cycle
through chattts_serving/export/sentences.txt), CHATTTS_MAX_NEW_TOKENS (100) and
CHATTTS_MIN_NEW_TOKENS (= max: a fixed budget per request), CHATTTS_VOICE (2),
CHATTTS_TIMEOUT_S (300, per request), CHATTTS_WAIT_S (0, pause between a user's requests),
CHATTTS_GATEWAY_PORT (8080: the gateway user's port on CHATTTS_HOST) and CHATTTS_API_KEY (the
gateway's bearer key, when it requires one).
"""

# gRPC must cooperate with gevent before anything imports it: without this a gRPC user never
# sends a request and Locust ignores -t and SIGTERM (seen with Locust's gevent workers).
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from locust import User, constant, events, task  # noqa: E402
from locust.contrib.fasthttp import FastHttpUser  # noqa: E402

from chattts_serving import contract  # noqa: E402
from chattts_serving.client.common import ClientError, SynthesisRequest  # noqa: E402
from chattts_serving.client.grpc_stream import iter_chunks  # noqa: E402
from chattts_serving.client.keys import http_headers, inference_key_from_env  # noqa: E402
from chattts_serving.client.sse import iter_events  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench import load_sentences  # noqa: E402

HOST = os.environ.get("CHATTTS_HOST", "127.0.0.1")
GRPC_PORT = int(os.environ.get("CHATTTS_GRPC_PORT", "8001"))
HTTP_PORT = int(os.environ.get("CHATTTS_HTTP_PORT", "8000"))
GATEWAY_PORT = int(os.environ.get("CHATTTS_GATEWAY_PORT") or "8080")
API_KEY = os.environ.get("CHATTTS_API_KEY", "").strip()
TRITON_HEADERS = http_headers(inference_key_from_env())
"""Triton's inference key header ($CHATTTS_INFERENCE_KEY or its file), when one is set; the gRPC
user's client library sends it by itself."""
MAX_NEW_TOKENS = int(os.environ.get("CHATTTS_MAX_NEW_TOKENS", "100"))
MIN_NEW_TOKENS = int(os.environ.get("CHATTTS_MIN_NEW_TOKENS", str(MAX_NEW_TOKENS)))
VOICE = os.environ.get("CHATTTS_VOICE", "2")
TIMEOUT_S = float(os.environ.get("CHATTTS_TIMEOUT_S", "300"))
WAIT_S = float(os.environ.get("CHATTTS_WAIT_S", "0"))
TEXTS = [os.environ["CHATTTS_TEXT"]] if os.environ.get("CHATTTS_TEXT") else load_sentences()
BYTES_PER_SAMPLE = 4
"""float32 PCM."""

_texts = itertools.cycle(enumerate(TEXTS))
_seq = itertools.count()
_lock = threading.Lock()
AUDIO: dict[str, dict[str, float]] = {}
"""Per reporting prefix ('grpc', 'sse', 'http', 'gateway'): requests, chunks, audio_s (seconds), ok."""


def next_request() -> SynthesisRequest:
    """The next request: texts cycle, every request gets its own sampler seed."""
    with _lock:
        _, text = next(_texts)
        seed = next(_seq)
    return SynthesisRequest(text, voice=VOICE, seed=seed, max_new_tokens=MAX_NEW_TOKENS,
                            min_new_tokens=MIN_NEW_TOKENS)


def count_audio(kind: str, chunks: int, samples: int) -> None:
    """Add one finished request's chunks and samples to :data:`AUDIO`."""
    with _lock:
        a = AUDIO.setdefault(kind, {"requests": 0, "chunks": 0, "audio_s": 0.0})
        a["requests"] += 1
        a["chunks"] += chunks
        a["audio_s"] += samples / contract.SAMPLE_RATE_HZ


@events.test_stop.add_listener
def _write_audio_summary(environment: Any, **_kw: Any) -> None:
    with _lock:
        summary = {k: dict(v) for k, v in AUDIO.items()}
    print("chattts audio: " + json.dumps(summary), flush=True)
    path = os.environ.get("CHATTTS_AUDIO_SUMMARY")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"sample_rate_hz": contract.SAMPLE_RATE_HZ, "per_type": summary},
                                         indent=1) + "\n")


class GrpcStreamUser(User):
    """Streams ``contract.MODEL_STREAM`` over gRPC; reports ``grpc:ttfa`` and ``grpc:total``."""

    wait_time = constant(WAIT_S)
    weight = 1

    def _fire(self, request_type: str, t_ms: float, length: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(request_type=request_type, name=contract.MODEL_STREAM,
                                             response_time=t_ms, response_length=length, exception=exc,
                                             context={})

    @task
    def stream(self) -> None:
        req = next_request()
        chunks = samples = 0
        t0 = time.perf_counter()
        try:
            for chunk in iter_chunks(f"{HOST}:{GRPC_PORT}", req, timeout_s=TIMEOUT_S):
                if chunks == 0:
                    self._fire("grpc:ttfa", (time.perf_counter() - t0) * 1e3, chunk.size * BYTES_PER_SAMPLE, None)
                chunks += 1
                samples += chunk.size
        except ClientError as exc:
            self._fire("grpc:total", (time.perf_counter() - t0) * 1e3, samples * BYTES_PER_SAMPLE, exc)
            return
        err = None if chunks else ClientError("stream ended without audio")
        self._fire("grpc:total", (time.perf_counter() - t0) * 1e3, samples * BYTES_PER_SAMPLE, err)
        count_audio("grpc", chunks, samples)


class _HttpUser(FastHttpUser):
    """Shared settings of the HTTP users (closed loop, timeouts) and their streamed POST."""

    abstract = True
    wait_time = constant(WAIT_S)
    weight = 1
    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    def _stream(self, url: str, kind: str, name: str, audio_bytes: Callable[[Iterator[bytes]], Iterator[int]],
                bytes_per_sample: int, **kwargs: Any) -> None:
        """POST ``url`` and read the body as it streams; ``audio_bytes`` turns the raw body into
        the audio bytes of each chunk (raising ClientError for an error inside the stream).
        Reports ``<kind>:ttfa`` at the first audio and ``<kind>:total`` at the end."""
        chunks = received = 0
        t0 = time.perf_counter()
        with self.client.request("POST", url, stream=True, catch_response=True, **kwargs) as resp:
            resp.request_meta["request_type"] = f"{kind}:total"
            resp.request_meta["name"] = name
            try:
                if resp.status_code != 200:
                    resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                    return
                for n in audio_bytes(resp.iter_content(chunk_size=1 << 16, decode_content=False)):
                    if chunks == 0:
                        self.environment.events.request.fire(
                            request_type=f"{kind}:ttfa", name=name, response_time=(time.perf_counter() - t0) * 1e3,
                            response_length=n, exception=None, context={})
                    chunks += 1
                    received += n
                if not received:
                    resp.failure("stream ended without audio")
                    return
                resp.success()
                count_audio(kind, chunks, received // bytes_per_sample)
            except (ClientError, OSError) as exc:  # an error event, or a stream cut after it started
                resp.failure(f"stream failed: {exc}")
            finally:
                resp.request_meta["response_time"] = (time.perf_counter() - t0) * 1e3
                resp.request_meta["response_length"] = received


class _TritonHttpUser(_HttpUser):
    """The HTTP users of Triton's HTTP endpoint."""

    abstract = True
    host = f"http://{HOST}:{HTTP_PORT}"


def _sse_audio_bytes(raw: Iterator[bytes]) -> Iterator[int]:
    """Audio bytes (float32) of each ``generate_stream`` event; an ``error`` event raises."""
    for event in iter_events(raw):
        if "error" in event:
            raise ClientError(f"stream error: {event['error']}")
        audio = event.get(contract.OUT_AUDIO.name)
        if isinstance(audio, list) and audio:
            yield len(audio) * BYTES_PER_SAMPLE


class SseStreamUser(_TritonHttpUser):
    """Streams ``contract.MODEL_STREAM`` over HTTP SSE; reports ``sse:ttfa`` and ``sse:total``."""

    @task
    def stream(self) -> None:
        self._stream(f"/v2/models/{contract.MODEL_STREAM}/generate_stream", "sse", contract.MODEL_STREAM,
                     _sse_audio_bytes, BYTES_PER_SAMPLE, json=next_request().json_inputs(),
                     headers={"Accept": "text/event-stream", **TRITON_HEADERS})


class HttpOfflineUser(_TritonHttpUser):
    """Whole utterances from ``contract.MODEL_OFFLINE`` over HTTP ``/infer``; reports ``http:infer``."""

    @task
    def infer(self) -> None:
        req = next_request()
        body = {"inputs": [{"name": name, "shape": list(arr.shape), "datatype": dtype,
                            "data": [v.decode("utf-8") if isinstance(v, bytes) else v.item() for v in arr]}
                           for name, arr, dtype in req.tensors()],
                "outputs": [{"name": contract.OUT_AUDIO.name, "parameters": {"binary_data": True}}]}
        with self.client.request("POST", f"/v2/models/{contract.MODEL_OFFLINE}/infer", json=body,
                                 headers=TRITON_HEADERS, catch_response=True) as resp:
            resp.request_meta["request_type"] = "http:infer"
            resp.request_meta["name"] = contract.MODEL_OFFLINE
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            content = resp.content or b""
            header_len = resp.headers.get("Inference-Header-Content-Length") \
                or resp.headers.get("inference-header-content-length")
            if header_len is None:
                resp.failure("response has no binary audio (Inference-Header-Content-Length missing)")
                return
            samples = (len(content) - int(header_len)) // BYTES_PER_SAMPLE
            if samples <= 0:
                resp.failure("response holds no audio")
                return
            resp.success()
            count_audio("http", 1, samples)


class GatewaySpeechUser(_HttpUser):
    """Streams ``POST /v1/audio/speech`` through the OpenAI gateway (16-bit pcm); reports
    ``gateway:ttfa`` and ``gateway:total``."""

    PATH = "/v1/audio/speech"
    URL = f"http://{HOST}:{GATEWAY_PORT}{PATH}"
    """Absolute: Locust's --host (Triton's HTTP endpoint in run.sh) replaces every user's host."""
    PCM_BYTES_PER_SAMPLE = 2

    @task
    def speech(self) -> None:
        req = next_request()
        body = {"model": "tts-1", "input": req.text, "voice": VOICE, "response_format": "pcm", "seed": req.seed,
                "max_new_tokens": MAX_NEW_TOKENS, "min_new_tokens": MIN_NEW_TOKENS}
        headers = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
        self._stream(self.URL, "gateway", self.PATH, lambda raw: (len(data) for data in raw if data),
                     self.PCM_BYTES_PER_SAMPLE, json=body, headers=headers)
