"""The BLS pipeline of the entry models, free of Triton.

``chattts`` (streaming) and ``chattts_offline`` parse and validate their inputs with
:func:`parse_entry`, then run :func:`stream_audio` or :func:`offline_audio` against a
:class:`Stages` implementation: in the server, BLS calls to the front end, the GPT engine and
the vocoder models; in unit tests, the same package objects called in-process.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import contract
from .chunking import ChunkSchedule, StreamChunker
from .engine import MODE_CODE, MODE_TEXT
from .refine import RefineParams, refine_params_from_inputs
from .sampling import ParamError, SamplingParams
from .textnorm import carry_speed, length_error

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
    """A validated entry-point request.

    ``priority``: 'realtime' or 'batch'; ``timeout_s``: deadline for the whole request from
    its arrival, or None; ``request_id``: the client's id (or a generated one) for logs;
    ``refine``: parameters of the refine-text stage, None to skip it (the default).
    """

    text: str
    voice: str
    vocoder: str
    params: SamplingParams
    lookahead_tokens: int | None
    priority: str = "realtime"
    timeout_s: float | None = None
    request_id: str = ""
    refine: RefineParams | None = None


@dataclass(frozen=True)
class FrontendOutput:
    """One text segment after the front end: prompt ids (T,) int32, speaker vector (H,)
    float32, the text after normalisation, and what was not spoken (characters or reserved
    tokens, in order of appearance)."""

    input_ids: np.ndarray
    spk_emb: np.ndarray
    normalized_text: str = ""
    dropped: tuple[str, ...] = ()
    refine_ids: np.ndarray | None = None
    """(T',) int32 refine-text prompt ids (``[Sbreak]{normalized}[Pbreak]{refine_prompt}``)."""


@dataclass(frozen=True)
class TokenBatch:
    """Tokens from the engine: codes (N, 4) int32, hidden (N, H) float32, stop_reason."""

    codes: np.ndarray
    hidden: np.ndarray
    stop_reason: str


class TokenStream(Protocol):
    """Tokens of one sequence: iterate for batches; ``cancel()`` ends it early and drains (a
    no-op once its last batch was read);
    ``request_cancel()`` (any thread) asks the engine to end it, the iterator then ends with
    a ``cancelled`` batch."""

    def __iter__(self) -> Iterator[TokenBatch]: ...

    def cancel(self) -> None: ...

    def request_cancel(self) -> None: ...


Watch = Callable[[Callable[[], None]], Callable[[], None]]
"""``watch(on_cancel)`` arranges for ``on_cancel()`` to run as soon as the client cancels and
returns a function that stops watching."""


class Stages(Protocol):
    """The three stages the entry models call (BLS in the server)."""

    def frontend(self, text: str, voice: str, request_id: str = "", refine_prompt: str | None = None,
                 refined_ids: np.ndarray | None = None) -> FrontendOutput:
        """Normalise and tokenize one segment, resolve the voice; with ``refine_prompt`` ('' for
        none) also the refine-text prompt (``refine_ids``); with ``refined_ids`` (text
        ids (N,) from the refine stage for this segment) the code prompt is built from the
        refined text. Raises RequestError. ``request_id`` (every stage) labels the
        sub-request for the stage's logs."""

    def generate(self, input_ids: np.ndarray, spk_emb: np.ndarray | None, params: SamplingParams,
                 emit_tokens: int, priority: int = 0, timeout_s: float | None = None,
                 first_emit_tokens: int = 0, request_id: str = "", mode: str = MODE_CODE) -> TokenStream:
        """Start a sequence on the engine (``priority`` 0 realtime / 1 batch; ``timeout_s``
        after which the engine ends it with an error; ``mode`` 'code', or 'text' for the
        refine stage: no speaker, codes (N, 4) carry the text id in every column). Iterating
        raises RequestError."""

    def vocode(self, path: str, window: np.ndarray, request_id: str = "") -> np.ndarray:
        """Window (T, H) float32 or (T, 4) int32 -> audio (512T-256,) float32. Raises RequestError."""


def scalar_input(inputs: Mapping[str, np.ndarray], spec: contract.ParamSpec) -> float | int | None:
    """The one value of input ``spec.name`` (int or float per its dtype), None when absent.
    Raises RequestError for a wrong dtype or not exactly one value."""
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


def string_input(inputs: Mapping[str, np.ndarray], name: str, required: bool) -> str | None:
    """The one UTF-8 string of BYTES input ``name``, None when absent and optional.
    Raises RequestError when missing and required, not BYTES, not one value, or not UTF-8."""
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


def sampling_input(inputs: Mapping[str, np.ndarray], max_new_tokens_cap: int) -> SamplingParams:
    """The request's sampling parameters (``contract.SAMPLING_PARAMS`` inputs, defaults for the
    absent ones), validated. Raises RequestError."""
    values = {}
    for spec in contract.SAMPLING_PARAMS:
        v = scalar_input(inputs, spec)
        if v is not None:
            values[spec.name] = v
    try:
        return SamplingParams(**values).validate(max_new_tokens_cap)  # type: ignore[arg-type]
    except ParamError as exc:
        raise RequestError(str(exc)) from None


def parse_request_params(params: Mapping[str, object]) -> None:
    """Refuse Triton request parameters: the entry points take none (their knobs are input
    tensors), so a parameter is a client mistake that must not be silently ignored.
    Names starting with ``triton_`` (set by Triton itself) are allowed, and ``id``: Triton's
    ``generate_stream`` passes a JSON body's ``id`` (the request id) on as a parameter too.
    Raises RequestError."""
    unknown = sorted(k for k in params if not k.startswith("triton_") and k != "id")
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}: this model's options are input tensors "
                           f"({', '.join(t.name for t in contract.ENTRY_INPUTS)})")


