"""Binding of the package to Triton's Python backend, shared by every ``model.py``.

``triton_python_backend_utils`` exists only inside a Python-backend stub process, so every
function here takes that module (``pb``) as an argument instead of importing it; the
adapters in ``model_repository/*/1/model.py`` stay a few lines each.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import contract
from .engine import DEADLINE_EXCEEDED, MODE_CODE, MODE_TEXT, MODES
from .logs import log_event
from .pipeline import (
    INTERNAL,
    INVALID,
    UNAVAILABLE,
    FrontendOutput,
    RequestError,
    TokenBatch,
    sampling_input,
    string_input,
)
from .profile import Profile, profile_from_json
from .refine import refine_params_from_inputs
from .resilience import CircuitBreaker, CircuitOpen
from .runtime import Artifacts, OrtOptions
from .sampling import SamplingParams

log = logging.getLogger("chattts_serving.triton")


@dataclass(frozen=True)
class ModelSetup:
    """What a model needs from ``initialize(args)``: its config, artifacts and profile."""

    name: str
    config: dict[str, Any]
    artifacts: Artifacts
    profile: Profile
    parameters: dict[str, str]
    gpu_index: int | None = None
    """The instance's GPU (Triton's ``model_instance_device_id``) for KIND_GPU, else None."""

    def ort(self, stage: Literal["engine", "vocoder"]) -> OrtOptions:
        """The profile's ONNX Runtime options for ``stage``, on this instance's GPU (an
        instance group over several GPUs gives each instance its own device)."""
        opts = self.profile.ort(stage)
        return opts if self.gpu_index is None else dataclasses.replace(opts, device_id=self.gpu_index)

    @classmethod
    def from_args(cls, pb: Any, args: dict[str, Any], decoupled: bool) -> ModelSetup:
        """Parse Triton's ``initialize`` args. Raises RuntimeError when the config's transaction
        policy does not match what the model implements, or its artifacts are missing."""
        logging.basicConfig(level=os.environ.get("CHATTTS_LOG_LEVEL", "INFO"),
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        config = json.loads(args["model_config"])
        name = config["name"]
        if pb.using_decoupled_model_transaction_policy(config) != decoupled:
            raise RuntimeError(f"{name}: model_transaction_policy decoupled must be {decoupled}")
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        artifacts = Artifacts.load(params["artifacts_dir"])
        profile = profile_from_json(Path(params["profile_path"]).read_text())
        gpu = int(args.get("model_instance_device_id", 0)) if args.get("model_instance_kind") == "GPU" else None
        return cls(name, config, artifacts, profile, params, gpu)


def request_inputs(pb: Any, request: Any, specs: Sequence[contract.TensorSpec]) -> dict[str, np.ndarray]:
    """The request's tensors among ``specs`` as numpy arrays (absent optional ones omitted)."""
    out = {}
    for spec in specs:
        t = pb.get_input_tensor_by_name(request, spec.name)
        if t is not None:
            out[spec.name] = t.as_numpy()
    return out


_CODES = {INVALID: "INVALID_ARG", UNAVAILABLE: "UNAVAILABLE", INTERNAL: "INTERNAL", "cancelled": "CANCELLED"}


_KIND_TAG = re.compile(r"^\[(invalid|unavailable|internal|cancelled)\] ")


def triton_error(pb: Any, exc: RequestError, tag_kind: bool = False) -> Any:
    """A ``pb_utils.TritonError`` with the code that matches ``exc.kind``.

    ``tag_kind`` prefixes the message with ``[kind]``: Triton 2.51 hands BLS callers every
    error as INTERNAL, so the stage models (front end, engine) that entry models call tag
    their messages and :func:`error_from_bls` recovers the kind and strips the tag.
    """
    code = getattr(pb.TritonError, _CODES.get(exc.kind, "INTERNAL"), None)
    msg = f"[{exc.kind}] {exc}" if tag_kind else str(exc)
    return pb.TritonError(msg, code) if code is not None else pb.TritonError(msg)


