"""Register row "ensemble: cancels and errors" (docs/triton-workarounds.md): the ensemble's
last step passes a client's cancel to the engine itself.

- symptom: a client's cancel marks only the steps an ensemble schedules after it, never the
  engine's running request; a dynamic batcher answers a marked request CANCELLED without
  running its model, which ends the ensemble while the engine runs on; a step error while
  windows are in flight leaves the ensemble waiting for good.
- cause: core's ensemble scheduler and dynamic batcher.
- what we do: every step after the engine is one decoupled model without a batcher,
  ``chattts_ensemble_vocoder`` (``deploy/render.py``), which sees every marked request and
  hands it to :func:`relay_cancel`: the engine's sequence is cancelled over its cancel socket
  (:mod:`.cancels`) and the step ends without audio. The engine's ensemble sink never asks
  ``is_cancelled`` and sends a stream's error as an empty window that this step answers with
  the error (``triton/responses.py``).
- shown by: ``tests/server/test_ensemble.py``.
- delete when: running steps see the cancel and step errors end the ensemble.
"""

from __future__ import annotations

import logging

from ... import contract
from ...serving.logs import log_event
from .cancels import cancel_address, send_cancel

log = logging.getLogger(__name__)


def engine_cancel_address() -> str:
    """The cancel socket of this server's engine."""
    return cancel_address(contract.MODEL_ENGINE)


def relay_cancel(address: str, stream_id: str, model: str, request_id: str) -> None:
    """Cancel the engine sequence ``stream_id`` of a request Triton marked cancelled (from the
    step ``model``): a datagram to the engine's cancel socket at ``address``, logged."""
    if not send_cancel(address, stream_id):
        log.warning("%s: could not reach the engine's cancel socket for %s", model, stream_id)
    log_event("ensemble_cancelled", model=model, request_id=request_id, stream_id=stream_id)
