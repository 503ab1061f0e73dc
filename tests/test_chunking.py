"""The chunk schedule, without a server: exact equality with the offline decode at full
receptive-field context, crossfaded seams at small lookahead, sizes and ends."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker
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
    offline decode is reported in the README (measured on the full-size model)."""
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
