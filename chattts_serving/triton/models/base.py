"""What every model shares: :class:`TritonModel` (the lifecycle), :class:`UnaryModel` (one
response per request) and :class:`DecoupledModel` (responses on the request's sender).

``initialize`` reads the setup (config, artifacts, profile), checks the transaction policy and
makes the model's hooks (:mod:`chattts_serving.triton.compat`, the Triton 2.51 workarounds,
called at fixed points: after ``start``, around ``execute``, per request and sender, at
unload); ``execute`` maps every per-request error to a response (a decoupled model ends the
stream with it, final flag set: the client never hangs); ``finalize`` stops the model's
threads.
"""

from __future__ import annotations

import faulthandler
import logging
from typing import Any, ClassVar

from ... import contract
from ...contract import Precision
from ...errors import RequestError, drop_tracebacks
from ...runtime import resolve_precision
from ...serving.entry_runtime import internal_error
from ...serving.threads import Spawn, start_thread
from ..compat import ModelHooks, triton_error
from ..responses import send_final_error
from ..setup import ModelSetup

log = logging.getLogger(__name__)


def precision_label(setup: ModelSetup, precision: Precision, graph: str) -> str:
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
    sends_from_threads: ClassVar[tuple[contract.TensorSpec, ...] | None] = None
    """The inputs of a model that sends responses from its own threads (its hooks need them);
    None: every response leaves inside ``execute``."""
    hooks_class: ClassVar[type[ModelHooks]] = ModelHooks
    """The model's kind of hooks (``self.hooks``)."""

    def initialize(self, args: dict[str, Any]) -> None:
        # A stub that dies of a fatal signal (a crash in a C extension or in the backend)
        # otherwise leaves only Triton's "Stub process '<instance>' is not healthy." behind:
        # this writes every thread's Python stack to the stub's stderr, i.e. the server log.
        faulthandler.enable(all_threads=True)
        self.setup = ModelSetup.from_args(self.pb, args, decoupled=self.decoupled)
        self.name = self.setup.name
        self.hooks = self.hooks_class(self.pb, self.name, self.decoupled, self.sends_from_threads, spawn=self.spawn)
        self.start(self.setup)
        self.hooks.started()

    def start(self, setup: ModelSetup) -> None:
        """Build the model's state (sessions, threads); what needs closing at unload is
        registered with ``self.hooks.owns``."""

    def finalize(self) -> None:
        """Triton unloads the model: a subclass stops its threads first, then calls this (the
        hooks release what the model registered and collect the cyclic garbage)."""
        self.hooks.finalize()


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
    """A model that answers each request on its response sender (the hooks' for it):
    :meth:`accept` takes the request (and later sends its responses); a RequestError from it
    ends the stream at once with :meth:`refuse`."""

    decoupled = True

    def execute(self, requests: list[Any]) -> None:
        with self.hooks.executing():
            for request in requests:
                if self.hooks.answered(request):
                    continue
                sender = self.hooks.sender(request, request.get_response_sender())
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

    def accept(self, request: Any, sender: Any) -> None:
        raise NotImplementedError

    def refuse(self, sender: Any, exc: RequestError) -> None:
        send_final_error(self.pb, sender, exc)
