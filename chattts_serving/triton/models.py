"""The Triton models: one class per model, each ``model_repository/<name>/1/model.py`` a few
lines that subclass it and set ``pb`` to ``triton_python_backend_utils``.

:class:`TritonModel` owns the lifecycle every model shares: ``initialize`` reads the setup
(config, artifacts, profile) and checks the transaction policy, ``execute`` maps every
per-request error to a response (a decoupled model ends the stream with it, final flag set:
the client never hangs), and ``finalize`` stops the model's threads. The logic lives below
this layer: the front end (:mod:`chattts_serving.text`), the engine
(:mod:`chattts_serving.engine`), the vocoders (:mod:`chattts_serving.audio`) and the entry
service (:mod:`chattts_serving.serving.entry`).

| model | class | decoupled |
|---|---|---|
| chattts_frontend | :class:`FrontendModel` | no |
| chattts_gpt | :class:`EngineModel` | yes |
| chattts_vocoder, chattts_dvae_vocoder | :class:`VocoderModel` | no (dynamic batching) |
| chattts | :class:`StreamingEntryModel` | yes |
| chattts_offline | :class:`OfflineEntryModel` | no |
| chattts_ensemble_vocoder | :class:`EnsembleVocoderModel` | yes |

``chattts_ensemble`` is a Triton ensemble (no model.py): its steps are the front end (a whole
request: :meth:`FrontendModel.respond`), the engine in window mode (:meth:`EngineModel.accept`),
and the ensemble's vocoder (:meth:`EnsembleVocoderModel.accept`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import itertools
import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from .. import contract
from ..audio.encoder import DvaeEncoderRunner
from ..audio.vocoder import CarriedStreams, StreamingVocoderRunner, VocoderRunner
from ..contract import Precision, VocoderPath
from ..engine.gpt import Embeddings, GptStepRunner
from ..engine.kernels import choose_int8_kernel
from ..engine.request import SequenceRequest
from ..engine.scheduler import Engine, Sequence
from ..errors import RequestError, drop_tracebacks, from_message
from ..runtime import OrtOptions, resolve_precision
from ..serving.admission import busy_error, rejection_reason
from ..serving.boundary import FrontendOutput, frontend_tensors
from ..serving.ensemble import prepare_request
from ..serving.entry import EntryService
from ..serving.entry_runtime import UNLOAD_WAIT_S, EntryRuntime, internal_error
from ..serving.frontend_service import FrontendService
from ..serving.job import SynthesisJob
from ..serving.logs import log_event
from ..serving.request import (
    EngineControl,
    EntryLimits,
    FrontendCall,
    int_input,
    parse_engine,
    parse_frontend,
)
from ..serving.threads import Spawn, start_thread
from ..serving.windows import WindowPlanner
from ..text.frontend import FrontEnd
from ..text.segments import SegmentRules
from .cancels import CancelListener, cancel_address, send_cancel
from .deliveries import RECEIPT_BOARD, ReceiptSender, ReceiptWriter, delivery_prefix
from .finals import FinalWindow, WindowedSender, answer_ping, is_ping, ping_inputs
from .metrics import EngineMetrics, EntryMetrics, MemoryGauges, PingMetrics, VocoderMetrics
from .responses import EngineSink, OfflineChannel, SenderChannel, WindowSink, send_engine_error, send_final_error
from .setup import ModelSetup, lower_priority
from .stages import ITERATOR_GRAVE, BlsStages, keep_iterator
from .tensors import first_string, request_inputs, string_tensor, triton_error

log = logging.getLogger(__name__)

PING_ID_PREFIX = "chattts-ping-"
"""Request id of a model's ping to itself (a counter follows)."""

WARM_UP_TEXT = "你好，世界。Hello 123, 2024-03-05."
"""The front end's first text: number readers, the normaliser, the tokenizer, the voice cache and
(with ``frontend.wetext``) WeTextProcessing warmed before serving."""


def _precision_label(setup: ModelSetup, precision: Precision, graph: str) -> str:
    """``precision`` as a log line shows it: "int8", or "auto: int8" when ``auto`` chose."""
    chosen = resolve_precision(setup.artifacts, precision, graph)
    return str(chosen) if chosen is precision else f"{precision}: {chosen}"