def error_from_bls(error: Any) -> RequestError:
    """The :class:`RequestError` behind a ``TritonError`` received from a BLS call."""
    msg = str(error.message())
    m = _KIND_TAG.match(msg)
    if m:
        return RequestError(msg[m.end():], m.group(1))
    return RequestError(msg, INTERNAL)


def string_tensor(pb: Any, name: str, value: str) -> Any:
    """A BYTES tensor of shape [1] holding ``value`` as UTF-8."""
    return pb.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _first_string(arr: np.ndarray) -> str:
    """The first element of a BYTES output tensor (from a model of ours: UTF-8) as str."""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def send_engine_error(pb: Any, sender: Any, exc: RequestError) -> None:
    """End a GPT-engine sequence with an error its BLS caller can receive: an empty response
    whose stop_reason is ``error:<kind>:<message>``, then the final flag (see
    ``contract.STOP_ERROR_PREFIX``)."""
    outs = [pb.Tensor(contract.EN_CODES.name, np.zeros((0, contract.NUM_VQ), np.int32)),
            pb.Tensor(contract.EN_HIDDEN.name, np.zeros((0, 0), np.float32)),
            string_tensor(pb, contract.EN_STOP.name, f"{contract.STOP_ERROR_PREFIX}{exc.kind}:{exc}")]
    sender.send(pb.InferenceResponse(output_tensors=outs))
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def send_final_error(pb: Any, sender: Any, exc: RequestError, tag_kind: bool = False) -> None:
    """End a decoupled stream with an error (final flag set, so the client never hangs)."""
    sender.send(pb.InferenceResponse(error=triton_error(pb, exc, tag_kind)),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


# --------------------------------------------------------------------------------------
# GPT engine side
# --------------------------------------------------------------------------------------
class SenderSink:
    """Engine :class:`~chattts_serving.engine.TokenSink` writing to a decoupled response sender.

    With a ``model`` name it writes one structured ``sequence_finished`` line (stage
    ``engine``) when the sequence ends: request id, prompt and generated tokens, time to the
    first token and duration in ms (from the sink's creation, i.e. the engine's arrival),
    stop reason and status."""

    def __init__(self, pb: Any, sender: Any, model: str = "", request_id: str = "", prompt_tokens: int = 0) -> None:
        self.pb, self.sender = pb, sender
        self.closed = False
        self.model, self.request_id, self.prompt_tokens = model, request_id, prompt_tokens
        self._t0 = time.monotonic()
        self._first_token_s: float | None = None
        self._tokens = 0

    def _log_end(self, status: str, stop_reason: str) -> None:
        if not self.model:
            return
        now = time.monotonic()
        log_event("sequence_finished", level="error" if status == "error" else "info", model=self.model,
                  stage="engine", request_id=self.request_id, status=status, stop_reason=stop_reason,
                  prompt_tokens=self.prompt_tokens, tokens=self._tokens,
                  first_token_ms=round((self._first_token_s - self._t0) * 1000, 1)
                  if self._first_token_s is not None else None,
                  duration_ms=round((now - self._t0) * 1000, 1))

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: str) -> None:
        pb = self.pb
        self._tokens += len(codes)
        if self._first_token_s is None and len(codes):
            self._first_token_s = time.monotonic()
        if stop_reason:
            self._log_end("cancelled" if stop_reason == contract.STOP_CANCELLED else "ok", stop_reason)
        if stop_reason == contract.STOP_CANCELLED and self.sender.is_cancelled():
            self.closed = True  # the client is gone: nobody to tell
            return
        outs = [pb.Tensor(contract.EN_CODES.name, np.ascontiguousarray(codes, np.int32)),
                pb.Tensor(contract.EN_HIDDEN.name, np.ascontiguousarray(hidden, np.float32)),
                string_tensor(pb, contract.EN_STOP.name, stop_reason)]
        self.sender.send(pb.InferenceResponse(output_tensors=outs))
        if stop_reason:
            self.closed = True
            self.sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def error(self, message: str) -> None:
        """End the sequence with an error. A passed deadline is the request's own limit
        (UNAVAILABLE, which does not count against the engine's circuit breaker); anything
        else is an engine failure (INTERNAL)."""
        self.closed = True
        expired = message.startswith(DEADLINE_EXCEEDED)
        self._log_end("expired" if expired else "error", f"error: {message}")
        send_engine_error(self.pb, self.sender, RequestError(message, UNAVAILABLE if expired else INTERNAL))

    def cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