def _priority_and_timeout(inputs: Mapping[str, np.ndarray]) -> tuple[str, float | None]:
    priority = string_input(inputs, contract.IN_PRIORITY.name, required=False) or "realtime"
    if priority not in contract.PRIORITIES:
        raise RequestError(f"priority must be one of {sorted(contract.PRIORITIES)}, got {priority!r}")
    timeout = scalar_input(inputs, contract.ParamSpec(contract.IN_TIMEOUT.name, "TYPE_FP32", 0, 0, 3600))
    if timeout is not None and not (np.isfinite(timeout) and 0.0 < timeout <= 3600.0):
        raise RequestError(f"timeout_s={timeout} is out of range (0, 3600]")
    return priority, (float(timeout) if timeout is not None else None)


def parse_entry(inputs: Mapping[str, np.ndarray], max_new_tokens_cap: int, default_vocoder: str,
                request_params: Mapping[str, object] | None = None, request_id: str = "",
                max_text_chars: int = 4096) -> EntryRequest:
    """Validate an entry request's tensors (name -> numpy array) and request parameters.
    Raises RequestError."""
    parse_request_params(request_params or {})
    priority, timeout_s = _priority_and_timeout(inputs)
    text = string_input(inputs, contract.IN_TEXT.name, required=True)
    assert text is not None
    too_long = length_error(text, max_text_chars)
    if too_long:
        raise RequestError(too_long)
    voice = string_input(inputs, contract.IN_VOICE.name, required=False) or ""
    vocoder = (string_input(inputs, contract.IN_VOCODER.name, required=False) or default_vocoder).strip()
    if vocoder not in contract.VOCODER_PATHS:
        raise RequestError(f"vocoder must be one of {sorted(contract.VOCODER_PATHS)}, got {vocoder!r}")
    params = sampling_input(inputs, max_new_tokens_cap)
    lookahead = None
    for spec in contract.STREAM_PARAMS:
        v = scalar_input(inputs, spec)
        if v is not None and not (spec.low <= v <= spec.high):
            raise RequestError(f"{spec.name}={v} is out of range [{spec.low:g}, {spec.high:g}]")
        if spec.name == "lookahead_tokens" and v is not None and v >= 1:
            lookahead = int(v)
        elif spec.name == "lookahead_tokens" and v == 0:
            raise RequestError("lookahead_tokens must be >= 1 (or -1 for the default)")
    return EntryRequest(text, voice, vocoder, params, lookahead, priority, timeout_s, request_id,
                        _refine_input(inputs, max_new_tokens_cap))


