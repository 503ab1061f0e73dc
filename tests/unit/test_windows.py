"""The ensemble door's vocoder windows without a server (:mod:`chattts_serving.serving.windows`):
token batches in the engine's sizes, each window vocoded alone and cut where the engine says,
against the offline decode and against the chunker's own cut; info on the first and last."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.chunking import StreamChunker
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.contract import StopReason
from chattts_serving.errors import ErrorKind, RequestError
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile
from chattts_serving.serving.windows import EnsembleWindow, EnsembleWindowPlanner

HEADER = json.dumps({"request_id": "r1", "sample_rate_hz": contract.SAMPLE_RATE_HZ, "final": False})


@pytest.fixture(scope="module")
def voc(small_artifacts: Artifacts) -> VocoderRunner:
    return VocoderRunner(small_artifacts, "hidden")


def _feed(planner: EnsembleWindowPlanner, hidden: np.ndarray, emit: int,
          stop: StopReason = StopReason.MAX_TOKENS) -> list[EnsembleWindow]:
    """The engine's pattern: a batch every ``emit`` tokens and at each of the planner's
    ``emit_at`` points, the last with the stop reason."""
    n, out, sent = len(hidden), [], 0
    codes = np.zeros((n, contract.NUM_VQ), np.int32)
    points = set(planner.emit_at(n))
    for t in range(1, n + 1):
        if t == n or t - sent >= emit or t in points:
            out += planner.add(codes[sent:t], hidden[sent:t], stop if t == n else None)
            sent = t
    return out


def _cut(voc: VocoderRunner, windows: list[EnsembleWindow]) -> np.ndarray:
    parts = [voc.run(w.hidden[None])[0][w.keep_first:w.keep_first + w.keep_samples] for w in windows if len(w.hidden)]
    return np.concatenate(parts)


@pytest.mark.parametrize("n", [5, 40, 133])
def test_windows_at_full_lookahead_equal_the_offline_decode(small_artifacts: Artifacts, voc: VocoderRunner,
                                                            n: int) -> None:
    hidden = np.random.default_rng(n).standard_normal((n, small_artifacts.hidden_size)).astype(np.float32)
    rf = small_artifacts.receptive_field_tokens("hidden")
    planner = EnsembleWindowPlanner(load_profile("cpu").stream.schedule().with_lookahead(rf), HEADER,
                            small_artifacts.hidden_size)
    windows = _feed(planner, hidden, emit=4)
    assert [w.index for w in windows] == list(range(len(windows)))
    assert [w.final for w in windows] == [False] * (len(windows) - 1) + [True]
    got, offline = _cut(voc, windows), voc.run(hidden[None])[0]
    assert got.shape == offline.shape == (contract.samples_for_tokens(n),)
    assert np.abs(got - offline).max() <= 1e-4


def test_windows_follow_the_profile_schedule_cut_at_chunk_boundaries(small_artifacts: Artifacts,
                                                                     voc: VocoderRunner) -> None:
    """At the profile's default lookahead the windows are the chunk schedule's, each cut where
    the chunker (without crossfade) cuts it, in the engine's token batches."""
    n = 150
    hidden = np.random.default_rng(1).standard_normal((n, small_artifacts.hidden_size)).astype(np.float32)
    schedule = load_profile("cpu").stream.schedule()
    windows = _feed(EnsembleWindowPlanner(schedule, HEADER, small_artifacts.hidden_size), hidden, emit=4)
    chunker, expected, avail = StreamChunker(schedule.windowed().without_crossfade()), [], 0
    while not chunker.done:
        avail = min(n, avail + 1)
        while (w := chunker.next_window(avail, avail == n)) is not None:
            expected.append(chunker.emit(w, voc.run(hidden[None, w.start:w.end])[0]))
    assert len(windows) == len(expected)
    for win, e in zip(windows, expected, strict=True):
        np.testing.assert_allclose(voc.run(win.hidden[None])[0][win.keep_first:win.keep_first + win.keep_samples], e,
                                   atol=1e-5)
    assert windows[0].keep_samples == schedule.first_chunk_tokens * contract.SAMPLES_PER_TOKEN


def test_first_window_carries_the_header_and_the_last_the_final_info(small_artifacts: Artifacts) -> None:
    n = 60
    hidden = np.zeros((n, small_artifacts.hidden_size), np.float32)
    windows = _feed(EnsembleWindowPlanner(load_profile("cpu").stream.schedule(), HEADER, small_artifacts.hidden_size),
                    hidden, emit=4, stop=StopReason.MAX_TOKENS)
    assert json.loads(windows[0].info) == json.loads(HEADER)
    assert all(w.info == "" for w in windows[1:-1])
    final = json.loads(windows[-1].info)
    assert final["final"] is True and final["request_id"] == "r1"
    assert final["tokens"] == n and final["capped_segments"] == [0] and final["stop_reason"] == "max_new_tokens"
    assert final["audio_s"] == round(contract.samples_for_tokens(n) / contract.SAMPLE_RATE_HZ, 6)
    assert final["chunks"] == sum(1 for w in windows if w.keep_samples)


def test_no_tokens_is_an_error_and_a_cancel_makes_no_window(small_artifacts: Artifacts) -> None:
    h = small_artifacts.hidden_size
    empty = (np.zeros((0, 4), np.int32), np.zeros((0, h), np.float32))
    with pytest.raises(RequestError) as info:
        EnsembleWindowPlanner(load_profile("cpu").stream.schedule(), HEADER, h).add(*empty, StopReason.EOS)
    assert info.value.kind == ErrorKind.INTERNAL
    planner = EnsembleWindowPlanner(load_profile("cpu").stream.schedule(), HEADER, h)
    assert planner.add(*empty, StopReason.CANCELLED) == []