class TritonModel:
    """Base of every model: ``pb`` (the ``triton_python_backend_utils`` module) is set by the
    model.py that subclasses it; ``decoupled`` is the transaction policy the config must have
    (checked at load: a mismatch fails the load)."""

    pb: ClassVar[Any] = None
    decoupled: ClassVar[bool] = False
    spawn: Spawn = staticmethod(start_thread)
    """How the model's components start threads (an entry model's runtime, which joins them)."""
    ping_specs: ClassVar[tuple[contract.TensorSpec, ...] | None] = None
    """The inputs of a model that sends final responses from its own threads, which then go
    through a :class:`~chattts_serving.triton.finals.FinalWindow` (``self.finals``) and are
    pinged for with these inputs' required ones; None: every response leaves ``execute``."""

    def initialize(self, args: dict[str, Any]) -> None:
        # A stub that dies of a fatal signal (a crash in a C extension or in the backend)
        # otherwise leaves only Triton's "Stub process '<instance>' is not healthy." behind:
        # this writes every thread's Python stack to the stub's stderr, i.e. the server log.
        faulthandler.enable(all_threads=True)
        self.setup = ModelSetup.from_args(self.pb, args, decoupled=self.decoupled)
        self.name = self.setup.name
        self._ping_ids = itertools.count()
        self.finals = FinalWindow(self._ping, spawn=self.spawn) if self.ping_specs is not None else None
        self.ping_metrics = PingMetrics(self.pb, self.name) if self.ping_specs is not None else None
        self.start(self.setup)
        self._freeze_start_heap()

    def _freeze_start_heap(self) -> None:
        """Move what ``start`` built, which lives as long as the stub, out of the cyclic GC's
        sight: the collections at unload (``finalize``'s and the interpreter's at the stub's
        exit) then walk only what serving made. Over the front end's heap they took 1.5 to 5 s
        on two busy cores, and a stop that outlasts ``--exit-timeout-secs`` logs an error and
        leaves stubs behind. Only in a stub (the real ``pb``): elsewhere the process is not
        this model's."""
        if getattr(self.pb, "__name__", None) != "triton_python_backend_utils":
            return
        gc.collect()
        gc.freeze()

    def _ping(self) -> None:
        """Ask Triton for an ``execute`` of this instance (a ping to this model; see
        :mod:`~chattts_serving.triton.finals`). A decoupled ping's ``exec`` returns with its
        first response, which is its answer (the final flag alone, :func:`answer_ping`) or its
        error: the iterator is read to its end at once (no wait) and goes to the grave. An
        iterator left unread stays in the stub's iterator map until the stub unloads, where
        python_backend r24.10 deadlocks freeing several of them (docs/triton-workarounds.md,
        "ping iterators")."""
        pb = self.pb
        assert self.ping_specs is not None
        ping_id = f"{PING_ID_PREFIX}{next(self._ping_ids)}"
        req = pb.InferenceRequest(model_name=self.name, request_id=ping_id, inputs=ping_inputs(pb, self.ping_specs),
                                  requested_output_names=[], parameters={contract.PING_PARAMETER: True})
        if not self.decoupled:
            req.exec()
            return
        iterator = req.exec(decoupled=True)
        for _ in iterator:  # the final response is already buffered: ends the iterator, never waits
            pass
        keep_iterator(iterator)

    def windowed(self, sender: Any) -> Any:
        """``sender`` with its final response sent through ``self.finals`` (as it is for a model
        that sends every response inside ``execute``)."""
        if self.finals is None:
            return sender
        return WindowedSender(sender, self.finals, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def close_finals(self) -> None:
        """The model unloads: finals from now on go out at once (:meth:`FinalWindow.close`); the
        pings' iterators are in the grave, freed when the model releases it in ``finalize``,
        while the stub's shared memory exists."""
        if self.finals is not None:
            self.finals.close()
        if self.ping_metrics is not None:
            self.ping_metrics.close()
            self.ping_metrics = None

    def answer_ping(self, request: Any, decoupled: bool) -> None:
        """Answer a ping (inside ``execute``) and count it."""
        answer_ping(self.pb, request.get_response_sender(), decoupled)
        if self.ping_metrics is not None:
            self.ping_metrics.answered()

    def executing(self) -> contextlib.AbstractContextManager[None]:
        """Wrap ``execute``'s body: the final-response window's (:meth:`FinalWindow.executing`)."""
        return self.finals.executing() if self.finals is not None else contextlib.nullcontext()

    def start(self, setup: ModelSetup) -> None:
        """Build the model's state (sessions, threads)."""

    def finalize(self) -> None:
        """Stop the model's threads (Triton unloads it). Every model's finalize ends by
        collecting the cyclic garbage while the stub's shared memory still exists
        (docs/triton-workarounds.md, "cycles at exit")."""
        gc.collect()


class UnaryModel(TritonModel):
    """A model with one response per request: :meth:`respond` turns each request into output
    tensors; a RequestError becomes an error response with its kind's code."""

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._response(r) for r in requests]

    def respond(self, request: Any) -> list[Any]:
        raise NotImplementedError

    def _response(self, request: Any) -> Any:
        pb = self.pb
        try:
            return pb.InferenceResponse(output_tensors=self.respond(request))
        except RequestError as exc:
            drop_tracebacks(exc)  # see errors.drop_tracebacks
            return pb.InferenceResponse(error=triton_error(pb, exc))
        except Exception as exc:
            log.exception("%s: request failed", self.name)
            drop_tracebacks(exc)
            return pb.InferenceResponse(error=triton_error(pb, internal_error(exc)))