def vocode_requests(pb: Any, runner: Any, requests: Sequence[Any], model: str, memory: Any = None) -> list[Any]:
    """The vocoder models' ``execute``: each request holds one token window (1, T, H) float32
    or (1, T, 4) int32 under ``runner.input_name``; windows of equal T run as one
    ``runner.run`` call (ONNX Runtime batch). Returns one response per request, audio
    (1, 512T-256) float32, and writes one structured ``vocoder_batch`` line (stage ``vocoder``:
    the requests' ids, window tokens, ONNX Runtime calls, duration in ms). ``memory``: the
    model's :class:`~chattts_serving.metrics.MemoryGauges`, refreshed here when given."""
    t0 = time.monotonic()
    windows = [pb.get_input_tensor_by_name(r, runner.input_name).as_numpy() for r in requests]
    audio: list[np.ndarray | None] = [None] * len(requests)
    lengths = sorted({w.shape[1] for w in windows})
    for length in lengths:
        idx = [i for i, w in enumerate(windows) if w.shape[1] == length]
        out = runner.run(np.concatenate([windows[i] for i in idx]))
        for row, i in enumerate(idx):
            audio[i] = out[row:row + 1]
    log_event("vocoder_batch", model=model, stage="vocoder", request_ids=[r.request_id() for r in requests],
              batch_size=len(requests), window_tokens=[int(w.shape[1]) for w in windows], runs=len(lengths),
              duration_ms=round((time.monotonic() - t0) * 1000, 1))
    if memory is not None:
        memory.maybe_update()
    return [pb.InferenceResponse(output_tensors=[pb.Tensor(contract.VO_AUDIO.name, a)]) for a in audio]


def engine_control(inputs: dict[str, np.ndarray]) -> tuple[str, str]:
    """(control, stream_id) of a GPT-engine request; control is '' for a new sequence.
    Raises RequestError for an unknown control word or a control request without stream_id."""
    control = (string_input(inputs, contract.EN_CONTROL.name, required=False) or "").strip()
    stream_id = string_input(inputs, contract.EN_STREAM_ID.name, required=False) or ""
    if control not in ("", "cancel"):
        raise RequestError(f"unknown control {control!r}; the only control is 'cancel'")
    if control and not stream_id:
        raise RequestError("a control request needs stream_id")
    return control, stream_id


@dataclass(frozen=True)
class EngineArgs:
    """A validated GPT-engine request: prompt ids (T,) int64, spk_emb (H,) float32 or None,
    sampling parameters, tokens per response, scheduling class, timeout in s or None, and the
    sequence mode ('code' or 'text')."""

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    params: SamplingParams
    emit_tokens: int
    priority: int
    timeout_s: float | None
    first_emit_tokens: int = 0
    mode: str = MODE_CODE


