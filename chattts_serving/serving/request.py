"""Every request the models take, parsed and validated in one place, free of Triton.

Each model hands its request's tensors (name -> numpy array, as ``pb_utils`` gives them) to
one function here and gets a typed, validated request back, or a
:class:`~chattts_serving.errors.RequestError` of kind INVALID whose message names the input
and whose ``param`` is that input's name (None for what concerns no one input: Triton request
parameters):

* :func:`parse_entry` -> :class:`EntryRequest` (``chattts`` and ``chattts_offline``),
* :func:`parse_frontend` -> :class:`FrontendCall` (``chattts_frontend``; :func:`frontend_inputs` is its
  inverse, for the BLS call),
* :func:`parse_engine` -> :class:`~chattts_serving.engine.request.SequenceRequest` or :class:`EngineControl`
  (``chattts_gpt``).

Names, dtypes, defaults and ranges come from :mod:`chattts_serving.contract`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import contract
from ..audio.reference import (
    RecordingError,
    ReferenceLimits,
    SpkSmpError,
    check_recording,
    check_transcript,
    decode_spk_smp,
)
from ..contract import Language, Priority, Segmentation, SequenceMode, VocoderPath
from ..engine.request import MAX_EMIT_TOKENS, SequenceRequest
from ..errors import RequestError
from ..params import ParamError, SamplingParams
from ..text.refine import REFINE_PARAMS, RefineParams
from ..text.request_text import length_error

Inputs = Mapping[str, np.ndarray]
"""A request's tensors by input name (absent optional inputs are absent)."""


# --- one tensor --------------------------------------------------------------------------
def scalar_input(inputs: Inputs, spec: contract.ParamSpec) -> float | int | None:
    """The one value of input ``spec.name`` (int or float per its dtype), None when absent.
    Raises RequestError for a wrong dtype or not exactly one value."""
    arr = inputs.get(spec.name)
    if arr is None:
        return None
    if arr.dtype != np.dtype(contract.TensorSpec(spec.name, spec.triton_dtype, (1,)).np_dtype):
        raise RequestError(f"input '{spec.name}' must be {spec.triton_dtype.removeprefix('TYPE_')}, "
                           f"got {arr.dtype}", param=spec.name)
    if arr.size != 1:
        raise RequestError(f"input '{spec.name}' must hold exactly one value, got shape {list(arr.shape)}",
                           param=spec.name)
    v = arr.reshape(-1)[0]
    return int(v) if spec.triton_dtype.startswith("TYPE_INT") else float(v)


def string_input(inputs: Inputs, name: str, required: bool) -> str | None:
    """The one UTF-8 string of BYTES input ``name``, None when absent and optional.
    Raises RequestError when missing and required, not BYTES, not one value, or not UTF-8."""
    arr = inputs.get(name)
    if arr is None:
        if required:
            raise RequestError(f"missing required input '{name}'", param=name)
        return None
    if arr.dtype != np.object_ and arr.dtype.kind not in ("S", "U"):
        raise RequestError(f"input '{name}' must be BYTES (UTF-8 string), got {arr.dtype}", param=name)
    if arr.size != 1:
        raise RequestError(f"input '{name}' must hold exactly one string, got shape {list(arr.shape)}", param=name)
    v = arr.reshape(-1)[0]
    if isinstance(v, str):
        return v
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"input '{name}' is not valid UTF-8 (byte {exc.start})", param=name) from None


def int_input(inputs: Inputs, name: str, default: int, low: int, high: int) -> int:
    """The one integer of input ``name`` in [low, high], ``default`` when absent.
    Raises RequestError for another dtype, not one value, or out of range."""
    arr = inputs.get(name)
    if arr is None:
        return default
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise RequestError(f"{name} must be one integer", param=name)
    v = int(arr.reshape(-1)[0])
    if not low <= v <= high:
        raise RequestError(f"{name}={v} is out of range [{low}, {high}]", param=name)
    return v


