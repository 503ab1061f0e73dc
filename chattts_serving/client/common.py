"""Protocol-independent pieces of the clients: the request, the result, errors and WAV output.

Tensor names, dtypes and the sample rate come from :mod:`chattts_serving.contract`; nothing
here talks to a server.
"""

from __future__ import annotations

import json
import math
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..contract import Language, Priority, Segmentation, VocoderPath, WireEnum
from ..errors import ErrorKind, decode_tagged, untagged_kind

_SPECS: dict[str, contract.TensorSpec] = {spec.name: spec for spec in contract.ENTRY_INPUTS}


class ClientError(Exception):
    """A request the server refused or failed, or a transport failure.

    ``message`` is the server's message without its kind tag (or the transport's); ``kind``
    is the :class:`~chattts_serving.errors.ErrorKind` the server tagged it with, else the one
    Triton's own message or its transport status implies (:func:`~chattts_serving.errors.untagged_kind`), else
    None; ``param`` is the entry input the server named in the tag (``[invalid:voice]``: the
    error is about ``voice``), else None; ``status`` is the HTTP status code (int), the gRPC
    status name (str, e.g. ``"StatusCode.INVALID_ARGUMENT"``), ``"timeout"`` for a client-side
    timeout, or None when unknown. ``connection`` is True when the server could not be
    reached at all, or went away mid-stream (kind UNAVAILABLE then).
    """

    def __init__(self, message: str, status: int | str | None = None, connection: bool = False) -> None:
        tagged = decode_tagged(message)
        kind = tagged.kind
        if kind is None and connection:
            kind = ErrorKind.UNAVAILABLE  # no server to say busy: it is down, stopping or restarting
        elif kind is None:
            kind = ErrorKind.DEADLINE if status == TIMEOUT else untagged_kind(tagged.message, status)
        super().__init__(tagged.message)
        self.message = tagged.message
        self.kind = kind
        self.param = tagged.param
        self.status = status
        self.connection = connection

    def __str__(self) -> str:
        return self.message


LOST_CONNECTION = "lost the connection to"
"""How the message of a stream cut by its server's going away begins (``connection=True``):
the server stopped, crashed or restarts; a retry may find it (or another) serving."""

STREAM_REMOVED = "Stream removed"
"""How gRPC's message begins (status INTERNAL or UNKNOWN) for a stream that its HTTP/2 connection
ended without a gRPC status: a proxy in between (haproxy) closing the stream because the
connection to its replica broke. The server went away, as with UNAVAILABLE
(:func:`connection_lost`)."""


def connection_lost(status: int | str | None, message: str) -> bool:
    """Whether a gRPC call's failure (``status``: ``"StatusCode.<NAME>"``) means that its server
    could not be reached or went away: UNAVAILABLE, or any status with :data:`STREAM_REMOVED`."""
    return status == "StatusCode.UNAVAILABLE" or (isinstance(status, str) and status.startswith("StatusCode.")
                                                  and message.startswith(STREAM_REMOVED))


TIMEOUT = "timeout"
"""``ClientError.status`` of a request this client stopped waiting for."""

_MODES: dict[str, type[WireEnum]] = {contract.IN_VOCODER.name: VocoderPath, contract.IN_PRIORITY.name: Priority,
                                     contract.IN_SEGMENTATION.name: Segmentation, contract.IN_LANGUAGE.name: Language}
"""The request fields whose values are an enum's (see :class:`SynthesisRequest`)."""
_VALUES: dict[str, frozenset[str]] = {name: frozenset(m.value for m in enum) for name, enum in _MODES.items()}


