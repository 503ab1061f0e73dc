"""A request's text made ready for the engine, free of Triton: split into segments, through
the front end, refined and given its audio prompt (:func:`prepare_segments`), or only checked
(:func:`validate_request`).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

import numpy as np

from .. import contract
from ..contract import Segmentation, SequenceMode
from ..engine.request import SequenceRequest
from ..errors import NOTHING_SPEAKABLE, ErrorKind, RequestError
from ..text.normalize import speakable
from ..text.request_text import carry_speed
from ..text.segments import split_like_chattts, split_segments
from .boundary import FrontendCall, FrontendOutput, Stages, Watch, no_watch
from .job import PreparedText, StreamResult, SynthesisJob, seconds_left
from .request import Reference
from .tokens import checked, code_call, run_all

__all__ = ["REFINE_EMIT_TOKENS", "prepare_segments", "validate_request"]

REFINE_EMIT_TOKENS = 16
"""Refined text ids per engine batch (the BLS sees progress, and cancels, that often)."""


def prepare_segments(job: SynthesisJob, stages: Stages, watch: Watch = no_watch) -> PreparedText:
    """Split the text into segments (``req.segmentation``) and run the front end on them: one
    call normalises and prompts every segment (and encodes the request's recording); what it
    made is carried to every later stage, and a later call only prompts its texts again.

    With ``req.refine``, that first call also builds each segment's refine-text prompt; the
    refine-text stage runs for all segments at once (one engine text-mode sequence each,
    batched together) and one more call builds each code prompt from its refined text, as
    ChatTTS' ``_infer`` does (refine, then ``_infer_code`` on the refined text, not normalised
    again).

    The audio prompt: the request's ``spk_smp`` codes, its recording (encoded and cached by
    the front end), or a reference voice's recording (the front end's); its transcript precedes
    ``[speed_N]`` in every prompt and a request that brings a recording without a voice has no
    speaker vector (``[empty_spk]``, ChatTTS' zero-shot use). In ``chattts`` segmentation pieces
    with nothing speakable are kept, as ChatTTS keeps them; and a text of several pieces without
    an audio prompt gets ChatTTS' own: :func:`_first_piece_audio` (piece 0 generated alone and
    vocoded whole), encoded by the front end (neither cached nor held to the recording limits)
    in the call that prompts every piece again with piece 0's text as its transcript.

    So the front end is called once per request, twice with ChatTTS' first-piece prompt or with
    refine-text, three times with both, whatever the number of segments. ``watch`` ends the
    refine and reference-pass sequences in the engine as soon as the client cancels. Raises
    RequestError (DeadlineExceeded past the deadline; Cancelled when the client cancelled
    before the first audio; INVALID for a text with nothing speakable)."""
    req = job.req
    chattts = req.segmentation == Segmentation.CHATTTS
    texts = carry_speed(split_like_chattts(req.text) if chattts else split_segments(req.text, job.segments))
    if not texts:
        raise RequestError("text is empty", param=contract.IN_TEXT.name)
    ref = req.reference
    base = FrontendCall(texts=tuple(texts), voice=req.voice, request_id=req.request_id,
                        reference_text=ref.transcript if ref is not None else None,
                        no_speaker=ref is not None and not req.voice.strip(), keep_unspeakable=chattts,
                        language=req.language)
    first_call = replace(base, refine_prompt=req.refine.prompt if req.refine is not None else None)
    if ref is not None and ref.audio is not None:
        first_call = replace(first_call, reference_audio=ref.audio, reference_rate_hz=ref.rate_hz)
    asked = _Stopwatch()
    with asked.counting(req.refine is not None or first_call.reference_audio is not None):
        prepared = stages.frontend(first_call)  # encodes the recording (or finds it cached)
    codes, source = _request_prompt(ref, prepared[0])
    if req.refine is not None:
        with asked:
            refined = _refine(job, stages, watch, prepared)
            prepared = _prompt_again(stages, base, prepared, refined_ids=refined)
    if chattts and not any(speakable(p.normalized_text) for p in prepared):
        raise RequestError(f"{NOTHING_SPEAKABLE} (only punctuation, symbols or unsupported characters)",
                           param=contract.IN_TEXT.name)
    if codes is None and chattts and len(prepared) > 1:
        with asked:
            wav = _first_piece_audio(job, stages, watch, prepared[0])
            prepared = _prompt_again(stages, base, prepared, reference_text=prepared[0].normalized_text,
                                     reference_audio=wav, reference_rate_hz=contract.SAMPLE_RATE_HZ,
                                     transient_reference=True)
            codes, source = prepared[0].prompt_codes, "first_piece"
    return PreparedText([replace(p, prompt_codes=codes) for p in prepared], source, asked.total_s)


def _prompt_again(stages: Stages, base: FrontendCall, prepared: list[FrontendOutput],
                  **changes: object) -> list[FrontendOutput]:
    """The prepared segments' texts prompted again by one front-end call, as the front end made
    them (not normalised again), with ``changes`` to ``base`` (refined ids, an audio prompt):
    their new prompt ids, the text they now speak and the call's audio-prompt codes; what the
    first call found (dropped, speed, refine prompt) is kept."""
    call = replace(base, texts=tuple(p.normalized_text for p in prepared), speeds=tuple(p.speed for p in prepared),
                   **changes)  # type: ignore[arg-type]
    outs = stages.frontend(call)
    return [replace(p, input_ids=o.input_ids, normalized_text=o.normalized_text, prompt_codes=o.prompt_codes)
            for p, o in zip(prepared, outs, strict=True)]


class _Stopwatch:
    """Adds up the seconds spent inside its ``with`` blocks (``total_s``)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> _Stopwatch:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total_s += time.monotonic() - self._t0

    def counting(self, on: bool) -> AbstractContextManager[object]:
        """This stopwatch when ``on``, else a block it does not count."""
        return self if on else nullcontext()