def ints_input(inputs: Inputs, name: str) -> tuple[int, ...]:
    """The integers of 1-D input ``name``, () when absent (their rules are the caller's).
    Raises RequestError for another dtype or shape."""
    arr = inputs.get(name)
    if arr is None:
        return ()
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise RequestError(f"{name} must be a 1-D integer tensor", param=name)
    return tuple(int(v) for v in arr)


def bool_input(inputs: Inputs, name: str) -> bool:
    """The one BOOL of input ``name``, False when absent. Raises RequestError otherwise."""
    arr = inputs.get(name)
    if arr is None:
        return False
    if arr.size != 1 or arr.dtype != np.bool_:
        raise RequestError(f"input '{name}' must be one BOOL", param=name)
    return bool(arr.reshape(-1)[0])


def enum_input(inputs: Inputs, name: str, enum: Any, default: Any) -> Any:
    """The member of ``enum`` (a :class:`~chattts_serving.contract.WireEnum`) named by string
    input ``name`` (surrounding spaces ignored), ``default`` when absent or empty.
    Raises RequestError for another value."""
    value = (string_input(inputs, name, required=False) or "").strip()
    if not value:
        return default
    try:
        return enum(value)
    except ValueError:
        raise RequestError(f"{name} must be one of {sorted(m.value for m in enum)}, got {value!r}",
                           param=name) from None


# --- parameter groups --------------------------------------------------------------------
def sampling_input(inputs: Inputs, max_new_tokens_cap: int) -> SamplingParams:
    """The request's sampling parameters (``contract.SAMPLING_PARAMS`` inputs, defaults for the
    absent ones), validated. Raises RequestError."""
    values = {}
    for spec in contract.SAMPLING_PARAMS:
        v = scalar_input(inputs, spec)
        if v is not None:
            values[spec.name] = v
    try:
        return SamplingParams(**values).validate(max_new_tokens_cap)  # type: ignore[arg-type]
    except ParamError as exc:
        raise RequestError(str(exc), param=exc.param) from None


def refine_input(inputs: Inputs, max_new_tokens_cap: int | None = None, prefix: str = "",
                 prompt: str = "") -> RefineParams:
    """Validated :class:`~chattts_serving.text.refine.RefineParams` from the optional one-value
    inputs ``f"{prefix}{spec.name}"`` of :data:`~chattts_serving.text.refine.REFINE_PARAMS`
    (temperature, top_p, repetition_penalty FP32; top_k, max_new_tokens, min_new_tokens INT32;
    seed INT64): ``prefix=''`` reads a GPT-engine request in text mode, ``'refine_'`` an
    entry request. Absent ones take ChatTTS' refine defaults. Raises RequestError."""
    values: dict[str, Any] = {}
    for spec in REFINE_PARAMS:
        v = scalar_input(inputs, replace(spec, name=prefix + spec.name))
        if v is not None:
            values[spec.name] = v
    try:
        return RefineParams(prompt=prompt, **values).validate(max_new_tokens_cap)
    except ParamError as exc:
        # check_params names the number it refused; RefineParams' other checks are the prompt's
        prompt_input = contract.IN_REFINE_PROMPT.name if prefix else None
        raise RequestError(str(exc), param=exc.param or prompt_input) from None


def refuse_request_params(params: Mapping[str, object]) -> None:
    """Refuse Triton request parameters: the entry points take none (their knobs are input
    tensors), so a parameter is a client mistake that must not be silently ignored.
    Names starting with ``triton_`` (set by Triton itself) are allowed, and ``id``: Triton's
    ``generate_stream`` passes a JSON body's ``id`` (the request id) on as a parameter too.
    Raises RequestError."""
    unknown = sorted(k for k in params if not k.startswith("triton_") and k != "id")
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}: this model's options are input tensors "
                           f"({', '.join(t.name for t in contract.ENTRY_INPUTS)})")


def codes_input(inputs: Inputs, name: str) -> np.ndarray | None:
    """Audio-prompt codes of INT32 input ``name``, None when absent (their shape and range are
    :class:`~chattts_serving.engine.request.SequenceRequest`'s rules). Raises RequestError for
    another dtype."""
    arr = inputs.get(name)
    if arr is None:
        return None
    if arr.dtype != np.int32:
        raise RequestError(f"{name} must be an INT32 tensor of shape [P, {contract.NUM_VQ}]", param=name)
    return arr


