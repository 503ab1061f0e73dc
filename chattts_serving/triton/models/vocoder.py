"""The vocoder models: ``chattts_vocoder`` / ``chattts_dvae_vocoder`` (the streaming and
offline doors' vocoder, dynamic batching) and ``chattts_ensemble_vocoder`` (the ensemble
door's last step)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from ... import contract
from ...audio.vocoder import CarriedStreams, StreamingVocoderRunner, VocoderRunner
from ...contract import VocoderPath
from ...errors import RequestError, from_message
from ...serving.logs import log_event
from ..compat import EnsembleStepHooks, triton_error
from ..metrics import MemoryGauges, VocoderMetrics
from ..setup import ModelSetup
from ..tensors import first_string, string_tensor
from .base import DecoupledModel, TritonModel, precision_label

log = logging.getLogger(__name__)


class VocoderModel(TritonModel):
    """chattts_vocoder / chattts_dvae_vocoder (dynamic batching): a token window, hidden (FP32
    [T, H]) or codes (INT32 [T, 4]), -> audio (FP32 [512*T-256]) at 24 kHz. Windows of equal
    length in one batch run as one ONNX Runtime call; one ``vocoder_batch`` log line per
    batch (request ids, window tokens, ONNX Runtime calls, duration in ms)."""

    def start(self, setup: ModelSetup) -> None:
        self.memory = self.hooks.owns(MemoryGauges(self.pb, setup.name, setup.gpu_index))
        self.runner = _vocoder_runner(setup, setup.parameters["vocoder_path"])
        self.streams: CarriedStreams | None = None
        self.metrics = self.hooks.owns(VocoderMetrics(self.pb, setup.name))
        if setup.profile.stream.carry_vocoder_state:
            stateful = StreamingVocoderRunner(setup.artifacts, setup.parameters["vocoder_path"], setup.ort("vocoder"))
            log.info("%s: stateful vocoder graph %s", setup.name, stateful.graph.name)
            stateful.warm_up(setup.artifacts.hidden_size)
            p = setup.profile.entry
            self.streams = CarriedStreams(stateful, max_streams=2 * (p.max_concurrent_streams + p.offline_threads))

    def execute(self, requests: list[Any]) -> list[Any]:
        """Windows decoded alone, batched by length; a request with ``stream_id`` is a carried
        stream's window (:class:`~chattts_serving.audio.vocoder.CarriedStreams`), answered on its
        own, or its error (INVALID_ARG: out of order, not open, no carried state in this profile)."""
        pb, runner = self.pb, self.runner
        t0 = time.monotonic()
        windows = [pb.get_input_tensor_by_name(r, runner.input_name).as_numpy() for r in requests]
        audio: list[np.ndarray | RequestError | None] = [None] * len(requests)
        plain = []
        for i, r in enumerate(requests):
            sid = pb.get_input_tensor_by_name(r, contract.VO_STREAM_ID.name)
            if sid is None:
                plain.append(i)
                continue
            audio[i] = self._carried(first_string(sid.as_numpy()), windows[i],
                                     pb.get_input_tensor_by_name(r, contract.VO_STREAM_PLAN.name))
        lengths = sorted({windows[i].shape[1] for i in plain} - {0})
        for length in lengths:
            idx = [i for i in plain if windows[i].shape[1] == length]
            out = runner.run(np.concatenate([windows[i] for i in idx]))
            for row, i in enumerate(idx):
                audio[i] = out[row:row + 1]
        tokens = [int(w.shape[1]) for w in windows]
        log_event("vocoder_batch", model=self.name, stage="vocoder", request_ids=[r.request_id() for r in requests],
                  batch_size=len(requests), window_tokens=tokens, runs=len(lengths) + len(requests) - len(plain),
                  duration_ms=round((time.monotonic() - t0) * 1000, 1))
        self.metrics.vocoded(sum(tokens), len(self.streams) if self.streams is not None else 0)
        self.memory.maybe_update()
        return [pb.InferenceResponse(error=triton_error(pb, a)) if isinstance(a, RequestError)
                else pb.InferenceResponse(output_tensors=[pb.Tensor(contract.VO_AUDIO.name, a)]) for a in audio]

    def _carried(self, stream_id: str, window: np.ndarray, plan_tensor: Any) -> np.ndarray | RequestError:
        """One carried stream's window (1, T, H|4): its audio (1, n), or the error to answer."""
        if self.streams is None:
            return RequestError("this profile's vocoder carries no stream state (stream.carry_vocoder_state)",
                                param=contract.VO_STREAM_ID.name)
        if plan_tensor is None or plan_tensor.as_numpy().size != 3 or window.shape[0] != 1:
            return RequestError("a stream window needs one stream_plan [start, carry_from, action] and one window",
                                param=contract.VO_STREAM_PLAN.name)
        start, carry_from, action = (int(v) for v in plan_tensor.as_numpy().reshape(-1))
        try:
            return self.streams.vocode(stream_id, window[0], start, carry_from, action)[None]
        except ValueError as exc:
            return RequestError(str(exc), param=contract.VO_STREAM_PLAN.name)


