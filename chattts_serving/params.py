"""Request parameters shared by every layer: the code stage's sampling parameters and their
range check (ranges and defaults in :data:`chattts_serving.contract.SAMPLING_PARAMS`).

The refine-text stage's parameters (:class:`chattts_serving.text.refine.RefineParams`) use the
same check with their own ranges. Nothing here imports Triton, torch or onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import contract


class ParamError(ValueError):
    """A request parameter outside its documented range (message names it); ``param``: its
    name (the input's, ``prefix`` included: :func:`check_params`), None when unknown."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request (defaults: ChatTTS' ``InferCodeParams``).

    Raises :class:`ParamError` from :meth:`validate` for values outside
    ``contract.SAMPLING_PARAMS``' ranges.
    """

    temperature: float = float(contract.SAMPLING_DEFAULTS["temperature"])
    top_p: float = float(contract.SAMPLING_DEFAULTS["top_p"])
    top_k: int = int(contract.SAMPLING_DEFAULTS["top_k"])
    repetition_penalty: float = float(contract.SAMPLING_DEFAULTS["repetition_penalty"])
    max_new_tokens: int = int(contract.SAMPLING_DEFAULTS["max_new_tokens"])
    min_new_tokens: int = int(contract.SAMPLING_DEFAULTS["min_new_tokens"])
    seed: int = int(contract.SAMPLING_DEFAULTS["seed"])

    def validate(self, max_new_tokens_cap: int | None = None) -> SamplingParams:
        """Return self if every field is in range, else raise :class:`ParamError`."""
        check_params(self, contract.SAMPLING_PARAMS, max_new_tokens_cap)
        return self


def check_params(params: object, specs: tuple[contract.ParamSpec, ...], max_new_tokens_cap: int | None = None,
                 prefix: str = "") -> None:
    """Check the attributes of ``params`` named by ``specs`` against their ranges: each a
    finite number (an integer for non-FP32 specs), inside [low, high] (low exclusive where
    the spec says so); ``max_new_tokens`` at most ``max_new_tokens_cap``; ``min_new_tokens``
    at most ``max_new_tokens``. Messages name each field as ``prefix + name``.

    Raises:
        ParamError: the first check that fails.
    """
    for spec in specs:
        v = getattr(params, spec.name)
        name = prefix + spec.name
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ParamError(f"{name} must be a number, got {v!r}", name)
        is_int = isinstance(v, (int, np.integer))
        if not is_int and not np.isfinite(v):
            raise ParamError(f"{name} must be a finite number, got {v}", name)
        if spec.triton_dtype != "TYPE_FP32" and not is_int and not float(v).is_integer():
            raise ParamError(f"{name} must be an integer, got {v!r}", name)
        top = spec.high  # the top of the range this deployment serves
        if spec.name == "max_new_tokens" and max_new_tokens_cap is not None:
            top = min(top, max_new_tokens_cap)
        capped = top < spec.high
        low_ok = v >= spec.low if spec.low_inclusive else v > spec.low
        if not low_ok or v > top:
            lo = "[" if spec.low_inclusive else "("
            if spec.triton_dtype == "TYPE_FP32":  # float32 inputs: 5.01 arrives as 5.010000228881836
                shown, low, high = f"{float(v):.6g}", f"{spec.low:g}", f"{top:g}"
            else:
                shown, low, high = str(int(v)), str(int(spec.low)), str(int(top))
            cap = " (this deployment's cap)" if capped else ""
            raise ParamError(f"{name}={shown} is out of range {lo}{low}, {high}]{cap}: {spec.doc}", name)
    max_new, min_new = getattr(params, "max_new_tokens"), getattr(params, "min_new_tokens")  # noqa: B009
    if min_new > max_new:
        raise ParamError(f"{prefix}min_new_tokens={min_new} exceeds {prefix}max_new_tokens={max_new}",
                         f"{prefix}min_new_tokens")