# --- the entry models ----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Reference:
    """A request's audio prompt (ChatTTS' ``spk_smp`` + ``txt_smp``), checked: its transcript
    and either a recording (``audio`` (N,) float32 mono at ``rate_hz``, encoded by the front
    end) or the codes of a ``spk_smp`` string (``codes`` (P, 4) int32)."""

    transcript: str
    audio: np.ndarray | None = None
    rate_hz: int = contract.SAMPLE_RATE_HZ
    codes: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class EntryRequest:
    """A validated entry-point request (``chattts`` / ``chattts_offline``).

    text: UTF-8, at most the profile's ``frontend.max_text_chars`` characters (control tokens
    not counted); voice: '' for the profile's default, a seed, a name or a spk_emb string
    (resolved by the front end); lookahead_tokens: right context per streamed chunk, None for
    the profile's; timeout_s: deadline of the whole request from its arrival, None for none;
    request_id: the client's Triton request id (or a generated one) for logs and ``info``;
    refine: refine-text parameters, None to skip that stage (the default); segmentation: how
    the text is cut into GPT sequences; reference: the audio prompt the request brought, None
    for none (a voice from the voices file may still bring its recording); language: the
    language of what the text gives no context for (:class:`~chattts_serving.contract.Language`);
    validate_only: check the request whole and generate nothing (:func:`~.prepare.validate_request`).
    """

    text: str
    voice: str = ""
    vocoder: VocoderPath = VocoderPath.HIDDEN
    params: SamplingParams = SamplingParams()
    lookahead_tokens: int | None = None
    priority: Priority = Priority.REALTIME
    timeout_s: float | None = None
    request_id: str = ""
    refine: RefineParams | None = None
    segmentation: Segmentation = Segmentation.STREAMING
    reference: Reference | None = None
    language: Language = Language.AUTO
    validate_only: bool = False


@dataclass(frozen=True, kw_only=True)
class EntryLimits:
    """The profile's limits that parsing applies (``engine.max_new_tokens_cap``,
    ``frontend.max_text_chars``, ``stream.default_vocoder``, ``frontend.segmentation``,
    ``[reference]``)."""

    max_new_tokens_cap: int
    max_text_chars: int = 4096
    default_vocoder: VocoderPath = VocoderPath.HIDDEN
    default_segmentation: Segmentation = Segmentation.STREAMING
    reference: ReferenceLimits = field(default_factory=ReferenceLimits)


MAX_TIMEOUT_S = 3600.0
"""Longest deadline a request may ask for (``timeout_s``), in seconds."""