def engine_sequence_args(inputs: dict[str, np.ndarray], hidden_size: int, max_new_tokens_cap: int) -> EngineArgs:
    """Validate a GPT-engine request. In text mode (refine-text) the sampling inputs take
    ``contract.REFINE_PARAMS``' defaults and ranges and a speaker vector is refused.
    Raises RequestError."""
    mode = (string_input(inputs, contract.EN_MODE.name, required=False) or MODE_CODE).strip()
    if mode not in MODES:
        raise RequestError(f"mode must be one of {MODES}, got {mode!r}")
    ids = inputs.get(contract.FE_INPUT_IDS.name)
    if ids is None:
        raise RequestError("missing required input 'input_ids'")
    if ids.dtype != np.int32 or ids.ndim != 1 or ids.size == 0:
        raise RequestError("input_ids must be a non-empty 1-D INT32 tensor")
    if ids.min() < 0 or ids.max() >= contract.TEXT_VOCAB_SIZE:
        raise RequestError(f"input_ids must be in [0, {contract.TEXT_VOCAB_SIZE})")
    spk = inputs.get(contract.EN_SPK_EMB.name)
    if spk is not None and (spk.dtype != np.float32 or spk.shape != (hidden_size,) or not np.isfinite(spk).all()):
        raise RequestError(f"spk_emb must be a finite FP32 tensor of shape [{hidden_size}]")
    if mode == MODE_TEXT:
        if spk is not None:
            raise RequestError("a text-mode (refine) sequence takes no spk_emb")
        params = refine_params_from_inputs(inputs, max_new_tokens_cap).sampling_params()
    else:
        params = sampling_input(inputs, max_new_tokens_cap)
    emit_tokens = _int_input(inputs, contract.EN_EMIT_TOKENS.name, 1, 1, 4096)
    first_emit = _int_input(inputs, contract.EN_FIRST_EMIT.name, 0, 0, 4096)
    priority = _int_input(inputs, contract.EN_PRIORITY.name, 0, 0, max(contract.PRIORITIES.values()))
    timeout_ms = _int_input(inputs, contract.EN_TIMEOUT_MS.name, 0, 0, 3_600_000)
    return EngineArgs(ids.astype(np.int64), spk, params, emit_tokens, priority, timeout_ms / 1000 or None,
                      first_emit, mode)


def _int_input(inputs: dict[str, np.ndarray], name: str, default: int, low: int, high: int) -> int:
    arr = inputs.get(name)
    if arr is None:
        return default
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise RequestError(f"{name} must be one integer")
    v = int(arr.reshape(-1)[0])
    if not low <= v <= high:
        raise RequestError(f"{name}={v} is out of range [{low}, {high}]")
    return v


# --------------------------------------------------------------------------------------
# BLS side: the Stages the entry models run against
# --------------------------------------------------------------------------------------
class BlsStages:
    """:class:`~chattts_serving.pipeline.Stages` over BLS calls to the other models."""

    def __init__(self, pb: Any, failure_threshold: int = 5, cooldown_s: float = 10.0) -> None:
        self.pb = pb
        self.breakers = {stage: GuardedBreaker(CircuitBreaker(stage, failure_threshold, cooldown_s))
                         for stage in ("frontend", "engine", "vocoder")}

    def _raise_if_error(self, response: Any, stage: str) -> None:
        breaker = self.breakers[stage]
        if response.has_error():
            err = error_from_bls(response.error())
            if err.kind == INTERNAL:
                breaker.failure()
            else:
                breaker.success()
            raise err
        breaker.success()

    def frontend(self, text: str, voice: str, request_id: str = "", refine_prompt: str | None = None,
                 refined_ids: np.ndarray | None = None) -> FrontendOutput:
        pb = self.pb
        self.breakers["frontend"].before_or_raise()
        inputs = [string_tensor(pb, contract.IN_TEXT.name, text), string_tensor(pb, contract.IN_VOICE.name, voice)]
        if refine_prompt is not None:
            inputs.append(string_tensor(pb, contract.IN_REFINE_PROMPT.name, refine_prompt))
        if refined_ids is not None:
            inputs.append(pb.Tensor(contract.FE_REFINED_IDS.name, np.ascontiguousarray(refined_ids, np.int32)))
        req = pb.InferenceRequest(model_name=contract.MODEL_FRONTEND, request_id=request_id, inputs=inputs,
                                  requested_output_names=[t.name for t in contract.FRONTEND_OUTPUTS])
        resp = req.exec()
        self._raise_if_error(resp, "frontend")

        def out(spec: contract.TensorSpec) -> np.ndarray:
            return pb.get_output_tensor_by_name(resp, spec.name).as_numpy()

        return FrontendOutput(out(contract.FE_INPUT_IDS), out(contract.FE_SPK_EMB),
                              _first_string(out(contract.FE_NORMALIZED)),
                              tuple(json.loads(_first_string(out(contract.FE_DROPPED)) or "[]")),
                              out(contract.FE_REFINE_IDS))

    def generate(self, input_ids: np.ndarray, spk_emb: np.ndarray | None, params: SamplingParams,
                 emit_tokens: int, priority: int = 0, timeout_s: float | None = None,
                 first_emit_tokens: int = 0, request_id: str = "", mode: str = MODE_CODE) -> EngineStream:
        self.breakers["engine"].before_or_raise()
        return EngineStream(self.pb, input_ids, spk_emb, params, emit_tokens, priority, timeout_s,
                            self.breakers["engine"], first_emit_tokens, request_id, mode)

    def vocode(self, path: str, window: np.ndarray, request_id: str = "") -> np.ndarray:
        pb = self.pb
        self.breakers["vocoder"].before_or_raise()
        spec = contract.VO_HIDDEN if path == "hidden" else contract.VO_CODES
        arr = np.ascontiguousarray(window[None], dtype=spec.np_dtype)
        req = pb.InferenceRequest(model_name=contract.VOCODER_PATHS[path], inputs=[pb.Tensor(spec.name, arr)],
                                  requested_output_names=[contract.VO_AUDIO.name], request_id=request_id)
        resp = req.exec()
        self._raise_if_error(resp, "vocoder")
        return pb.get_output_tensor_by_name(resp, contract.VO_AUDIO.name).as_numpy()[0]