def _vocoder_runner(setup: ModelSetup, path: str) -> VocoderRunner:
    """The vocoder graph of ``path`` at the profile's vocoder precision, logged and warmed up."""
    runner = VocoderRunner(setup.artifacts, path, setup.ort("vocoder"))
    log.info("%s: vocoder graph %s (precision %s)", setup.name, runner.graph.name,
             precision_label(setup, setup.ort("vocoder").precision, runner.source))
    runner.warm_up(setup.artifacts.hidden_size)
    return runner


class EnsembleVocoderModel(DecoupledModel):
    """chattts_ensemble_vocoder (decoupled, no Triton batching): the ensemble door's last step.
    Each request is one engine response (:data:`contract.WINDOW_OUTPUTS`): a window is vocoded
    (hidden path) and answered with the samples its ``window_plan`` keeps (``audio`` FP32
    [n]), its ``chunk_index`` (INT32 [1]) and, when ``window_info`` is not '', ``info``; a
    window with a ``window_error`` is answered with that error (the stream's, sent by the
    engine behind its earlier windows); a progress tick (only ``window_stream_id``) ends
    without a response.

    A request that Triton has marked cancelled (the ensemble marks every step it schedules
    after the client cancelled, and every step after the engine is this one) is not vocoded:
    its hooks cancel its stream in the engine, which drops the sequence at its next step and
    ends it with the final flag alone. Why no dynamic batcher: it answers a marked request
    CANCELLED itself, which ends the ensemble before the engine hears of the cancel (both:
    :mod:`~chattts_serving.triton.compat.ensemble`). So a window is vocoded on its own, in
    ``execute``, which also keeps one stream's chunks in the engine's order."""

    hooks_class = EnsembleStepHooks
    hooks: EnsembleStepHooks

    def start(self, setup: ModelSetup) -> None:
        self.memory = self.hooks.owns(MemoryGauges(self.pb, setup.name, setup.gpu_index))
        self.runner = _vocoder_runner(setup, VocoderPath.HIDDEN)

    def accept(self, request: Any, sender: Any) -> None:
        pb = self.pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        tensors = {spec.name: t.as_numpy() for spec in contract.WINDOW_OUTPUTS
                   if (t := pb.get_input_tensor_by_name(request, spec.name)) is not None}
        rid = tensors.get(contract.WIN_REQUEST_ID.name)  # windows carry it, ticks do not
        request_id = first_string(rid) if rid is not None else request.request_id()
        if request.is_cancelled():
            if (stream := tensors.get(contract.WIN_STREAM_ID.name)) is not None:
                self.hooks.relay_cancel(first_string(stream), request_id)
            sender.send(flags=final)
            return
        hidden, plan = tensors.get(contract.WIN_HIDDEN.name), tensors.get(contract.WIN_PLAN.name)
        if hidden is None or plan is None:  # a progress tick
            sender.send(flags=final)
            return
        error = tensors.get(contract.WIN_ERROR.name)
        if error is not None and (message := first_string(error)):
            sender.send(pb.InferenceResponse(error=triton_error(pb, from_message(message))), flags=final)
            return
        index, first, count = (int(v) for v in plan.reshape(-1)[:3])
        window = hidden.reshape(1, -1, hidden.shape[-1])
        t0 = time.monotonic()
        audio = self.runner.run(window)[0] if window.shape[1] else np.zeros(0, np.float32)
        log_event("vocoder_batch", model=self.name, stage="vocoder", request_ids=[request_id],
                  batch_size=1, window_tokens=[int(window.shape[1])], runs=int(window.shape[1] > 0),
                  duration_ms=round((time.monotonic() - t0) * 1000, 1))
        outs = [pb.Tensor(contract.OUT_AUDIO.name, np.ascontiguousarray(audio[first:first + count])),
                pb.Tensor(contract.OUT_CHUNK_INDEX.name, np.array([index], np.int32))]
        info = tensors.get(contract.WIN_INFO.name)
        if info is not None and (text := first_string(info)):
            outs.append(string_tensor(pb, contract.OUT_INFO.name, text))
        self.memory.maybe_update()
        sender.send(pb.InferenceResponse(output_tensors=outs), flags=final)