def parse_entry(inputs: Inputs, limits: EntryLimits, request_params: Mapping[str, object] | None = None,
                request_id: str = "") -> EntryRequest:
    """Validate an entry request's tensors and Triton request parameters. Cheap checks come
    first, the text's length last but one. Raises RequestError (INVALID)."""
    refuse_request_params(request_params or {})
    priority = enum_input(inputs, contract.IN_PRIORITY.name, Priority, Priority.REALTIME)
    timeout = scalar_input(inputs, contract.ParamSpec(contract.IN_TIMEOUT.name, "TYPE_FP32", 0, 0, MAX_TIMEOUT_S))
    if timeout is not None and not (np.isfinite(timeout) and 0.0 < timeout <= MAX_TIMEOUT_S):
        raise RequestError(f"timeout_s={timeout} is out of range (0, {MAX_TIMEOUT_S:g}]",
                           param=contract.IN_TIMEOUT.name)
    text = string_input(inputs, contract.IN_TEXT.name, required=True) or ""
    too_long = length_error(text, limits.max_text_chars)
    if too_long:
        raise RequestError(too_long, param=contract.IN_TEXT.name)
    voice = string_input(inputs, contract.IN_VOICE.name, required=False) or ""
    vocoder = enum_input(inputs, contract.IN_VOCODER.name, VocoderPath, limits.default_vocoder)
    params = sampling_input(inputs, limits.max_new_tokens_cap)
    lookahead = None
    for spec in contract.STREAM_PARAMS:
        v = scalar_input(inputs, spec)
        if v is not None and not (spec.low <= v <= spec.high):
            raise RequestError(f"{spec.name}={v} is out of range [{spec.low:g}, {spec.high:g}]", param=spec.name)
        if spec.name == "lookahead_tokens" and v is not None and v >= 1:
            lookahead = int(v)
        elif spec.name == "lookahead_tokens" and v == 0:
            raise RequestError("lookahead_tokens must be >= 1 (or -1 for the default)", param=spec.name)
    return EntryRequest(text=text, voice=voice, vocoder=vocoder, params=params, lookahead_tokens=lookahead,
                        priority=priority, timeout_s=float(timeout) if timeout is not None else None,
                        request_id=request_id, refine=_entry_refine(inputs, limits.max_new_tokens_cap),
                        segmentation=enum_input(inputs, contract.IN_SEGMENTATION.name, Segmentation,
                                                limits.default_segmentation),
                        reference=_entry_reference(inputs, limits.reference),
                        language=enum_input(inputs, contract.IN_LANGUAGE.name, Language, Language.AUTO),
                        validate_only=bool_input(inputs, contract.IN_VALIDATE_ONLY.name))


def _entry_reference(inputs: Inputs, limits: ReferenceLimits) -> Reference | None:
    """The request's audio prompt: ``reference_audio`` (+ ``reference_sample_rate_hz``) or
    ``spk_smp``, each with its ``reference_text``, checked against ``limits`` (duration, sample
    rate, transcript length; a ``spk_smp`` of at most ``limits.max_tokens`` tokens). None
    without one. Raises RequestError: both given, a transcript without either (or either
    without a transcript), a rate without a recording, a malformed recording or spk_smp."""
    audio = inputs.get(contract.IN_REFERENCE_AUDIO.name)
    spk_smp = string_input(inputs, contract.IN_SPK_SMP.name, required=False)
    transcript = string_input(inputs, contract.IN_REFERENCE_TEXT.name, required=False)
    rate_given = contract.IN_REFERENCE_RATE.name in inputs
    rate = int_input(inputs, contract.IN_REFERENCE_RATE.name, contract.SAMPLE_RATE_HZ, 1, 2**31 - 1)
    if audio is None and spk_smp is None:
        if transcript is not None:
            raise RequestError("reference_text is the transcript of reference_audio or spk_smp; send one of them "
                               "with it", param=contract.IN_REFERENCE_TEXT.name)
        if rate_given:
            raise RequestError("reference_sample_rate_hz needs reference_audio", param=contract.IN_REFERENCE_RATE.name)
        return None
    if audio is not None and spk_smp is not None:
        raise RequestError("send either reference_audio or spk_smp, not both", param=contract.IN_SPK_SMP.name)
    if spk_smp is not None and rate_given:
        raise RequestError("reference_sample_rate_hz needs reference_audio (a spk_smp string is already encoded)",
                           param=contract.IN_REFERENCE_RATE.name)
    try:
        text = check_transcript(transcript or "", limits)
    except RecordingError as exc:
        raise RequestError(str(exc), param=contract.IN_REFERENCE_TEXT.name) from None
    if audio is None:
        try:
            return Reference(transcript=text, codes=decode_spk_smp(spk_smp or "", limits.max_tokens))
        except SpkSmpError as exc:
            raise RequestError(str(exc), param=contract.IN_SPK_SMP.name) from None
    if audio.dtype != np.float32 or audio.ndim != 1:
        raise RequestError(f"reference_audio must be a 1-D FP32 tensor of mono samples, got {audio.dtype} "
                           f"{list(audio.shape)}", param=contract.IN_REFERENCE_AUDIO.name)
    try:
        check_recording(audio, rate, limits)
    except RecordingError as exc:
        raise RequestError(str(exc), param=contract.IN_REFERENCE_AUDIO.name) from None
    return Reference(transcript=text, audio=audio, rate_hz=rate)