class GuardedBreaker:
    """A :class:`CircuitBreaker` whose open state surfaces as an UNAVAILABLE RequestError."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def before_or_raise(self) -> None:
        try:
            self.breaker.before()
        except CircuitOpen as exc:
            raise RequestError(f"server unavailable: {exc}", UNAVAILABLE) from None

    def success(self) -> None:
        self.breaker.success()

    def failure(self) -> None:
        self.breaker.failure()


class EngineStream:
    """One sequence on the GPT engine over a decoupled BLS call: iterate for
    :class:`TokenBatch` es; :meth:`cancel` ends it early (Triton 2.51's BLS cannot cancel a
    request it sent, so a control request names the sequence by its ``stream_id``)."""

    def __init__(self, pb: Any, input_ids: np.ndarray, spk_emb: np.ndarray | None, params: SamplingParams,
                 emit_tokens: int, priority: int = 0, timeout_s: float | None = None,
                 breaker: GuardedBreaker | None = None, first_emit_tokens: int = 0, request_id: str = "",
                 mode: str = MODE_CODE) -> None:
        self.pb = pb
        self.breaker = breaker
        self.stream_id = uuid.uuid4().hex
        inputs = [pb.Tensor(contract.FE_INPUT_IDS.name, input_ids.astype(np.int32)),
                  string_tensor(pb, contract.EN_MODE.name, mode),
                  pb.Tensor(contract.EN_EMIT_TOKENS.name, np.array([emit_tokens], np.int32)),
                  string_tensor(pb, contract.EN_STREAM_ID.name, self.stream_id),
                  pb.Tensor(contract.EN_PRIORITY.name, np.array([priority], np.int32)),
                  pb.Tensor(contract.EN_FIRST_EMIT.name, np.array([first_emit_tokens], np.int32))]
        if spk_emb is not None:
            inputs.append(pb.Tensor(contract.EN_SPK_EMB.name, spk_emb.astype(np.float32)))
        if timeout_s is not None:
            inputs.append(pb.Tensor(contract.EN_TIMEOUT_MS.name, np.array([int(timeout_s * 1000) + 1], np.int64)))
        for spec in contract.SAMPLING_PARAMS:
            dtype = contract.TensorSpec(spec.name, spec.triton_dtype, (1,)).np_dtype
            inputs.append(pb.Tensor(spec.name, np.array([getattr(params, spec.name)], dtype=dtype)))
        req = pb.InferenceRequest(model_name=contract.MODEL_ENGINE, inputs=inputs, request_id=request_id,
                                  requested_output_names=[t.name for t in contract.ENGINE_OUTPUTS])
        self._responses = req.exec(decoupled=True)
        self.finished = False  # the engine's last response for this sequence has been read

    def __iter__(self) -> Iterator[TokenBatch]:
        pb = self.pb
        for resp in self._responses:
            if resp.has_error():
                self.finished = True  # the engine's errors are final responses
                err = error_from_bls(resp.error())
                if self.breaker is not None and err.kind == INTERNAL:
                    self.breaker.failure()
                raise err
            codes_t = pb.get_output_tensor_by_name(resp, contract.EN_CODES.name)
            if codes_t is None:
                continue  # the empty response that carries only the final flag
            hidden = pb.get_output_tensor_by_name(resp, contract.EN_HIDDEN.name).as_numpy()
            stop = _first_string(pb.get_output_tensor_by_name(resp, contract.EN_STOP.name).as_numpy())
            batch = TokenBatch(codes_t.as_numpy(), hidden, stop)
            if batch.stop_reason.startswith(contract.STOP_ERROR_PREFIX):
                for _ in self._responses:
                    pass
                self.finished = True
                kind, _, message = batch.stop_reason[len(contract.STOP_ERROR_PREFIX):].partition(":")
                if self.breaker is not None and kind == INTERNAL:
                    self.breaker.failure()
                raise RequestError(message, kind)
            if batch.stop_reason:
                if self.breaker is not None:
                    self.breaker.success()
                # Consume the final-flag response before handing over the last batch: an
                # unfinished iterator keeps the calling model from unloading at shutdown.
                for _ in self._responses:
                    pass
                self.finished = True
            yield batch
        self.finished = True

    def request_cancel(self) -> None:
        """Ask the engine to end the sequence (any thread); iteration then ends with a
        ``cancelled`` batch."""
        pb = self.pb
        req = pb.InferenceRequest(model_name=contract.MODEL_ENGINE,
                                  inputs=[string_tensor(pb, contract.EN_STREAM_ID.name, self.stream_id),
                                          string_tensor(pb, contract.EN_CONTROL.name, "cancel")],
                                  requested_output_names=[t.name for t in contract.ENGINE_OUTPUTS])
        for _ in req.exec(decoupled=True):
            pass

    def cancel(self) -> None:
        """End the sequence in the engine and drain its responses (an unfinished BLS
        iterator would keep the calling model from unloading). A no-op once the engine's last
        response was read: asking a finished BLS iterator for more blocks forever."""
        if self.finished:
            return
        self.request_cancel()
        for _ in self._responses:
            pass
        self.finished = True


class StreamGuard:
    """The client side of one stream: chunks, then exactly one final response (or error).

    ``touch()`` records progress; a :class:`CancelWatcher` with a stall limit ends a stream
    that made none for that long (the GPT engine's process died: Triton 2.51 then never
    answers the BLS iterator) with an explicit error, and the stream's own thread, should it
    ever wake, finds the stream closed and sends nothing more.
    """

    def __init__(self, pb: Any, sender: Any) -> None:
        self.pb, self.sender = pb, sender
        self.last_activity = time.monotonic()
        self.closed = False
        self.closed_by_watchdog = False
        self._lock = threading.Lock()

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def is_cancelled(self) -> bool:
        """The client cancelled; False once the stream is closed. Asking Triton about a
        request that has completed crashes it (2.51), so the check and the closing of the
        stream exclude each other."""
        with self._lock:
            return False if self.closed else bool(self.sender.is_cancelled())

    def send_chunk(self, tensor_name: str, chunk: np.ndarray, info: str | None = None) -> None:
        """Send one audio chunk (1-D float32), with the ``info`` JSON string when given."""
        outs = [self.pb.Tensor(tensor_name, chunk)]
        if info is not None:
            outs.append(string_tensor(self.pb, contract.OUT_INFO.name, info))
        with self._lock:
            if not self.closed:
                self.sender.send(self.pb.InferenceResponse(output_tensors=outs))
        self.touch()

    def finish(self, info: str | None = None) -> bool:
        """Send the final response (carrying the ``info`` JSON string when given, else empty)
        unless the stream is already closed; True if this call closed it."""
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            if info is None:
                self.sender.send(flags=final)
            else:
                resp = self.pb.InferenceResponse(output_tensors=[string_tensor(self.pb, contract.OUT_INFO.name, info)])
                self.sender.send(resp, flags=final)
            return True

    def fail(self, exc: RequestError, by_watchdog: bool = False) -> bool:
        """End the stream with ``exc`` unless already closed; True if this call closed it."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            self.closed_by_watchdog = by_watchdog
            send_final_error(self.pb, self.sender, exc)
            return True


