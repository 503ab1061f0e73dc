"""Precision variants of an exported artifact directory, added as a profile or the CLI asks.

One entry point for ``chattts-export --precision`` and ``make demo PROFILE=...``, so that a
profile whose ``precision`` names a variant finds it exported (fp16: :mod:`.fp16`, int8:
:mod:`.int8`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..contract import Precision

VARIANT_PRECISIONS = tuple(str(p) for p in Precision if p not in (Precision.FP32, Precision.AUTO))
"""Precisions written next to the fp32 graphs on request (fp32 is always exported)."""


def ensure_precision(out: Path, weights_root: Path, precision: str, *, force: bool = False,
                     progress: Callable[[str], None] | None = None) -> bool:
    """Add the ``precision`` variant to the complete fp32 artifact directory ``out`` unless it
    is up to date (or ``force``). fp16 checks its parity against ChatTTS' torch modules, so it
    loads the checkpoint in ``weights_root``; int8 is checked against the fp32 graph and needs
    no weights. ``fp32`` is a no-op, and so is ``auto`` (it runs int8 only where an int8 graph was
    exported and measured accurate enough: ``make int8-accuracy``).

    Returns True when a variant was written.

    Raises:
        ValueError: an unknown precision.
        chattts_serving.export.weights.WeightsError: the variant's parity check failed, or the
            artifacts are incomplete.
    """
    say = progress or (lambda _msg: None)
    if precision in (Precision.FP32, Precision.AUTO):
        return False
    if precision == Precision.FP16:
        from .fp16 import add_fp16, fp16_up_to_date
        from .weights import load_chat

        if not force and fp16_up_to_date(out):
            return False
        say("loading weights through ChatTTS (fp16 parity reference)")
        return add_fp16(load_chat(weights_root), out, force=True, progress=say)
    if precision == Precision.INT8:
        from .int8 import INT8_VOCODER_BLOCK_SIZE, add_int8, quantize_graph
        from .streaming import ensure_streaming_vocoders

        wrote = add_int8(out, force=force, progress=say)
        quantize = partial(quantize_graph, block_size=INT8_VOCODER_BLOCK_SIZE, keep_fp32=())
        return ensure_streaming_vocoders(out, weights_root, quantize=quantize, progress=say) or wrote
    raise ValueError(f"unknown precision {precision!r}; expected fp32 or one of {VARIANT_PRECISIONS}")