def _entry_refine(inputs: Inputs, max_new_tokens_cap: int) -> RefineParams | None:
    """RefineParams when ``refine_text`` is true, else None. Raises RequestError, also for
    ``refine_*`` inputs sent without ``refine_text`` (they would be ignored silently)."""
    on = bool_input(inputs, contract.IN_REFINE_TEXT.name)
    prompt = string_input(inputs, contract.IN_REFINE_PROMPT.name, required=False)
    given = sorted(k for k in inputs if k.startswith(contract.REFINE_PREFIX) and k != contract.IN_REFINE_TEXT.name)
    if not on:
        if given:
            raise RequestError(f"{given} need refine_text=true", param=contract.IN_REFINE_TEXT.name)
        return None
    return refine_input(inputs, max_new_tokens_cap, prefix=contract.REFINE_PREFIX, prompt=prompt or "")


# --- the front end ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FrontendCall:
    """A request's segments for the front end (``chattts_frontend``), in order, and their voice.

    ``texts``: each segment's text, normalised and prompted; with ``speeds`` (one per text, 0..9)
    the texts are what the front end made of them before (its ``normalized_text``, refined or
    not), prompted again as they are at those speeds, not normalised again (refine-text's code
    prompts, ChatTTS' first-piece audio prompt). ``refine_prompt`` (control tokens, '' for none)
    also asks for each segment's refine-text prompt; ``refined_ids`` (one (N,) int32 array per
    text, empty for a segment not refined) builds the code prompts from the text ids the refine
    stage generated.

    The audio prompt: ``reference_text`` is placed before ``[speed_N]`` in every code prompt
    (ChatTTS' ``txt_smp``; None: the voice's own transcript for a reference-recording voice,
    else none); ``reference_audio`` ((N,) float32 mono at ``reference_rate_hz``) is encoded
    into every output's ``prompt_codes`` (cached; ``transient_reference``: encoded once, neither
    checked against the recording limits nor cached: the first piece's own audio);
    ``no_speaker``: no speaker vector (``[empty_spk]``); ``keep_unspeakable``: pieces of
    ChatTTS' split, prompted even with nothing speakable in them; ``language``: the request's
    :class:`~chattts_serving.contract.Language`.
    """

    texts: tuple[str, ...]
    speeds: tuple[int, ...] | None = None
    voice: str = ""
    request_id: str = ""
    refine_prompt: str | None = None
    refined_ids: tuple[np.ndarray, ...] | None = None
    reference_text: str | None = None
    reference_audio: np.ndarray | None = None
    reference_rate_hz: int = contract.SAMPLE_RATE_HZ
    transient_reference: bool = False
    no_speaker: bool = False
    keep_unspeakable: bool = False
    language: Language = Language.AUTO


