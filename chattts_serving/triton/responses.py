"""Responses of the decoupled models, over a Triton response sender (``pb`` is the
``triton_python_backend_utils`` module, passed in).

* :class:`SenderChannel`: the :class:`~chattts_serving.serving.lifecycle.ResponseChannel` of an
  entry-model stream (audio chunks with ``info``, then the final response or one error);
* :class:`EngineSink`: the GPT engine's :class:`~chattts_serving.engine.sinks.TokenSink` for
  one sequence (token batches, then the last one with its stop reason and the final flag);
  an error travels as the stop reason ``error:<kind>:<message>``
  (:func:`chattts_serving.errors.encode_stop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import contract
from ..contract import StopReason
from ..errors import ErrorKind, RequestError, encode_stop
from ..serving.logs import log_event
from ..serving.windows import EnsembleWindow, EnsembleWindowPlanner
from .compat.error_codes import triton_error
from .tensors import string_tensor


def send_final_error(pb: Any, sender: Any, exc: RequestError) -> None:
    """End a decoupled stream with ``exc`` (final flag set, so the client never hangs)."""
    sender.send(pb.InferenceResponse(error=triton_error(pb, exc)), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class SenderChannel:
    """An entry-model stream's client: ``audio`` (FP32 [n]) responses, the first with ``info``
    (BYTES [1] JSON), then a final response carrying only ``info``, or one error."""

    def __init__(self, pb: Any, sender: Any) -> None:
        self.pb, self.sender = pb, sender

    def send_audio(self, chunk: np.ndarray, info: str | None) -> None:
        outs = [self.pb.Tensor(contract.OUT_AUDIO.name, chunk)]
        if info is not None:
            outs.append(string_tensor(self.pb, contract.OUT_INFO.name, info))
        self.sender.send(self.pb.InferenceResponse(output_tensors=outs))

    def send_final(self, info: str | None) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if info is None:
            self.sender.send(flags=final)
            return
        resp = self.pb.InferenceResponse(output_tensors=[string_tensor(self.pb, contract.OUT_INFO.name, info)])
        self.sender.send(resp, flags=final)

    def send_error(self, exc: RequestError) -> None:
        send_final_error(self.pb, self.sender, exc)

    def is_cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


class OfflineChannel:
    """A ``chattts_offline`` request's client: one response with the whole utterance (the
    audio of the one ``send_audio``, kept until the final) and ``info``, or one error."""

    def __init__(self, pb: Any, sender: Any) -> None:
        self.pb, self.sender = pb, sender
        self._audio = np.zeros(0, np.float32)

    def send_audio(self, chunk: np.ndarray, info: str | None) -> None:
        self._audio = chunk

    def send_final(self, info: str | None) -> None:
        pb = self.pb
        outs = [pb.Tensor(contract.OUT_AUDIO.name, self._audio),
                string_tensor(pb, contract.OUT_INFO.name, info or "{}")]
        self.sender.send(pb.InferenceResponse(output_tensors=outs), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def send_error(self, exc: RequestError) -> None:
        send_final_error(self.pb, self.sender, exc)

    def is_cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


def engine_outputs(pb: Any, codes: np.ndarray, hidden: np.ndarray, stop: str) -> list[Any]:
    """The GPT engine's output tensors: codes (N, 4) INT32, hidden (N, H) FP32, stop_reason."""
    return [pb.Tensor(contract.EN_CODES.name, np.ascontiguousarray(codes, np.int32)),
            pb.Tensor(contract.EN_HIDDEN.name, np.ascontiguousarray(hidden, np.float32)),
            string_tensor(pb, contract.EN_STOP.name, stop)]


