"""The entry models: ``chattts`` / ``chattts_entry`` (streams) and ``chattts_offline`` /
``chattts_offline_entry`` (whole utterances), thin adapters over
:class:`~chattts_serving.serving.entry_runtime.EntryRuntime` and
:class:`~chattts_serving.serving.entry.EntryService`."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, ClassVar

import numpy as np

from ... import contract
from ...errors import RequestError
from ...serving.entry import EntryService
from ...serving.entry_runtime import UNLOAD_WAIT_S
from ...serving.job import SynthesisJob
from ...serving.logs import log_event
from ..compat import EntryHooks
from ..metrics import EntryMetrics
from ..responses import OfflineChannel, SenderChannel, send_final_error
from ..setup import ModelSetup
from ..stages import BlsStages
from ..tensors import entry_request
from .base import TritonModel


class ServerStopper:
    """What an entry model does when a request finds a stage stuck (no answer for
    ``entry.stall_timeout_s``, ``health.stop_on_stall``): stop the server once (SIGTERM to
    tritonserver, the stub's parent), so that it stops claiming readiness and its supervisor
    starts a fresh one. Holds no reference to the model (the model frees by reference counting
    alone: :mod:`~chattts_serving.triton.compat.unload`)."""

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
    ``chattts_serving/gate/gate.cc``), the models run as ``chattts_entry`` and
    ``chattts_offline_entry``: the gate decides admission, this model's slots are a safety
    limit (config parameter ``gated``,
    :func:`~chattts_serving.serving.admission.entry_slots`), and its metrics and logs carry the
    public name (``label_model``).
    """

    offline: ClassVar[bool] = False
    sends_from_threads = contract.ENTRY_INPUTS
    hooks_class = EntryHooks
    hooks: EntryHooks

    def initialize(self, args: dict[str, Any]) -> None:
        self.runtime = EntryHooks.runtime()
        self.spawn = self.runtime.spawn
        try:
            super().initialize(args)
        except BaseException:
            self.runtime.stop(first=self.hooks.close if hasattr(self, "hooks") else None)
            raise

    def start(self, setup: ModelSetup) -> None:
        entry = setup.profile.entry
        stages = BlsStages(self.pb, entry.breaker_failures, entry.breaker_cooldown_s)
        label = setup.parameters.get("label_model", setup.name)  # behind the gate: the public name
        self.metrics = self.hooks.owns(EntryMetrics(self.pb, label))
        self.service = EntryService(label, setup.profile, stages, self.metrics, offline=self.offline,
                                    gated=setup.parameters.get("gated") == "true",
                                    on_stall=(ServerStopper(self.name, entry.stall_timeout_s)
                                              if setup.profile.health.stop_on_stall else None),
                                    spawn=self.runtime.spawn)
        self.runtime.serve(self.service, self, refusal_threads=entry.refusal_threads,
                           settle_s=entry.admission_settle_s, max_wait_s=entry.admission_max_wait_s)

    def execute(self, requests: list[Any]) -> None:
        with self.hooks.executing():
            for request in requests:
                arrival = time.monotonic()
                if self.hooks.answered(request):
                    continue
                self.runtime.arrive(request, self.hooks.sender(request, request.get_response_sender()), arrival)
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
        (:meth:`EntryRuntime.stop`), the hooks closing first; then the metrics are released
        (:meth:`TritonModel.finalize`)."""
        self.runtime.stop(UNLOAD_WAIT_S, first=self.hooks.close)
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
