"""The one source of truth for names, dtypes and audio geometry.

Every Triton model, the clients, the load tests and the tests import their tensor names,
dtypes, model names and audio constants from here, so that the server and its users cannot
drift apart. Nothing in this module imports Triton, torch or onnxruntime.

Audio geometry (ChatTTS 0.2.5, ``ChatTTS/config/config.py`` and ``vocos`` head config):
one GPT step emits one token = 4 codes; the Decoder/DVAE upsample each token to 2 mel frames;
Vocos' iSTFT has a hop of 256 samples, so one token is 512 samples of 24 kHz mono audio,
46.875 tokens per second of audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

import numpy as np


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
    by ``python -m chattts_serving.bench.kv``) meets the project's threshold, else fp32
    (``runtime.resolve_kv_precision``)."""

# --- audio -----------------------------------------------------------------------------
SAMPLE_RATE_HZ: Final = 24000
"""Output sample rate of every audio tensor, in Hz (mono, float32 in [-1, 1])."""
HOP_SAMPLES: Final = 256
"""Vocos iSTFT hop length, samples per mel frame."""
MEL_FRAMES_PER_TOKEN: Final = 2
SAMPLES_PER_TOKEN: Final = HOP_SAMPLES * MEL_FRAMES_PER_TOKEN
"""Samples of audio per GPT step (512)."""
N_FFT: Final = 1024
"""Vocos iSTFT frame size in samples (and the DVAE encoder's STFT size)."""
N_MELS: Final = 100
"""Mel bins of the vocoders' and the DVAE encoder's mel spectrograms."""

# --- GPT codes ---------------------------------------------------------------------------
NUM_VQ: Final = 4
"""Codes per GPT step (one per code head)."""
NUM_AUDIO_TOKENS: Final = 626
"""Code vocabulary per head: 0..624 are audio codes, 625 ends the sequence."""
EOS_CODE: Final = 625
"""A code-head value that ends the sequence (not emitted)."""
TEXT_VOCAB_SIZE: Final = 21178
"""bert-base-chinese (21128) plus ChatTTS' 50 added tokens (ids 21128..21177)."""
BERT_VOCAB_SIZE: Final = 21128
SPECIAL_TOKEN_IDS: Final = {"[Stts]": 21131, "[Ebreak]": 21136, "[laugh]": 21142, "[spk_emb]": 21143,
                            "[break_0]": 21147}
"""Special-token ids of ChatTTS' published tokenizer that the project relies on."""

