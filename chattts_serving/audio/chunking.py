"""Streaming chunk schedule: which token window to vocode next, and which samples to send.

Chunk k covers tokens ``[b_k, b_{k+1})``; the first chunk is small (low time to first audio),
later ones grow geometrically to amortise the vocoder's per-call cost. A chunk is decoded
once ``b_{k+1} + lookahead`` tokens exist (or the stream has ended), over the window
``[b_k - left, b_{k+1} + lookahead)``: each chunk is decoded once, with context, never by
re-decoding the whole prefix (ChatTTS' own streaming re-decodes the prefix every 24 tokens).

With ``left`` and ``lookahead`` at least the vocoder's receptive field (in the manifest), a
token's samples depend only on tokens inside the window, so the concatenated stream equals
the offline decode of the whole utterance up to float rounding. A smaller lookahead lowers
latency; the seam is then hidden by a linear crossfade of ``crossfade_samples`` centred on
the chunk boundary, between this chunk's decode (which has left context there) and the next
chunk's (which has right context there).

Sample indexing: a window starting at token ``s`` yields ``512*(e-s) - 256`` samples; its
sample ``j`` is global sample ``512*s + j``. An utterance of ``n`` tokens has
``512*n - 256`` samples (``contract.samples_for_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import contract


@dataclass(frozen=True)
class ChunkSchedule:
    """Chunking knobs, all in tokens except ``crossfade_samples``.

    Raises ValueError from :meth:`validate` when the crossfade does not fit the context.
    """

    first_chunk_tokens: int = 8
    growth: float = 2.0
    max_chunk_tokens: int = 64
    left_context_tokens: int = 52
    lookahead_tokens: int = 8
    crossfade_samples: int = 512
    first_lookahead_tokens: int = 0
    """Lookahead of the first chunk only (0 = ``lookahead_tokens``): the latency knob of
    time to first audio, at the cost of one less exact seam."""

    def validate(self) -> ChunkSchedule:
        if self.first_chunk_tokens < 1 or self.max_chunk_tokens < self.first_chunk_tokens:
            raise ValueError("need 1 <= first_chunk_tokens <= max_chunk_tokens")
        if self.growth < 1.0:
            raise ValueError("growth must be >= 1")
        if self.lookahead_tokens < 1 or self.left_context_tokens < 0 or self.first_lookahead_tokens < 0:
            raise ValueError("lookahead_tokens must be >= 1, left_context_tokens and first_lookahead_tokens >= 0")
        f = self.crossfade_samples
        if f < 0 or f % 2:
            raise ValueError("crossfade_samples must be even and >= 0")
        shortest = min(self.lookahead_tokens, self.first_lookahead)
        if f // 2 > contract.SAMPLES_PER_TOKEN * shortest - contract.HOP_SAMPLES:
            raise ValueError(f"crossfade of {f} samples needs more lookahead than {self.first_lookahead} tokens")
        if f // 2 > contract.SAMPLES_PER_TOKEN * self.left_context_tokens:
            raise ValueError(f"crossfade of {f} samples needs more left context than "
                             f"{self.left_context_tokens} tokens")
        return self

    @property
    def first_lookahead(self) -> int:
        return self.first_lookahead_tokens or self.lookahead_tokens

    def tokens_before_first_chunk(self) -> int:
        """Tokens that must exist before the first window can be decoded."""
        edge = -(-(self.crossfade_samples // 2) // contract.SAMPLES_PER_TOKEN)
        return self.first_chunk_tokens + edge + self.first_lookahead

    def with_lookahead(self, lookahead_tokens: int) -> ChunkSchedule:
        """The same schedule with another lookahead; the left context grows to at least the
        lookahead (so a lookahead of the receptive field gives exact offline audio) and the
        crossfade shrinks to fit if needed."""
        room = 2 * (contract.SAMPLES_PER_TOKEN * lookahead_tokens - contract.HOP_SAMPLES)
        fade = min(self.crossfade_samples, max(0, room) // 2 * 2)
        return ChunkSchedule(self.first_chunk_tokens, self.growth, self.max_chunk_tokens,
                             max(self.left_context_tokens, lookahead_tokens), lookahead_tokens, fade,
                             first_lookahead_tokens=0).validate()

    def without_crossfade(self) -> ChunkSchedule:
        """The same chunks, context and lookahead, seams cut at the chunk boundary instead of
        crossfaded: what a stream whose windows are vocoded by a stateless step needs (the
        ensemble door: its vocoder cannot blend a window with the one before), see
        :meth:`StreamChunker.keep`. With a lookahead of the receptive field nothing changes
        (both sides of a seam equal the offline decode)."""
        return ChunkSchedule(self.first_chunk_tokens, self.growth, self.max_chunk_tokens, self.left_context_tokens,
                             self.lookahead_tokens, 0, self.first_lookahead_tokens).validate()


@dataclass(frozen=True)
class Window:
    """A vocoder job: decode tokens ``[start, end)``; ``final`` marks the stream's last one."""

    start: int
    end: int
    chunk_start: int
    chunk_end: int
    final: bool


