"""Streaming client over HTTP server-sent events: ``POST /v2/models/<MODEL_STREAM>/generate_stream``.

The request body is a JSON object keyed by input name; the server answers with
``data: {json}`` events, each holding one audio chunk as a JSON number array, or an
``"error"`` key. Events are parsed from a single growing buffer scanned once, because
``requests.Response.iter_lines`` rescans long lines and is quadratic in their length.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import requests
import urllib3

from .. import contract
from .common import (
    TIMEOUT,
    ClientError,
    StreamPart,
    SynthesisRequest,
    SynthesisResult,
    audio_only,
    collect_stream,
    parse_info,
)

DEFAULT_TIMEOUT_S = 300.0
"""Default deadline of a whole stream, in seconds."""
READ_BYTES = 1 << 16
"""Bytes read from the socket at a time."""


def iter_events(byte_chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """Parse a server-sent-event byte stream into the JSON objects of its ``data:`` fields.

    Linear in the stream's length: the buffer is scanned for the blank line that ends an
    event from where the previous scan stopped, and consumed once per read. Lines other than
    ``data:`` (comments, ``event:``, ``id:``) are ignored; an event's data lines are joined
    with newlines as the SSE specification says. Raises :class:`ClientError` on data that is
    not a JSON object.
    """
    buf = bytearray()
    scan = 0
    for piece in byte_chunks:
        if not piece:
            continue
        buf += piece
        start = 0
        while True:
            end, sep = _event_end(buf, max(start, scan - 3))
            if end < 0:
                break
            event = _parse_event(bytes(buf[start:end]))
            start = end + sep
            if event is not None:
                yield event
        if start:
            del buf[:start]
        scan = len(buf)
    tail = _parse_event(bytes(buf)) if buf.strip() else None
    if tail is not None:
        yield tail


def _event_end(buf: bytearray, since: int) -> tuple[int, int]:
    """(index where the first event ending at or after ``since`` ends, separator length), or (-1, 0)."""
    best, sep_len = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buf.find(sep, since)
        if i >= 0 and (best < 0 or i < best):
            best, sep_len = i, len(sep)
    return best, sep_len


def _parse_event(raw: bytes) -> dict[str, Any] | None:
    data = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    if not data:
        return None
    text = b"\n".join(data)
    try:
        obj = json.loads(text)
    except ValueError:
        raise ClientError(f"malformed server-sent event: {text[:200]!r}") from None
    if not isinstance(obj, dict):
        raise ClientError(f"server-sent event is not a JSON object: {text[:200]!r}")
    return obj


def _root_cause(exc: BaseException) -> str:
    """The innermost OS-level reason of a requests/urllib3 error ("Connection refused"), else str(exc)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args)
                    if isinstance(x, BaseException))
    return str(exc)


def _error_message(resp: requests.Response) -> str:
    """The server's message from a non-200 answer: a JSON ``{"error": ...}`` body, or the same
    as one ``data:`` event (what ``generate_stream`` sends when the first response fails)."""
    raw = resp.content
    body: Any = None
    try:
        body = json.loads(raw)
    except ValueError:
        try:
            body = next(iter_events(iter([raw])), None)
        except ClientError:
            body = None
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return raw.decode("utf-8", "replace").strip() or resp.reason or f"HTTP {resp.status_code}"


def iter_sse_chunks(url: str, request: SynthesisRequest,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> Generator[np.ndarray, None, None]:
    """Stream ``request`` to ``contract.MODEL_STREAM`` at ``url`` (``host:port`` of Triton's
    HTTP endpoint) and yield each audio chunk: (n,) float32 mono at
    ``contract.SAMPLE_RATE_HZ``. Closing the generator closes the connection, which cancels
    the request on the server. Raises :class:`ClientError` as :func:`iter_sse_parts` does."""
    yield from audio_only(iter_sse_parts(url, request, timeout_s))


def iter_sse_parts(url: str, request: SynthesisRequest,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> Generator[StreamPart, None, None]:
    """Like :func:`iter_sse_chunks`, but yield every event as a :class:`StreamPart` (audio,
    possibly empty, and the ``info`` JSON object on the first audio event and the last).

    Raises :class:`ClientError`: with the HTTP status and the server's message when the
    request is refused, or the event's message (status None) when the stream ends with an
    ``"error"`` event; with ``connection=True`` when the server cannot be reached; status
    ``"timeout"`` when the stream does not finish within ``timeout_s`` seconds.
    """
    endpoint = f"http://{url}/v2/models/{contract.MODEL_STREAM}/generate_stream"
    deadline = time.monotonic() + timeout_s
    try:
        body: dict[str, Any] = dict(request.json_inputs())
        if request.request_id:
            body["id"] = request.request_id
        resp = requests.post(endpoint, json=body, stream=True,
                             headers={"Accept": "text/event-stream"}, timeout=(timeout_s, timeout_s))
    except requests.ConnectionError as exc:
        raise ClientError(f"cannot connect to {url}: {_root_cause(exc)}", connection=True) from None
    except requests.Timeout:
        raise ClientError(f"no response from {url} within {timeout_s:g} s", TIMEOUT) from None
    except requests.RequestException as exc:
        raise ClientError(f"request to {endpoint} failed: {exc}") from None
    with resp:
        if resp.status_code != 200:
            raise ClientError(_error_message(resp), resp.status_code)
        try:
            for event in iter_events(resp.raw.stream(READ_BYTES, decode_content=True)):
                if "error" in event:  # the stream began (HTTP 200) and then failed: no status
                    raise ClientError(str(event["error"]))
                audio = event.get(contract.OUT_AUDIO.name)
                info = event.get(contract.OUT_INFO.name)
                part = StreamPart(np.asarray(audio if audio is not None else [], dtype=np.float32).reshape(-1),
                                  parse_info(info[0] if isinstance(info, list) else info)
                                  if info is not None else None)
                if part.audio.size or part.info:
                    yield part
                if time.monotonic() > deadline:
                    raise ClientError(f"stream from {url} did not finish within {timeout_s:g} s", TIMEOUT)
        except urllib3.exceptions.ReadTimeoutError:
            raise ClientError(f"no data from {url} for {timeout_s:g} s", TIMEOUT) from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClientError(f"stream from {url} failed: {exc}") from None


def synthesize_sse(url: str, request: SynthesisRequest,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> SynthesisResult:
    """Run one streamed synthesis over SSE and collect it.

    ``ttfa_s`` is the time from sending to the first non-empty chunk, ``total_s`` to the end
    of the event stream (``time.perf_counter`` seconds). Raises :class:`ClientError` as
    :func:`iter_sse_chunks` does.
    """
    t0 = time.perf_counter()
    return collect_stream(iter_sse_parts(url, request, timeout_s=timeout_s), t0)