class DecoupledModel(TritonModel):
    """A model that answers each request on its response sender: :meth:`accept` takes the
    request (and later sends its responses, the final one through ``self.finals``); a
    RequestError from it ends the stream at once with :meth:`refuse`; a ping is answered."""

    decoupled = True

    def execute(self, requests: list[Any]) -> None:
        with self.executing():
            for request in requests:
                if is_ping(request):
                    self.answer_ping(request, decoupled=True)
                    continue
                sender = self.windowed(self.sender_for(request, request.get_response_sender()))
                try:
                    self.accept(request, sender)
                except RequestError as exc:
                    drop_tracebacks(exc)  # see errors.drop_tracebacks
                    self.refuse(sender, exc)
                except Exception as exc:
                    log.exception("%s: request failed", self.name)
                    drop_tracebacks(exc)
                    self.refuse(sender, internal_error(exc))
        return None

    def sender_for(self, request: Any, sender: Any) -> Any:
        """The sender :meth:`accept` and :meth:`refuse` use for ``request`` (its own)."""
        return sender

    def accept(self, request: Any, sender: Any) -> None:
        raise NotImplementedError

    def refuse(self, sender: Any, exc: RequestError) -> None:
        send_final_error(self.pb, sender, exc)


# --- stage models ----------------------------------------------------------------------------
class FrontendModel(UnaryModel):
    """chattts_frontend: text (BYTES [1]) + voice, refine_prompt, reference_text (BYTES [1]),
    refined_ids (INT32 [N]), reference_audio (FP32 [N]) at reference_sample_rate_hz (INT32 [1]),
    no_speaker, keep_unspeakable, transient_reference (BOOL [1]), all optional -> input_ids
    (INT32 [T]), spk_emb (FP32 [H], L2-normalised; [0] without a speaker), normalized_text
    (BYTES [1]), dropped (BYTES [1], JSON list of what is not spoken), refine_ids (INT32 [T'],
    the refine-text prompt), prompt_codes (INT32 [P, 4], the audio prompt; [0, 4] for none).
    A request's segments come in one call (``segments`` BYTES [N] instead of ``text``, each
    output then per segment: ``contract.FE_SEGMENTS`` and the names after it;
    :func:`~chattts_serving.serving.boundary.frontend_tensors`).
    The DVAE encoder runs here (:class:`~chattts_serving.serving.frontend_service.FrontendService`).

    With ``request_text`` the call is the ensemble door's first step: the whole request (the
    entry inputs, ``request_text`` its text) is validated and prepared by
    :func:`~chattts_serving.serving.ensemble.prepare_request`, and the outputs also hold the
    engine's window-mode inputs (``contract.FRONTEND_REQUEST_OUTPUTS``)."""

    def start(self, setup: ModelSetup) -> None:
        profile = setup.profile
        fp, ref = profile.frontend, profile.reference
        encoder = DvaeEncoderRunner(setup.artifacts, OrtOptions(intra_op_threads=ref.encoder_intra_op_threads))
        encoder.run(np.zeros(contract.SAMPLE_RATE_HZ, np.float32))  # first-run allocations before serving
        self.service = FrontendService(
            FrontEnd(setup.artifacts, fp.max_text_chars, fp.default_voice_seed, wetext=fp.wetext), encoder.run,
            ref.limits(), ref.prompt_cache_entries)
        self.service.prepare(FrontendCall(texts=(WARM_UP_TEXT,)))
        self.limits = EntryLimits(max_new_tokens_cap=profile.engine.max_new_tokens_cap,
                                  max_text_chars=fp.max_text_chars, default_vocoder=profile.stream.default_vocoder,
                                  default_segmentation=fp.segmentation, reference=ref.limits())
        self.rules = SegmentRules(max_chars=fp.max_segment_chars, merge_chars=fp.merge_segment_chars)
        self.schedule = profile.stream.schedule()

    def respond(self, request: Any) -> list[Any]:
        pb = self.pb
        if pb.get_input_tensor_by_name(request, contract.FE_REQUEST_TEXT.name) is not None:
            return self._ensemble_request(request)
        outs = self.service.prepare(parse_frontend(request_inputs(pb, request, contract.FRONTEND_INPUTS),
                                                   request.request_id()))
        return self._prepared(outs)

    def _ensemble_request(self, request: Any) -> list[Any]:
        """The ensemble door's request -> the prepared segment and the engine's window-mode inputs."""
        pb = self.pb
        arrival = time.monotonic()
        inputs, params, request_id = entry_request(pb, request, ENSEMBLE_FRONTEND_INPUTS)
        inputs[contract.IN_TEXT.name] = inputs.pop(contract.FE_REQUEST_TEXT.name)
        try:
            r = prepare_request(inputs, params, request_id, self.service, self.limits, self.rules, self.schedule,
                                arrival)
        except RequestError as exc:
            log_event("request_rejected", level="warning", model=contract.MODEL_ENSEMBLE, request_id=request_id,
                      reason=rejection_reason(exc), status=exc.kind, message=str(exc))
            raise
        log_event("request_accepted", model=contract.MODEL_ENSEMBLE, request_id=request_id, stream_id=r.stream_id,
                  priority=r.request.priority, text_chars=len(r.request.text))
        return [*self._prepared([r.segment]),
                string_tensor(pb, contract.FE_STREAM_ID.name, r.stream_id),
                pb.Tensor(contract.FE_ENGINE_PRIORITY.name, np.array([r.engine_priority], np.int32)),
                pb.Tensor(contract.FE_TIMEOUT_MS.name, np.array([r.timeout_ms], np.int64)),
                pb.Tensor(contract.FE_LOOKAHEAD.name, np.array([r.lookahead_tokens], np.int32)),
                string_tensor(pb, contract.FE_INFO.name, r.info_header)]

    def _prepared(self, outs: list[FrontendOutput]) -> list[Any]:
        return [self.pb.Tensor(name, arr) for name, arr in frontend_tensors(outs).items()]