# --- Triton model names ------------------------------------------------------------------
MODEL_STREAM: Final = "chattts"
"""Decoupled entry point: text in, audio chunks streamed out. With the admission gate on (the
default, profile ``[entry] gate``) it is the C++ gate (``chattts_serving/gate/gate.cc``), which
answers "server busy" itself and forwards the rest to :data:`MODEL_STREAM_ENTRY`; without it,
the Python BLS entry model under this name."""
MODEL_STREAM_ENTRY: Final = "chattts_entry"
"""The Python BLS entry model behind the gate (metrics and logs labelled ``model="chattts"``)."""
GATE_BACKEND: Final = "chattts_gate"
"""The gate's Triton backend name (``backends/chattts_gate/libtriton_chattts_gate.so``)."""
MODEL_OFFLINE: Final = "chattts_offline"
"""Non-decoupled entry point for HTTP ``/v2/models/chattts_offline/infer``: the whole utterance.
With the gate on it is a second instance of the C++ gate, in front of :data:`MODEL_OFFLINE_ENTRY`."""
MODEL_OFFLINE_ENTRY: Final = "chattts_offline_entry"
"""The Python offline entry model behind its gate (metrics and logs labelled ``model="chattts_offline"``)."""
GATED_MODELS: Final = {MODEL_STREAM: MODEL_STREAM_ENTRY, MODEL_OFFLINE: MODEL_OFFLINE_ENTRY}
"""Each public entry model and the Python model behind it when the gate is on."""
MODEL_ADMISSION: Final = "chattts_admission"
"""The admission watch (gate on only): a decoupled model of the gate's backend that answers a
request with one response at once, one more each time a door of :data:`ADMISSION_DOORS` fills
or stops being full (output :data:`ADM_FULL`) and the same again every
:data:`ADMISSION_HEARTBEAT_S` between changes, until the client cancels or a gate unloads
(then it ends with the final flag: subscribe again). The OpenAI gateway subscribes to it and
refuses "busy" itself while ``chattts`` is full."""
PING_PARAMETER: Final = "chattts_ping"
"""Request parameter (BOOL true) of a ping: a request to a Python model that sends final
responses from its own threads (the entry models, the GPT engine), answered at once by its
``execute`` with an empty final response and nothing else. A model pings itself to get an
``execute`` in which to send its queued final responses, and the admission gate pings its
target to tell a live model from a stuck one (docs/triton-workarounds.md, "final responses")."""
ADMISSION_DOORS: Final = (MODEL_STREAM, MODEL_OFFLINE)
"""The doors the admission watch reports on, in the order of :data:`ADM_FULL`'s elements."""
ADMISSION_HEARTBEAT_S: Final = 5.0
"""Between changes the admission watch repeats its report this often, in seconds: a subscriber
that hears nothing for a few of these stops trusting the last report (a dead connection, not a
quiet server)."""
MODEL_ENSEMBLE: Final = "chattts_ensemble"
"""The ensemble door: a Triton ``platform: "ensemble"`` model whose steps are
:data:`MODEL_FRONTEND` (the whole request: validated, one sentence segment -> prompt),
:data:`MODEL_ENGINE` (in window mode: one response per vocoder window of the chunk schedule),
:data:`MODEL_ENSEMBLE_VOCODER`; it streams the same audio chunks as
:data:`MODEL_STREAM` for one sentence, without a Python entry model in the per-chunk path, and
refuses what only :data:`MODEL_STREAM` does (refine-text, several segments, reference
recordings: docs/ensemble.md)."""
MODEL_ENSEMBLE_VOCODER: Final = "chattts_ensemble_vocoder"
"""The ensemble's last step (decoupled, no Triton batching): vocodes each window the engine
sends, drops the engine's progress ticks, and tells the engine when the client has cancelled
(docs/triton-workarounds.md, "ensemble: cancels and errors")."""
MODEL_FRONTEND: Final = "chattts_frontend"
MODEL_ENGINE: Final = "chattts_gpt"
MODEL_VOCODER: Final = "chattts_vocoder"
"""hidden (T, H) -> Decoder -> Vocos -> waveform (ChatTTS' default path)."""
MODEL_VOCODER_CODES: Final = "chattts_dvae_vocoder"
"""codes (T, 4) -> DVAE -> Vocos -> waveform (about half the cost)."""
ALL_MODELS: Final = (MODEL_FRONTEND, MODEL_ENGINE, MODEL_VOCODER, MODEL_VOCODER_CODES, MODEL_STREAM,
                     MODEL_OFFLINE, MODEL_STREAM_ENTRY, MODEL_OFFLINE_ENTRY, MODEL_ADMISSION, MODEL_ENSEMBLE_VOCODER,
                     MODEL_ENSEMBLE)
"""Every model of the repository with the gate on (the default); without it, all but the
Python models behind the gates (:data:`GATED_MODELS`) and the admission watch (:func:`models`)."""


def models(gate: bool) -> tuple[str, ...]:
    """The repository's models, with or without the admission gate."""
    gate_only = (*GATED_MODELS.values(), MODEL_ADMISSION)
    return ALL_MODELS if gate else tuple(m for m in ALL_MODELS if m not in gate_only)

REJECTED_METRIC: Final = "tts_rejected_total"
REJECTED_HELP: Final = "Requests refused before any work, by reason"
"""The refusal counter (labels ``model``, ``reason``) and its help text: the entry models and
the admission gate register the same family, which Triton merges only when name and help agree
(deploy/render.py passes both to the gate)."""

ACTIVE_METRIC: Final = "tts_active_requests"
"""The gauge of accepted requests in flight per entry model (label ``model``): set by the entry
models, read by the drain before a stop (:mod:`chattts_serving.deploy.drain`)."""

VOCODER_PATHS: Final = {VocoderPath.HIDDEN: MODEL_VOCODER, VocoderPath.CODES: MODEL_VOCODER_CODES}
"""The vocoder model that serves each path."""


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

# priorities: the ``priority`` input of the entry points (:class:`Priority`; "priority" itself
# is a reserved Triton request-parameter name, and Python models cannot read Triton's request
# priority)

# entry-point inputs (models chattts and chattts_offline, max_batch_size 0)
IN_TEXT: Final = TensorSpec("text", "TYPE_STRING", (1,), doc="UTF-8 text, Chinese and/or English")
IN_VOICE: Final = TensorSpec("voice", "TYPE_STRING", (1,), optional=True,
                             doc="speaker: integer seed, ChatTTS spk_emb string, or empty for the default")
IN_VOCODER: Final = TensorSpec("vocoder", "TYPE_STRING", (1,), optional=True,
                               doc="'hidden' (Decoder, ChatTTS' default) or 'codes' (DVAE)")
IN_PRIORITY: Final = TensorSpec("priority", "TYPE_STRING", (1,), optional=True,
                                doc="'realtime' (default) or 'batch': realtime requests are scheduled first")
