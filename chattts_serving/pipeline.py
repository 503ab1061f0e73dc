"""The BLS pipeline of the entry models, free of Triton.

``chattts`` (streaming) and ``chattts_offline`` parse and validate their inputs with
:func:`parse_entry`, then run :func:`stream_audio` or :func:`offline_audio` against a
:class:`Stages` implementation: in the server, BLS calls to the front end, the GPT engine and
the vocoder models; in unit tests, the same package objects called in-process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import contract
from .chunking import ChunkSchedule, StreamChunker
from .sampling import ParamError, SamplingParams

INVALID, UNAVAILABLE, INTERNAL, CANCELLED = "invalid", "unavailable", "internal", "cancelled"


class RequestError(Exception):
    """A request that ends with an error. ``kind`` maps to a Triton error code:
    invalid -> INVALID_ARG (HTTP 400), unavailable -> UNAVAILABLE (HTTP 503),
    internal -> INTERNAL (HTTP 500), cancelled -> CANCELLED."""

    def __init__(self, message: str, kind: str = INVALID) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class EntryRequest:
    """A validated entry-point request."""

    text: str
    voice: str
    vocoder: str
    params: SamplingParams
    lookahead_tokens: int | None


@dataclass(frozen=True)
class TokenBatch:
    """Tokens from the engine: codes (N, 4) int32, hidden (N, H) float32, stop_reason."""

    codes: np.ndarray
    hidden: np.ndarray
    stop_reason: str


class TokenStream(Protocol):
    """Tokens of one sequence: iterate for batches; ``cancel()`` ends it early and drains."""

    def __iter__(self) -> Iterator[TokenBatch]: ...

    def cancel(self) -> None: ...


class Stages(Protocol):
    """The three stages the entry models call (BLS in the server)."""

    def frontend(self, text: str, voice: str) -> tuple[np.ndarray, np.ndarray]:
        """-> (input_ids (T,) int32, spk_emb (H,) float32). Raises RequestError."""

    def generate(self, input_ids: np.ndarray, spk_emb: np.ndarray, params: SamplingParams,
                 emit_tokens: int) -> TokenStream:
        """Start a sequence on the engine. Iterating raises RequestError on engine errors."""

    def vocode(self, path: str, window: np.ndarray) -> np.ndarray:
        """Window (T, H) float32 or (T, 4) int32 -> audio (512T-256,) float32. Raises RequestError."""


def _scalar(inputs: Mapping[str, np.ndarray], spec: contract.ParamSpec) -> float | int | None:
    arr = inputs.get(spec.name)
    if arr is None:
        return None
    if arr.dtype != np.dtype(contract.TensorSpec(spec.name, spec.triton_dtype, (1,)).np_dtype):
        raise RequestError(f"input '{spec.name}' must be {spec.triton_dtype.removeprefix('TYPE_')}, "
                           f"got {arr.dtype}")
    if arr.size != 1:
        raise RequestError(f"input '{spec.name}' must hold exactly one value, got shape {list(arr.shape)}")
    v = arr.reshape(-1)[0]
    return int(v) if spec.triton_dtype.startswith("TYPE_INT") else float(v)


def _string(inputs: Mapping[str, np.ndarray], name: str, required: bool) -> str | None:
    arr = inputs.get(name)
    if arr is None:
        if required:
            raise RequestError(f"missing required input '{name}'")
        return None
    if arr.dtype != np.object_ and arr.dtype.kind not in ("S", "U"):
        raise RequestError(f"input '{name}' must be BYTES (UTF-8 string), got {arr.dtype}")
    if arr.size != 1:
        raise RequestError(f"input '{name}' must hold exactly one string, got shape {list(arr.shape)}")
    v = arr.reshape(-1)[0]
    if isinstance(v, str):
        return v
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"input '{name}' is not valid UTF-8 (byte {exc.start})") from None


def parse_entry(inputs: Mapping[str, np.ndarray], max_new_tokens_cap: int,
                default_vocoder: str) -> EntryRequest:
    """Validate an entry request's tensors (name -> numpy array). Raises RequestError."""
    text = _string(inputs, contract.IN_TEXT.name, required=True)
    assert text is not None
    voice = _string(inputs, contract.IN_VOICE.name, required=False) or ""
    vocoder = (_string(inputs, contract.IN_VOCODER.name, required=False) or default_vocoder).strip()
    if vocoder not in contract.VOCODER_PATHS:
        raise RequestError(f"vocoder must be one of {sorted(contract.VOCODER_PATHS)}, got {vocoder!r}")
    values = {}
    for spec in contract.SAMPLING_PARAMS:
        v = _scalar(inputs, spec)
        if v is not None:
            values[spec.name] = v
    try:
        params = SamplingParams(**values).validate(max_new_tokens_cap)  # type: ignore[arg-type]
    except ParamError as exc:
        raise RequestError(str(exc)) from None
    lookahead = None
    for spec in contract.STREAM_PARAMS:
        v = _scalar(inputs, spec)
        if v is not None and not (spec.low <= v <= spec.high):
            raise RequestError(f"{spec.name}={v} is out of range [{spec.low:g}, {spec.high:g}]")
        if spec.name == "lookahead_tokens" and v is not None and v >= 1:
            lookahead = int(v)
        elif spec.name == "lookahead_tokens" and v == 0:
            raise RequestError("lookahead_tokens must be >= 1 (or -1 for the default)")
    return EntryRequest(text, voice, vocoder, params, lookahead)


