"""How a tensor and a numeric request parameter are described (:class:`TensorSpec`,
:class:`ParamSpec`), and the numeric parameters of the entry points with ChatTTS' defaults and
ranges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from .units import NUM_AUDIO_TOKENS, TEXT_VOCAB_SIZE


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a Triton model's interface.

    ``dims`` excludes the batch dimension for models with ``max_batch_size > 0``; ``-1`` is a
    variable dimension. ``triton_dtype`` is the config.pbtxt spelling, ``np_dtype`` the numpy
    dtype the tensor has on the wire (``object`` for TYPE_STRING, bytes items).
    """

    name: str
    triton_dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    doc: str = ""

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(_NP_OF[self.triton_dtype])

    @property
    def client_dtype(self) -> str:
        """The tritonclient datatype string ("FP32", "BYTES", ...)."""
        return self.triton_dtype.removeprefix("TYPE_").replace("STRING", "BYTES")


_NP_OF: Final = {"TYPE_FP32": "float32", "TYPE_INT32": "int32", "TYPE_INT64": "int64",
                 "TYPE_STRING": "object", "TYPE_BOOL": "bool"}


# --- request parameters (entry points) ---------------------------------------------------
@dataclass(frozen=True)
class ParamSpec:
    """A numeric request parameter of the entry points, with ChatTTS' default and valid range.

    Defaults are ChatTTS 0.2.5's ``InferCodeParams`` (temperature 0.3, top_p 0.7, top_k 20,
    repetition penalty 1.05 over the last 16 steps); ``max_new_tokens`` is lowered from
    ChatTTS' 2048 to a serving default and capped by the deployment profile.
    """

    name: str
    triton_dtype: str
    default: float
    low: float
    high: float
    low_inclusive: bool = True
    doc: str = ""

    def tensor(self) -> TensorSpec:
        return TensorSpec(self.name, self.triton_dtype, (1,), optional=True, doc=self.doc)


SAMPLING_PARAMS: Final = (
    ParamSpec("temperature", "TYPE_FP32", 0.3, 0.0, 5.0, low_inclusive=False,
              doc="softmax temperature, > 0"),
    ParamSpec("top_p", "TYPE_FP32", 0.7, 0.0, 1.0, low_inclusive=False, doc="nucleus mass, (0, 1]"),
    ParamSpec("top_k", "TYPE_INT32", 20, 1, NUM_AUDIO_TOKENS, doc="candidates kept per head"),
    ParamSpec("repetition_penalty", "TYPE_FP32", 1.05, 1.0, 10.0,
              doc="ChatTTS' penalty over the last 16 steps, >= 1"),
    ParamSpec("max_new_tokens", "TYPE_INT32", 1024, 1, 4096,
              doc="cap on generated tokens (1 token = 512 samples)"),
    ParamSpec("min_new_tokens", "TYPE_INT32", 0, 0, 4096, doc="end-of-sequence suppressed before this"),
    ParamSpec("seed", "TYPE_INT64", 0, 0, 2**63 - 1, doc="seed of this request's sampler"),
)
SAMPLING_DEFAULTS: Final = {p.name: p.default for p in SAMPLING_PARAMS}
REPETITION_WINDOW: Final = 16
"""ChatTTS' repetition-penalty window in steps (``gen_logits``)."""
MIN_TOKENS_TO_KEEP: Final = 3
"""ChatTTS' top-p/top-k warpers keep at least 3 candidates (``min_tokens_to_keep=3``)."""

REFINE_PARAMS: Final = (
    ParamSpec("temperature", "TYPE_FP32", 0.7, 0.0, 5.0, low_inclusive=False,
              doc="refine-text softmax temperature, > 0"),
    ParamSpec("top_p", "TYPE_FP32", 0.7, 0.0, 1.0, low_inclusive=False, doc="refine-text nucleus mass, (0, 1]"),
    ParamSpec("top_k", "TYPE_INT32", 20, 1, TEXT_VOCAB_SIZE,
              doc="refine-text candidates kept (ChatTTS keeps at least 3)"),
    ParamSpec("repetition_penalty", "TYPE_FP32", 1.0, 1.0, 10.0,
              doc="penalty over the last 16 refined tokens, >= 1 (ChatTTS: 1.0)"),
    ParamSpec("max_new_tokens", "TYPE_INT32", 384, 1, 4096, doc="refined tokens at most"),
    ParamSpec("min_new_tokens", "TYPE_INT32", 0, 0, 4096, doc="[Ebreak] suppressed before this many tokens"),
    ParamSpec("seed", "TYPE_INT64", 0, 0, 2**63 - 1, doc="seed of the refine sampler"),
)
"""Numeric parameters of the refine-text stage (the GPT's text head, ChatTTS'
``skip_refine_text=False``): defaults are ChatTTS 0.2.5's ``Chat.RefineTextParams`` (top_P
0.7, top_K 20, temperature 0.7, repetition_penalty 1.0, max_new_token 384, min_new_token 0).
The GPT engine reads them under these names in text mode; the entry points take them with the
prefix :data:`REFINE_PREFIX`."""
REFINE_PREFIX: Final = "refine_"

STREAM_PARAMS: Final = (
    ParamSpec("lookahead_tokens", "TYPE_INT32", -1, -1, 256,
              doc="right context per chunk in tokens; -1 = the profile's default"),
)