IN_TIMEOUT: Final = TensorSpec("timeout_s", "TYPE_FP32", (1,), optional=True,
                               doc="deadline for the whole request in seconds, (0, 3600]; expiry ends it with an error")
IN_REFINE_TEXT: Final = TensorSpec("refine_text", "TYPE_BOOL", (1,), optional=True,
                                   doc="run ChatTTS' refine-text stage first (pauses, laughs, fillers); default false")
IN_REFINE_PROMPT: Final = TensorSpec("refine_prompt", "TYPE_STRING", (1,), optional=True,
                                     doc="control tokens for refine-text, e.g. '[oral_2][laugh_0][break_6]'")
IN_SEGMENTATION: Final = TensorSpec("segmentation", "TYPE_STRING", (1,), optional=True,
                                    doc="'streaming' (sentence segments, lowest TTFA) or 'chattts' (ChatTTS' split and "
                                        "first-piece audio prompt); default: the profile's frontend.segmentation")
IN_LANGUAGE: Final = TensorSpec("language", "TYPE_STRING", (1,), optional=True,
                                doc="'auto' (default), 'zh' or 'en': the language numbers, units and symbols are read "
                                    "in where the text around them does not say")
IN_REFERENCE_AUDIO: Final = TensorSpec("reference_audio", "TYPE_FP32", (-1,), optional=True,
                                       doc="reference recording: mono samples in [-1, 1] at reference_sample_rate_hz, "
                                           "the voice to speak with (ChatTTS' spk_smp, encoded by the DVAE encoder)")
IN_REFERENCE_RATE: Final = TensorSpec("reference_sample_rate_hz", "TYPE_INT32", (1,), optional=True,
                                      doc="sample rate of reference_audio in Hz (default 24000; others are resampled)")
IN_REFERENCE_TEXT: Final = TensorSpec("reference_text", "TYPE_STRING", (1,), optional=True,
                                      doc="transcript of reference_audio or spk_smp (ChatTTS' txt_smp); required with "
                                          "either")
IN_SPK_SMP: Final = TensorSpec("spk_smp", "TYPE_STRING", (1,), optional=True,
                               doc="a ChatTTS audio-prompt string (Chat.sample_audio_speaker), instead of "
                                   "reference_audio")
IN_VALIDATE_ONLY: Final = TensorSpec("validate_only", "TYPE_BOOL", (1,), optional=True,
                                     doc="check the request whole (parameters, voice, reference, refine prompt) and "
                                         "end with the final info and no audio: nothing is generated")
ENTRY_INPUTS: Final = (IN_TEXT, IN_VOICE, IN_VOCODER, IN_PRIORITY, IN_TIMEOUT,
                       *(p.tensor() for p in SAMPLING_PARAMS), *(p.tensor() for p in STREAM_PARAMS),
                       IN_REFINE_TEXT, IN_REFINE_PROMPT,
                       *(TensorSpec(REFINE_PREFIX + p.name, p.triton_dtype, (1,), optional=True, doc=p.doc)
                         for p in REFINE_PARAMS),
                       IN_SEGMENTATION, IN_REFERENCE_AUDIO, IN_REFERENCE_RATE, IN_REFERENCE_TEXT, IN_SPK_SMP,
                       IN_LANGUAGE, IN_VALIDATE_ONLY)
OUT_AUDIO: Final = TensorSpec("audio", "TYPE_FP32", (-1,),
                              doc="mono waveform samples at SAMPLE_RATE_HZ, float32 in [-1, 1]")
OUT_INFO: Final = TensorSpec("info", "TYPE_STRING", (1,),
                             doc="JSON object about the request (see INFO_HEADER_KEYS, INFO_FINAL_KEYS)")
ENTRY_OUTPUTS: Final = (OUT_AUDIO, OUT_INFO)
ADM_FULL: Final = TensorSpec("full", "TYPE_BOOL", (-1,),
                             doc="per door of ADMISSION_DOORS: every slot taken, a request now is refused busy")
"""The admission watch's one output (no inputs); its name is also written in gate.cc."""
INFO_HEADER_KEYS: Final = ("request_id", "sample_rate_hz", "normalized_text", "dropped", "segments", "vocoder",
                           "refined", "degraded", "segmentation", "reference", "segment_starts", "final")
