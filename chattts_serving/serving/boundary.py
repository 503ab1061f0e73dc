"""What crosses the boundary between the pipeline and its stages, free of Triton.

:class:`Stages` is the three stages the entry models call (BLS in the server:
:class:`chattts_serving.triton.stages.BlsStages`; in process in tests): the front end gives a
:class:`FrontendOutput` per segment, the GPT engine a :class:`TokenStream` of
:class:`TokenBatch` es, the vocoder audio for a window (a :class:`CarriedWindow` names a carried
stream's). :data:`Watch` is how the pipeline learns that the client cancelled. The front end's
call (:class:`~chattts_serving.serving.request.FrontendCall`) lives with the request parsers: the
front-end model parses its tensors into one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .. import contract
from ..contract import StopReason, VocoderPath
from ..engine.request import SequenceRequest
from ..text.normalize import DEFAULT_SPEED
from ..text.segments import join_normalized
from .request import FrontendCall

__all__ = ["CarriedWindow", "FrontendCall", "FrontendOutput", "Stages", "TokenBatch", "TokenStream", "Watch",
           "frontend_outputs", "frontend_tensors", "no_watch"]

@dataclass(frozen=True, kw_only=True)
class FrontendOutput:
    """One segment after the front end: prompt ids (T,) int32, speaker vector (H,) float32
    (None without one: ``[empty_spk]`` prompt), the text after normalisation (or refinement),
    what was not spoken (characters or reserved tokens, in order of appearance), when asked
    for the refine-text prompt ids (T',) int32 (``[Sbreak]{normalized}[Pbreak]{refine_prompt}``;
    None also for a piece with nothing speakable), the audio-prompt codes (P, 4) int32 of
    the call's recording or of the voice's (None for none), and N of the prompt's
    ``[speed_N]`` (what a later call needs to prompt ``normalized_text`` again)."""

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    normalized_text: str = ""
    dropped: tuple[str, ...] = ()
    refine_ids: np.ndarray | None = None
    prompt_codes: np.ndarray | None = None
    speed: int = DEFAULT_SPEED


@dataclass(frozen=True)
class TokenBatch:
    """Tokens from the engine: codes (N, 4) int32, hidden (N, H) float32, and the stop reason
    on the sequence's last batch (None before)."""

    codes: np.ndarray
    hidden: np.ndarray
    stop_reason: StopReason | None = None


class TokenStream(Protocol):
    """Tokens of one sequence: iterate for batches (iteration raises RequestError when the
    sequence fails); ``cancel()`` ends it early and drains (a no-op once its last batch was
    read); ``request_cancel()`` (any thread) asks the engine to end it, the iterator then ends
    with a CANCELLED batch."""

    def __iter__(self) -> Iterator[TokenBatch]: ...

    def cancel(self) -> None: ...

    def request_cancel(self) -> None: ...


class Stages(Protocol):
    """The three stages the entry models call (BLS in the server). Each raises
    :class:`~chattts_serving.errors.RequestError`."""

    def frontend(self, call: FrontendCall) -> list[FrontendOutput]:
        """Normalise and tokenize every segment of the call (or prompt again the texts it made
        before), resolve the voice and the audio prompt (:class:`FrontendCall`): one output
        per text, in order."""

    def generate(self, call: SequenceRequest) -> TokenStream:
        """Start a sequence on the engine (:class:`SequenceRequest`)."""

    def vocode(self, path: VocoderPath, window: np.ndarray, request_id: str = "") -> np.ndarray:
        """Window (T, H) float32 (hidden path) or (T, 4) int32 (codes path) -> audio
        (512T-256,) float32."""

    def vocode_carried(self, path: VocoderPath, window: np.ndarray, request_id: str,
                       carried: CarriedWindow) -> np.ndarray:
        """A carried stream's window (:class:`CarriedWindow`; window as for :meth:`vocode`) ->
        its complete samples (:meth:`~chattts_serving.audio.vocoder.VocoderStream.vocode`); a
        ``STREAM_RELEASE`` (empty window) frees the stream's state and returns no samples."""


