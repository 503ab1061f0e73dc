"""Register row "ping iterators" (docs/triton-workarounds.md), and the pings themselves: a
model's request to itself that only brings an ``execute`` of it.

Why pings: a model that sends final responses from its own threads sends them only inside
``execute`` (:mod:`.finals`); when none is due, a ping (a request carrying
:data:`~chattts_serving.contract.PING_PARAMETER`) brings one. The admission gate pings its
target the same way to tell a live model from a stuck one (``chattts_serving/gate/target_ping.cc``).
``tts_pings_total`` counts the pings a model answered, so that Triton's request counts can be
told from traffic.

- symptom: the engine stub crashed at unload after it had pinged itself, or a ping's iterator
  freed early corrupted the stub; a stop after streams waited out its whole exit timeout
  (``failed to stop server: Internal - Exit timeout expired``) and left stubs behind.
- cause: a decoupled BLS iterator must outlive its last response (:mod:`.grave`); and the stub
  frees the iterators still in its own map at unload holding the map's mutex, while its
  stub-to-parent thread waits for that mutex: freeing an unread one deadlocks.
- what we do: :meth:`Pinger.ping` reads the ping's iterator to its end at once (``exec``
  returns with the answer, the final flag alone, so nothing waits) and hands it to the grave;
  nothing unread is left in the stub's map.
- shown by: ``tests/unit/test_quiet_logs.py``, ``tests/server/test_quiet_logs.py``,
  ``tests/server/test_faults.py`` (a stop with live streams) and the crash-sign scan of every
  test server's log (``tests/conftest.py``).
- delete when: the pings go (see :mod:`.finals`), or as for :mod:`.grave` and the stub frees
  its iterator map without holding its mutex.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import contract
from ..metrics import PingMetrics
from .grave import keep_iterator

PING_ID_PREFIX = "chattts-ping-"
"""Request id of a model's ping to itself (a counter follows)."""


class Pinger:
    """A model instance's pings: :meth:`ping` asks Triton for an ``execute`` of the model
    ``model`` (``specs``: its inputs, whose required ones a ping fills; ``decoupled``: its
    transaction policy); :meth:`answer` ends a ping that arrived in ``execute`` and counts it.
    Holds no reference to the model (:mod:`.unload`)."""

    def __init__(self, pb: Any, model: str, specs: Sequence[contract.TensorSpec] | None, decoupled: bool) -> None:
        self.pb, self.model, self.specs, self.decoupled = pb, model, specs, decoupled
        self._ids = itertools.count()
        self.metrics: PingMetrics | None = PingMetrics(pb, model) if specs is not None else None

    def ping(self) -> None:
        """Ask Triton for an ``execute`` of this instance. A decoupled ping's ``exec`` returns
        with its first response, which is its answer (the final flag alone) or its error: the
        iterator is read to its end at once (no wait) and goes to the grave."""
        pb = self.pb
        assert self.specs is not None
        req = pb.InferenceRequest(model_name=self.model, request_id=f"{PING_ID_PREFIX}{next(self._ids)}",
                                  inputs=ping_inputs(pb, self.specs), requested_output_names=[],
                                  parameters={contract.PING_PARAMETER: True})
        if not self.decoupled:
            req.exec()
            return
        iterator = req.exec(decoupled=True)
        for _ in iterator:  # the final response is already buffered: ends the iterator, never waits
            pass
        keep_iterator(iterator)

    def answer(self, request: Any) -> bool:
        """Whether ``request`` is a ping; one is answered here (inside ``execute``) and counted."""
        if not is_ping(request):
            return False
        answer_ping(self.pb, request.get_response_sender(), self.decoupled)
        if self.metrics is not None:
            self.metrics.answered()
        return True

    def close(self) -> None:
        """Release the ping counter (the model unloads)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


def is_ping(request: Any) -> bool:
    """Whether a request is a ping (:data:`~chattts_serving.contract.PING_PARAMETER`)."""
    params = request.parameters() or ""
    if contract.PING_PARAMETER not in params:
        return False
    try:
        return json.loads(params).get(contract.PING_PARAMETER) is True
    except (ValueError, AttributeError):
        return False


def ping_inputs(pb: Any, specs: Sequence[contract.TensorSpec]) -> list[Any]:
    """The smallest tensors a ping needs to pass Triton's check of the model's required
    inputs (``specs``): one zero element (an empty string) of each required one."""
    out = []
    for spec in specs:
        if spec.optional:
            continue
        shape = tuple(1 if d < 0 else d for d in spec.dims)
        value = np.full(shape, b"", dtype=np.object_) if spec.np_dtype == np.object_ else np.zeros(shape, spec.np_dtype)
        out.append(pb.Tensor(spec.name, value))
    return out


def answer_ping(pb: Any, sender: Any, decoupled: bool) -> None:
    """End a ping inside ``execute``: the final flag alone (decoupled), or one empty response."""
    final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if decoupled:
        sender.send(flags=final)
    else:
        sender.send(pb.InferenceResponse(output_tensors=[]), flags=final)