"""Keys of ``info`` on a stream's first audio response: the request id (the client's Triton
request id, or one generated by the server), 24000, the text after normalisation (one string
per sentence segment; after refine-text, the refined text the code stage spoke), the characters
or reserved tokens that were not spoken (never dropped silently), the number of segments, the
vocoder path, whether refine-text ran, whether the server ran the request in its degraded mode
(which skips refine-text), the segmentation (:class:`Segmentation`), where the audio prompt
came from (:data:`REFERENCE_SOURCES`), ``segment_starts`` (the sample offset at SAMPLE_RATE_HZ where
each segment's audio begins, so far; the first chunk of every later segment carries an ``info``
of only ``{"segment_starts": [...]}``, the list grown by one: where sentences start in the audio,
as it streams), and ``final`` false. Triton 2.51's Python backend cannot set response
parameters (docs/triton-workarounds.md, "no response parameters"), so this travels as an
output; the client's request id also comes back in every
response's ``id`` field (Triton's own)."""
INFO_FINAL_KEYS: Final = (*INFO_HEADER_KEYS, "audio_s", "chunks", "tokens", "capped_segments", "stop_reason")
"""Keys of ``info`` on the final response (streaming) or the only one (offline): the header's
keys with ``final`` true, plus seconds of audio sent, audio chunks, GPT tokens, the indices of
segments that hit max_new_tokens (their sentence may be cut short) and the last stop reason."""

REFERENCE_SOURCES: Final = ("", "recording", "spk_smp", "voice", "first_piece")
"""``info.reference``: no audio prompt; the request's reference_audio; its spk_smp; the
recording of a voice from the voices file; the first piece's own audio (``chattts``
segmentation, more than one piece, no other reference)."""

# front end
FE_INPUT_IDS: Final = TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True, doc="prompt token ids (T,)")
FE_SPK_EMB: Final = TensorSpec("spk_emb", "TYPE_FP32", (-1,),
                               doc="L2-normalised speaker vector (H,); empty (0,) without one ([empty_spk] prompt)")
FE_NORMALIZED: Final = TensorSpec("normalized_text", "TYPE_STRING", (1,), doc="text after normalisation")
FE_DROPPED: Final = TensorSpec("dropped", "TYPE_STRING", (1,),
                               doc="JSON list of the characters or reserved tokens that are not spoken")
FE_REFINE_IDS: Final = TensorSpec("refine_ids", "TYPE_INT32", (-1,),
                                  doc="refine-text prompt ids [Sbreak]{normalized}[Pbreak]{refine_prompt} (T,)")
FE_REFINED_IDS: Final = TensorSpec("refined_ids", "TYPE_INT32", (-1,), optional=True,
                                   doc="text ids the refine stage generated (N,): the code prompt is built from them")
FE_NO_SPEAKER: Final = TensorSpec("no_speaker", "TYPE_BOOL", (1,), optional=True,
                                  doc="true: no speaker vector, [empty_spk] in the prompt (a reference recording "
                                      "alone)")
FE_KEEP_UNSPEAKABLE: Final = TensorSpec("keep_unspeakable", "TYPE_BOOL", (1,), optional=True,
                                        doc="true: a piece of ChatTTS' split, prompted even when nothing in it can be "
                                            "spoken (a blank line, a lone 。), as ChatTTS does")
FE_TRANSIENT_REFERENCE: Final = TensorSpec("transient_reference", "TYPE_BOOL", (1,), optional=True,
                                           doc="true: reference_audio is used once (the first piece's own audio): "
                                               "encoded without the recording checks and not cached")
FE_PROMPT_CODES: Final = TensorSpec("prompt_codes", "TYPE_INT32", (-1, NUM_VQ),
                                    doc="audio-prompt codes (P, 4) of reference_audio or of the voice's recording; "
                                        "(0, 4) for none")
FE_REQUEST_TEXT: Final = TensorSpec("request_text", "TYPE_STRING", (1,), optional=True,
                                   doc="the ensemble door's whole request (its 'text'; the other entry inputs under "
                                       "their own names): validated like chattts' and prepared for the engine's "
                                       "window mode; without it the call is one segment of a BLS pipeline")
FRONTEND_REQUEST_INPUTS: Final = tuple(t for t in ENTRY_INPUTS if t.name not in
                                       {IN_TEXT.name, IN_VOICE.name, IN_REFINE_PROMPT.name, IN_REFERENCE_TEXT.name,
                                        IN_REFERENCE_AUDIO.name, IN_REFERENCE_RATE.name, IN_VALIDATE_ONLY.name})
"""The entry inputs the front end takes only for an ensemble request (the others it takes anyway)."""
FE_TEXT: Final = TensorSpec(IN_TEXT.name, IN_TEXT.triton_dtype, IN_TEXT.dims, optional=True,
                            doc="one segment's text (required, unless the call has request_text or segments)")
FE_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,),
                                 doc="ensemble request: the engine sequence's handle (a fresh UUID hex)")
FE_ENGINE_PRIORITY: Final = TensorSpec("engine_priority", "TYPE_INT32", (1,),
                                       doc="ensemble request: the engine's scheduling class (0 realtime, 1 batch)")