def send_engine_error(pb: Any, sender: Any, exc: RequestError) -> None:
    """End a GPT-engine sequence with an error its BLS caller can receive: an empty response
    whose stop reason is :func:`~chattts_serving.errors.encode_stop`, then the final flag."""
    empty = (np.zeros((0, contract.NUM_VQ), np.int32), np.zeros((0, 0), np.float32))
    sender.send(pb.InferenceResponse(output_tensors=engine_outputs(pb, *empty, encode_stop(exc))))
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class EngineSink:
    """The engine's token sink for one sequence, writing to its decoupled response sender.

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

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> None:
        self._tokens += len(codes)
        if self._first_token_s is None and len(codes):
            self._first_token_s = time.monotonic()
        if stop_reason is not None:
            self._log_end("cancelled" if stop_reason == StopReason.CANCELLED else "ok", stop_reason)
        if stop_reason == StopReason.CANCELLED and self.sender.is_cancelled():
            self.closed = True  # the client is gone: nobody to tell
            return
        # The final flag travels alone, after the last batch: a BLS caller's iterator releases a
        # final response's shared memory when it finishes, so a last batch must not be final.
        self.sender.send(self.pb.InferenceResponse(output_tensors=engine_outputs(self.pb, codes, hidden,
                                                                                 stop_reason or "")))
        if stop_reason is not None:
            self.closed = True
            self.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def error(self, exc: RequestError) -> None:
        """End the sequence with ``exc``: a passed deadline (DEADLINE, which does not count
        against the caller's circuit breaker) or an engine failure (INTERNAL)."""
        self.closed = True
        self._log_end("expired" if exc.kind == ErrorKind.DEADLINE else "error", f"error: {exc}")
        send_engine_error(self.pb, self.sender, exc)

    def cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


class EnsembleSink(EngineSink):
    """The engine's sink for one sequence of the ensemble door (ensemble mode): its responses are
    vocoder windows (:class:`~chattts_serving.serving.windows.EnsembleWindowPlanner`), the stream's
    last one (or its error) with the final flag; every token batch that completes no window
    is a progress tick carrying only ``window_stream_id``, so that the vocoder step sees a
    client's cancel within ``stream.emit_tokens`` decode steps. An error travels as an empty
    window whose ``window_error`` the vocoder step answers, after the windows before it
    (:mod:`~chattts_serving.triton.compat.ensemble`). A cancelled sequence ends with the final
    flag alone. ``on_close`` runs once when the stream ends (its ensemble-door slot)."""

    def __init__(self, pb: Any, sender: Any, model: str, request_id: str, prompt_tokens: int,
                 planner: EnsembleWindowPlanner, stream_id: str, on_close: Callable[[], object]) -> None:
        super().__init__(pb, sender, model, request_id, prompt_tokens)
        self.planner, self.stream_id, self._on_close = planner, stream_id, on_close

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()

    def _stream_id(self) -> Any:
        return string_tensor(self.pb, contract.WIN_STREAM_ID.name, self.stream_id)

    def _send_window(self, w: EnsembleWindow, error: str = "") -> None:
        pb = self.pb
        outs = [pb.Tensor(contract.WIN_HIDDEN.name, w.hidden),
                pb.Tensor(contract.WIN_PLAN.name, np.array([w.index, w.keep_first, w.keep_samples], np.int32)),
                string_tensor(pb, contract.WIN_INFO.name, w.info), string_tensor(pb, contract.WIN_ERROR.name, error),
                self._stream_id(), string_tensor(pb, contract.WIN_REQUEST_ID.name, self.request_id)]
        final = w.final or bool(error)
        self.sender.send(pb.InferenceResponse(output_tensors=outs),
                         flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> None:
        self._tokens += len(codes)
        if self._first_token_s is None and len(codes):
            self._first_token_s = time.monotonic()
        if stop_reason == StopReason.CANCELLED:
            self._log_end("cancelled", stop_reason)
            self._end()
            self.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        try:
            windows = self.planner.add(codes, hidden, stop_reason)
        except RequestError as exc:
            self.error(exc)
            return
        if stop_reason is not None:
            self._log_end("ok", stop_reason)
            self._end()
        for w in windows:
            self._send_window(w)
        if not windows:
            self.sender.send(self.pb.InferenceResponse(output_tensors=[self._stream_id()]))

    def cancelled(self) -> bool:
        """Always False, without asking Triton: the engine asks every sequence's sink at every
        step, and ``response_sender.is_cancelled()`` is a round trip to the server (measured
        with py-spy at c=16: 14 % of the engine thread's time), and the running step is never
        marked cancelled (:mod:`~chattts_serving.triton.compat.ensemble`): a
        client's cancel comes through the ensemble's vocoder step instead."""
        return False

    def error(self, exc: RequestError) -> None:
        self._log_end("expired" if exc.kind == ErrorKind.DEADLINE else "error", f"error: {exc}")
        self._end()
        empty = EnsembleWindow(np.zeros((0, self.planner.hidden_size), np.float32), self.planner.index, 0, 0, "",
                              True)
        self._send_window(empty, exc.wire())