def parse_frontend(inputs: Inputs, request_id: str = "") -> FrontendCall:
    """Validate a front-end request's tensors: ``segments`` (or the one ``text``), with
    ``segment_speeds`` and ``refined_lengths`` one per segment when given. Raises RequestError."""
    audio = inputs.get(contract.IN_REFERENCE_AUDIO.name)
    if audio is not None and (audio.dtype != np.float32 or audio.ndim != 1):
        raise RequestError("reference_audio must be a 1-D FP32 tensor of mono samples",
                           param=contract.IN_REFERENCE_AUDIO.name)
    segments = inputs.get(contract.FE_SEGMENTS.name)
    if segments is None:
        texts: tuple[str, ...] = (string_input(inputs, contract.IN_TEXT.name, required=True) or "",)
    else:
        texts = tuple(string_input({contract.FE_SEGMENTS.name: s}, contract.FE_SEGMENTS.name, required=True) or ""
                      for s in segments.reshape(-1, 1))
        if not texts:
            raise RequestError("segments must hold at least one text", param=contract.FE_SEGMENTS.name)
    speeds = _per_segment(inputs, contract.FE_SEGMENT_SPEEDS.name, len(texts), 0, 9)
    refined = inputs.get(contract.FE_REFINED_IDS.name)
    lengths = _per_segment(inputs, contract.FE_REFINED_LENGTHS.name, len(texts), 0, 2**31 - 1)
    if refined is not None and lengths is None:
        if len(texts) != 1:
            raise RequestError("refined_ids of several segments need refined_lengths",
                               param=contract.FE_REFINED_LENGTHS.name)
        lengths = (int(refined.size),)
    refined_ids = None
    if lengths is not None:
        ids = refined.reshape(-1) if refined is not None else np.zeros(0, np.int32)
        if sum(lengths) != ids.size:
            raise RequestError(f"refined_lengths add up to {sum(lengths)}, refined_ids holds {ids.size}",
                               param=contract.FE_REFINED_LENGTHS.name)
        refined_ids = tuple(np.split(ids, np.cumsum(lengths)[:-1]))
    return FrontendCall(texts=texts, speeds=speeds, voice=string_input(inputs, contract.IN_VOICE.name,
                                                                         required=False) or "",
                        request_id=request_id,
                        refine_prompt=string_input(inputs, contract.IN_REFINE_PROMPT.name, required=False),
                        refined_ids=refined_ids,
                        reference_text=string_input(inputs, contract.IN_REFERENCE_TEXT.name, required=False),
                        reference_audio=audio,
                        reference_rate_hz=int_input(inputs, contract.IN_REFERENCE_RATE.name, contract.SAMPLE_RATE_HZ,
                                                    1, 2**31 - 1),
                        transient_reference=bool_input(inputs, contract.FE_TRANSIENT_REFERENCE.name),
                        no_speaker=bool_input(inputs, contract.FE_NO_SPEAKER.name),
                        keep_unspeakable=bool_input(inputs, contract.FE_KEEP_UNSPEAKABLE.name),
                        language=enum_input(inputs, contract.IN_LANGUAGE.name, Language, Language.AUTO))


def _per_segment(inputs: Inputs, name: str, n: int, low: int, high: int) -> tuple[int, ...] | None:
    """The integers of input ``name``, one per segment, each in [low, high]; None when absent.
    Raises RequestError for another dtype, count or range."""
    arr = inputs.get(name)
    if arr is None:
        return None
    if arr.dtype.kind not in "iu" or arr.size != n:
        raise RequestError(f"{name} must hold one integer per segment ({n})", param=name)
    values = tuple(int(v) for v in arr.reshape(-1))
    if any(not low <= v <= high for v in values):
        raise RequestError(f"{name} must be in [{low}, {high}]", param=name)
    return values


def frontend_inputs(call: FrontendCall) -> dict[str, np.ndarray]:
    """The front-end model's input tensors for ``call`` (what :func:`parse_frontend` reads back):
    BYTES as object arrays of UTF-8, flags only when true, optional inputs only when given."""
    def text(value: str) -> np.ndarray:
        return np.array([value.encode("utf-8")], dtype=np.object_)

    out = {contract.FE_SEGMENTS.name: np.array([t.encode("utf-8") for t in call.texts], dtype=np.object_),
           contract.IN_VOICE.name: text(call.voice)}
    if call.speeds is not None:
        out[contract.FE_SEGMENT_SPEEDS.name] = np.array(call.speeds, np.int32)
    if call.refine_prompt is not None:
        out[contract.IN_REFINE_PROMPT.name] = text(call.refine_prompt)
    if call.refined_ids is not None:
        out[contract.FE_REFINED_IDS.name] = np.concatenate(
            [np.asarray(ids, np.int32).reshape(-1) for ids in call.refined_ids]).astype(np.int32, copy=False)
        out[contract.FE_REFINED_LENGTHS.name] = np.array([np.asarray(ids).size for ids in call.refined_ids], np.int32)
    if call.reference_text is not None:
        out[contract.IN_REFERENCE_TEXT.name] = text(call.reference_text)
    if call.reference_audio is not None:
        out[contract.IN_REFERENCE_AUDIO.name] = np.ascontiguousarray(call.reference_audio, np.float32)
        out[contract.IN_REFERENCE_RATE.name] = np.array([call.reference_rate_hz], np.int32)
    if call.language != Language.AUTO:
        out[contract.IN_LANGUAGE.name] = text(call.language.value)
    for spec, on in ((contract.FE_TRANSIENT_REFERENCE, call.transient_reference),
                     (contract.FE_NO_SPEAKER, call.no_speaker), (contract.FE_KEEP_UNSPEAKABLE, call.keep_unspeakable)):
        if on:
            out[spec.name] = np.array([True])
    return out