def _request_prompt(ref: Reference | None, first: FrontendOutput) -> tuple[np.ndarray | None, str]:
    """The request's audio-prompt codes and their source: a ``spk_smp``, else what the front
    end encoded for the first segment (the request's recording, or the voice's)."""
    if ref is not None and ref.codes is not None:
        return ref.codes, "spk_smp"
    if first.prompt_codes is not None and len(first.prompt_codes):
        return first.prompt_codes, "recording" if ref is not None else "voice"
    return None, ""


def _refine(job: SynthesisJob, stages: Stages, watch: Watch, prepared: list[FrontendOutput]) -> tuple[np.ndarray, ...]:
    """The refine-text stage for every prepared segment: the refined text ids (N,) int32 of
    each, empty for a segment the front end gave no refine prompt (nothing speakable in it;
    the front end then keeps its text). Raises RequestError (Cancelled, DeadlineExceeded)."""
    req = job.req
    assert req.refine is not None
    params = req.refine.sampling_params()
    todo = {i: p.refine_ids for i, p in enumerate(prepared) if p.refine_ids is not None and p.refine_ids.size}
    runs = run_all(stages, [SequenceRequest(input_ids=ids, spk_emb=None, params=params,
                                            emit_tokens=REFINE_EMIT_TOKENS, priority=req.priority.engine_class,
                                            timeout_s=seconds_left(job), request_id=req.request_id,
                                            mode=SequenceMode.TEXT) for ids in todo.values()],
                   watch, "cancelled by the client during refine-text")
    seconds_left(job)
    refined = [np.zeros(0, np.int32)] * len(prepared)
    for i, (store, _) in zip(todo, runs, strict=True):
        refined[i] = store.codes[:store.n, 0].astype(np.int32)
    return tuple(refined)


def _first_piece_audio(job: SynthesisJob, stages: Stages, watch: Watch, first: FrontendOutput) -> np.ndarray:
    """ChatTTS' reference pass (``Chat.infer`` with several pieces and no ``spk_smp``): the first
    piece generated alone, without an audio prompt, and vocoded whole on the request's vocoder
    path (``_infer_code`` + ``_decode_to_wavs`` of ``text[0]``): (N,) float32 at 24 kHz.
    Raises RequestError: Cancelled, DeadlineExceeded, INTERNAL when the piece ended too early
    to be encoded (fewer than ``contract.ENCODER_MIN_SAMPLES`` samples)."""
    req = job.req
    ((store, reason),) = run_all(stages, [code_call(job, first)], watch,
                                  "cancelled by the client during the first piece's reference pass")
    checked(reason, store.n)
    seconds_left(job)
    wav = stages.vocode(req.vocoder, store.window(req.vocoder, 0, store.n), req.request_id)
    if wav.size < contract.ENCODER_MIN_SAMPLES:
        raise RequestError(f"the first sentence ended after {store.n} token(s), too short to be ChatTTS' audio "
                           "prompt; try another seed or set min_new_tokens", ErrorKind.INTERNAL)
    return wav


def validate_request(job: SynthesisJob, stages: Stages) -> StreamResult:
    """A ``validate_only`` request: what only the front end can check (the voice, the reference
    recording or ``spk_smp`` with its transcript, the refine prompt), checked on the request's
    text as one piece that may have nothing speakable in it; nothing is generated. The
    recording is encoded and cached, so the synthesis that follows finds it ready. Returns an
    empty :class:`StreamResult` with the front end's view of the text. Raises RequestError
    (INVALID naming the input at fault)."""
    req, ref = job.req, job.req.reference
    call = FrontendCall(texts=(req.text,), voice=req.voice, request_id=req.request_id,
                        refine_prompt=req.refine.prompt if req.refine is not None else None,
                        reference_text=ref.transcript if ref is not None else None,
                        reference_audio=ref.audio if ref is not None else None,
                        reference_rate_hz=ref.rate_hz if ref is not None else contract.SAMPLE_RATE_HZ,
                        no_speaker=ref is not None and not req.voice.strip(), keep_unspeakable=True)
    (out,) = stages.frontend(call)
    result = StreamResult()
    result.add_prepared(PreparedText([out], _request_prompt(ref, out)[1]))
    return result

