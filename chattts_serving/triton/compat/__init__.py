"""Triton 2.51's workarounds, one module per row (or family of rows) of the register in
docs/triton-workarounds.md; each module's docstring is its row (symptom, cause, what we do,
shown by, delete when).

| module | rows |
|---|---|
| :mod:`.finals` | final responses; is_cancelled after the final |
| :mod:`.pings` | ping iterators (and the pings themselves) |
| :mod:`.receipts` | receipts |
| :mod:`.cancels` | cancel datagram |
| :mod:`.grave` | iterator grave |
| :mod:`.unload` | cycles at exit; threads at stub exit; metrics at unload |
| :mod:`.error_codes` | error codes lost; server not ready (the Triton side) |
| :mod:`.ensemble` | ensemble: cancels and errors |

The models reach them through two entry points: the hooks (:mod:`.hooks`: one object per
model, called at fixed points of its life) and the error codes (:func:`triton_error`,
:func:`error_from_triton`). The BLS stages (``triton/stages.py``) use :mod:`.receipts`,
:mod:`.cancels` and :mod:`.grave` directly.
"""

from .error_codes import error_from_triton, triton_error
from .hooks import EngineHooks, EnsembleStepHooks, EntryHooks, ModelHooks

__all__ = ["EngineHooks", "EnsembleStepHooks", "EntryHooks", "ModelHooks", "error_from_triton", "triton_error"]
