"""Streaming client over HTTP server-sent events: ``POST /v2/models/<model>/generate_stream`` (``chattts``,
or the ensemble door ``chattts_ensemble``).

The request body is a JSON object keyed by input name; the server answers with
``data: {json}`` events, each holding one audio chunk as a JSON number array, or an
``"error"`` key. The transport is httpx and the event parser httpx-sse (``EventSource``):
linear in the stream's length, with no limit on an event's size (a 30 s chunk is one line of
several MB; ``requests.Response.iter_lines`` rescans long lines and is quadratic in their
length). httpx2 carries the same parser but needs Python 3.11; the GPU image has 3.10.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import httpx
import numpy as np
from httpx_sse import EventSource

from .. import contract
from .common import (
    LOST_CONNECTION,
    TIMEOUT,
    ChunkOrder,
    ClientError,
    StreamPart,
    SynthesisRequest,
    SynthesisResult,
    audio_only,
    collect_stream,
    parse_info,
)
from .keys import http_headers, key_error, resolve_key

DEFAULT_TIMEOUT_S = 300.0
"""Default deadline of a whole stream, in seconds."""
_EVENT_STREAM = "text/event-stream"


def _json_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of the events of ``response`` (an event stream) that carry data; raises
    ClientError on data that is not a JSON object, httpx_sse.SSEError (an httpx.HTTPError) when
    the response is not an event stream."""
    for event in EventSource(response).iter_sse():
        if not event.data:
            continue
        try:
            obj = json.loads(event.data)
        except ValueError:
            raise ClientError(f"malformed server-sent event: {event.data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ClientError(f"server-sent event is not a JSON object: {event.data[:200]!r}")
        yield obj


def iter_events(byte_chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Parse a server-sent-event byte stream (read elsewhere, e.g. by a load-test client) into
    the JSON objects of its ``data:`` fields, with httpx-sse's parser: comments, ``event:`` and
    ``id:`` lines are skipped, an event's data lines are joined with newlines, events of any
    size are accepted. Raises :class:`ClientError` on data that is not a JSON object."""
    response = httpx.Response(200, headers={"content-type": _EVENT_STREAM}, content=iter(byte_chunks),
                              request=httpx.Request("GET", "http://sse.invalid/"))
    yield from _json_events(response)


def _root_cause(exc: BaseException) -> str:
    """The innermost OS-level reason of a transport error ("Connection refused"), else str(exc)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        todo.extend(x for x in (e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException))
    return str(exc) or type(exc).__name__


def _error_message(resp: httpx.Response) -> str:
    """The server's message from a non-200 answer: a JSON ``{"error": ...}`` body, or the same
    as one ``data:`` event (what ``generate_stream`` sends when the first response fails)."""
    raw = resp.read()
    body: Any = None
    try:
        body = json.loads(raw)
    except ValueError:
        try:
            body = next(iter_events([raw]), None)
        except ClientError:
            body = None
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return raw.decode("utf-8", "replace").strip() or resp.reason_phrase or f"HTTP {resp.status_code}"


def iter_sse_chunks(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
                    model: str = contract.MODEL_STREAM, inference_key: str | None = None
                    ) -> Generator[np.ndarray, None, None]:
    """Stream ``request`` to ``model`` (``chattts`` or ``chattts_ensemble``) at ``url``
    (``host:port`` of Triton's HTTP endpoint) and yield each audio chunk: (n,) float32 mono at
    ``contract.SAMPLE_RATE_HZ``. Closing the generator closes the connection, which cancels
    the request on the server. Raises :class:`ClientError` as :func:`iter_sse_parts` does."""
    yield from audio_only(iter_sse_parts(url, request, timeout_s, model, inference_key))


def iter_sse_parts(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
                   model: str = contract.MODEL_STREAM, inference_key: str | None = None
                   ) -> Generator[StreamPart, None, None]:
    """Like :func:`iter_sse_chunks`, but yield every event as a :class:`StreamPart` (audio,
    possibly empty, and the ``info`` JSON object on the first audio event and the last), in
    stream order (the ensemble's events by their ``chunk_index``: :class:`ChunkOrder`).

    Raises :class:`ClientError`: with the HTTP status and the server's message when the
    request is refused, or the event's message (status None) when the stream ends with an
    ``"error"`` event; with ``connection=True`` when the server cannot be reached or the
    connection drops mid-stream (a server that died or restarts: retry); status
    ``"timeout"`` when the stream does not finish within ``timeout_s`` seconds, or an
    ensemble chunk is missing; "inference key required" (status 403) when the server refuses
    the inference key (``inference_key``, default the configured one: :func:`.keys.resolve_key`).
    """
    key = resolve_key(inference_key)
    endpoint = f"http://{url}/v2/models/{model}/generate_stream"
    order = ChunkOrder()
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = dict(request.json_inputs())
    if request.request_id:
        body["id"] = request.request_id
    try:
        with httpx.stream("POST", endpoint, json=body, headers={"Accept": _EVENT_STREAM, **http_headers(key)},
                          timeout=httpx.Timeout(timeout_s)) as resp:
            if resp.status_code != 200:
                message = _error_message(resp)
                raise key_error(message, url, bool(key), grpc=False) or ClientError(message, resp.status_code)
            for event in _json_events(resp):
                if "error" in event:  # the stream began (HTTP 200) and then failed: no status
                    raise ClientError(str(event["error"]))
                audio = event.get(contract.OUT_AUDIO.name)
                info = event.get(contract.OUT_INFO.name)
                index = event.get(contract.OUT_CHUNK_INDEX.name)
                part = StreamPart(np.asarray(audio if audio is not None else [], dtype=np.float32).reshape(-1),
                                  parse_info(info[0] if isinstance(info, list) else info)
                                  if info is not None else None,
                                  int(np.reshape(index, -1)[0]) if index is not None else None)
                for p in order.add(part):
                    if p.audio.size or p.info:
                        yield p
                if time.monotonic() > deadline:
                    raise ClientError(f"stream from {url} did not finish within {timeout_s:g} s", TIMEOUT)
            order.check_complete()
    except httpx.ConnectError as exc:
        raise ClientError(f"cannot connect to {url}: {_root_cause(exc)}", connection=True) from None
    except httpx.TimeoutException:
        raise ClientError(f"no data from {url} for {timeout_s:g} s", TIMEOUT) from None
    except (httpx.ReadError, httpx.RemoteProtocolError) as exc:  # the server went away mid-stream
        raise ClientError(f"{LOST_CONNECTION} {url} during the stream: {_root_cause(exc)}",
                          connection=True) from None
    except httpx.HTTPError as exc:  # other transport failures, and an answer that is not an event stream
        raise ClientError(f"stream from {url} failed: {_root_cause(exc)}") from None


def synthesize_sse(url: str, request: SynthesisRequest, timeout_s: float = DEFAULT_TIMEOUT_S,
                   model: str = contract.MODEL_STREAM, inference_key: str | None = None) -> SynthesisResult:
    """Run one streamed synthesis over SSE and collect it.

    ``ttfa_s`` is the time from sending to the first non-empty chunk, ``total_s`` to the end
    of the event stream (``time.perf_counter`` seconds). Raises :class:`ClientError` as
    :func:`iter_sse_chunks` does.
    """
    t0 = time.perf_counter()
    return collect_stream(iter_sse_parts(url, request, timeout_s=timeout_s, model=model,
                                         inference_key=inference_key), t0)