FE_TIMEOUT_MS: Final = TensorSpec("timeout_ms", "TYPE_INT64", (1,),
                                  doc="ensemble request: what is left of timeout_s in ms (0: no deadline)")
FE_LOOKAHEAD: Final = TensorSpec("window_lookahead_tokens", "TYPE_INT32", (1,),
                                 doc="ensemble request: the request's lookahead_tokens (-1: the profile's schedule)")
FE_INFO: Final = TensorSpec("info_header", "TYPE_STRING", (1,),
                            doc="ensemble request: info JSON of the stream's first chunk (INFO_HEADER_KEYS)")
FRONTEND_REQUEST_OUTPUTS: Final = (FE_STREAM_ID, FE_ENGINE_PRIORITY, FE_TIMEOUT_MS, FE_LOOKAHEAD, FE_INFO)

# GPT engine (decoupled)
EN_EMIT_TOKENS: Final = TensorSpec("emit_tokens", "TYPE_INT32", (1,), optional=True,
                                   doc="tokens per streamed response (default 1)")
EN_FIRST_EMIT: Final = TensorSpec("first_emit_tokens", "TYPE_INT32", (1,), optional=True,
                                  doc="also send a response when exactly this many tokens exist (0: off)")
EN_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,), optional=True,
                                 doc="caller's handle for this sequence, used by a later cancel request")
EN_CONTROL: Final = TensorSpec("control", "TYPE_STRING", (1,), optional=True,
                               doc="'cancel': end the live sequence named by stream_id (no other inputs)")
EN_PRIORITY: Final = TensorSpec("priority", "TYPE_INT32", (1,), optional=True,
                                doc="scheduling class: 0 realtime (admitted first), 1 batch")
EN_TIMEOUT_MS: Final = TensorSpec("timeout_ms", "TYPE_INT64", (1,), optional=True,
                                  doc="the sequence ends with an error this many ms after submission")
EN_MODE: Final = TensorSpec("mode", "TYPE_STRING", (1,), optional=True,
                            doc="'code' (speech codes, default) or 'text' (refine-text: no spk_emb; sampling inputs "
                                "take REFINE_PARAMS' defaults and ranges; codes carry the text id in every column)")
EN_SPK_EMB: Final = TensorSpec("spk_emb", "TYPE_FP32", (-1,), optional=True,
                               doc="L2-normalised speaker vector (H,); none or (0,): [empty_spk] prompt")
EN_PROMPT_CODES: Final = TensorSpec("prompt_codes", "TYPE_INT32", (-1, NUM_VQ), optional=True,
                                    doc="audio-prompt codes (P, 4) in [0, 625) after the text prompt (ChatTTS' "
                                        "spk_smp), (0, 4) for none; code mode only")
EN_DELIVERY_ADDRESS: Final = TensorSpec("delivery_address", "TYPE_STRING", (1,), optional=True,
                                        doc="the caller's receipt socket (Linux abstract namespace): the engine writes "
                                            "stream_id there after each response it sent "
                                            "(chattts_serving.triton.deliveries)")
EN_WINDOW_LOOKAHEAD: Final = TensorSpec(FE_LOOKAHEAD.name, "TYPE_INT32", (1,), optional=True,
                                        doc="window mode (the ensemble door): respond with vocoder windows of the "
                                            "profile's chunk schedule at this lookahead (-1: the profile's) instead "
                                            "of token batches")
EN_INFO_HEADER: Final = TensorSpec(FE_INFO.name, "TYPE_STRING", (1,), optional=True,
                                   doc="window mode: info JSON for the first window (the last one's is completed "
                                       "with the final keys)")
ENGINE_INPUTS: Final = (FE_INPUT_IDS, EN_SPK_EMB, *(p.tensor() for p in SAMPLING_PARAMS), EN_EMIT_TOKENS,
                        EN_STREAM_ID, EN_CONTROL, EN_PRIORITY, EN_TIMEOUT_MS, EN_FIRST_EMIT, EN_MODE, EN_PROMPT_CODES,
                        EN_DELIVERY_ADDRESS, EN_WINDOW_LOOKAHEAD, EN_INFO_HEADER)
EN_CODES: Final = TensorSpec("codes", "TYPE_INT32", (-1, NUM_VQ), doc="codes of the new tokens (N, 4)")
EN_HIDDEN: Final = TensorSpec("hidden", "TYPE_FP32", (-1, -1), doc="GPT last hidden state per token (N, H)")
EN_STOP: Final = TensorSpec("stop_reason", "TYPE_STRING", (1,),
                            doc="'' while running, then 'eos', 'max_new_tokens' or 'cancelled'")
