"""The pipeline's stages over BLS calls (:class:`BlsStages`), as the entry models run them.

Every call goes through its stage's circuit breaker
(:class:`~chattts_serving.serving.resilience.CircuitBreaker`) and settles it exactly once:
success, failure (INTERNAL) or release (busy, deadline, cancel, or a call abandoned by its
caller), so a half-open breaker's trial can never stay in flight
(:func:`~chattts_serving.serving.resilience.settle`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from .. import contract
from ..contract import StopReason, VocoderPath
from ..engine.request import SequenceRequest
from ..errors import decode_stop
from ..serving.boundary import CarriedWindow, FrontendCall, FrontendOutput, TokenBatch, frontend_outputs
from ..serving.request import CONTROL_CANCEL, frontend_inputs
from ..serving.resilience import BreakerCall, CircuitBreaker, enter, settle
from .compat.cancels import cancel_address, send_cancel
from .compat.error_codes import error_from_triton
from .compat.grave import keep_iterator
from .compat.receipts import ReceiptBoard, StreamReceipts, receipt_board
from .tensors import first_string, string_tensor

log = logging.getLogger(__name__)

FRONTEND_CALL_OUTPUTS = tuple(t for t in contract.FRONTEND_OUTPUTS if t not in contract.FRONTEND_REQUEST_OUTPUTS)
"""The front-end outputs of a pipeline call (the ensemble request's own are not asked for)."""

STAGES = ("frontend", "engine", "vocoder")
"""The stages of the pipeline, each behind its own circuit breaker."""


class BlsStages:
    """:class:`~chattts_serving.serving.boundary.Stages` over BLS calls to the other models
    (``pb``: the ``triton_python_backend_utils`` module). ``failure_threshold`` consecutive
    INTERNAL failures of a stage open its breaker for ``cooldown_s`` seconds. Engine streams
    are cancelled over the engine's cancel socket (:mod:`~chattts_serving.triton.compat.cancels`),
    whose address is this server's, and read once the engine's receipt says a response is
    queued (``receipts``: this stub's board by default, :mod:`~chattts_serving.triton.compat.receipts`)."""

    def __init__(self, pb: Any, failure_threshold: int = 5, cooldown_s: float = 10.0,
                 receipts: ReceiptBoard | Literal["stub"] | None = "stub") -> None:
        self.pb = pb
        self.breakers = {stage: CircuitBreaker(stage, failure_threshold, cooldown_s) for stage in STAGES}
        self.cancel_address = cancel_address(contract.MODEL_ENGINE)
        self.receipts = receipt_board() if receipts == "stub" else receipts

    def _unary(self, stage: str, request: Any) -> Any:
        """Run one BLS call through ``stage``'s breaker: the response, or RequestError (the
        stage's own error, kind restored from its message). An exception from ``exec`` itself
        counts as a failure of the stage."""
        call = enter(self.breakers[stage])
        try:
            resp = request.exec()
        except BaseException:
            call.failure()
            raise
        error = error_from_triton(resp.error()) if resp.has_error() else None
        settle(call, error)
        if error is not None:
            raise error
        return resp

    def frontend(self, call: FrontendCall) -> list[FrontendOutput]:
        pb = self.pb
        resp = self._unary("frontend", pb.InferenceRequest(
            model_name=contract.MODEL_FRONTEND, request_id=call.request_id,
            inputs=[pb.Tensor(name, arr) for name, arr in frontend_inputs(call).items()],
            requested_output_names=[t.name for t in FRONTEND_CALL_OUTPUTS]))
        return frontend_outputs({t.name: pb.get_output_tensor_by_name(resp, t.name).as_numpy()
                                 for t in FRONTEND_CALL_OUTPUTS})

    def generate(self, call: SequenceRequest) -> EngineStream:
        return EngineStream(self.pb, call, enter(self.breakers["engine"]), self.cancel_address,
                            receipts=self.receipts)

    def vocode(self, path: VocoderPath, window: np.ndarray, request_id: str = "") -> np.ndarray:
        pb = self.pb
        spec = contract.VO_HIDDEN if path == VocoderPath.HIDDEN else contract.VO_CODES
        arr = np.ascontiguousarray(window[None], dtype=spec.np_dtype)
        resp = self._unary("vocoder", pb.InferenceRequest(
            model_name=contract.VOCODER_PATHS[path], inputs=[pb.Tensor(spec.name, arr)],
            requested_output_names=[contract.VO_AUDIO.name], request_id=request_id))
        return pb.get_output_tensor_by_name(resp, contract.VO_AUDIO.name).as_numpy()[0]

    def vocode_carried(self, path: VocoderPath, window: np.ndarray, request_id: str,
                       carried: CarriedWindow) -> np.ndarray:
        pb = self.pb
        spec = contract.VO_HIDDEN if path == VocoderPath.HIDDEN else contract.VO_CODES
        inputs = [pb.Tensor(spec.name, np.ascontiguousarray(window[None], dtype=spec.np_dtype)),
                  pb.Tensor(contract.VO_STREAM_ID.name, np.array([[carried.stream_id]], dtype=np.object_)),
                  pb.Tensor(contract.VO_STREAM_PLAN.name,
                            np.array([[carried.start, carried.carry_from, carried.action]], np.int32))]
        resp = self._unary("vocoder", pb.InferenceRequest(
            model_name=contract.VOCODER_PATHS[path], inputs=inputs,
            requested_output_names=[contract.VO_AUDIO.name], request_id=request_id))
        return pb.get_output_tensor_by_name(resp, contract.VO_AUDIO.name).as_numpy()[0]


def engine_inputs(pb: Any, call: SequenceRequest, stream_id: str, delivery_address: str = "") -> list[Any]:
    """The GPT engine's input tensors for ``call`` (``contract.ENGINE_INPUTS``); with a
    ``delivery_address``, the engine writes a receipt there after each response it sent."""
    inputs = [pb.Tensor(contract.FE_INPUT_IDS.name, np.asarray(call.input_ids).astype(np.int32)),
              string_tensor(pb, contract.EN_MODE.name, call.mode),
              pb.Tensor(contract.EN_EMIT_TOKENS.name, np.array([call.emit_tokens], np.int32)),
              string_tensor(pb, contract.EN_STREAM_ID.name, stream_id),
              pb.Tensor(contract.EN_PRIORITY.name, np.array([call.priority], np.int32))]
    if call.emit_at:
        inputs.append(pb.Tensor(contract.EN_EMIT_AT.name, np.array(call.emit_at, np.int32)))
    if call.spk_emb is not None:
        inputs.append(pb.Tensor(contract.EN_SPK_EMB.name, call.spk_emb.astype(np.float32)))
    if call.timeout_s is not None:
        inputs.append(pb.Tensor(contract.EN_TIMEOUT_MS.name, np.array([int(call.timeout_s * 1000) + 1], np.int64)))
    if call.prompt_codes is not None:
        inputs.append(pb.Tensor(contract.EN_PROMPT_CODES.name, np.ascontiguousarray(call.prompt_codes, np.int32)))
    if delivery_address:
        inputs.append(string_tensor(pb, contract.EN_DELIVERY_ADDRESS.name, delivery_address))
    for spec in contract.SAMPLING_PARAMS:
        inputs.append(pb.Tensor(spec.name, np.array([getattr(call.params, spec.name)], dtype=spec.tensor().np_dtype)))
    return inputs


class _Done:
    """An exhausted response iterator (what an :class:`EngineStream` holds once its BLS
    iterator is in the :class:`~chattts_serving.triton.compat.grave.IteratorGrave`)."""

    def __iter__(self) -> Iterator[Any]:
        return iter(())


class EngineStream:
    """One sequence on the GPT engine over a decoupled BLS call: iterate for
    :class:`~chattts_serving.serving.boundary.TokenBatch` es; :meth:`cancel` ends it early
    (:mod:`~chattts_serving.triton.compat.cancels`: a datagram to the engine's cancel
    socket at ``cancel_address`` names the sequence by its ``stream_id``, or, when nothing
    listens there, a control request to the engine model does). ``call`` (the engine breaker's) is settled exactly once:
    success at the last batch, failure on an INTERNAL error, release otherwise.

    With ``receipts`` (this stub's :class:`~chattts_serving.triton.compat.receipts.ReceiptBoard`)
    each response is read only after the engine's receipt for it arrived
    (:class:`~chattts_serving.triton.compat.receipts.StreamReceipts`), so that the BLS iterator
    never waits inside ``Next``. The first response is there when ``exec`` returns (the
    engine's acknowledgement, or Triton's error for an engine that is down: read at once)."""

    def __init__(self, pb: Any, call: SequenceRequest, breaker_call: BreakerCall, cancel_address: str = "",
                 receipts: ReceiptBoard | None = None) -> None:
        self.pb = pb
        self.breaker_call = breaker_call
        self.cancel_address = cancel_address
        self.stream_id = uuid.uuid4().hex
        self._receipts = StreamReceipts(receipts, self.stream_id)
        try:
            req = pb.InferenceRequest(model_name=contract.MODEL_ENGINE,
                                      inputs=engine_inputs(pb, call, self.stream_id, self._receipts.address),
                                      request_id=call.request_id,
                                      requested_output_names=[t.name for t in contract.ENGINE_OUTPUTS])
            self._responses = req.exec(decoupled=True)
        except BaseException:
            self._receipts.close()
            breaker_call.release()
            raise
        self.finished = False  # the engine's last response for this sequence has been read

    def _read(self) -> Iterator[Any]:
        """The responses, each read once its receipt arrived; ends after the final one (a
        Triton error, or the response without codes that carries only the final flag) without
        asking the iterator again (there is no receipt to wait for)."""
        pb = self.pb
        while not self.finished:
            self._receipts.before_read()
            try:
                resp = next(self._responses)
            except StopIteration:
                self._finish()
                return
            final = resp.has_error() or pb.get_output_tensor_by_name(resp, contract.EN_CODES.name) is None
            yield resp
            if final:
                self._finish()
                return

    def _drain(self) -> None:
        """Read the rest of the responses (the final flag): an unfinished BLS iterator keeps
        the calling model from unloading at shutdown."""
        for _ in self._read():
            pass
        self._finish()

    def _finish(self) -> None:
        """The engine's last response has been read: hand the BLS iterator to the
        :class:`~chattts_serving.triton.compat.grave.IteratorGrave`, which frees it after the
        stub's cleanup of it (never the stub's own thread, nor the cyclic garbage collector: see
        :func:`chattts_serving.errors.drop_tracebacks`)."""
        self.finished = True
        self._receipts.close()
        if not isinstance(self._responses, _Done):
            keep_iterator(self._responses)
            self._responses = _Done()

    def __iter__(self) -> Iterator[TokenBatch]:
        pb = self.pb
        try:
            for resp in self._read():
                if resp.has_error():
                    err = error_from_triton(resp.error())
                    del resp
                    self._finish()  # the engine's errors are final responses
                    settle(self.breaker_call, err)
                    raise err
                codes_t = pb.get_output_tensor_by_name(resp, contract.EN_CODES.name)
                if codes_t is None:
                    continue  # the empty response that carries only the final flag
                hidden = pb.get_output_tensor_by_name(resp, contract.EN_HIDDEN.name).as_numpy()
                stop = first_string(pb.get_output_tensor_by_name(resp, contract.EN_STOP.name).as_numpy())
                failed = decode_stop(stop)
                if failed is not None:
                    self._drain()
                    settle(self.breaker_call, failed)
                    raise failed
                batch = TokenBatch(codes_t.as_numpy(), hidden, StopReason(stop) if stop else None)
                if batch.stop_reason is not None:
                    self.breaker_call.success()
                    self._drain()  # before handing over the last batch
                yield batch
            self._finish()
        finally:
            self.breaker_call.release()  # a no-op once settled; else the caller abandoned the stream

    def request_cancel(self) -> None:
        """Ask the engine to end the sequence (any thread); iteration then ends with a
        CANCELLED batch. Over the cancel socket when the engine listens there (never blocks),
        else with a control request to the engine model (a BLS round trip; see
        :mod:`~chattts_serving.triton.compat.cancels` for why that is only the fallback)."""
        if self.cancel_address and send_cancel(self.cancel_address, self.stream_id):
            return
        pb = self.pb
        req = pb.InferenceRequest(model_name=contract.MODEL_ENGINE,
                                  inputs=[string_tensor(pb, contract.EN_STREAM_ID.name, self.stream_id),
                                          string_tensor(pb, contract.EN_CONTROL.name, CONTROL_CANCEL)],
                                  requested_output_names=[t.name for t in contract.ENGINE_OUTPUTS])
        responses = req.exec(decoupled=True)
        for _ in responses:
            pass
        keep_iterator(responses)

    def cancel(self) -> None:
        """End the sequence in the engine and drain its responses. A no-op once the engine's
        last response was read: asking a finished BLS iterator for more blocks forever."""
        self.breaker_call.release()
        if self.finished:
            return
        self.request_cancel()
        self._drain()

