"""Helpers for tests that drive the GPT engine's text mode (refine-text) directly."""

from __future__ import annotations

from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.contract import SequenceMode
from chattts_serving.engine.sequence import Sequence, make_sequence
from chattts_serving.engine.sinks import TokenSink
from chattts_serving.text.refine import RefineParams


def refine_sequence(prompt_ids: np.ndarray, params: RefineParams, sink: TokenSink, **kwargs: Any) -> Sequence:
    """A text-mode engine Sequence: ``prompt_ids`` (T,) from ``refine_prompt_ids``, no speaker
    vector, ``params`` (validated here: ParamError) as sampling parameters; ``kwargs`` are the
    other Sequence fields. The sink receives codes (N, 4) int32 whose columns all hold the
    refined text id (:func:`text_ids`)."""
    params.validate()
    return make_sequence(np.asarray(prompt_ids), None, params.sampling_params(), sink, mode=SequenceMode.TEXT, **kwargs)


def text_ids(codes: np.ndarray) -> np.ndarray:
    """Text ids (N,) int64 from a text-mode sequence's codes (N, 4) (column 0). Raises
    ValueError when ``codes`` is not (N, 4), its columns differ, or an id is outside the text
    vocabulary."""
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != contract.NUM_VQ:
        raise ValueError(f"text-mode codes must have shape (N, {contract.NUM_VQ}), got {c.shape}")
    if c.size and ((c != c[:, :1]).any() or c.min() < 0 or c.max() >= contract.TEXT_VOCAB_SIZE):
        raise ValueError("these are not text-mode codes (columns differ or ids are outside the text vocabulary)")
    return c[:, 0].astype(np.int64)
