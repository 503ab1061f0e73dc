"""The chunk schedule, without a server: exact equality with the offline decode at full
receptive-field context, crossfaded seams at small lookahead, sizes and ends."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from bench.stats import REALTIME_TOLERANCE_S
from chattts_serving import contract
from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker, TokenWindow, ready_points
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.runtime import Artifacts


def _stream(chunker: StreamChunker, n: int, step: int, vocode) -> list[np.ndarray]:
    out, avail = [], 0
    while not chunker.done:
        avail = min(n, avail + step)
        while (w := chunker.next_window(avail, avail == n)) is not None:
            assert 0 <= w.start < w.end <= avail
            out.append(chunker.emit(w, vocode(w.start, w.end)))
    return out


def _fir_vocoder(tokens: np.ndarray, radius: int):
    """A toy vocoder with a known receptive field of ``radius`` tokens: each token's 512
    samples are a moving average of the token values within +-radius (zero-padded at the
    window edges, like the real convolution stacks)."""
    def vocode(start: int, end: int) -> np.ndarray:
        x = tokens[start:end]
        padded = np.concatenate([np.zeros(radius), x, np.zeros(radius)])
        y = np.convolve(padded, np.ones(2 * radius + 1) / (2 * radius + 1), mode="valid")
        return np.repeat(y, contract.SAMPLES_PER_TOKEN)[:contract.samples_for_tokens(end - start)].astype(np.float32)
    return vocode


@pytest.mark.parametrize("n", [1, 7, 8, 9, 30, 150])
@pytest.mark.parametrize("step", [1, 4, 50])
def test_full_context_stream_equals_offline_decode_toy(n: int, step: int) -> None:
    tokens = np.random.default_rng(n).normal(size=n)
    voc = _fir_vocoder(tokens, radius=5)
    offline = voc(0, n)
    chunks = _stream(StreamChunker(ChunkSchedule(4, 2.0, 32, 5, 5, 512)), n, step, voc)
    got = np.concatenate(chunks)
    assert got.shape == offline.shape == (contract.samples_for_tokens(n),)
    np.testing.assert_allclose(got, offline, atol=1e-6)


def test_first_chunk_is_small_and_chunks_grow() -> None:
    n = 200
    voc = _fir_vocoder(np.ones(n), radius=2)
    chunks = _stream(StreamChunker(ChunkSchedule(8, 2.0, 64, 4, 4, 256)), n, 1, voc)
    sizes = [c.size for c in chunks]
    assert sizes[0] == 8 * contract.SAMPLES_PER_TOKEN - 128
    assert sizes[1] > sizes[0] and max(sizes[:-1]) <= 64 * contract.SAMPLES_PER_TOKEN
    assert sum(sizes) == contract.samples_for_tokens(n)


def test_first_chunk_needs_only_first_chunk_plus_lookahead_plus_crossfade_tokens() -> None:
    ch = StreamChunker(ChunkSchedule(8, 2.0, 64, 24, 4, 512))
    assert ch.next_window(12, False) is None
    w = ch.next_window(13, False)
    assert w is not None and (w.start, w.end, w.chunk_end) == (0, 13, 8)


def test_no_tokens_no_audio() -> None:
    ch = StreamChunker(ChunkSchedule())
    assert ch.next_window(0, True) is None and ch.done


@pytest.mark.parametrize("bad", [dict(lookahead_tokens=0), dict(crossfade_samples=3),
                                 dict(lookahead_tokens=1, crossfade_samples=1024),
                                 dict(first_chunk_tokens=0), dict(growth=0.5)])
def test_invalid_schedules_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ChunkSchedule(**bad).validate()


@pytest.fixture(scope="module")
def real(small_artifacts: Artifacts):
    rng = np.random.default_rng(0)
    n = 90
    hidden = rng.standard_normal((n, small_artifacts.hidden_size)).astype(np.float32)
    voc = VocoderRunner(small_artifacts, "hidden")
    return small_artifacts, hidden, voc, voc.run(hidden[None])[0]


def test_real_vocoder_full_receptive_field_equals_offline(real) -> None:
    art, hidden, voc, offline = real
    rf = art.receptive_field_tokens("hidden")
    sched = ChunkSchedule(8, 2.0, 64, 24, 8, 512).with_lookahead(rf)
    got = np.concatenate(_stream(StreamChunker(sched), len(hidden), 3, lambda s, e: voc.run(hidden[None, s:e])[0]))
    assert got.shape == offline.shape
    assert np.abs(got - offline).max() <= 1e-4


def test_real_vocoder_smaller_lookahead_stays_close(real) -> None:
    """A lookahead below the receptive field is an approximation; its SNR against the
    offline decode is reported in docs/streaming-quality.md (measured on the full-size model)."""
    _, hidden, voc, offline = real
    snrs = []
    for lookahead in (2, 4, 8):
        sched = ChunkSchedule(8, 2.0, 64, 24, lookahead, 512).with_lookahead(lookahead)
        got = np.concatenate(_stream(StreamChunker(sched), len(hidden), 3,
                                     lambda s, e: voc.run(hidden[None, s:e])[0]))
        err = got - offline
        snrs.append(10 * np.log10((offline ** 2).sum() / (err ** 2).sum()))
    assert snrs[0] < snrs[1] < snrs[2]
    assert snrs[0] > 10.0


@pytest.mark.parametrize("n", [1, 8, 13, 150])
@pytest.mark.parametrize("step", [1, 4, 33])
@pytest.mark.parametrize("lookahead", [1, 4, 8])
def test_keep_cuts_exactly_what_emit_sends_without_crossfade(n: int, step: int, lookahead: int) -> None:
    """The ensemble door's vocoder is told which samples of a window to keep; for a schedule
    without crossfade that is exactly what emit() would send, seam for seam, and the kept
    samples add up to the utterance."""
    tokens = np.random.default_rng(n + step).normal(size=n)
    voc = _fir_vocoder(tokens, radius=3)
    sched = ChunkSchedule(4, 2.0, 32, 8, lookahead, 512, first_lookahead_tokens=2).without_crossfade()
    emitted = _stream(StreamChunker(sched), n, step, voc)
    kept, ch, avail = [], StreamChunker(sched), 0
    while not ch.done:
        avail = min(n, avail + step)
        while (w := ch.next_window(avail, avail == n)) is not None:
            first, count = ch.keep(w)
            kept.append(voc(w.start, w.end)[first:first + count])
    assert len(kept) == len(emitted)
    for a, b in zip(kept, emitted, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sum(k.size for k in kept) == contract.samples_for_tokens(n)


def test_keep_refuses_a_schedule_with_a_crossfade() -> None:
    ch = StreamChunker(ChunkSchedule(4, 2.0, 32, 8, 8, 512))
    w = ch.next_window(100, False)
    assert w is not None
    with pytest.raises(ValueError, match="crossfade"):
        ch.keep(w)


# ---- chunk sizes planned from the token rate (a simulated stream on a fake clock) ------------

CPU_LIKE = ChunkSchedule(4, 2.0, 64, 8, 8, 512, first_lookahead_tokens=4)
"""The cpu profile's schedule before rate planning (first chunk 4 + 4 lookahead, then 8)."""