@dataclass(frozen=True)
class CarriedWindow:
    """Which carried stream a window belongs to and what the vocoder does with it:
    ``stream_id`` (unique per segment), the window's first token ``start``, the token to commit
    ``carry_from`` and ``action`` (``contract.STREAM_CONTINUE``, ``STREAM_FINAL``,
    ``STREAM_RELEASE``)."""

    stream_id: str
    start: int
    carry_from: int
    action: int


Watch = Callable[[Callable[[], None]], Callable[[], None]]
"""``watch(on_cancel)`` arranges for ``on_cancel()`` to run as soon as the client cancels and
returns a function that stops watching."""



def no_watch(on_cancel: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


def frontend_tensors(outs: list[FrontendOutput]) -> dict[str, np.ndarray]:
    """The front-end model's output tensors (``contract.FRONTEND_OUTPUTS`` less the ensemble
    request's) for the outputs of one call: the segments' prompt and refine ids concatenated
    with their lengths, their texts, dropped and speeds one per segment, ``normalized_text``
    and ``dropped`` for the whole text; the speaker vector and the audio prompt once (the
    first output's: one call has one voice and one audio prompt)."""
    first = outs[0]
    none = np.zeros(0, np.int32)
    dropped = list(dict.fromkeys(d for o in outs for d in o.dropped))

    def strings(values: list[str]) -> np.ndarray:
        return np.array([v.encode("utf-8") for v in values], dtype=np.object_)

    return {
        contract.FE_INPUT_IDS.name: np.concatenate([np.asarray(o.input_ids, np.int32) for o in outs]),
        contract.FE_INPUT_LENGTHS.name: np.array([o.input_ids.size for o in outs], np.int32),
        contract.FE_SPK_EMB.name: (first.spk_emb.astype(np.float32) if first.spk_emb is not None
                                   else np.zeros(0, np.float32)),
        contract.FE_NORMALIZED.name: strings([join_normalized([o.normalized_text for o in outs])]),
        contract.FE_DROPPED.name: strings([json.dumps(dropped, ensure_ascii=False)]),
        contract.FE_SEGMENT_TEXTS.name: strings([o.normalized_text for o in outs]),
        contract.FE_SEGMENT_DROPPED.name: strings([json.dumps(list(o.dropped), ensure_ascii=False) for o in outs]),
        contract.FE_PROMPT_SPEEDS.name: np.array([o.speed for o in outs], np.int32),
        contract.FE_REFINE_IDS.name: np.concatenate([none, *(np.asarray(o.refine_ids, np.int32) for o in outs
                                                             if o.refine_ids is not None)]),
        contract.FE_REFINE_LENGTHS.name: np.array([o.refine_ids.size if o.refine_ids is not None else 0
                                                   for o in outs], np.int32),
        contract.FE_PROMPT_CODES.name: (first.prompt_codes if first.prompt_codes is not None
                                        else np.zeros((0, contract.NUM_VQ), np.int32)),
    }


def frontend_outputs(tensors: Mapping[str, np.ndarray]) -> list[FrontendOutput]:
    """The outputs of one front-end call from its output tensors (:func:`frontend_tensors`'
    inverse)."""
    def strings(spec: contract.TensorSpec) -> list[str]:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensors[spec.name].reshape(-1)]

    def split(ids: contract.TensorSpec, lengths: contract.TensorSpec) -> list[np.ndarray]:
        n = tensors[lengths.name].reshape(-1)
        return np.split(tensors[ids.name].reshape(-1), np.cumsum(n)[:-1]) if n.size else []

    spk, codes = tensors[contract.FE_SPK_EMB.name], tensors[contract.FE_PROMPT_CODES.name]
    speeds = tensors[contract.FE_PROMPT_SPEEDS.name].reshape(-1)
    return [FrontendOutput(input_ids=ids, spk_emb=spk if spk.size else None, normalized_text=text,
                           dropped=tuple(json.loads(dropped or "[]")), refine_ids=refine if refine.size else None,
                           prompt_codes=codes if codes.size else None, speed=int(speed))
            for ids, text, dropped, refine, speed in zip(
                split(contract.FE_INPUT_IDS, contract.FE_INPUT_LENGTHS), strings(contract.FE_SEGMENT_TEXTS),
                strings(contract.FE_SEGMENT_DROPPED), split(contract.FE_REFINE_IDS, contract.FE_REFINE_LENGTHS),
                speeds, strict=True)]