class CancelWatcher:
    """Polls the live streams' ``is_cancelled()`` every ``interval_s`` on one thread and runs
    their ``on_cancel`` once, so that a client's cancel reaches the engine within about one
    decode step even while the stream's own thread waits for tokens. With ``stall_s`` it also
    ends streams whose guard saw no progress for that long (see :class:`StreamGuard`)."""

    def __init__(self, interval_s: float = 0.005, stall_s: float | None = None,
                 on_stall: Any = None) -> None:
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.on_stall = on_stall
        self._watched: dict[int, tuple[Any, Any]] = {}
        self._guards: dict[int, tuple[Any, Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="cancel-watch", daemon=True).start()

    def _add(self, table: dict[int, tuple[Any, Any]], entry: tuple[Any, Any]) -> Any:
        """Put ``entry`` into ``table`` under a new key; returns the function that removes it."""
        key = next(self._ids)
        with self._lock:
            table[key] = entry

        def remove() -> None:
            with self._lock:
                table.pop(key, None)
        return remove

    def guard(self, guard: StreamGuard, context: Any) -> Any:
        """Watch ``guard`` for stalls; returns a function that stops watching it.
        ``on_stall(guard, context)`` runs (on the watcher thread) when it stalls."""
        return self._add(self._guards, (guard, context))

    def watcher(self, is_cancelled: Any) -> Any:
        """A ``pipeline.Watch`` for one stream whose client is asked with ``is_cancelled()``."""
        return lambda on_cancel: self._add(self._watched, (is_cancelled, on_cancel))

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval_s)
            fire = []
            # is_cancelled() runs under the lock that unwatch() takes: once a stream has
            # unwatched (before it sends its final response) it is never polled again. Polling
            # a sender whose request has completed crashes Triton 2.51 (use after free in
            # TRITONBACKEND_ResponseFactoryIsCancelled).
            with self._lock:
                for key, (is_cancelled, on_cancel) in list(self._watched.items()):
                    try:
                        if is_cancelled():
                            del self._watched[key]
                            fire.append(on_cancel)
                    except Exception:  # a failing check must not stop the watcher
                        log.exception("cancel watcher")
            for on_cancel in fire:
                try:
                    on_cancel()
                except Exception:
                    log.exception("cancel watcher")
            if self.stall_s is None:
                continue
            now = time.monotonic()
            with self._lock:
                stalled = [(k, g, c) for k, (g, c) in self._guards.items() if now - g.last_activity > self.stall_s]
                for k, _, _ in stalled:
                    del self._guards[k]
            for _, g, c in stalled:
                try:
                    self.on_stall(g, c)
                except Exception:
                    log.exception("stall watcher")


class StreamSlots:
    """Admission limit of the streaming entry model: at most ``limit`` live streams.

    A decoupled model that hands requests to threads empties Triton's queue at once, so the
    queue policy cannot bound live streams; this counter does (../shared/TRITON.md).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.live = 0
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self.live >= self.limit:
                return False
            self.live += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.live -= 1
