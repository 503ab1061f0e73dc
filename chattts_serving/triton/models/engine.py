"""``chattts_gpt``: the in-flight batching GPT engine, and the ensemble door's engine step
(ensemble mode)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np

from ... import contract
from ...engine.gpt import Embeddings, GptStepRunner
from ...engine.kernels import choose_kernels
from ...engine.request import SequenceRequest
from ...engine.scheduler import Engine
from ...engine.sequence import Sequence
from ...errors import RequestError, drop_tracebacks
from ...serving.admission import EnsembleDoor, SlotToken
from ...serving.entry_runtime import internal_error
from ...serving.request import EngineControl, int_input, parse_engine
from ...serving.windows import EnsembleWindowPlanner
from ..compat import EngineHooks
from ..metrics import EngineMetrics, MemoryGauges
from ..responses import EngineSink, EnsembleSink, send_engine_error, send_final_error
from ..setup import ModelSetup, lower_priority
from ..tensors import first_string, request_inputs
from .base import DecoupledModel, precision_label

log = logging.getLogger(__name__)


def header_request_id(header: str) -> str:
    """The ``request_id`` of an ``info`` header JSON (the ensemble's front end puts the client's
    or a generated one there); '' when the header has none or is not JSON."""
    try:
        value = json.loads(header).get("request_id", "") if header else ""
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


class EngineModel(DecoupledModel):
    """chattts_gpt: the in-flight batching GPT engine, KV caches resident. input_ids (INT32
    [T]), spk_emb (FP32 [H], code mode), mode, sampling parameters, emit_tokens -> a stream of
    codes (INT32 [N, 4]), hidden (FP32 [N, H]), stop_reason (BYTES [1]), starting with an empty
    acknowledgement; or a control request ('cancel' + stream_id), answered with the final flag.

    With ``window_lookahead_tokens`` (the ensemble door) the sequence answers in ensemble mode
    (:class:`~chattts_serving.triton.responses.EnsembleSink`): vocoder windows of the profile's
    chunk schedule (``window_hidden``, ``window_plan``, ``window_info``, ``window_error``,
    ``window_stream_id``) and progress ticks; errors are Triton error responses (final). The
    ensemble door's admission is decided here, where its streams start
    (:class:`~chattts_serving.serving.admission.EnsembleDoor`)."""

    sends_from_threads = contract.ENGINE_INPUTS
    hooks_class = EngineHooks
    hooks: EngineHooks

    def start(self, setup: ModelSetup) -> None:
        ep = setup.profile.engine
        self.hidden_size = setup.artifacts.hidden_size
        runner = GptStepRunner(setup.artifacts, setup.ort("engine"))
        kv = runner.opts.kv_cache
        log.info("%s: GPT step graph %s (precision %s), KV cache %s", setup.name, runner.graph.name,
                 precision_label(setup, runner.opts.precision, contract.GPT_GRAPH),
                 runner.kv_precision if runner.kv_precision is kv else f"{kv}: {runner.kv_precision}")
        choose_kernels(runner)  # the fastest int8 MatMul kernel and int8-cache attention on this CPU (logged)
        self.metrics = self.hooks.owns(EngineMetrics(self.pb, setup.name, ep.max_batch_size * ep.max_context_tokens,
                                                     MemoryGauges(self.pb, setup.name, setup.gpu_index)))
        self.engine = Engine(runner, Embeddings(setup.artifacts), ep.engine_config(), self.metrics)
        self.engine.warm_up(text_head=self.engine.emb.has_text_head)  # refine-text needs the text head
        if not self.engine.emb.has_text_head:
            log.warning("%s: the artifacts have no text head (exported before exporter version 3): "
                        "refine_text requests will fail until `make export` runs again", setup.artifacts.root)
        self.engine.start()
        if ep.nice:
            log.info("%s: niceness %d on %d threads (profile [engine] nice)", setup.name, ep.nice,
                     lower_priority(ep.nice))
        self.hooks.listen_cancels(self.engine.cancel)
        self.ensemble_door = EnsembleDoor(setup.profile.ensemble.max_concurrent_streams)

    def accept(self, request: Any, sender: Any) -> None:
        inputs = request_inputs(self.pb, request, contract.ENGINE_INPUTS)
        if contract.EN_WINDOW_LOOKAHEAD.name in inputs:
            try:
                self._accept_ensemble(request, sender, inputs)
            except RequestError as exc:
                drop_tracebacks(exc)
                send_final_error(self.pb, sender, exc)
            except Exception as exc:
                log.exception("%s: ensemble-mode request failed", self.name)
                drop_tracebacks(exc)
                send_final_error(self.pb, sender, internal_error(exc))
            return
        owner = request.request_id()
        req = parse_engine(inputs, self.hidden_size, self.setup.profile.engine.max_new_tokens_cap, owner)
        if isinstance(req, EngineControl):
            self.engine.cancel(req.stream_id)
            sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if not req.stream_id:  # a caller without a handle: the sequence is named by its request
            req = replace(req, stream_id=owner)
        deadline = time.monotonic() + req.timeout_s if req.timeout_s else None
        sink = EngineSink(self.pb, sender, self.name, owner, req.prompt_length)
        self.engine.submit(Sequence(req, sink, deadline_s=deadline, acknowledge=True))

    def _accept_ensemble(self, request: Any, sender: Any, inputs: dict[str, np.ndarray]) -> None:
        """An ensemble-mode sequence (the ensemble door): validated, then admitted by the door
        (:meth:`EnsembleDoor.admit`), whose slot the stream holds until it ends. Raises
        RequestError."""
        profile = self.setup.profile
        req = parse_engine(inputs, self.hidden_size, profile.engine.max_new_tokens_cap)
        if isinstance(req, EngineControl) or not req.stream_id:
            raise RequestError("an ensemble-mode request needs stream_id and no control",
                               param=contract.EN_STREAM_ID.name)
        lookahead = int_input(inputs, contract.EN_WINDOW_LOOKAHEAD.name, -1, -1, 256)
        if lookahead == 0:
            raise RequestError("window_lookahead_tokens must be >= 1 (or -1 for the profile's)",
                               param=contract.EN_WINDOW_LOOKAHEAD.name)
        schedule = profile.stream.schedule()
        if lookahead > 0:
            schedule = schedule.with_lookahead(lookahead)
        header = first_string(inputs[contract.EN_INFO_HEADER.name]) if contract.EN_INFO_HEADER.name in inputs else ""
        planner = EnsembleWindowPlanner(schedule, header, self.hidden_size)
        request_id = request.request_id() or header_request_id(header)
        slot = self.ensemble_door.admit(request_id)
        try:
            self._submit_ensemble(request_id, sender, req, planner, slot)
        except BaseException:
            slot.release()
            raise

    def _submit_ensemble(self, request_id: str, sender: Any, req: SequenceRequest, planner: EnsembleWindowPlanner,
                        slot: SlotToken) -> None:
        deadline = time.monotonic() + req.timeout_s if req.timeout_s else None
        sink = EnsembleSink(self.pb, sender, self.name, request_id, req.prompt_length, planner, req.stream_id,
                          slot.release)
        req = replace(req, emit_tokens=self.setup.profile.stream.emit_tokens,
                      emit_at=planner.emit_at(req.params.max_new_tokens), request_id=req.stream_id)
        self.engine.submit(Sequence(req, sink, deadline_s=deadline))

    def refuse(self, sender: Any, exc: RequestError) -> None:
        send_engine_error(self.pb, sender, exc)

    def finalize(self) -> None:
        self.hooks.close()  # no execute comes any more: the engine's last responses go out at once
        self.engine.stop()
        super().finalize()