class StreamChunker:
    """Stateful chunker for one stream. Feed it the token count, ask for windows, hand back
    each window's audio, get the samples to send.

    Usage::

        ch = StreamChunker(schedule)
        while ...:
            w = ch.next_window(available_tokens, finished)
            if w: send(ch.emit(w, vocode(tokens[w.start:w.end])))
    """

    def __init__(self, schedule: ChunkSchedule) -> None:
        self.s = schedule.validate()
        self.boundary = 0  # b_k: first token of the next chunk
        self.size = schedule.first_chunk_tokens
        self.emitted = 0  # global samples already sent
        self.tail: np.ndarray | None = None  # previous decode over the crossfade region
        self.done = False

    def next_window(self, available: int, finished: bool) -> Window | None:
        """The next window to decode, or None until more tokens arrive.

        ``available``: tokens generated so far; ``finished``: no more will come. Context is
        counted from the edges of the samples the window contributes (its chunk widened by
        the crossfade's half on each side).
        """
        if self.done:
            return None
        edge = -(-(self.s.crossfade_samples // 2) // contract.SAMPLES_PER_TOKEN)  # ceil, in tokens
        start = max(0, self.boundary - edge - self.s.left_context_tokens)
        end = self.boundary + self.size
        lookahead = self.s.first_lookahead if self.boundary == 0 else self.s.lookahead_tokens
        need = end + edge + lookahead
        if finished and need > available:
            if available <= self.boundary and self.emitted >= contract.samples_for_tokens(available):
                self.done = True
                return None
            return Window(start, available, self.boundary, available, True)
        if available < need:
            return None
        return Window(start, need, self.boundary, end, False)

    def keep(self, w: Window) -> tuple[int, int]:
        """For a schedule without crossfade (:meth:`ChunkSchedule.without_crossfade`): which
        samples of window ``w``'s audio to send, (first sample, count), advancing the chunker
        as :meth:`emit` does; ``emit(w, audio)`` returns exactly ``audio[first:first+count]``.
        For a vocoder that is told what to keep instead of being handed the audio. Raises
        ValueError for a schedule with a crossfade (its seams need the previous window's audio)."""
        if self.s.crossfade_samples:
            raise ValueError("keep() needs a schedule without crossfade")
        spt = contract.SAMPLES_PER_TOKEN
        stop = contract.samples_for_tokens(w.end) if w.final else w.chunk_end * spt
        first = self.emitted - w.start * spt
        count = max(0, stop - self.emitted)
        self._advance(w, stop)
        return first, count

    def _advance(self, w: Window, stop: int) -> None:
        if w.final:
            self.done = True
        else:
            self.boundary = w.chunk_end
            self.size = min(self.s.max_chunk_tokens, max(self.size + 1, int(self.size * self.s.growth)))
        self.emitted = stop

    def emit(self, w: Window, audio: np.ndarray) -> np.ndarray:
        """Samples to send for window ``w`` given its decoded ``audio`` (1-D float32)."""
        spt = contract.SAMPLES_PER_TOKEN
        base = w.start * spt
        half = self.s.crossfade_samples // 2
        stop = contract.samples_for_tokens(w.end) if w.final else w.chunk_end * spt - half
        out = np.asarray(audio[self.emitted - base: stop - base], dtype=np.float32).copy()
        if self.tail is not None and self.tail.size:
            f = min(self.tail.size, out.size)
            ramp = (np.arange(f, dtype=np.float32) + 0.5) / np.float32(self.tail.size)
            out[:f] = self.tail[:f] * (1.0 - ramp) + out[:f] * ramp
        self.tail = None if w.final else np.asarray(audio[stop - base: stop + 2 * half - base], dtype=np.float32).copy()
        self._advance(w, stop)
        return out
