"""A stand-in for ``triton_python_backend_utils`` that hosts the project's Triton models in
one process: the models of ``chattts_serving.triton.models`` are initialised from the rendered
repository's configs and BLS requests between them are function calls.

It models what the project relies on in Triton 2.51's Python backend: tensors, responses,
``TritonError`` codes, decoupled response senders (final flag, ``is_cancelled``), BLS
``exec`` for plain and decoupled models (a decoupled call returns an iterator whose last item
carries only the final flag), metrics, and the config's transaction policy. It checks the
final-response rule on every sender: nothing may be sent after the final flag.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from chattts_serving.triton import models

FINAL = 1


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int | None = None) -> None:
        self._message, self._code = message, TritonError.INTERNAL if code is None else code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._tensors, self._error = list(output_tensors or []), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors


class Sender:
    """A decoupled response sender: responses go to ``sent`` (and to a queue, for a BLS caller);
    anything after the final flag is recorded in ``violations``."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.violations: list[str] = []
        self.cancelled = False
        self.closed = threading.Event()
        self.queue: queue.Queue[tuple[InferenceResponse, bool]] = queue.Queue()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed.is_set():
            self.violations.append("send after the final flag")
            return
        self.sent.append((response, flags))
        final = bool(flags & FINAL)
        if response is not None or final:
            self.queue.put((response if response is not None else InferenceResponse(), final))
        if final:
            self.closed.set()

    def is_cancelled(self) -> bool:
        if self.closed.is_set():
            self.violations.append("is_cancelled after the final flag")
        return self.cancelled

    @property
    def responses(self) -> list[InferenceResponse]:
        return [r for r, _ in self.sent if r is not None]


class Request:
    def __init__(self, inputs: list[Tensor], request_id: str = "", parameters: dict[str, Any] | None = None) -> None:
        self.inputs = {t.name(): t for t in inputs}
        self._id, self._params = request_id, json.dumps(parameters or {})
        self.sender = Sender()

    def request_id(self) -> str:
        return self._id

    def parameters(self) -> str:
        return self._params

    def get_response_sender(self) -> Sender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.sender.cancelled


class Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.value, self.observations = labels, 0.0, []  # type: ignore[var-annotated]

    def increment(self, v: float) -> None:
        self.value += v

    def set(self, v: float) -> None:
        self.value = v

    def observe(self, v: float) -> None:
        self.observations.append(v)


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    registry: ClassVar[dict[str, list[Metric]]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        MetricFamily.registry.setdefault(name, [])

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> Metric:
        m = Metric(labels)
        MetricFamily.registry[self.name].append(m)
        return m

    @classmethod
    def total(cls, name: str, **labels: str) -> float:
        return sum(m.value for m in cls.registry.get(name, []) if labels.items() <= m.labels.items())


class FakePb:
    """The module object the models use as ``pb``; BLS requests go to ``host``."""

    Tensor = Tensor
    TritonError = TritonError
    InferenceResponse = InferenceResponse
    MetricFamily = MetricFamily
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL

    def __init__(self) -> None:
        self.host: Host | None = None
        pb = self

        class InferenceRequest:
            def __init__(self, model_name: str, inputs: list[Tensor], requested_output_names: list[str],
                         request_id: str = "", parameters: dict[str, Any] | None = None) -> None:
                self.model_name, self.request = model_name, Request(inputs, request_id, parameters)

            def exec(self, decoupled: bool = False) -> Any:
                assert pb.host is not None
                return pb.host.call(self.model_name, self.request, decoupled)

        self.InferenceRequest = InferenceRequest

    @staticmethod
    def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
        return request.inputs.get(name)

    @staticmethod
    def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
        return next((t for t in response.output_tensors() if t.name() == name), None)

    @staticmethod
    def using_decoupled_model_transaction_policy(config: dict[str, Any]) -> bool:
        return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


CLASSES = {"chattts_frontend": models.FrontendModel, "chattts_gpt": models.EngineModel,
           "chattts_vocoder": models.VocoderModel, "chattts_dvae_vocoder": models.VocoderModel,
           "chattts": models.StreamingEntryModel, "chattts_offline": models.OfflineEntryModel}


class Host:
    """Every model of a rendered repository, initialised in this process with ``pb``.
    ``override`` maps a model name to a function ``(request, decoupled) -> response`` that
    answers in its place (a failing stage). The repository is one rendered without the
    admission gate (``[entry] gate = false``: a C++ backend runs in tritonserver only)."""

    def __init__(self, repo: Path, pb: FakePb) -> None:
        self.pb = pb
        pb.host = self
        self.models: dict[str, models.TritonModel] = {}
        self.override: dict[str, Any] = {}
        self._finalized: set[int] = set()
        for name, cls in CLASSES.items():
            config = text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
            args = {"model_config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)),
                    "model_instance_kind": "CPU"}
            model = type(f"Fake_{name}", (cls,), {"pb": pb})()
            model.initialize(args)
            self.models[name] = model

    def call(self, name: str, request: Request, decoupled: bool) -> Any:
        if name in self.override:
            return self.override[name](request, decoupled)
        model = self.models[name]
        out = model.execute([request])  # type: ignore[attr-defined]
        if not decoupled:
            assert out is not None and len(out) == 1
            return out[0]
        return self._responses(request.sender)

    @staticmethod
    def _responses(sender: Sender) -> Iterator[InferenceResponse]:
        while True:
            response, final = sender.queue.get(timeout=60)
            yield response
            if final:
                return

    def close(self) -> None:
        """Finalize every model once, the entry models first (they end their streams while the
        stages those call are still there, as when Triton unloads them all at once)."""
        entries = [m for m in self.models.values() if isinstance(m, models.EntryModel)]
        for model in entries + [m for m in self.models.values() if m not in entries]:
            if id(model) not in self._finalized:
                self._finalized.add(id(model))
                model.finalize()