# window mode (the ensemble door): a response is a vocoder window, or a progress tick that
# carries only window_stream_id (the ensemble vocoder's chance to see a client's cancel)
WIN_HIDDEN: Final = TensorSpec("window_hidden", "TYPE_FP32", (-1, -1), optional=True,
                               doc="the window's tokens' hidden states (T, H): new tokens with left context and "
                                   "lookahead; (0, H) for an error or an empty last window")
WIN_PLAN: Final = TensorSpec("window_plan", "TYPE_INT32", (3,), optional=True,
                             doc="[chunk index, first sample of the window's audio to keep, samples to keep]")
WIN_INFO: Final = TensorSpec("window_info", "TYPE_STRING", (1,), optional=True,
                             doc="info JSON of the first chunk (INFO_HEADER_KEYS) and of the last (INFO_FINAL_KEYS); "
                                 "'' for the others")
WIN_ERROR: Final = TensorSpec("window_error", "TYPE_STRING", (1,), optional=True,
                              doc="'' or the stream's error ([kind] message): the ensemble vocoder answers it "
                                  "with that error")
WIN_STREAM_ID: Final = TensorSpec("window_stream_id", "TYPE_STRING", (1,), optional=True,
                                  doc="the engine sequence's stream_id (the ensemble vocoder cancels it when the "
                                      "client has gone)")
WIN_REQUEST_ID: Final = TensorSpec("window_request_id", "TYPE_STRING", (1,), optional=True,
                                   doc="the stream's request id (the client's, or the one the front end generated), "
                                       "on every window: for the vocoder step's log lines")
WINDOW_OUTPUTS: Final = (WIN_HIDDEN, WIN_PLAN, WIN_INFO, WIN_ERROR, WIN_STREAM_ID, WIN_REQUEST_ID)
ENGINE_OUTPUTS: Final = (EN_CODES, EN_HIDDEN, EN_STOP, *WINDOW_OUTPUTS)

# vocoders (max_batch_size > 0: dims exclude the batch dimension)
VO_HIDDEN: Final = TensorSpec("hidden", "TYPE_FP32", (-1, -1), doc="token window of GPT hidden states (T, H)")
VO_CODES: Final = TensorSpec("codes", "TYPE_INT32", (-1, NUM_VQ), doc="token window of codes (T, 4)")
VO_AUDIO: Final = TensorSpec("audio", "TYPE_FP32", (-1,), doc="waveform of the window, 512*T-256 samples")
VO_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,), optional=True,
                                 doc="a carried stream's id (the vocoder keeps its convolution state under it); "
                                     "absent: the window is decoded alone")
VO_STREAM_PLAN: Final = TensorSpec("stream_plan", "TYPE_INT32", (3,), optional=True,
                                   doc="with stream_id: [first token of the window, token to commit (the next "
                                       "window's start), STREAM_* action]; audio then holds the window's complete "
                                       "samples, 512*(T-1) (to the end on STREAM_FINAL; none on STREAM_RELEASE)")
VOCODER_STREAM_INPUTS: Final = (VO_STREAM_ID, VO_STREAM_PLAN)
STREAM_CONTINUE: Final = 0
"""stream_plan action: vocode the window, commit, keep the state."""
STREAM_FINAL: Final = 1
"""stream_plan action: the stream's last window; its state is freed."""
STREAM_RELEASE: Final = 2
"""stream_plan action: free the state without vocoding (an empty window: the stream was cancelled or failed)."""

# the ensemble door: chattts' inputs; audio chunks, each with its index, info on the first and last
OUT_CHUNK_INDEX: Final = TensorSpec("chunk_index", "TYPE_INT32", (1,),
                                    doc="the chunk's index in its stream (0, 1, ...): a client plays chunks in this "
                                        "order (Triton does not promise an ensemble's responses in order)")
ENSEMBLE_INPUTS: Final = tuple(FE_TEXT if t == IN_TEXT else t for t in ENTRY_INPUTS if t != IN_VALIDATE_ONLY)
"""chattts' inputs; ``text`` is optional in the config only because of docs/triton-workarounds.md,
"ensemble: missing required input": the front end refuses it ("missing required input
'text'", as chattts does). ``validate_only`` is not
one of them: the ensemble always synthesises (Triton refuses the input by name)."""
ENSEMBLE_OUTPUTS: Final = (OUT_AUDIO, OUT_CHUNK_INDEX, OUT_INFO)
ENSEMBLE_VOCODER_INPUTS: Final = WINDOW_OUTPUTS
ENSEMBLE_VOCODER_OUTPUTS: Final = ENSEMBLE_OUTPUTS
"""The ensemble's last step answers with the ensemble's own outputs."""

TEXT_EOS_ID: Final = SPECIAL_TOKEN_IDS["[Ebreak]"]
"""End token of the text mode: ``[Ebreak]`` (21136), ChatTTS' ``tokenizer.eos_token``; like
the code mode's 625 it ends the sequence and is not emitted."""

