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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..contract import StopReason, VocoderPath
from ..engine.request import SequenceRequest
from .request import FrontendCall

__all__ = ["CarriedWindow", "FrontendCall", "FrontendOutput", "Stages", "TokenBatch", "TokenStream", "Watch",
           "no_watch"]

@dataclass(frozen=True, kw_only=True)
class FrontendOutput:
    """One segment after the front end: prompt ids (T,) int32, speaker vector (H,) float32
    (None without one: ``[empty_spk]`` prompt), the text after normalisation (or refinement),
    what was not spoken (characters or reserved tokens, in order of appearance), when asked
    for the refine-text prompt ids (T',) int32 (``[Sbreak]{normalized}[Pbreak]{refine_prompt}``;
    None also for a piece with nothing speakable), and the audio-prompt codes (P, 4) int32 of
    the call's recording or of the voice's (None for none)."""

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    normalized_text: str = ""
    dropped: tuple[str, ...] = ()
    refine_ids: np.ndarray | None = None
    prompt_codes: np.ndarray | None = None


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

    def frontend(self, call: FrontendCall) -> FrontendOutput:
        """Normalise and tokenize one segment, resolve the voice (:class:`FrontendCall`)."""

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