@dataclass
class StreamResult:
    """What a finished stream did: chunks and samples sent, tokens, stop reason, timings (s)."""

    chunks: int = 0
    samples: int = 0
    tokens: int = 0
    stop_reason: str = ""
    first_audio_s: float | None = None
    chunk_samples: list[int] = field(default_factory=list)


class _TokenStore:
    """Growing (N, 4) codes and (N, H) hidden arrays with amortised appends."""

    def __init__(self) -> None:
        self.n = 0
        self.codes = np.zeros((0, contract.NUM_VQ), np.int32)
        self.hidden = np.zeros((0, 0), np.float32)

    def add(self, b: TokenBatch) -> None:
        k = len(b.codes)
        if not k:
            return
        if self.n + k > len(self.codes):
            cap = max(64, 2 * (self.n + k))
            codes = np.zeros((cap, contract.NUM_VQ), np.int32)
            hidden = np.zeros((cap, b.hidden.shape[1]), np.float32)
            if self.n:
                codes[:self.n], hidden[:self.n] = self.codes[:self.n], self.hidden[:self.n]
            self.codes, self.hidden = codes, hidden
        self.codes[self.n:self.n + k] = b.codes
        self.hidden[self.n:self.n + k] = b.hidden
        self.n += k

    def window(self, path: str, start: int, end: int) -> np.ndarray:
        return self.hidden[start:end] if path == "hidden" else self.codes[start:end]


def stream_audio(req: EntryRequest, stages: Stages, schedule: ChunkSchedule, emit_tokens: int,
                 send: Callable[[np.ndarray], None], cancelled: Callable[[], bool]) -> StreamResult:
    """Run one streaming request: send each audio chunk (1-D float32, 24 kHz) as it is ready.

    Returns a :class:`StreamResult`; raises RequestError (the caller sends it as the stream's
    error). Stops early, without error, when ``cancelled()`` turns true.
    """
    t0 = time.monotonic()
    if req.lookahead_tokens is not None:
        schedule = schedule.with_lookahead(req.lookahead_tokens)
    input_ids, spk_emb = stages.frontend(req.text, req.voice)
    chunker = StreamChunker(schedule)
    store = _TokenStore()
    result = StreamResult()
    tokens = stages.generate(input_ids, spk_emb, req.params, emit_tokens)
    ended = False
    try:
        for batch in tokens:
            store.add(batch)
            finished = bool(batch.stop_reason)
            if finished:
                ended = True
                result.stop_reason = batch.stop_reason
            if cancelled():
                result.stop_reason = CANCELLED
                return result
            while (w := chunker.next_window(store.n, finished)) is not None:
                audio = stages.vocode(req.vocoder, store.window(req.vocoder, w.start, w.end))
                out = chunker.emit(w, audio)
                if out.size:
                    if result.first_audio_s is None:
                        result.first_audio_s = time.monotonic() - t0
                    send(out)
                    result.chunks += 1
                    result.samples += out.size
                    result.chunk_samples.append(out.size)
            if finished:
                break
    finally:
        if not ended:
            tokens.cancel()
    result.tokens = store.n
    if not result.stop_reason:
        raise RequestError("the GPT engine ended the stream without a stop reason", INTERNAL)
    if store.n == 0:
        raise RequestError("the model ended the utterance before producing any audio; "
                           "try another seed or set min_new_tokens", INTERNAL)
    return result


def offline_audio(req: EntryRequest, stages: Stages, emit_tokens: int = 64) -> tuple[np.ndarray, str]:
    """Run one request to the end and vocode the whole utterance in one window (ChatTTS'
    offline decode). Returns (audio (512N-256,) float32, stop_reason). Raises RequestError."""
    input_ids, spk_emb = stages.frontend(req.text, req.voice)
    store = _TokenStore()
    reason = ""
    for batch in stages.generate(input_ids, spk_emb, req.params, emit_tokens):
        store.add(batch)
        if batch.stop_reason:
            reason = batch.stop_reason
    if not reason:
        raise RequestError("the GPT engine ended the stream without a stop reason", INTERNAL)
    if store.n == 0:
        raise RequestError("the model ended the utterance before producing any audio; "
                           "try another seed or set min_new_tokens", INTERNAL)
    return stages.vocode(req.vocoder, store.window(req.vocoder, 0, store.n)), reason