# --- metrics -------------------------------------------------------------------------------
LATENCY_BUCKETS_S: Final = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
"""Upper bounds, in seconds, of the latency histograms (time to first audio, request duration)
of the models and of the gateway: one set, so that their quantiles compare bucket for bucket."""

# --- ONNX graphs ---------------------------------------------------------------------------
GPT_GRAPH: Final = "gpt_step.onnx"
VOCODER_HIDDEN_GRAPH: Final = "vocoder_hidden.onnx"
VOCODER_CODES_GRAPH: Final = "vocoder_codes.onnx"
DVAE_ENCODER_GRAPH: Final = "dvae_encoder.onnx"
"""log-mel (B, 100, F) float32 -> codes (B, F // 2, 4) int32: ChatTTS' ``DVAE.sample_audio``
after its mel (which audio.encoder.log_mel computes; reference recordings and the first-piece
audio prompt, see chattts_serving/audio/reference.py). fp32 only: its codes come from floor() boundaries
that fp16 would move."""
VOCODER_STREAM_GRAPHS: Final = {VOCODER_HIDDEN_GRAPH: "vocoder_hidden.stream.onnx",
                                VOCODER_CODES_GRAPH: "vocoder_codes.stream.onnx"}
"""The stateful variant of each vocoder graph (chattts_serving/export/streaming.py: a call vocodes
only the uncommitted tokens, the convolutions' left context carried in cache tensors), listed
in manifest.json under ``streaming_vocoders``; its int8 file is ``STREAM_INT8_SUFFIX`` in place of
``.onnx``."""
STREAM_INT8_SUFFIX: Final = ".int8.onnx"
FP16_GRAPH_FILES: Final = {GPT_GRAPH: "gpt_step.fp16.onnx",
                           VOCODER_HIDDEN_GRAPH: "vocoder_hidden.fp16.onnx",
                           VOCODER_CODES_GRAPH: "vocoder_codes.fp16.onnx"}
"""fp16 file of each graph (fp16 weights and compute, fp32 inputs and outputs), as the exporter
writes them and lists them in manifest.json under ``precisions.fp16``."""
INT8_GRAPH_FILES: Final = {GPT_GRAPH: "gpt_step.int8.onnx",
                           VOCODER_HIDDEN_GRAPH: "vocoder_hidden.int8.onnx",
                           VOCODER_CODES_GRAPH: "vocoder_codes.int8.onnx"}
"""int8 file of each graph that has one (8-bit weight-only MatMulNBits, fp32 IO; see
``chattts_serving/export/int8.py``), as ``chattts-export --precision int8`` writes them and lists
them in manifest.json under ``precisions.int8``."""
KV_SCALES_FILE: Final = "kv_scales.npz"
"""The int8 KV cache's scales (``k_<layer>``, ``v_<layer>``: (heads, 1, head_dim) float32 each),
written by ``python -m chattts_serving.bench.kv --calibrate`` and listed in manifest.json under
``kv_cache.int8``."""
MANIFEST: Final = "manifest.json"
EMBED_FILE: Final = "embed.npz"
SPEAKER_FILE: Final = "speaker_stats.npz"
TOKENIZER_DIR: Final = "tokenizer"

E_MEL: Final = "mel"
"""DVAE encoder graph input: (B, 100, F) float32 log-mel of 24 kHz audio (audio.encoder.log_mel)."""
E_CODES: Final = "codes"
"""DVAE encoder graph output: (B, F // 2, 4) int32 codes in [0, 625) (T = encoder_tokens(N))."""
MEL_FILE: Final = "dvae_mel.npz"
"""window (1024,) and fb (513, 100) float32 of the DVAE's mel front end (torchaudio's)."""
ENCODER_MIN_SAMPLES: Final = N_FFT // 2 + 1
"""Shortest audio the DVAE encoder takes (its STFT reflect-pads n_fft/2 samples): 513."""