# --- the GPT engine ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineControl:
    """A control request to the GPT engine: ``cancel`` the live sequence ``stream_id``."""

    stream_id: str


CONTROL_CANCEL = "cancel"
"""The only control word of the GPT engine."""
MAX_ENGINE_TIMEOUT_MS = 3_600_000


def parse_engine(inputs: Inputs, hidden_size: int, max_new_tokens_cap: int,
                 request_id: str = "") -> SequenceRequest | EngineControl:
    """A GPT-engine request's tensors as a control request (``control='cancel'`` with a
    ``stream_id``) or a :class:`~chattts_serving.engine.request.SequenceRequest` (whose own
    rules are checked as it is made; here only what the wire and this engine add: dtypes, the
    speaker vector's size, the sampling ranges). ``request_id``: the BLS request's id (the
    request the sequence belongs to). In text mode (refine-text) the sampling inputs take
    ``contract.REFINE_PARAMS``' defaults and ranges. Raises RequestError."""
    control = (string_input(inputs, contract.EN_CONTROL.name, required=False) or "").strip()
    stream_id = string_input(inputs, contract.EN_STREAM_ID.name, required=False) or ""
    if control not in ("", CONTROL_CANCEL):
        raise RequestError(f"unknown control {control!r}; the only control is '{CONTROL_CANCEL}'",
                           param=contract.EN_CONTROL.name)
    if control:
        if not stream_id:
            raise RequestError("a control request needs stream_id", param=contract.EN_STREAM_ID.name)
        return EngineControl(stream_id)
    mode = enum_input(inputs, contract.EN_MODE.name, SequenceMode, SequenceMode.CODE)
    ids = inputs.get(contract.FE_INPUT_IDS.name)
    if ids is None:
        raise RequestError("missing required input 'input_ids'", param=contract.FE_INPUT_IDS.name)
    if ids.dtype != np.int32:
        raise RequestError("input_ids must be a non-empty 1-D INT32 tensor", param=contract.FE_INPUT_IDS.name)
    spk = inputs.get(contract.EN_SPK_EMB.name)
    if spk is not None and spk.size == 0:  # the front end's "no speaker" (the ensemble passes it on as is)
        spk = None
    if spk is not None and (spk.dtype != np.float32 or spk.shape != (hidden_size,)):
        raise RequestError(f"spk_emb must be a finite FP32 tensor of shape [{hidden_size}]",
                           param=contract.EN_SPK_EMB.name)
    prompt_codes = codes_input(inputs, contract.EN_PROMPT_CODES.name)
    if mode == SequenceMode.TEXT:
        params = refine_input(inputs, max_new_tokens_cap).sampling_params()
    else:
        params = sampling_input(inputs, max_new_tokens_cap)
    priority_high = max(p.engine_class for p in Priority)
    timeout_ms = int_input(inputs, contract.EN_TIMEOUT_MS.name, 0, 0, MAX_ENGINE_TIMEOUT_MS)
    return SequenceRequest(input_ids=ids.astype(np.int64), spk_emb=spk, params=params,
                           emit_tokens=int_input(inputs, contract.EN_EMIT_TOKENS.name, 1, 1, MAX_EMIT_TOKENS),
                           emit_at=ints_input(inputs, contract.EN_EMIT_AT.name),
                           priority=int_input(inputs, contract.EN_PRIORITY.name, 0, 0, priority_high),
                           timeout_s=timeout_ms / 1000 or None, mode=mode, prompt_codes=prompt_codes,
                           stream_id=stream_id, request_id=request_id)