class EngineModel(DecoupledModel):
    """chattts_gpt: the in-flight batching GPT engine, KV caches resident. input_ids (INT32
    [T]), spk_emb (FP32 [H], code mode), mode, sampling parameters, emit_tokens -> a stream of
    codes (INT32 [N, 4]), hidden (FP32 [N, H]), stop_reason (BYTES [1]), starting with an empty
    acknowledgement; or a control request ('cancel' + stream_id), answered with the final flag.

    With ``window_lookahead_tokens`` (the ensemble door) the sequence answers in window mode
    (:class:`~chattts_serving.triton.responses.WindowSink`): vocoder windows of the profile's
    chunk schedule (``window_hidden``, ``window_plan``, ``window_info``, ``window_error``,
    ``window_stream_id``) and progress ticks; errors are Triton error responses (final), and at
    most ``ensemble.max_concurrent_streams`` such sequences live at once, beyond which a request
    is refused "server busy" at once (the ensemble door's admission)."""

    ping_specs = contract.ENGINE_INPUTS

    def start(self, setup: ModelSetup) -> None:
        ITERATOR_GRAVE.acquire()  # its pings' iterators (released at finalize)
        ep = setup.profile.engine
        self.hidden_size = setup.artifacts.hidden_size
        runner = GptStepRunner(setup.artifacts, setup.ort("engine"))
        kv = runner.opts.kv_cache
        log.info("%s: GPT step graph %s (precision %s), KV cache %s", setup.name, runner.graph.name,
                 _precision_label(setup, runner.opts.precision, contract.GPT_GRAPH),
                 runner.kv_precision if runner.kv_precision is kv else f"{kv}: {runner.kv_precision}")
        choose_int8_kernel(runner)  # the int8 step's fastest MatMulNBits kernel on this CPU (logged)
        self.metrics = EngineMetrics(self.pb, setup.name, ep.max_batch_size * ep.max_context_tokens,
                                     MemoryGauges(self.pb, setup.name, setup.gpu_index))
        self.engine = Engine(runner, Embeddings(setup.artifacts), ep.engine_config(), self.metrics)
        self.engine.warm_up(text_head=self.engine.emb.has_text_head)  # refine-text needs the text head
        if not self.engine.emb.has_text_head:
            log.warning("%s: the artifacts have no text head (exported before exporter version 3): "
                        "refine_text requests will fail until `make export` runs again", setup.artifacts.root)
        self.engine.start()
        if ep.nice:
            log.info("%s: niceness %d on %d threads (profile [engine] nice)", setup.name, ep.nice,
                     lower_priority(ep.nice))
        self.cancels: CancelListener | None = None
        try:
            self.cancels = CancelListener(cancel_address(setup.name), self.engine.cancel).start()
        except OSError as exc:  # the entry models fall back to control requests
            log.warning("%s: no cancel socket (%s): cancels arrive as control requests only", setup.name, exc)
        self.receipts = ReceiptWriter()
        self.window_limit = setup.profile.ensemble.max_concurrent_streams
        self._windows_live = 0
        self._windows_lock = threading.Lock()

    def sender_for(self, request: Any, sender: Any) -> Any:
        """A sequence that names its caller's receipt socket (``delivery_address``) and its
        ``stream_id`` gets a sender that writes a receipt after each response (see
        :mod:`~chattts_serving.triton.deliveries`); a control request never does."""
        pb = self.pb
        address, stream_id, control = (pb.get_input_tensor_by_name(request, spec.name) for spec in
                                       (contract.EN_DELIVERY_ADDRESS, contract.EN_STREAM_ID, contract.EN_CONTROL))
        if address is None or stream_id is None or control is not None:
            return sender
        try:
            addr = first_string(address.as_numpy())
            sid = first_string(stream_id.as_numpy())
        except (ValueError, IndexError, UnicodeDecodeError):
            return sender  # parse_engine reports the bad input
        if not addr.startswith(delivery_prefix()) or not sid:
            return sender  # only this server's entry stubs get receipts
        return ReceiptSender(sender, self.receipts, addr, sid)

    def accept(self, request: Any, sender: Any) -> None:
        inputs = request_inputs(self.pb, request, contract.ENGINE_INPUTS)
        if contract.EN_WINDOW_LOOKAHEAD.name in inputs:
            try:
                self._accept_windows(request, sender, inputs)
            except RequestError as exc:
                drop_tracebacks(exc)
                send_final_error(self.pb, sender, exc)
            except Exception as exc:
                log.exception("%s: window-mode request failed", self.name)
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

    def _accept_windows(self, request: Any, sender: Any, inputs: dict[str, np.ndarray]) -> None:
        """A window-mode sequence (the ensemble door): admitted while fewer than
        ``window_limit`` live, else BUSY. Raises RequestError."""
        profile = self.setup.profile
        req = parse_engine(inputs, self.hidden_size, profile.engine.max_new_tokens_cap)
        if isinstance(req, EngineControl) or not req.stream_id:
            raise RequestError("a window-mode request needs stream_id and no control",
                               param=contract.EN_STREAM_ID.name)
        lookahead = int_input(inputs, contract.EN_WINDOW_LOOKAHEAD.name, -1, -1, 256)
        if lookahead == 0:
            raise RequestError("window_lookahead_tokens must be >= 1 (or -1 for the profile's)",
                               param=contract.EN_WINDOW_LOOKAHEAD.name)
        schedule = profile.stream.schedule()
        if lookahead > 0:
            schedule = schedule.with_lookahead(lookahead)
        header = first_string(inputs[contract.EN_INFO_HEADER.name]) if contract.EN_INFO_HEADER.name in inputs else ""
        planner = WindowPlanner(schedule, header, self.hidden_size)
        request_id = request.request_id() or header_request_id(header)
        with self._windows_lock:
            busy = self._windows_live >= self.window_limit
            if not busy:
                self._windows_live += 1
        if busy:
            exc = busy_error(self.window_limit)
            log_event("request_rejected", level="warning", model=contract.MODEL_ENSEMBLE,
                      request_id=request_id, reason=rejection_reason(exc), status=exc.kind, message=str(exc))
            raise exc
        try:
            self._submit_windows(request_id, sender, req, planner)
        except BaseException:
            self._window_closed()
            raise

    def _submit_windows(self, request_id: str, sender: Any, req: SequenceRequest, planner: WindowPlanner) -> None:
        deadline = time.monotonic() + req.timeout_s if req.timeout_s else None
        sink = WindowSink(self.pb, sender, self.name, request_id, req.prompt_length, planner, req.stream_id,
                          self._window_closed)
        req = replace(req, emit_tokens=self.setup.profile.stream.emit_tokens,
                      first_emit_tokens=planner.first_emit_tokens(), request_id=req.stream_id)
        self.engine.submit(Sequence(req, sink, deadline_s=deadline))

    def _window_closed(self) -> None:
        with self._windows_lock:
            self._windows_live -= 1

    def refuse(self, sender: Any, exc: RequestError) -> None:
        send_engine_error(self.pb, sender, exc)

    def finalize(self) -> None:
        self.close_finals()  # no execute comes any more: the engine's last finals go out at once
        if self.cancels is not None:
            self.cancels.close()
        self.engine.stop()
        self.receipts.close()
        self.metrics.close()
        ITERATOR_GRAVE.release(time.monotonic() + 1.0)
        super().finalize()