def encoder_tokens(n_samples: int) -> int:
    """Audio-prompt tokens the DVAE encoder makes of ``n_samples`` samples: the mel has
    ``n // 256 + 1`` frames (centred STFT, hop 256) and the encoder's stride-2 convolution
    (kernel 4, padding 1) halves that, rounding down: ``(n // 256 + 1) // 2``, about one token
    per 512 samples like the GPT's own tokens (ChatTTS 0.2.5 ``DVAE.forward(mode="encode")``)."""
    return (n_samples // HOP_SAMPLES + 1) // 2 if n_samples >= ENCODER_MIN_SAMPLES else 0


G_EMBEDS: Final = "inputs_embeds"
"""GPT step input: (B, S, H) float32 embeddings of the S new positions (right-padded in a prefill)."""
G_SEQLENS_K: Final = "seqlens_k"
"""GPT step input: (B,) int32, each row's positions in its KV cache after the call, minus 1
(GroupQueryAttention's ``seqlens_k``; chattts_serving/export/fused.py)."""
G_TOTAL_SEQ: Final = "total_sequence_length"
"""GPT step input: (1,) int32, ``max(seqlens_k) + 1``."""
G_LOGITS: Final = "logits"
G_HIDDEN: Final = "hidden"


def past_names(layer: int) -> tuple[str, str]:
    """Names of layer ``layer``'s KV-cache inputs: (B, heads, C, head_dim) each, the cache
    buffers (C columns; each row's positions from column 0)."""
    return f"past_key_{layer}", f"past_value_{layer}"


def present_names(layer: int) -> tuple[str, str]:
    """Names of layer ``layer``'s KV-cache outputs: (B, heads, max(C, total), head_dim) each;
    the engine binds them to the same buffers as :func:`past_names` (the new positions are
    written in place)."""
    return f"present_key_{layer}", f"present_value_{layer}"


def samples_for_tokens(n_tokens: int) -> int:
    """Samples the vocoder returns for a window of ``n_tokens`` tokens.

    ``torch.istft(center=True)`` over ``2*n`` mel frames yields ``hop*(2n-1)`` samples, i.e. the
    last half token (256 samples) of an utterance is never produced; offline ChatTTS has the
    same length. Returns 0 for an empty window.
    """
    return max(0, SAMPLES_PER_TOKEN * n_tokens - HOP_SAMPLES)


# --- the front end once per request (issue 44) ------------------------------------------------
# One call to chattts_frontend prepares every segment of a request; a later call (refine-text's
# code prompts, ChatTTS' first-piece audio prompt) prompts the texts it made again without
# normalising them. A call with the single-segment ``text`` is unchanged: for it every output
# below describes that one segment.
FE_SEGMENTS: Final = TensorSpec("segments", "TYPE_STRING", (-1,), optional=True,
                                doc="the request's segment texts (N,), in order, each normalised and prompted "
                                    "(instead of text)")
FE_SEGMENT_SPEEDS: Final = TensorSpec("segment_speeds", "TYPE_INT32", (-1,), optional=True,
                                      doc="with segments: they are the front end's own segment_texts, prompted again "
                                          "at these speeds (N,) 0..9 without normalising")
FE_REFINED_LENGTHS: Final = TensorSpec("refined_lengths", "TYPE_INT32", (-1,), optional=True,
                                       doc="how many of refined_ids belong to each segment (N,), in order; 0: not "
                                           "refined")
FE_INPUT_LENGTHS: Final = TensorSpec("input_lengths", "TYPE_INT32", (-1,),
                                     doc="how many of input_ids (every segment's, concatenated) are each "
                                         "segment's (N,)")
FE_REFINE_LENGTHS: Final = TensorSpec("refine_lengths", "TYPE_INT32", (-1,),
                                      doc="how many of refine_ids (every segment's, concatenated) are each segment's "
                                          "(N,); 0: none")
FE_SEGMENT_TEXTS: Final = TensorSpec("segment_texts", "TYPE_STRING", (-1,),
                                     doc="each segment's text after normalisation (or refinement) (N,); "
                                         "normalized_text joins them")
FE_SEGMENT_DROPPED: Final = TensorSpec("segment_dropped", "TYPE_STRING", (-1,),
                                       doc="each segment's JSON list of what is not spoken (N,); dropped merges them")
FE_PROMPT_SPEEDS: Final = TensorSpec("prompt_speeds", "TYPE_INT32", (-1,),
                                     doc="N of each segment's [speed_N] (N,)")
FRONTEND_INPUTS: Final = (FE_TEXT, IN_VOICE, IN_REFINE_PROMPT, FE_REFINED_IDS, IN_REFERENCE_TEXT, IN_REFERENCE_AUDIO,
                          IN_REFERENCE_RATE, FE_NO_SPEAKER, FE_KEEP_UNSPEAKABLE, FE_TRANSIENT_REFERENCE,
                          FE_REQUEST_TEXT, *FRONTEND_REQUEST_INPUTS, FE_SEGMENTS, FE_SEGMENT_SPEEDS,
                          FE_REFINED_LENGTHS)
FRONTEND_OUTPUTS: Final = (FE_INPUT_IDS, FE_SPK_EMB, FE_NORMALIZED, FE_DROPPED, FE_REFINE_IDS, FE_PROMPT_CODES,
                           *FRONTEND_REQUEST_OUTPUTS, FE_INPUT_LENGTHS, FE_REFINE_LENGTHS, FE_SEGMENT_TEXTS,
                           FE_SEGMENT_DROPPED, FE_PROMPT_SPEEDS)