def _simulate(schedule: ChunkSchedule, rate_hz: float, n: int, batch: int = 4,
              vocode_s=lambda tokens: 0.004 + 0.0003 * tokens):  # type: ignore[no-untyped-def]
    """A stream of ``n`` tokens arriving ``batch`` at a time at ``rate_hz`` tokens/s, each window
    vocoded in ``vocode_s(window tokens)`` seconds of a fake clock; returns (chunk send times
    (s), chunk samples, the concatenated audio, the offline audio) with the toy vocoder."""
    from bench.stats import needed_buffer_s

    clock = [0.0]
    ch = StreamChunker(schedule, clock=lambda: clock[0])
    tokens = np.random.default_rng(int(rate_hz)).normal(size=n)
    voc = _fir_vocoder(tokens, radius=schedule.lookahead_tokens)
    times, samples, chunks = [], [], []
    avail = 0
    while not ch.done:
        arrived = min(n, int(clock[0] * rate_hz) // batch * batch)
        if arrived <= avail:
            arrived = min(n, avail + batch)
            clock[0] = max(clock[0], arrived / rate_hz)
        avail = arrived
        while (w := ch.next_window(avail, avail == n)) is not None:
            clock[0] += vocode_s(w.end - w.start)
            out = ch.emit(w, voc(w.start, w.end))
            if out.size:
                times.append(clock[0])
                samples.append(out.size)
                chunks.append(out)
    return needed_buffer_s(times, samples), times, np.concatenate(chunks), voc(0, n)


@pytest.mark.parametrize("rtf", [0.7, 0.58, 0.45])
def test_rate_planned_chunks_play_without_a_gap_where_doubling_ones_stall(rtf: float) -> None:
    """Generated at 1 / RTF times real time: doubling chunk sizes (first 4 + 4, then 8 with 8
    of lookahead, 16, ...) need a start buffer (a gap at c=1 in the issue's int8 run, RTF 0.58);
    chunks sized from the measured rate need none (within 10 ms), with the same first chunk at
    the same time (TTFA kept), and the stream still equals the offline decode at full
    lookahead."""
    rate = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN / rtf
    n = 400
    grown, t_grown, _, _ = _simulate(CPU_LIKE, rate, n)
    planned_schedule = ChunkSchedule(4, 2.0, 64, 8, 8, 512, first_lookahead_tokens=4, rate_planned=True)
    planned, t_planned, audio, offline = _simulate(planned_schedule, rate, n)
    assert grown > REALTIME_TOLERANCE_S, grown  # measured 0.60 / 0.29 / 0.044 s
    assert planned <= REALTIME_TOLERANCE_S, planned
    assert t_planned[0] == t_grown[0]
    np.testing.assert_allclose(audio[-offline.size // 2:], offline[-offline.size // 2:], atol=1e-6)
    assert audio.size == offline.size


def test_rate_planning_waits_for_a_rate_and_leaves_slow_streams_to_growth() -> None:
    """Before two tokens have arrived over measurable time there is no plan; a stream slower
    than real time gets the geometric sizes (it stalls whatever the size); a fast one reaches
    the largest chunks."""
    sched = ChunkSchedule(4, 2.0, 64, 8, 8, 512, first_lookahead_tokens=4, rate_planned=True)
    clock = [0.0]
    ch = StreamChunker(sched, clock=lambda: clock[0])
    assert ch.rate_hz is None and ch.plan_next(0) is None
    slow = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN * 0.8
    _, t_slow, _, _ = _simulate(sched, slow, 200)
    _, t_grow, _, _ = _simulate(CPU_LIKE, slow, 200)
    assert t_slow == t_grow
    fast_sizes = []
    clock[0] = 0.0
    ch = StreamChunker(sched, clock=lambda: clock[0])
    avail = 0
    while not ch.done and avail < 2000:
        avail += 4
        clock[0] += 4 / 1000.0  # 1000 tokens/s
        while (w := ch.next_window(avail, avail == 2000)) is not None:
            ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
            fast_sizes.append(w.chunk_end - w.chunk_start)
    assert fast_sizes[0] == 4 and max(fast_sizes) == 64


def test_margin_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="margin"):
        ChunkSchedule(rate_planned=True, margin_s=-0.1).validate()


def test_planned_chunks_have_a_floor_that_bounds_the_vocoder_windows() -> None:
    """Barely faster than real time (RTF 0.8), an unbounded plan would cut 300 tokens into
    dozens of tiny windows (each vocoding ~18 tokens of context); the floor of 2 tokens keeps
    the needed start buffer within 30 ms with far fewer windows, and a floor of 4 fewer still."""
    rate = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN / 0.8
    windows = {}
    for floor in (1, 2, 4):
        sched = ChunkSchedule(4, 2.0, 64, 8, 8, 512, first_lookahead_tokens=4, rate_planned=True,
                              min_planned_tokens=floor)
        buf, times, _, _ = _simulate(sched, rate, 300, vocode_s=lambda t: 0.010 + 0.0005 * t)
        windows[floor] = len(times)
        if floor == 2:
            assert buf <= 0.03, buf
    assert windows[1] > windows[2] > windows[4], windows
    with pytest.raises(ValueError, match="min_planned_tokens"):
        ChunkSchedule(rate_planned=True, min_planned_tokens=0).validate()


# ---- chunks that grow with the audio sent (growth_basis "audio": gapless, request-determined) ----

CPU_AUDIO = ChunkSchedule(4, 1.4, 64, 8, 8, 512, first_lookahead_tokens=4, growth_basis="audio")
"""The cpu profiles' schedule: first chunk 4 + 4 lookahead, then the audio sent grows 1.4x per chunk."""


def test_audio_growth_boundaries_grow_by_the_factor_with_a_floor_and_a_cap() -> None:
    """Each chunk ends at floor(growth x the audio sent so far), at least min_planned_tokens
    long and at most max_chunk_tokens; the last window takes what is left."""
    n = 600
    chunks = _stream(StreamChunker(CPU_AUDIO), n, 1, _fir_vocoder(np.ones(n), radius=2))
    ends = np.cumsum([0] + [c.size for c in chunks])[1:-1]  # samples sent after each chunk but the last
    boundaries = [(e + 256) // contract.SAMPLES_PER_TOKEN for e in ends]  # a seam sits 256 samples before its token
    assert boundaries[0] == 4
    for b, nxt in itertools.pairwise(boundaries):
        assert nxt - b == min(64, max(2, int(1.4 * b) - b)), (b, nxt)
    assert n - boundaries[-1] <= 64 + 8 + 1  # the last window: one chunk, with the lookahead it no longer waits for


@pytest.mark.parametrize("rtf", [0.7, 0.6, 0.45])
def test_audio_growth_plays_without_a_gap_up_to_rtf_one_over_growth(rtf: float) -> None:
    """Generated at RTF up to 1 / growth (0.71 for 1.4), the stream needs no start buffer
    (within 10 ms) where doubling chunks stall, with the same first chunk at the same time,
    and it still equals the offline decode at full lookahead."""
    rate = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN / rtf
    grown, t_grown, _, _ = _simulate(CPU_LIKE, rate, 400)
    audio_grown, t_audio, audio, offline = _simulate(CPU_AUDIO, rate, 400)
    assert grown > REALTIME_TOLERANCE_S, grown
    assert audio_grown <= REALTIME_TOLERANCE_S, audio_grown
    assert t_audio[0] == t_grown[0]
    assert audio.size == offline.size
    np.testing.assert_allclose(audio[-offline.size // 2:], offline[-offline.size // 2:], atol=1e-6)


def _windows(schedule: ChunkSchedule, rtf: float, per_token_s: float, n: int = 300) -> list[TokenWindow]:
    """The windows a stream of ``n`` tokens asks for, its tokens arriving 4 at a time at
    ``rtf`` token durations each, each window vocoded in ``per_token_s`` per token (fake clock)."""
    clock, out, avail = [0.0], [], 0
    ch = StreamChunker(schedule, clock=lambda: clock[0])
    while not ch.done:
        avail = min(n, avail + 4)
        clock[0] += 4 * rtf * contract.SAMPLES_PER_TOKEN / contract.SAMPLE_RATE_HZ
        while (w := ch.next_window(avail, avail == n)) is not None:
            clock[0] += per_token_s * (w.end - w.start)
            ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
            out.append(w)
    return out


def test_audio_growth_seams_depend_on_the_request_alone() -> None:
    """Unlike rate-planned chunks, the windows are the same at any token rate and vocoder
    speed: the same request gives the same audio run to run."""
    assert _windows(CPU_AUDIO, 0.3, 0.0005) == _windows(CPU_AUDIO, 0.9, 0.002) == _windows(CPU_AUDIO, 0.6, 0.0)
    planned = replace(CPU_AUDIO, rate_planned=True, growth_basis="chunk", growth=2.0)
    assert _simulate(planned, 1000.0, 300)[1] != _simulate(planned, 60.0, 300)[1]


def test_growth_basis_is_checked_and_kept_by_the_derived_schedules() -> None:
    with pytest.raises(ValueError, match="growth_basis"):
        ChunkSchedule(growth_basis="tokens").validate()
    assert CPU_AUDIO.with_lookahead(52).growth_basis == "audio"
    assert CPU_AUDIO.without_crossfade().growth_basis == "audio"


# ---- streams slower than real time (slow_growth) ----------------------------------------------

CPU_SLOW = replace(CPU_AUDIO, slow_growth=2.0)
"""The cpu profiles' schedule: growth 1.4 of the audio sent, chunks doubled for a slow stream."""


@pytest.mark.parametrize("rtf", [0.3, 0.6, 0.9])
def test_a_stream_faster_than_real_time_keeps_the_audio_growth(rtf: float) -> None:
    """Faster than real time, slow_growth changes nothing: the same windows as growth 1.4 of
    the audio sent (gapless up to RTF 0.71, seams set by the request alone)."""
    assert _windows(CPU_SLOW, rtf, 0.0005) == _windows(CPU_AUDIO, rtf, 0.0005)


@pytest.mark.parametrize("rtf", [1.2, 2.0, 4.0])
def test_a_stream_slower_than_real_time_doubles_its_chunks(rtf: float) -> None:
    """Slower than real time (c=16 on two cores: RTF about 4 per stream), chunks after the
    first double up to the cap, so 300 tokens take fewer windows and vocode fewer tokens than
    with growth 1.4 of the audio sent; the first window is the same (TTFA), and the stream
    still equals the offline decode at full lookahead."""
    slow, audio = _windows(CPU_SLOW, rtf, 0.0005), _windows(CPU_AUDIO, rtf, 0.0005)
    sizes = [w.chunk_end - w.chunk_start for w in slow[:-1]]
    assert sizes == [min(64, 4 * 2 ** k) for k in range(len(sizes))], sizes
    assert slow[0] == audio[0]
    assert len(slow) < len(audio)
    assert sum(w.end - w.start for w in slow) < sum(w.end - w.start for w in audio)
    rate = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN / rtf
    _, _, stream, offline = _simulate(CPU_SLOW.with_lookahead(52), rate, 300)
    assert stream.size == offline.size
    np.testing.assert_allclose(stream, offline, atol=1e-6)


def test_slow_growth_follows_the_rate_chunk_by_chunk_and_is_checked() -> None:
    """Each chunk is sized by the rate measured so far (tokens since the first over the time
    since): fast at first (growth 1.4 of the audio sent), slow after a stall (doubling), fast
    again once the stream has made up for it (growth 1.4 again); the first chunk, with no rate
    yet, is not slow. slow_growth is 0 (off) or at least 1, and the derived schedules keep it."""
    clock = [0.0]
    ch = StreamChunker(replace(CPU_SLOW, max_chunk_tokens=1000), clock=lambda: clock[0])
    assert not ch.slower_than_real_time
    token_s = contract.SAMPLES_PER_TOKEN / contract.SAMPLE_RATE_HZ
    avail, n, chunks = 0, 800, []  # (boundary, size of the chunk before it, size of the chunk after it)
    while not ch.done:
        # token durations per token: 0.5 up to token 40, 2.0 up to 100, then 0.1 (fast again from ~150)
        avail = min(n, avail + 1)
        clock[0] += (0.5 if avail < 40 else 2.0 if avail < 100 else 0.1) * token_s
        while (w := ch.next_window(avail, avail == n)) is not None:
            before = ch.size
            ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
            chunks.append((ch.boundary, before, ch.size, ch.slower_than_real_time))
    by_audio = [b for b, _, size, slow in chunks if not slow and size == max(2, int(1.4 * b) - b)]
    doubled = [b for b, before, size, slow in chunks if slow and size == 2 * before]
    assert [b for b, *_ in chunks if b < 40] == [b for b in by_audio if b < 40], chunks
    assert doubled and all(40 <= b < 170 for b in doubled), chunks
    assert any(b > 170 for b in by_audio), chunks
    with pytest.raises(ValueError, match="slow_growth"):
        replace(CPU_AUDIO, slow_growth=0.5).validate()
    assert CPU_SLOW.with_lookahead(52).slow_growth == CPU_SLOW.without_crossfade().slow_growth == 2.0
    assert CPU_SLOW.with_carried_state().windowed().slow_growth == 2.0


# ---- when the engine answers: each window's ready point -----------------------------------

def _shipped_schedules() -> list[ChunkSchedule]:
    from chattts_serving.serving.profile import load_profile

    out = []
    for name in ("cpu", "cpu-fp32", "gpu"):
        s = load_profile(name).stream.schedule()
        out += [s, s.windowed(), s.windowed().without_crossfade(), s.with_lookahead(20)]
    return out


@pytest.mark.parametrize("n", [1, 9, 10, 40, 100, 300])
def test_ready_points_are_where_each_window_but_the_last_becomes_complete(n: int) -> None:
    """Fed one token at a time, a stream faster than real time hands out each window but the
    last exactly when the token count reaches the next ready point, for every shipped
    schedule (carried, windowed, without crossfade, another lookahead)."""
    for schedule in _shipped_schedules():
        ch = StreamChunker(replace(schedule, slow_growth=0.0))
        handed = []
        for avail in range(1, n + 1):
            while (w := ch.next_window(avail, avail == n)) is not None:
                if not w.final:
                    assert w.end == avail
                    handed.append(avail)
                ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
        assert list(ready_points(schedule, n, 64)) == handed, schedule


def test_ready_points_are_capped_and_only_the_first_is_known_for_rate_planned_chunks() -> None:
    s = _shipped_schedules()[0]
    every = ready_points(s, 2048, 64)
    assert len(every) > 30 and every[0] == s.tokens_before_first_chunk()
    assert all(b > a for a, b in itertools.pairwise(every)) and every[-1] <= 2048
    assert ready_points(s, 2048, 5) == every[:5]
    assert ready_points(replace(s, rate_planned=True), 2048, 64) == (s.tokens_before_first_chunk(),)


def _needed_buffer_with_points(schedule: ChunkSchedule, rtf: float, n: int, emit: int,
                               points: tuple[int, ...]) -> float:
    """The start buffer a stream needs (s) when the engine answers every ``emit`` tokens
    (counted from its last answer) and at ``points``, tokens generated at ``rtf`` on a fake
    clock and each window vocoded in 4 ms + 1.3 ms per token (the int8 vocoder at c=1)."""
    from bench.stats import needed_buffer_s

    per_token_s = rtf * contract.SAMPLES_PER_TOKEN / contract.SAMPLE_RATE_HZ
    answers, pending = [], 0
    for t in range(1, n + 1):
        pending += 1
        if t == n or pending >= emit or t in points:
            answers.append(t)
            pending = 0
    ch, clock, times, samples = StreamChunker(schedule, clock=lambda: 0.0), 0.0, [], []
    for avail in answers:
        clock = max(clock, avail * per_token_s)
        while (w := ch.next_window(avail, avail == n)) is not None:
            clock += 0.004 + 0.0013 * (w.end - w.start)
            out = ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
            if out.size:
                times.append(clock)
                samples.append(out.size)
    need = needed_buffer_s(times, samples)
    assert need is not None
    return need


@pytest.mark.parametrize("rtf", [0.5, 0.55, 0.6, 0.65])
def test_answering_at_every_ready_point_lowers_the_start_buffer(rtf: float) -> None:
    """Answered every 4 tokens and at the first window's need only, the cpu schedule's second
    window (ready at 15 tokens) waits for the 17th, later ones up to 3 tokens each, and the
    client needs a start buffer at every rate here. Answered at every ready point, each window
    is vocoded as soon as it can be: less is needed, none at RTF 0.55 and below (the same
    first chunk at the same time)."""
    s = replace(_shipped_schedules()[0], slow_growth=0.0, lookahead_step=0)
    n = 100
    points = ready_points(s, n, 64)
    first_only = _needed_buffer_with_points(s, rtf, n, 4, points[:1])
    every = _needed_buffer_with_points(s, rtf, n, 4, points)
    assert every < first_only, (every, first_only)  # simulated: 14.6 / 23.1 / 31.6 / 40.2 ms against 0 / 0 / 6.0 / 12.4
    if rtf <= 0.55:
        assert every == 0.0


def test_the_lookahead_grows_by_its_step_after_the_first_window() -> None:
    """The cpu schedule's windows: lookahead 4 for the first chunk, then 6, then 8 from the
    third on (its step of 2); without a step, 8 from the second on. A window's lookahead is
    what it vocodes past its chunk and the crossfade's edge."""
    edge = 1  # 512 / 2 samples of crossfade: one token
    for step, expected in ((2, [4, 6, 8, 8, 8]), (0, [4, 8, 8, 8, 8]), (1, [4, 5, 6, 7, 8]), (9, [4, 8, 8, 8, 8])):
        s = replace(_shipped_schedules()[0], slow_growth=0.0, lookahead_step=step)
        ch, got = StreamChunker(s), []
        for avail in range(1, 200):
            while (w := ch.next_window(avail, False)) is not None:
                got.append(w.end - w.chunk_end - edge)
                ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
        assert got[:5] == expected, (step, got[:5])
    with pytest.raises(ValueError, match="lookahead_step"):
        replace(_shipped_schedules()[0], lookahead_step=-1).validate()


@pytest.mark.parametrize("rtf", [0.6, 0.64, 0.68])
def test_a_lookahead_that_grows_lowers_the_start_buffer(rtf: float) -> None:
    """Answered at every ready point, the cpu schedule with its lookahead jumping from 4 to 8
    still needs a start buffer from RTF 0.6 (its second window waits for 15 tokens while 3.5
    tokens of audio play); growing 4, 6, 8 its second window needs 13 and less is needed at
    every rate, none below RTF 0.66, at the same first chunk."""
    n = 100
    step2 = replace(_shipped_schedules()[0], slow_growth=0.0)
    assert step2.lookahead_step == 2
    jump = replace(step2, lookahead_step=0)
    jumping = _needed_buffer_with_points(jump, rtf, n, 4, ready_points(jump, n, 64))
    growing = _needed_buffer_with_points(step2, rtf, n, 4, ready_points(step2, n, 64))
    assert growing < jumping, (growing, jumping)  # simulated: 0 / 0 / 4.8 ms against 6.0 / 11.2 / 16.3 ms
    if rtf < 0.66:
        assert growing == 0.0