def _refine_input(inputs: Mapping[str, np.ndarray], max_new_tokens_cap: int) -> RefineParams | None:
    """RefineParams when ``refine_text`` is true, else None. Raises RequestError, also for
    ``refine_*`` inputs sent without ``refine_text`` (they would be ignored silently)."""
    flag = inputs.get(contract.IN_REFINE_TEXT.name)
    on = False
    if flag is not None:
        if flag.size != 1 or flag.dtype != np.bool_:
            raise RequestError(f"input '{contract.IN_REFINE_TEXT.name}' must be one BOOL")
        on = bool(flag.reshape(-1)[0])
    prompt = string_input(inputs, contract.IN_REFINE_PROMPT.name, required=False)
    given = sorted(k for k in inputs if k.startswith(contract.REFINE_PREFIX) and k != contract.IN_REFINE_TEXT.name)
    if not on:
        if given:
            raise RequestError(f"{given} need refine_text=true")
        return None
    return refine_params_from_inputs(inputs, max_new_tokens_cap, prefix=contract.REFINE_PREFIX, prompt=prompt or "")


@dataclass
class StreamResult:
    """What a finished stream did: chunks and samples sent, tokens, stop reason, timings (s),
    and what the front end made of the text (per segment; ``dropped`` merged, in order)."""

    chunks: int = 0
    samples: int = 0
    tokens: int = 0
    stop_reason: str = ""
    first_audio_s: float | None = None
    chunk_samples: list[int] = field(default_factory=list)
    segments: int = 0
    capped_segments: list[int] = field(default_factory=list)
    """Indices of segments that hit max_new_tokens (their sentence may be cut short)."""
    normalized_text: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def add_prepared(self, prepared: list[FrontendOutput]) -> None:
        """Record the front end's view of every segment (before any audio is sent)."""
        self.normalized_text = [p.normalized_text for p in prepared]
        self.dropped = list(dict.fromkeys(d for p in prepared for d in p.dropped))


def info_json(req: EntryRequest, result: StreamResult, final: bool, degraded: bool = False) -> str:
    """The entry models' ``info`` output (``contract.OUT_INFO``): a JSON object with the keys
    ``contract.INFO_HEADER_KEYS`` (``final`` false: a stream's first audio response) or
    ``contract.INFO_FINAL_KEYS`` (``final`` true). Non-ASCII text is kept as is (UTF-8)."""
    info: dict[str, object] = {
        "request_id": req.request_id, "sample_rate_hz": contract.SAMPLE_RATE_HZ,
        "normalized_text": result.normalized_text, "dropped": result.dropped,
        "segments": len(result.normalized_text), "vocoder": req.vocoder, "refined": req.refine is not None,
        "degraded": degraded, "final": final}
    if final:
        info.update(audio_s=round(result.samples / contract.SAMPLE_RATE_HZ, 6), chunks=result.chunks,
                    tokens=result.tokens, capped_segments=result.capped_segments, stop_reason=result.stop_reason)
    return json.dumps(info, ensure_ascii=False)


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


_SENTENCE_END = re.compile(r"(?<=[。！？!?；;\n])|(?<=[.](?=\s))")
MAX_SEGMENT_CHARS = 120
"""Longest text segment generated as one GPT sequence (ChatTTS splits its input at 。 too)."""