@dataclass(frozen=True)
class SynthesisRequest:
    """One text-to-speech request for the entry models (``chattts`` / ``chattts_offline``).

    Every field but ``text`` is optional; None leaves it to the server's default (see
    ``contract.SAMPLING_PARAMS`` and ``contract.STREAM_PARAMS`` for defaults and ranges).

    text: UTF-8 text, Chinese and/or English. voice: integer seed as a string, a ChatTTS
    spk_emb string, or '' for the default voice. seed: sampler seed (INT64).
    temperature, top_p, repetition_penalty: FP32. top_k, max_new_tokens, min_new_tokens:
    INT32 (tokens; 1 token = ``contract.SAMPLES_PER_TOKEN`` samples). vocoder: a
    :class:`~chattts_serving.contract.VocoderPath` ('hidden' or 'codes'). lookahead_tokens:
    right context per streamed chunk in tokens (INT32, streaming only; -1 = server default).
    priority: a :class:`~chattts_serving.contract.Priority` ('realtime' or 'batch').
    timeout_s: deadline for the whole request in seconds (FP32). refine_text: run ChatTTS'
    refine-text stage first (BOOL); refine_prompt: its control tokens, e.g.
    '[oral_2][laugh_0][break_6]'; refine_temperature, refine_top_p, refine_top_k,
    refine_max_new_tokens, refine_min_new_tokens, refine_seed: its sampling (defaults in
    ``contract.REFINE_PARAMS``). segmentation: a :class:`~chattts_serving.contract.Segmentation`,
    'streaming' or 'chattts' (ChatTTS' split and first-piece audio prompt). reference_audio: a
    reference recording, (N,) float32 mono samples in [-1, 1] at reference_sample_rate_hz
    (INT32, default 24000; :func:`read_wav` reads one); reference_text: its transcript
    (required with it or with spk_smp); spk_smp: a ChatTTS audio-prompt string instead of a
    recording. language: a :class:`~chattts_serving.contract.Language`, 'auto', 'zh' or 'en':
    the language of numbers, units and symbols the text gives no context for. validate_only:
    check the request whole (its parameters, voice, reference and refine prompt, as a
    synthesis would) and end with the final ``info`` and no audio (BOOL). request_id: Triton
    request id (not a tensor): echoed in every response's ``id`` and in ``info``; the server
    generates one when it is None.

    vocoder, priority, segmentation and language also take their values as strings (from a
    command line or a JSON body): a known value becomes its enum member, any other string is kept and sent
    as it is, for the server to refuse (INVALID, ``param`` naming the input).
    """

    text: str
    voice: str | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    vocoder: VocoderPath | str | None = None
    lookahead_tokens: int | None = None
    priority: Priority | str | None = None
    timeout_s: float | None = None
    refine_text: bool | None = None
    refine_prompt: str | None = None
    refine_temperature: float | None = None
    refine_top_p: float | None = None
    refine_top_k: int | None = None
    refine_max_new_tokens: int | None = None
    refine_min_new_tokens: int | None = None
    refine_seed: int | None = None
    segmentation: Segmentation | str | None = None
    reference_audio: np.ndarray | None = field(default=None, compare=False)
    reference_sample_rate_hz: int | None = None
    reference_text: str | None = None
    spk_smp: str | None = None
    language: Language | str | None = None
    validate_only: bool | None = None
    request_id: str | None = None

    def __post_init__(self) -> None:
        for name, enum in _MODES.items():
            value = getattr(self, name)
            if isinstance(value, str) and value in _VALUES[name]:
                object.__setattr__(self, name, enum(value))

    def tensors(self) -> Iterator[tuple[str, np.ndarray, str]]:
        """Yield ``(input name, numpy array, client datatype)`` for each field that is set, with
        the dtype the contract declares (object/bytes for BYTES): shape [1], except
        ``reference_audio`` ([N] float32).

        Raises KeyError if a field has no matching entry input in the contract (a contract
        change the client has not followed).
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "request_id":
                continue
            spec = _SPECS[f.name]
            if spec.dims == (-1,):
                arr = np.ascontiguousarray(value, dtype=spec.np_dtype).reshape(-1)
            elif spec.np_dtype == np.dtype(object):
                arr = np.array([str(value).encode("utf-8")], dtype=np.object_)
            else:
                arr = np.array([value], dtype=spec.np_dtype)
            yield spec.name, arr, spec.client_dtype

    def json_inputs(self) -> dict[str, str | int | float | bool | list[float]]:
        """The set fields as a JSON object for ``generate_stream``: strings plain, BOOL as JSON
        booleans, INT32/INT64 as JSON integers, FP32 as JSON floats (``reference_audio`` as a
        JSON array of them)."""
        out: dict[str, str | int | float | bool | list[float]] = {}
        for name, arr, _ in self.tensors():
            v = arr[0] if arr.size == 1 and name != contract.IN_REFERENCE_AUDIO.name else None
            if v is None:
                out[name] = [float(x) for x in arr]
            elif isinstance(v, bytes):
                out[name] = v.decode("utf-8")
            elif arr.dtype == np.bool_:
                out[name] = bool(v)
            elif arr.dtype.kind in "iu":
                out[name] = int(v)
            else:
                out[name] = float(v)
        return out


@dataclass
class SynthesisResult:
    """A finished synthesis.

    audio: (N,) float32 mono samples in [-1, 1] at ``sample_rate_hz``. ttfa_s: seconds from
    sending the request to the first non-empty audio chunk. total_s: seconds from sending
    the request to the end of the response stream. chunks: non-empty audio chunks received.
    chunk_samples: samples per chunk, in order. info: the server's ``info`` JSON objects
    merged (keys ``contract.INFO_FINAL_KEYS`` when the request completed; ``request_id``,
    ``dropped`` (what was not spoken), ``capped_segments`` (sentences that hit
    max_new_tokens), ...); empty when the server sent none.
    """

    audio: np.ndarray
    sample_rate_hz: int = contract.SAMPLE_RATE_HZ
    ttfa_s: float = 0.0
    total_s: float = 0.0
    chunks: int = 0
    chunk_samples: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def audio_s(self) -> float:
        """Duration of the audio in seconds."""
        return float(self.audio.size) / float(self.sample_rate_hz)

    @property
    def rtf(self) -> float:
        """Real-time factor: total_s / audio_s (lower is faster; inf for empty audio)."""
        return self.total_s / self.audio_s if self.audio_s > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        """The summary: keys ttfa_s, total_s, audio_s, rtf, chunks, sample_rate_hz, and from
        the server's info request_id, dropped and capped_segments (None when not sent)."""
        return {"ttfa_s": self.ttfa_s, "total_s": self.total_s, "audio_s": self.audio_s,
                "rtf": self.rtf, "chunks": self.chunks, "sample_rate_hz": self.sample_rate_hz,
                "request_id": self.info.get("request_id"), "dropped": self.info.get("dropped"),
                "capped_segments": self.info.get("capped_segments")}

    def to_json_str(self) -> str:
        """:meth:`to_json` as a JSON string (an infinite RTF is written as null)."""
        d = self.to_json()
        return json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k, v in d.items()}, ensure_ascii=False)


