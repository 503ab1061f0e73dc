"""The ensemble door's vocoder windows, free of Triton: one stream's token batches in, the
windows of the chunk schedule out, each with the samples of its audio to keep.

In the BLS door the entry model vocodes each window and crossfades its seams
(:func:`~chattts_serving.serving.pipeline.stream_audio`). In the ensemble door the GPT engine,
in its ensemble mode, sends each window as it is complete to ``chattts_ensemble_vocoder``, a
decoupled step without Triton batching that vocodes each window alone, in arrival order, and
keeps no state between them (no carried convolution state, no previous window to blend with).
So the engine also says which samples of the window's audio are the chunk
(:meth:`~chattts_serving.audio.chunking.StreamChunker.keep`): the same chunk schedule, seams
cut at the chunk boundary instead of crossfaded
(:meth:`~chattts_serving.audio.chunking.ChunkSchedule.without_crossfade`). With a lookahead of
the vocoder's receptive field both doors' streams equal the offline decode.

The first window's ``info`` is the stream's header (``contract.INFO_HEADER_KEYS``, made by the
front end); the last one's the same object completed with ``contract.INFO_FINAL_KEYS``. (A
non-final window waits for its lookahead, so tokens always remain for a last window with
samples; were none left, an empty last window would carry the final info.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule, StreamChunker, ready_points
from ..contract import StopReason, VocoderPath
from ..engine.request import MAX_EMIT_POINTS
from ..errors import ErrorKind, RequestError
from .boundary import TokenBatch
from .tokens import NO_AUDIO, TokenStore


@dataclass(frozen=True)
class EnsembleWindow:
    """One window as the engine sends it to the ensemble's vocoder step (the
    ``contract.WINDOW_OUTPUTS`` tensors): ``hidden`` (T, H) float32 (T = 0 for an empty last
    window), its ``index`` in the stream (from 0), the samples of its audio to keep
    (``keep_first``, ``keep_samples``), ``info`` ('' or a JSON object) and whether it is the
    stream's last (``final``)."""

    hidden: np.ndarray
    index: int
    keep_first: int
    keep_samples: int
    info: str
    final: bool


def final_info(header: str, *, samples: int, chunks: int, tokens: int, stop_reason: StopReason) -> str:
    """The stream's last ``info``: the front end's ``header`` JSON with ``final`` true and the
    final keys (audio seconds, chunks with audio, tokens, capped segments, stop reason)."""
    info = json.loads(header) if header else {}
    info.update(final=True, audio_s=round(samples / contract.SAMPLE_RATE_HZ, 6), chunks=chunks, tokens=tokens,
                capped_segments=[0] if stop_reason == StopReason.MAX_TOKENS else [], stop_reason=str(stop_reason))
    return json.dumps(info, ensure_ascii=False)


class EnsembleWindowPlanner:
    """One ensemble stream's windows (see the module docstring). ``schedule``: the stream's
    chunk schedule (its crossfade is dropped, and a carried schedule runs windowed: the
    ensemble's vocoder step vocodes each window alone); ``header``: the first chunk's info JSON;
    ``hidden_size``: H. Not thread-safe (the engine thread calls it)."""

    def __init__(self, schedule: ChunkSchedule, header: str, hidden_size: int) -> None:
        self.schedule = schedule.windowed().without_crossfade()  # each window is vocoded alone
        self.chunker = StreamChunker(self.schedule)
        self.store = TokenStore()
        self.header = header
        self.hidden_size = hidden_size
        self.index = 0
        self.samples = 0
        self.chunks = 0

    def emit_at(self, max_tokens: int) -> tuple[int, ...]:
        """The token counts at which this stream's windows become complete (up to
        ``max_tokens``): when the engine should send its tokens besides every ``emit_tokens``."""
        return ready_points(self.schedule, max_tokens, MAX_EMIT_POINTS)

    def add(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> list[EnsembleWindow]:
        """Take a token batch (codes (N, 4) int32, hidden (N, H) float32; ``stop_reason`` on
        the last) and return the windows it completes, in order; after a stop reason the last
        of them is final. Raises RequestError (INTERNAL) when the sequence ended without a
        single token (as the BLS door does); a CANCELLED stop makes no window."""
        self.store.add(TokenBatch(codes, hidden, stop_reason))
        if stop_reason == StopReason.CANCELLED:
            return []
        finished = stop_reason is not None
        if finished and self.store.n == 0:
            raise RequestError(NO_AUDIO, ErrorKind.INTERNAL)
        out = []
        while (w := self.chunker.next_window(self.store.n, finished)) is not None:
            first, count = self.chunker.keep(w)
            out.append(self._window(self.store.window(VocoderPath.HIDDEN, w.start, w.end), first, count, w.final,
                                    stop_reason))
        if finished and not (out and out[-1].final):
            out.append(self._window(np.zeros((0, self.hidden_size), np.float32), 0, 0, True, stop_reason))
        return out

    def _window(self, hidden: np.ndarray, first: int, count: int, final: bool,
                stop_reason: StopReason | None) -> EnsembleWindow:
        self.samples += count
        self.chunks += 1 if count else 0
        if final:
            assert stop_reason is not None
            info = final_info(self.header, samples=self.samples, chunks=self.chunks, tokens=self.store.n,
                              stop_reason=stop_reason)
        else:
            info = self.header if self.index == 0 else ""
        w = EnsembleWindow(np.ascontiguousarray(hidden, np.float32), self.index, first, count, info, final)
        self.index += 1
        return w
