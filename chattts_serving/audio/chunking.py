"""Streaming chunk schedule: which token window to vocode next, and which samples to send.

A token window (:class:`TokenWindow`) is a span of GPT tokens the vocoder decodes in one call:
a chunk's new tokens with their left context and lookahead.

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

Chunk sizes after the first: with ``rate_planned`` each next chunk is sized from the stream's
measured token rate so that it is ready before the audio already sent has played out (see
:meth:`StreamChunker.plan_next`); otherwise (or until a rate is known) they grow
geometrically by ``growth``: each chunk ``growth`` times the one before (``growth_basis``
"chunk"), or each chunk ending where the audio sent so far, times ``growth``, ends
(``growth_basis`` "audio": ``b_{k+1} = floor(growth * b_k)``). The second keeps a stream
gapless at any real-time factor up to ``1 / growth``, with seams that depend on the request
alone: chunk k+1 must be generated (``b_{k+1} + lookahead`` tokens at ``r`` token durations
each) while the audio sent so far (``b_k`` tokens, from the moment the first chunk went out)
plays, so ``b_{k+1} <= b_k / r`` whenever the first chunk's lookahead plus its length is at
least the later lookahead. The first chunk is always ``first_chunk_tokens`` (TTFA). With
``slow_growth`` a stream measured slower than real time when its next chunk is sized grows
that chunk by ``slow_growth`` instead (basis "chunk"): it stalls whatever its sizes, and
fewer windows leave the cores to the other streams.

Sample indexing: a window starting at token ``s`` yields ``512*(e-s) - 256`` samples; its
sample ``j`` is global sample ``512*s + j``. An utterance of ``n`` tokens has
``512*n - 256`` samples (``contract.samples_for_tokens``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from .. import contract

GROWTH_BASES = ("chunk", "audio")
"""Values of :attr:`ChunkSchedule.growth_basis`."""


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
    rate_planned: bool = False
    """Size each chunk after the first from the measured token rate (:meth:`StreamChunker.plan_next`)."""
    margin_s: float = 0.05
    """Seconds of audio a rate-planned chunk keeps in hand: it aims to be ready this long
    before the audio already sent has played out (jitter of the token rate and delivery)."""
    min_planned_tokens: int = 2
    """Smallest rate-planned chunk, and smallest chunk of ``growth_basis`` "audio". Each window
    vocodes its chunk plus its context, lookahead and crossfade edges, so a stream
    barely faster than real time would be cut into many tiny, costly windows; below this size
    it takes the small gap instead (the trade is simulated in tests/unit/test_chunking.py)."""
    growth_basis: str = "chunk"
    """What ``growth`` multiplies: "chunk" (each chunk's size) or "audio" (the audio sent so far:
    gapless up to RTF ``1 / growth``, see the module docstring)."""
    slow_growth: float = 0.0
    """Growth of each chunk's size (as basis "chunk") for a stream generated slower than real
    time when its next chunk is sized (:attr:`StreamChunker.slower_than_real_time`); 0: the
    schedule's own growth at any rate. Such a stream stalls whatever its chunk sizes, so the
    small chunks that keep a faster one gapless only cost vocoder windows, which the other
    streams on the same cores pay for. Its seams then depend on the rate as well as the request."""
    lookahead_step: int = 0
    """After the first window, each window's lookahead grows by this many tokens from the first
    one's until ``lookahead_tokens`` (0: ``lookahead_tokens`` from the second window on). The
    jump from the first window's short lookahead to the full one is tokens the second window
    must wait for while only the first chunk plays: with the cpu schedule (4, then 8) its need
    is 15 tokens for 6 tokens of audio, gapless only up to RTF 0.58; with a step of 2 it is
    13 (:meth:`StreamChunker.lookahead_now`). Costs those seams' exactness (lookahead 6
    instead of 8 at one seam with that schedule)."""
    carried: bool = False
    """The vocoder carries its convolution state from window to window
    (:meth:`with_carried_state`): windows have no left context (``left_context_tokens`` is kept
    for :meth:`windowed`), and the crossfade needs none."""

    def validate(self) -> ChunkSchedule:
        if self.first_chunk_tokens < 1 or self.max_chunk_tokens < self.first_chunk_tokens:
            raise ValueError("need 1 <= first_chunk_tokens <= max_chunk_tokens")
        if self.growth < 1.0:
            raise ValueError("growth must be >= 1")
        if self.slow_growth != 0.0 and self.slow_growth < 1.0:
            raise ValueError("slow_growth must be 0 (off) or >= 1")
        if self.growth_basis not in GROWTH_BASES:
            raise ValueError(f"growth_basis must be one of {GROWTH_BASES}")
        if self.margin_s < 0:
            raise ValueError("margin_s must be >= 0")
        if not 1 <= self.min_planned_tokens <= self.max_chunk_tokens:
            raise ValueError("need 1 <= min_planned_tokens <= max_chunk_tokens")
        if self.lookahead_tokens < 1 or self.left_context_tokens < 0 or self.first_lookahead_tokens < 0:
            raise ValueError("lookahead_tokens must be >= 1, left_context_tokens and first_lookahead_tokens >= 0")
        if self.lookahead_step < 0:
            raise ValueError("lookahead_step must be >= 0")
        f = self.crossfade_samples
        if f < 0 or f % 2:
            raise ValueError("crossfade_samples must be even and >= 0")
        shortest = min(self.lookahead_tokens, self.first_lookahead)
        if f // 2 > contract.SAMPLES_PER_TOKEN * shortest - contract.HOP_SAMPLES:
            raise ValueError(f"crossfade of {f} samples needs more lookahead than {self.first_lookahead} tokens")
        if not self.carried and f // 2 > contract.SAMPLES_PER_TOKEN * self.left_context_tokens:
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
                             first_lookahead_tokens=0, rate_planned=self.rate_planned,
                             margin_s=self.margin_s, min_planned_tokens=self.min_planned_tokens,
                             growth_basis=self.growth_basis, slow_growth=self.slow_growth,
                             lookahead_step=self.lookahead_step, carried=self.carried).validate()

    def without_crossfade(self) -> ChunkSchedule:
        """The same chunks, context and lookahead, seams cut at the chunk boundary instead of
        crossfaded (:meth:`StreamChunker.keep`): what a stream needs whose vocoder step cannot
        blend a window with the one before (the ensemble door's). With a lookahead of the
        receptive field nothing changes (both sides of a seam equal the offline decode)."""
        return ChunkSchedule(self.first_chunk_tokens, self.growth, self.max_chunk_tokens, self.left_context_tokens,
                             self.lookahead_tokens, 0, self.first_lookahead_tokens,
                             min_planned_tokens=self.min_planned_tokens, growth_basis=self.growth_basis,
                             slow_growth=self.slow_growth, lookahead_step=self.lookahead_step,
                             carried=self.carried).validate()

    def with_carried_state(self) -> ChunkSchedule:
        """The same chunks, lookahead and crossfade for a vocoder that carries its convolution
        state from window to window (:class:`~chattts_serving.audio.vocoder.VocoderStream`): no
        left context (the carried state is the left context; ``left_context_tokens`` is kept for
        :meth:`windowed`). Window k is ``[b_k - edge, b_{k+1} + edge + lookahead)`` (``edge``:
        the crossfade's half, in whole tokens); the vocoder commits at
        :meth:`StreamChunker.carry_point`, the start of the next window, so the tokens after it
        are vocoded again with their right context, and the seam is crossfaded between the two
        decodes as in the windowed mode (without the crossfade the seam would keep the first
        decode's error at its end, where it lacks right context)."""
        return replace(self, carried=True).validate()

    def windowed(self) -> ChunkSchedule:
        """The same schedule for a vocoder that decodes each window alone (its left context
        back): what a vocoder step that keeps no state between windows needs (the ensemble
        door's) whatever the profile's mode."""
        return replace(self, carried=False).validate()

    @property
    def left_tokens(self) -> int:
        """Left context each window vocodes: ``left_context_tokens``, 0 when carried."""
        return 0 if self.carried else self.left_context_tokens


def _fast_windows(schedule: ChunkSchedule, n_tokens: int) -> Iterator[TokenWindow]:
    """The windows of an ``n_tokens`` utterance under ``schedule`` (the last one final), tokens
    arriving one at a time, faster than real time: the schedule's growth only (rate-planned
    windows and a slow stream's depend on timing; neither is what this yields). A window is
    yielded when the token count first reaches its ``end``."""
    chunker, avail = StreamChunker(replace(schedule, rate_planned=False, slow_growth=0.0)), 0
    while not chunker.done:
        avail = min(n_tokens, avail + 1)
        while (w := chunker.next_window(avail, avail == n_tokens)) is not None:
            yield w
            chunker.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))


def vocoded_tokens(schedule: ChunkSchedule, n_tokens: int) -> int:
    """Tokens an ``n_tokens`` utterance passes through the vocoder under ``schedule``: the sum
    of its windows' lengths (:func:`_fast_windows`: the count the vocoder makes for a stream
    faster than real time)."""
    return sum(w.end - w.start for w in _fast_windows(schedule, n_tokens))


@functools.lru_cache(maxsize=256)
def ready_points(schedule: ChunkSchedule, max_tokens: int, most: int) -> tuple[int, ...]:
    """The token counts at which each window but the last of a stream of up to ``max_tokens``
    tokens becomes complete under ``schedule`` (its chunk, crossfade edge and lookahead exist),
    for a stream faster than real time (:func:`_fast_windows`), ascending, at most ``most`` of
    them. The engine responds at each (the sequence's ``emit_at``) besides every
    ``emit_tokens``: a window is then vocoded as soon as it can be, not up to
    ``emit_tokens - 1`` tokens later. With ``rate_planned`` only the first window's is known
    in advance (the rest follow the measured rate)."""
    if schedule.rate_planned:
        return (schedule.tokens_before_first_chunk(),)[:most]
    points: list[int] = []
    for w in _fast_windows(schedule, max_tokens + 1):  # one more: every window ending at max_tokens is not final
        if w.final or w.end > max_tokens or len(points) == most:
            break
        points.append(w.end)
    return tuple(points)


@dataclass(frozen=True)
class TokenWindow:
    """A vocoder job: decode tokens ``[start, end)``, of which the chunk's own are
    ``[chunk_start, chunk_end)`` (the rest: left context, crossfade edge and lookahead);
    ``final`` marks the stream's last one."""

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

    def __init__(self, schedule: ChunkSchedule, clock: Callable[[], float] = time.monotonic) -> None:
        self.s = schedule.validate()
        self.clock = clock
        self.boundary = 0  # b_k: first token of the next chunk
        self.size = schedule.first_chunk_tokens
        self.chunks = 0  # chunks sent before the next one
        self.emitted = 0  # global samples already sent
        self.tail: np.ndarray | None = None  # previous decode over the crossfade region
        self.done = False
        self._first_seen: tuple[float, int] | None = None  # (clock, tokens) when tokens were first seen
        self._last_seen: tuple[float, int] | None = None
        self._window_at: float | None = None  # clock when the last window was handed out
        self.vocode_s = 0.0
        """Seconds between the last window being handed out and its audio coming back."""
        self.first_emit_s: float | None = None
        """Clock time of the first samples sent: playback is taken to start then."""

    @property
    def rate_hz(self) -> float | None:
        """Tokens per second generated since the chunker first saw tokens (None until at least
        2 more arrived over a measurable time)."""
        if self._first_seen is None or self._last_seen is None:
            return None
        (t0, n0), (t1, n1) = self._first_seen, self._last_seen
        if n1 - n0 < 2 or t1 <= t0:
            return None
        return (n1 - n0) / (t1 - t0)

    @property
    def slower_than_real_time(self) -> bool:
        """True when the stream's tokens are measured (:attr:`rate_hz`) to arrive slower than
        their audio plays (one token per ``SAMPLES_PER_TOKEN`` samples); False while no rate is known."""
        rate = self.rate_hz
        return rate is not None and rate < contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN

    def _observe(self, available: int) -> None:
        now = self.clock()
        if available > 0 and self._first_seen is None:
            self._first_seen = (now, available)
        if self._last_seen is None or available > self._last_seen[1]:
            self._last_seen = (now, available)

    def lookahead_now(self) -> int:
        """The next window's lookahead (tokens): the first one's for the first chunk, then
        growing by ``lookahead_step`` per chunk sent until ``lookahead_tokens``."""
        s = self.s
        if self.chunks == 0:
            return s.first_lookahead
        if not s.lookahead_step:
            return s.lookahead_tokens
        return min(s.lookahead_tokens, s.first_lookahead + self.chunks * s.lookahead_step)

    def plan_next(self, available: int) -> int | None:
        """Tokens of the chunk after the one just sent, so that it is ready before the audio
        sent so far has played out; None when no plan can be made (no rate yet, or
        ``rate_planned`` off: the caller grows geometrically).

        Playback is taken to start at the first sent sample and run without a stop, so the
        audio sent so far (``emitted`` samples) ends at ``first_emit_s + emitted / 24000``. A
        chunk of n tokens after boundary b can be vocoded once ``b + n + edge + lookahead``
        tokens exist; at the measured rate r that is ``(b + n + edge + lookahead -
        available) / r`` seconds from now, plus the last vocoder call's duration. The largest n
        that lands ``margin_s`` before the end of the sent audio is taken, at least
        ``min_planned_tokens`` (below it the stream takes a short gap rather than many tiny
        windows) and at most ``max_chunk_tokens``. A stream generated slower than real time gets ``growth``'s
        sizes instead: it stalls whatever the size, and larger chunks cost less vocoder time.
        """
        rate = self.rate_hz
        if not self.s.rate_planned or rate is None or self.first_emit_s is None or self.slower_than_real_time:
            return None
        edge = -(-(self.s.crossfade_samples // 2) // contract.SAMPLES_PER_TOKEN)
        played_until = self.first_emit_s + self.emitted / contract.SAMPLE_RATE_HZ
        budget_s = played_until - self.clock() - self.vocode_s - self.s.margin_s
        n = math.floor(budget_s * rate + available - self.boundary - edge - self.lookahead_now())
        return max(self.s.min_planned_tokens, min(self.s.max_chunk_tokens, n))

    def next_window(self, available: int, finished: bool) -> TokenWindow | None:
        """The next window to decode, or None until more tokens arrive.

        ``available``: tokens generated so far; ``finished``: no more will come. Context is
        counted from the edges of the samples the window contributes (its chunk widened by
        the crossfade's half on each side).
        """
        if self.done:
            return None
        self._observe(available)
        edge = -(-(self.s.crossfade_samples // 2) // contract.SAMPLES_PER_TOKEN)  # ceil, in tokens
        start = max(0, self.boundary - edge - self.s.left_tokens)
        end = self.boundary + self.size
        need = end + edge + self.lookahead_now()
        if finished and need > available:
            if available <= self.boundary and self.emitted >= contract.samples_for_tokens(available):
                self.done = True
                return None
            self._window_at = self.clock()
            return TokenWindow(start, available, self.boundary, available, True)
        if available < need:
            return None
        self._window_at = self.clock()
        return TokenWindow(start, need, self.boundary, end, False)

    def carry_point(self, w: TokenWindow) -> int:
        """Where the window after ``w`` starts (its chunk's start less the crossfade's edge and
        the left context): what a vocoder that carries its state commits after ``w``."""
        edge = -(-(self.s.crossfade_samples // 2) // contract.SAMPLES_PER_TOKEN)
        return max(0, w.chunk_end - edge - self.s.left_tokens)

    def keep(self, w: TokenWindow) -> tuple[int, int]:
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
        self._advance(w, stop, count)
        return first, count

    def _advance(self, w: TokenWindow, stop: int, sent: int) -> None:
        """Window ``w`` was handed out, ``sent`` samples of it up to sample ``stop``: record the
        vocoder's time and the first emit, then size the next chunk (:meth:`_grown`, or planned
        from the token rate: :meth:`plan_next`)."""
        now = self.clock()
        if self._window_at is not None:
            self.vocode_s = max(0.0, now - self._window_at)
        if self.first_emit_s is None and sent:
            self.first_emit_s = now
        if w.final:
            self.done = True
        else:
            self.boundary = w.chunk_end
            self.chunks += 1
            grown = self._grown()
            planned = self.plan_next(self._last_seen[1] if self._last_seen else w.end)
            self.size = grown if planned is None else planned
        self.emitted = stop

    def _grown(self) -> int:
        """The next chunk's size without a rate plan (``self.boundary`` is its first token):
        ``growth`` times the last chunk, or up to ``floor(growth * boundary)`` ("audio"
        basis, at least ``min_planned_tokens``), or ``slow_growth`` times the last chunk for a
        stream slower than real time; at most ``max_chunk_tokens``."""
        s = self.s
        growth, basis = ((s.slow_growth, "chunk") if s.slow_growth and self.slower_than_real_time
                         else (s.growth, s.growth_basis))
        if basis == "audio":
            size = max(s.min_planned_tokens, math.floor(growth * self.boundary) - self.boundary)
        else:
            size = max(self.size + 1, int(self.size * growth))
        return min(s.max_chunk_tokens, size)

    def emit(self, w: TokenWindow, audio: np.ndarray) -> np.ndarray:
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
        self._advance(w, stop, out.size)
        return out