@dataclass(frozen=True)
class StreamPart:
    """One response of a stream: ``audio`` (n,) float32 at ``contract.SAMPLE_RATE_HZ`` (may
    be empty) and the ``info`` JSON object it carried, if any."""

    audio: np.ndarray
    info: dict[str, Any] | None = None
    index: int | None = None
    """The chunk's ``chunk_index`` (the ensemble door's responses carry one), None without."""


class ChunkOrder:
    """Puts the ensemble door's chunks in stream order: Triton does not promise an ensemble's
    responses in order, so each carries its ``chunk_index`` and :meth:`add` returns the parts
    that are next in order (holding a part until those before it arrived); parts without an
    index pass at once. :meth:`check_complete` at the stream's end raises ClientError when an
    index is missing (held parts never came out) or came twice."""

    def __init__(self) -> None:
        self.next = 0
        self.held: dict[int, StreamPart] = {}
        self.out_of_order = 0
        """Parts that arrived before one of their predecessors (0 on Triton 2.51 with one
        vocoder instance, see docs/ensemble.md)."""

    def add(self, part: StreamPart) -> list[StreamPart]:
        if part.index is None:
            return [part]
        if part.index < self.next or part.index in self.held:
            raise ClientError(f"chunk {part.index} arrived twice")
        if part.index != self.next:
            self.out_of_order += 1
        self.held[part.index] = part
        ready = []
        while self.next in self.held:
            ready.append(self.held.pop(self.next))
            self.next += 1
        return ready

    def check_complete(self) -> None:
        if self.held:
            raise ClientError(f"the stream ended without chunk {self.next} (held: {sorted(self.held)})")