def split_segments(text: str, max_chars: int = MAX_SEGMENT_CHARS) -> list[str]:
    """Split text at sentence ends into segments of at most ``max_chars`` characters, in order,
    nothing dropped (whitespace-only pieces are merged away). A sentence longer than
    ``max_chars`` is cut at a comma when it has one, else hard."""
    pieces = [p for p in _SENTENCE_END.split(text) if p]
    out: list[str] = []
    for piece in pieces:
        while len(piece) > max_chars:
            # cut after a full-width pause or ", " (never inside "1,234" or "3 km")
            cut = max(max(piece.rfind(c, 0, max_chars) for c in "，、；"), piece.rfind(", ", 0, max_chars - 1))
            cut = cut + 1 if cut > 0 else max_chars
            out.append(piece[:cut])
            piece = piece[cut:]
        if out and (not piece.strip() or len(out[-1]) + len(piece) <= max_chars // 4):
            out[-1] += piece
        else:
            out.append(piece)
    return [seg for seg in out if seg.strip()] or [text]


class DeadlineExceeded(RequestError):
    """The request's ``timeout_s`` passed."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"deadline exceeded: the request did not finish within timeout_s={timeout_s:g}",
                         UNAVAILABLE)


def _check_deadline(req: EntryRequest, t0: float) -> float | None:
    """Seconds left before the deadline (None without one). Raises DeadlineExceeded."""
    if req.timeout_s is None:
        return None
    left = req.timeout_s - (time.monotonic() - t0)
    if left <= 0:
        raise DeadlineExceeded(req.timeout_s)
    return left


class Cancelled(RequestError):
    """The client cancelled before any audio (during refine-text)."""

    def __init__(self) -> None:
        super().__init__("cancelled by the client during refine-text", CANCELLED)


REFINE_EMIT_TOKENS = 16
"""Refined text ids per engine response (the BLS sees progress, and cancels, that often)."""


def prepare_segments(req: EntryRequest, stages: Stages, t0: float, watch: Watch | None = None) -> list[FrontendOutput]:
    """Split the text into segments (:func:`split_segments`) and run the front end on each;
    with ``req.refine``, run the refine-text stage for all segments at once (one engine
    text-mode sequence each, batched together) and build each code prompt from its refined
    text, as ChatTTS' ``_infer`` does (refine, then ``_infer_code`` on the refined text).
    ``watch`` (optional) ends the refine sequences in the engine as soon as the client cancels.
    Raises RequestError (DeadlineExceeded past ``req.timeout_s`` counted from ``t0``;
    :class:`Cancelled` when the client cancelled during refine-text)."""
    segments = carry_speed(split_segments(req.text))
    prompt = req.refine.prompt if req.refine is not None else None
    prepared = [stages.frontend(seg, req.voice, req.request_id, prompt) for seg in segments]
    if req.refine is None:
        return prepared
    params = req.refine.sampling_params()
    streams: list[TokenStream] = []
    unwatch: list[Callable[[], None]] = []
    refined: list[np.ndarray] = []
    try:
        for p in prepared:
            # A BLS call to a decoupled model returns at its first response: the engine
            # answers every REFINE_EMIT_TOKENS tokens, so each sequence is watched for a
            # client cancel a few steps after it starts (not after its whole text).
            stream = stages.generate(p.refine_ids if p.refine_ids is not None else np.zeros(0, np.int32), None,
                                     params, REFINE_EMIT_TOKENS, contract.PRIORITIES[req.priority],
                                     _check_deadline(req, t0), request_id=req.request_id, mode=MODE_TEXT)
            streams.append(stream)
            if watch is not None:
                unwatch.append(watch(stream.request_cancel))
        for stream in streams:
            ids: list[np.ndarray] = []
            for batch in stream:
                ids.append(np.asarray(batch.codes)[:, 0])
                if batch.stop_reason == contract.STOP_CANCELLED:
                    raise Cancelled()
                if batch.stop_reason:
                    break
            refined.append(np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32))
    finally:
        for stop in unwatch:
            stop()
        for stream in streams:
            stream.cancel()  # ends and drains what an error or a cancel left running; no-op on finished ones
    _check_deadline(req, t0)
    return [stages.frontend(seg, req.voice, req.request_id, refined_ids=r)
            for seg, r in zip(segments, refined, strict=True)]


def stream_audio(req: EntryRequest, stages: Stages, schedule: ChunkSchedule, emit_tokens: int,
                 send: Callable[[np.ndarray], None], cancelled: Callable[[], bool],
                 t0: float | None = None, watch: Watch | None = None,
                 progress: Callable[[], None] | None = None, result: StreamResult | None = None) -> StreamResult:
    """Run one streaming request: send each audio chunk (1-D float32, 24 kHz) as it is ready.

    Text is split into sentence segments (:func:`split_segments`) generated one after the
    other and streamed in order. ``watch`` (optional) reports a client cancel between token
    batches, so the engine drops the sequence at its next step; ``progress()`` (optional) is
    called on every token batch (a stall watchdog's heartbeat). Returns a
    :class:`StreamResult`; raises RequestError (the caller sends it as the stream's error),
    DeadlineExceeded past ``req.timeout_s`` (counted from ``t0``, the request's arrival).
    Stops early, without error, when ``cancelled()``. ``result`` (optional) is filled in place,
    so that ``send`` can read the front end's view of the text (``add_prepared`` runs before
    the first chunk).
    """
    t0 = time.monotonic() if t0 is None else t0
    if req.lookahead_tokens is not None:
        schedule = schedule.with_lookahead(req.lookahead_tokens)
    result = StreamResult() if result is None else result
    try:
        prepared = prepare_segments(req, stages, t0, watch)
    except Cancelled:
        result.stop_reason = CANCELLED
        return result
    result.add_prepared(prepared)
    for index, seg in enumerate(prepared):
        result.segments += 1
        reason, n = _stream_segment(req, stages, schedule, emit_tokens, send, cancelled, t0, seg.input_ids,
                                    seg.spk_emb, result, watch, progress)
        result.tokens += n
        result.stop_reason = reason
        if reason == CANCELLED:
            return result
        if reason == contract.STOP_MAX_TOKENS:
            result.capped_segments.append(index)
    return result


def _stream_segment(req: EntryRequest, stages: Stages, schedule: ChunkSchedule, emit_tokens: int,
                    send: Callable[[np.ndarray], None], cancelled: Callable[[], bool], t0: float,
                    input_ids: np.ndarray, spk_emb: np.ndarray, result: StreamResult,
                    watch: Watch | None, progress: Callable[[], None] | None = None) -> tuple[str, int]:
    chunker = StreamChunker(schedule)
    store = _TokenStore()
    left = _check_deadline(req, t0)
    tokens = stages.generate(input_ids, spk_emb, req.params, emit_tokens, contract.PRIORITIES[req.priority], left,
                             schedule.tokens_before_first_chunk(), req.request_id)
    unwatch = watch(tokens.request_cancel) if watch is not None else None
    ended = False
    reason = ""
    try:
        for batch in tokens:
            if progress is not None:
                progress()
            store.add(batch)
            finished = bool(batch.stop_reason)
            if finished:
                ended = True
                reason = batch.stop_reason
            if reason == contract.STOP_CANCELLED or cancelled():
                return CANCELLED, store.n
            _check_deadline(req, t0)
            while (w := chunker.next_window(store.n, finished)) is not None:
                audio = stages.vocode(req.vocoder, store.window(req.vocoder, w.start, w.end), req.request_id)
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
        if unwatch is not None:
            unwatch()
        if not ended:
            tokens.cancel()
    if not reason:
        raise RequestError("the GPT engine ended the stream without a stop reason", INTERNAL)
    if store.n == 0:
        raise RequestError("the model ended the utterance before producing any audio; "
                           "try another seed or set min_new_tokens", INTERNAL)
    return reason, store.n


def offline_audio(req: EntryRequest, stages: Stages, emit_tokens: int = 64,
                  t0: float | None = None) -> tuple[np.ndarray, StreamResult]:
    """Run one request to the end and vocode each segment in one window (ChatTTS' offline
    decode). Returns (audio (sum of 512N-256 per segment,) float32, result). Raises RequestError."""
    t0 = time.monotonic() if t0 is None else t0
    result = StreamResult()
    pieces = []
    prepared = prepare_segments(req, stages, t0)
    result.add_prepared(prepared)
    for index, seg in enumerate(prepared):
        store = _TokenStore()
        reason = ""
        left = _check_deadline(req, t0)
        for batch in stages.generate(seg.input_ids, seg.spk_emb, req.params, emit_tokens,
                                     contract.PRIORITIES[req.priority], left, request_id=req.request_id):
            store.add(batch)
            if batch.stop_reason:
                reason = batch.stop_reason
        if not reason:
            raise RequestError("the GPT engine ended the stream without a stop reason", INTERNAL)
        if store.n == 0:
            raise RequestError("the model ended the utterance before producing any audio; "
                               "try another seed or set min_new_tokens", INTERNAL)
        _check_deadline(req, t0)
        pieces.append(stages.vocode(req.vocoder, store.window(req.vocoder, 0, store.n), req.request_id))
        result.segments += 1
        result.tokens += store.n
        result.stop_reason = reason
        if reason == contract.STOP_MAX_TOKENS:
            result.capped_segments.append(index)
    audio = np.concatenate(pieces).astype(np.float32, copy=False)
    result.samples, result.chunks = int(audio.size), 1
    return audio, result