class VocoderModel(TritonModel):
    """chattts_vocoder / chattts_dvae_vocoder (dynamic batching): a token window, hidden (FP32
    [T, H]) or codes (INT32 [T, 4]), -> audio (FP32 [512*T-256]) at 24 kHz. Windows of equal
    length in one batch run as one ONNX Runtime call; one ``vocoder_batch`` log line per
    batch (request ids, window tokens, ONNX Runtime calls, duration in ms)."""

    def start(self, setup: ModelSetup) -> None:
        self.memory = MemoryGauges(self.pb, setup.name, setup.gpu_index)
        self.runner = _vocoder_runner(setup, setup.parameters["vocoder_path"])
        self.streams: CarriedStreams | None = None
        self.metrics = VocoderMetrics(self.pb, setup.name)
        if setup.profile.stream.carry_vocoder_state:
            stateful = StreamingVocoderRunner(setup.artifacts, setup.parameters["vocoder_path"], setup.ort("vocoder"))
            log.info("%s: stateful vocoder graph %s", setup.name, stateful.graph.name)
            stateful.warm_up(setup.artifacts.hidden_size)
            p = setup.profile.entry
            self.streams = CarriedStreams(stateful, max_streams=2 * (p.max_concurrent_streams + p.offline_threads))

    def finalize(self) -> None:
        self.memory.close()
        self.metrics.close()
        super().finalize()

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