def parse_info(raw: object) -> dict[str, Any]:
    """Decode an ``info`` output value (bytes, str, or a one-element array of either) into a
    dict. Raises ClientError when it is not a JSON object."""
    value = raw
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size else b""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise ClientError(f"the server's '{contract.OUT_INFO.name}' output is not a JSON object: {text[:200]!r}")
    return info


def concat_chunks(chunks: list[np.ndarray]) -> np.ndarray:
    """Concatenate 1-D audio chunks into one (N,) float32 array (empty list -> empty array)."""
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate([np.asarray(c, np.float32).reshape(-1) for c in chunks])


def collect_stream(parts: Iterator[StreamPart], t0: float) -> SynthesisResult:
    """Drain a stream of :class:`StreamPart` into a :class:`SynthesisResult`; ``t0`` is the
    ``time.perf_counter()`` at which the request was sent: TTFA is taken at the first
    non-empty chunk, total time at the stream's end (seconds); later ``info`` keys override
    earlier ones (the final response's summary wins)."""
    import time

    got: list[np.ndarray] = []
    info: dict[str, Any] = {}
    ttfa: float | None = None
    for part in parts:
        if part.info:
            info.update(part.info)
        if not part.audio.size:
            continue
        if ttfa is None:
            ttfa = time.perf_counter() - t0
        got.append(part.audio)
    total = time.perf_counter() - t0
    return SynthesisResult(audio=concat_chunks(got), sample_rate_hz=int(info.get("sample_rate_hz",
                                                                                    contract.SAMPLE_RATE_HZ)),
                           ttfa_s=total if ttfa is None else ttfa, total_s=total, chunks=len(got),
                           chunk_samples=[c.size for c in got], info=info)


def audio_only(parts: Iterator[StreamPart]) -> Iterator[np.ndarray]:
    """The non-empty audio chunks of ``parts``; closing this generator closes ``parts`` (which
    cancels the request on the server)."""
    try:
        for part in parts:
            if part.audio.size:
                yield part.audio
    finally:
        close = getattr(parts, "close", None)
        if close is not None:
            close()


def read_wav(source: str | Path | bytes) -> tuple[np.ndarray, int]:
    """A PCM WAV file (a path, or its bytes) as ((N,) float32 mono samples in [-1, 1], sample
    rate in Hz): 8-bit unsigned or 16/24/32-bit signed integer samples, several channels
    averaged to one. For a ``reference_audio``.

    Raises:
        ValueError: not a PCM WAV file (a compressed or floating-point WAV, another format),
            or a file that cannot be read (an OSError's message).
    """
    import io

    try:
        with wave.open(io.BytesIO(source) if isinstance(source, bytes) else str(source), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        why = f" ({exc})" if str(exc) else ""
        raise ValueError(f"not a PCM WAV file{why}; convert it, e.g. "
                         "`ffmpeg -i in -c:a pcm_s16le out.wav`") from None
    except OSError as exc:
        raise ValueError(str(exc)) from None
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = (((b[:, 2] << 24) | (b[:, 1] << 16) | (b[:, 0] << 8)) >> 8).astype(np.float32) / float(1 << 23)
    else:
        dtype = {2: "<i2", 4: "<i4"}[width]
        x = np.frombuffer(raw, dtype).astype(np.float32) / float(1 << (8 * width - 1))
    return x.reshape(-1, channels).mean(axis=1).astype(np.float32), int(rate)


def write_wav(path: str | Path, audio: np.ndarray, sample_rate_hz: int = contract.SAMPLE_RATE_HZ) -> None:
    """Write ``audio`` ((N,) float, nominally in [-1, 1]) as 16-bit PCM mono WAV.

    Samples are clipped to [-1, 1] and scaled by 32767. Raises OSError if the file cannot
    be written and ValueError if ``audio`` is not 1-D.
    """
    a = np.asarray(audio, dtype=np.float32)
    if a.ndim != 1:
        raise ValueError(f"audio must be 1-D, got shape {list(a.shape)}")
    pcm = np.round(np.clip(np.nan_to_num(a), -1.0, 1.0) * 32767.0).astype("<i2")
    # Open the file first: wave.open(path) on an unwritable path leaves a half-built writer
    # whose __del__ prints a traceback on Python 3.11.
    with open(path, "wb") as f, wave.open(f, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate_hz))
        w.writeframes(pcm.tobytes())
