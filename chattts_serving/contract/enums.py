"""The enumerations of the contract: string values as they travel on the wire (Triton string
inputs, JSON, profiles) and what each member means."""

from __future__ import annotations

from enum import Enum


class WireEnum(str, Enum):
    """A string enumeration whose members are their values on the wire, in JSON and in
    f-strings alike (Python 3.10's Triton stub has no ``enum.StrEnum``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class VocoderPath(WireEnum):
    """Which vocoder turns tokens into audio."""

    HIDDEN = "hidden"
    """GPT hidden states (T, H) -> Decoder -> mel -> Vocos (ChatTTS' default)."""
    CODES = "codes"
    """Codes (T, 4) -> DVAE -> mel -> Vocos (about half the cost)."""


class Priority(WireEnum):
    """A request's scheduling class (the entry models' ``priority`` input)."""

    REALTIME = "realtime"
    BATCH = "batch"

    @property
    def engine_class(self) -> int:
        """The GPT engine's scheduling class: lower is admitted first (0 realtime, 1 batch)."""
        return 0 if self is Priority.REALTIME else 1


class StopReason(WireEnum):
    """Why a sequence (or a stream) ended without an error."""

    EOS = "eos"
    """The model emitted its end token (625 on a code head; ``[Ebreak]`` in text mode)."""
    MAX_TOKENS = "max_new_tokens"
    """It reached the request's ``max_new_tokens``."""
    CANCELLED = "cancelled"
    """The client cancelled."""


class SequenceMode(WireEnum):
    """What a GPT engine sequence generates."""

    CODE = "code"
    """Speech codes: decode steps embed the 4 previous codes, logits from the 4 code heads."""
    TEXT = "text"
    """Refine-text (ChatTTS' ``GPT.generate(infer_text=True)``): text ids from the text head."""


class Segmentation(WireEnum):
    """How a request's text is cut into GPT sequences (the entry models' ``segmentation``
    input; profile ``frontend.segmentation`` is the default)."""

    STREAMING = "streaming"
    """Sentence segments, short ones merged, each generated and streamed as soon as it can be
    (``text.segments.split_segments``): the lowest time to first audio."""
    CHATTTS = "chattts"
    """ChatTTS 0.2.5's ``Chat.infer``: its split (every ``。``, ``. ``, newline) and, for more
    than one piece without a reference, its first-piece audio prompt (one voice across a
    paragraph); the first audio comes after that reference pass."""


class Language(WireEnum):
    """The language of what a request's text gives no context for (the entry models'
    ``language`` input): a bare ``25kg`` or ``03:04pm``, a text of digits and symbols."""

    AUTO = "auto"
    """The language with more words in the text (Chinese on a tie)."""
    ZH = "zh"
    EN = "en"


class Precision(WireEnum):
    """Precision of an exported graph (``chattts-export --precision``, profile ``precision``)."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    """8-bit weight graphs (``chattts-export --precision int8``): the GPT step and both
    vocoders, see :data:`INT8_GRAPH_FILES`."""
    AUTO = "auto"
    """int8 where the artifacts hold that graph's int8 variant and the int8 accuracy measured
    for them (manifest.json ``precisions.int8.accuracy.meets_threshold``) meets the project's
    threshold, else fp32 (``runtime.resolve_precision``)."""


class KvPrecision(WireEnum):
    """Element type of the GPT step's KV cache (profile ``engine.kv_cache``): what the fused
    graph's ``past_*``/``present_*`` hold and the engine's preallocated cache buffers are made
    of. Attention itself computes in the graph's compute type; see
    ``chattts_serving/engine/kvprecision.py``."""

    FP32 = "fp32"
    """The exported graph as it is (the reference: served fp32 == ChatTTS)."""
    FP16 = "fp16"
    """Half the cache bytes: the attention of the graph runs in fp16 on the cache (the query
    is cast to fp16 and the attention output back to fp32; ONNX Runtime's CPU
    GroupQueryAttention takes an fp16 cache only with an fp16 query)."""
    INT8 = "int8"
    """A quarter of the cache bytes: symmetric int8 with one static scale per head and
    channel for K and for V of each layer, calibrated on the fp32 graph
    (:data:`KV_SCALES_FILE`); GroupQueryAttention dequantizes on read and computes in fp32."""
    AUTO = "auto"
    """int8 where the artifacts hold the int8 cache's scales and its accuracy measured with the
    weights in use (manifest.json ``kv_cache.int8.accuracy.<weights>.meets_threshold``, written
    by ``python -m chattts_serving.export.accuracy kv``) meets the project's threshold, else fp32
    (``runtime.resolve_kv_precision``)."""