def header_request_id(header: str) -> str:
    """The ``request_id`` of an ``info`` header JSON (the ensemble's front end puts the client's
    or a generated one there); '' when the header has none or is not JSON."""
    try:
        value = json.loads(header).get("request_id", "") if header else ""
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def _vocoder_runner(setup: ModelSetup, path: str) -> VocoderRunner:
    """The vocoder graph of ``path`` at the profile's vocoder precision, logged and warmed up."""
    runner = VocoderRunner(setup.artifacts, path, setup.ort("vocoder"))
    log.info("%s: vocoder graph %s (precision %s)", setup.name, runner.graph.name,
             _precision_label(setup, setup.ort("vocoder").precision, runner.source))
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
    its stream is cancelled in the engine over the engine's cancel socket
    (:mod:`~chattts_serving.triton.cancels`), and the engine drops the sequence at its next
    step and ends it with the final flag alone. Why no dynamic batcher: it answers a marked
    request CANCELLED itself, which ends the ensemble before the engine hears of the cancel
    (docs/triton-workarounds.md, "ensemble: cancels and errors"). So a window is vocoded on
    its own, in ``execute``, which also keeps one stream's chunks in the engine's order."""

    def start(self, setup: ModelSetup) -> None:
        self.cancel_address = cancel_address(contract.MODEL_ENGINE)
        self.memory = MemoryGauges(self.pb, setup.name, setup.gpu_index)
        self.runner = _vocoder_runner(setup, VocoderPath.HIDDEN)

    def finalize(self) -> None:
        self.memory.close()
        super().finalize()

    def accept(self, request: Any, sender: Any) -> None:
        pb = self.pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        tensors = {spec.name: t.as_numpy() for spec in contract.WINDOW_OUTPUTS
                   if (t := pb.get_input_tensor_by_name(request, spec.name)) is not None}
        rid = tensors.get(contract.WIN_REQUEST_ID.name)  # windows carry it, ticks do not
        request_id = first_string(rid) if rid is not None else request.request_id()
        if request.is_cancelled():
            if (stream := tensors.get(contract.WIN_STREAM_ID.name)) is not None:
                stream_id = first_string(stream)
                if not send_cancel(self.cancel_address, stream_id):
                    log.warning("%s: could not reach the engine's cancel socket for %s", self.name, stream_id)
                log_event("ensemble_cancelled", model=self.name, request_id=request_id, stream_id=stream_id)
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


# --- entry models ------------------------------------------------------------------------------
def entry_request(pb: Any, request: Any, specs: tuple[contract.TensorSpec, ...] = contract.ENTRY_INPUTS
                  ) -> tuple[dict[str, np.ndarray], dict[str, object], str]:
    """An entry request's tensors (``specs``), Triton request parameters (an unparsable JSON
    reads as none) and request id (the client's, or a generated UUID hex)."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (ValueError, TypeError):
        params = {}
    return request_inputs(pb, request, specs), params, request.request_id() or uuid.uuid4().hex


ENSEMBLE_FRONTEND_INPUTS = (contract.FE_REQUEST_TEXT, *(t for t in contract.ENTRY_INPUTS if t != contract.IN_TEXT))
"""What the front end reads of an ensemble request: the entry inputs, the text as ``request_text``."""


class ServerStopper:
    """What an entry model does when a request finds a stage stuck (no answer for
    ``entry.stall_timeout_s``, ``health.stop_on_stall``): stop the server once (SIGTERM to
    tritonserver, the stub's parent), so that it stops claiming readiness and its supervisor
    starts a fresh one. Holds no reference to the model (docs/triton-workarounds.md, "cycles at
    exit")."""

    def __init__(self, model: str, stall_timeout_s: float) -> None:
        self.model, self.stall_timeout_s = model, stall_timeout_s
        self._lock = threading.Lock()
        self.stopped = False

    def __call__(self, stage: str) -> None:
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        log_event("server_stopping", level="error", model=self.model, reason=f"the {stage} stopped responding",
                  stall_timeout_s=self.stall_timeout_s)
        os.kill(os.getppid(), signal.SIGTERM)


class EntryModel(TritonModel):
    """What the two entry models share: a thin adapter over
    :class:`~chattts_serving.serving.entry_runtime.EntryRuntime`, which owns the slots, every
    thread of the stub and the process-wide helpers (its docstring is the map). Requests are
    answered on their response sender (also by ``chattts_offline``, which Triton lets do so when
    ``execute`` returns None), so that ``execute`` only takes a slot or refuses "busy" and
    hands everything else to the runtime's threads (why: docs/performance.md, "Where the busy
    time goes"). With the admission gate in front (``[entry] gate``,
    ``chattts_serving/gate/gate.cc``), the streaming model runs as ``chattts_entry``: the gate
    refuses at the stream limit, this model's own limit is twice it (config parameter
    ``gated``), and its metrics and logs carry the public name (``label_model``).
    """

    offline: ClassVar[bool] = False
    ping_specs = contract.ENTRY_INPUTS

    def initialize(self, args: dict[str, Any]) -> None:
        self.runtime = EntryRuntime(helpers=(RECEIPT_BOARD, ITERATOR_GRAVE))
        self.spawn = self.runtime.spawn
        try:
            super().initialize(args)
        except BaseException:
            self.runtime.stop(first=self.close_finals if hasattr(self, "finals") else None)
            raise

    def start(self, setup: ModelSetup) -> None:
        entry = setup.profile.entry
        stages = BlsStages(self.pb, entry.breaker_failures, entry.breaker_cooldown_s, receipts=RECEIPT_BOARD.get())
        label = setup.parameters.get("label_model", setup.name)  # behind the gate: the public name
        self.metrics = EntryMetrics(self.pb, label)
        self.service = EntryService(label, setup.profile, stages, self.metrics, offline=self.offline,
                                    gated=setup.parameters.get("gated") == "true",
                                    on_stall=(ServerStopper(self.name, entry.stall_timeout_s)
                                              if setup.profile.health.stop_on_stall else None),
                                    spawn=self.runtime.spawn)
        self.runtime.serve(self.service, self, refusal_threads=entry.refusal_threads,
                           settle_s=entry.admission_settle_s, max_wait_s=entry.admission_max_wait_s)

    def execute(self, requests: list[Any]) -> None:
        with self.executing():
            for request in requests:
                arrival = time.monotonic()
                if is_ping(request):
                    self.answer_ping(request, self.decoupled)
                    continue
                self.runtime.arrive(request, self.windowed(request.get_response_sender()), arrival)
        return None

    # ---- EntryHandler ----------------------------------------------------------------------------
    def parse(self, request: Any) -> tuple[dict[str, np.ndarray], dict[str, object], str]:
        return entry_request(self.pb, request)

    def send_error(self, sender: Any, exc: RequestError) -> None:
        send_final_error(self.pb, sender, exc)

    def request_id(self, request: Any) -> str:
        return str(request.request_id())

    def run(self, job: SynthesisJob, sender: Any) -> None:
        raise NotImplementedError

    def finalize(self) -> None:
        """Unload: the runtime ends every request and joins every thread
        (:meth:`EntryRuntime.stop`), the final-response window closing first; then the metrics
        are released (docs/triton-workarounds.md, "metrics at unload")."""
        self.runtime.stop(UNLOAD_WAIT_S, first=self.close_finals)
        self.metrics.close()
        super().finalize()


class StreamingEntryModel(EntryModel):
    """chattts_entry behind the admission gate, or chattts itself without it (decoupled BLS
    entry point): text (BYTES [1]) and optional voice, vocoder,
    sampling, lookahead_tokens, priority, timeout_s and refine inputs -> a stream of audio
    chunks (FP32 [n], 24 kHz mono), small first chunk, larger ones after; the first chunk also
    carries info (BYTES [1], JSON: contract.INFO_HEADER_KEYS); the stream ends with a final
    response carrying only info (contract.INFO_FINAL_KEYS) or an explicit error."""

    decoupled = True

    def run(self, job: SynthesisJob, sender: Any) -> None:
        self.service.stream(job, SenderChannel(self.pb, sender))


class OfflineEntryModel(EntryModel):
    """chattts_offline (HTTP/gRPC infer): the inputs of chattts -> the whole utterance as one
    audio tensor (FP32 [n], 24 kHz mono), each sentence vocoded in one window like offline
    ChatTTS, and info (BYTES [1], JSON: contract.INFO_FINAL_KEYS); "busy" at once when the
    instance already runs ``entry.offline_threads`` requests."""

    offline = True

    def run(self, job: SynthesisJob, sender: Any) -> None:
        self.service.offline(job, OfflineChannel(self.pb, sender))
