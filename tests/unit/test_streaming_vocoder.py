"""The stateful vocoder graphs (chattts_serving/export/streaming.py) and their runner
(:class:`~chattts_serving.audio.vocoder.VocoderStream`) on the small generated checkpoint: a stream
carried from window to window against the offline decode of the whole utterance (exact at a
lookahead of the receptive field, bounded below it and no worse than the windowed mode), the
chunk schedule it runs on, its misuse refused, and the int8 variant."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker, vocoded_tokens
from chattts_serving.audio.vocoder import CarriedStreams, StreamingVocoderRunner, VocoderRunner
from chattts_serving.contract import VocoderPath
from chattts_serving.runtime import Artifacts, OrtOptions
from chattts_serving.serving.entry import EntryService
from chattts_serving.serving.profile import Profile, load_profile
from tests.support.inprocess import InProcessStages, RecordingChannel, RecordingObserver


def _input(art: Artifacts, path: VocoderPath, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if path is VocoderPath.HIDDEN:
        return rng.standard_normal((n, art.hidden_size)).astype(np.float32)
    return rng.integers(0, 625, (n, contract.NUM_VQ)).astype(np.int32)


def carried_stream(runner: StreamingVocoderRunner, x: np.ndarray, schedule: ChunkSchedule) -> tuple[np.ndarray, int]:
    """``x`` streamed through ``runner`` on ``schedule``'s carried windows, tokens arriving one
    at a time: (the concatenated chunks, tokens vocoded)."""
    n = len(x)
    chunker, stream, parts, avail, vocoded = StreamChunker(schedule.with_carried_state()), runner.open(), [], 0, 0
    while not chunker.done:
        avail = min(n, avail + 1)
        while (w := chunker.next_window(avail, avail == n)) is not None:
            assert w.start == stream.committed
            parts.append(chunker.emit(w, stream.vocode(x[w.start:w.end], w.start, w.final, chunker.carry_point(w))))
            vocoded += w.end - w.start
    assert stream.done
    return np.concatenate(parts), vocoded


def windowed_stream(runner: VocoderRunner, x: np.ndarray, schedule: ChunkSchedule) -> np.ndarray:
    """The same through the windowed mode (left context, lookahead, crossfade)."""
    n = len(x)
    chunker, parts, avail = StreamChunker(schedule), [], 0
    while not chunker.done:
        avail = min(n, avail + 1)
        while (w := chunker.next_window(avail, avail == n)) is not None:
            parts.append(chunker.emit(w, runner.run(x[None, w.start:w.end])[0]))
    return np.concatenate(parts)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - got) ** 2.0), 1e-30)))


@pytest.mark.parametrize("path", list(VocoderPath))
@pytest.mark.parametrize("n", [3, 9, 40, 133])
def test_full_lookahead_carried_stream_equals_the_offline_decode(small_artifacts: Artifacts, path: VocoderPath,
                                                                 n: int) -> None:
    x = _input(small_artifacts, path, n, n)
    rf = small_artifacts.receptive_field_tokens(path)
    schedule = load_profile("cpu").stream.schedule().windowed().with_lookahead(rf)
    got, vocoded = carried_stream(StreamingVocoderRunner(small_artifacts, path), x, schedule)
    offline = VocoderRunner(small_artifacts, path).run(x[None])[0]
    assert got.shape == offline.shape == (contract.samples_for_tokens(n),)
    assert np.abs(got - offline).max() <= 1e-5
    assert vocoded == vocoded_tokens(schedule.with_carried_state(), n)


@pytest.mark.parametrize("path", list(VocoderPath))
def test_profile_lookahead_is_bounded_and_no_worse_than_the_windowed_mode(small_artifacts: Artifacts,
                                                                          path: VocoderPath) -> None:
    """At the profile's lookahead (below the receptive field) the carried stream is not exact;
    its error against the offline decode is bounded, no larger than the windowed mode's, and it
    vocodes fewer tokens."""
    n = 150
    x = _input(small_artifacts, path, n, 7)
    schedule = load_profile("cpu").stream.schedule().windowed()
    assert schedule.lookahead_tokens < small_artifacts.receptive_field_tokens(path)
    offline = VocoderRunner(small_artifacts, path).run(x[None])[0]
    carried, vocoded = carried_stream(StreamingVocoderRunner(small_artifacts, path), x, schedule)
    windowed = windowed_stream(VocoderRunner(small_artifacts, path), x, schedule)
    assert carried.shape == windowed.shape == offline.shape
    assert np.abs(carried - offline).max() > 1e-6  # not exact: the lookahead guesses its right context
    assert snr_db(offline, carried) >= 30.0
    assert snr_db(offline, carried) >= snr_db(offline, windowed) - 1.0
    assert vocoded < vocoded_tokens(schedule, n)


def test_carried_schedule_keeps_the_chunks_and_the_first_chunk_comes_no_later() -> None:
    """The carried windows are the windowed mode's chunks without the left context: the same
    boundaries, each window starting one crossfade edge before its chunk, and the first window
    needs no more tokens than today's."""
    schedule = load_profile("cpu").stream.schedule().windowed()
    carried = schedule.with_carried_state()
    assert load_profile("cpu").stream.schedule() == carried  # the profile's knob: carry_vocoder_state
    assert not load_profile("gpu").stream.schedule().carried
    assert (carried.left_tokens, carried.crossfade_samples) == (0, schedule.crossfade_samples)
    assert carried.with_lookahead(40).left_tokens == 0
    assert carried.windowed() == schedule
    assert carried.tokens_before_first_chunk() == schedule.tokens_before_first_chunk()

    def windows(s: ChunkSchedule) -> list[tuple[int, int, int]]:
        ch, out, avail = StreamChunker(s), [], 0
        while not ch.done:
            avail = min(300, avail + 1)
            while (w := ch.next_window(avail, avail == 300)) is not None:
                out.append((w.start, w.chunk_start, w.chunk_end))
                ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
        return out

    got, before = windows(carried), windows(schedule)
    assert [w[1:] for w in got] == [w[1:] for w in before]
    assert [w[0] for w in got] == [max(0, b - 1) for _, b, _ in got]
    saved = sum(c - s for (c, _, _), (s, _, _) in zip(got, before, strict=True))
    assert vocoded_tokens(schedule, 300) - vocoded_tokens(carried, 300) == saved > 0


def test_a_stream_refuses_calls_out_of_order_and_after_its_end(small_artifacts: Artifacts) -> None:
    runner = StreamingVocoderRunner(small_artifacts, "hidden")
    x = _input(small_artifacts, VocoderPath.HIDDEN, 20, 3)
    stream = runner.open()
    assert stream.nbytes() > 0
    with pytest.raises(ValueError, match="starts at token 2"):
        stream.vocode(x[2:10], 2, False, 6)
    with pytest.raises(ValueError, match="must commit a token inside it"):
        stream.vocode(x[0:6], 0, False, 6)
    with pytest.raises(ValueError, match="must commit a token inside it"):
        stream.vocode(x[0:6], 0, False)
    assert stream.vocode(x[0:10], 0, False, 4).size == 9 * contract.SAMPLES_PER_TOKEN  # complete: all but the last
    assert stream.committed == 4
    assert stream.vocode(x[4:20], 4, True).size == contract.samples_for_tokens(20) - 4 * 512
    with pytest.raises(ValueError, match="has ended"):
        stream.vocode(x[4:20], 20, True)
    with pytest.raises(ValueError, match="unknown vocoder path"):
        StreamingVocoderRunner(small_artifacts, "mel")


def test_manifest_lists_the_stateful_graphs_with_their_parity(small_artifacts: Artifacts) -> None:
    section = small_artifacts.manifest["streaming_vocoders"]
    for name in contract.VOCODER_STREAM_GRAPHS.values():
        assert (small_artifacts.root / name).is_file()
        assert small_artifacts.manifest["files"][name]
        assert 0 <= section[name]["parity_max_abs_error"] <= 1e-5
        assert all(r > 0 for _, r in section[name]["caches"])


def test_int8_stateful_vocoder_streams_its_offline_int8_decode_within_int8_rounding(
        small_int8_artifacts: Artifacts) -> None:
    """The int8 stream graph (the int8 vocoders' quantization) at full lookahead against the int8
    offline graph: int8 rounding of activations that differ in the last bit, not a different
    computation."""
    art, path = small_int8_artifacts, VocoderPath.HIDDEN
    opts = OrtOptions(precision="int8")
    runner = StreamingVocoderRunner(art, path, opts)
    assert runner.graph.name == "vocoder_hidden.stream.int8.onnx"
    x = _input(art, path, 80, 5)
    got, _ = carried_stream(runner, x, load_profile("cpu").stream.schedule().windowed().with_lookahead(
        art.receptive_field_tokens(path)))
    offline = VocoderRunner(art, path, opts).run(x[None])[0]
    assert snr_db(offline, got) >= 40.0


# --- the vocoder model's registry and the BLS pipeline over it ------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_carried_streams_open_on_the_first_window_and_free_on_final_release_or_idle(
        small_artifacts: Artifacts) -> None:
    clock = _Clock()
    streams = CarriedStreams(StreamingVocoderRunner(small_artifacts, "hidden"), max_streams=2, idle_s=10.0,
                             clock=clock)
    x = _input(small_artifacts, VocoderPath.HIDDEN, 30, 11)
    with pytest.raises(ValueError, match="is not open"):
        streams.vocode("late", x[4:12], 4, 8, contract.STREAM_CONTINUE)
    assert streams.vocode("a", x[0:12], 0, 8, contract.STREAM_CONTINUE).size == 11 * contract.SAMPLES_PER_TOKEN
    streams.vocode("b", x[0:12], 0, 8, contract.STREAM_CONTINUE)
    assert len(streams) == 2 and streams.nbytes() > 0
    with pytest.raises(ValueError, match="2 vocoder streams are open"):
        streams.vocode("c", x[0:12], 0, 8, contract.STREAM_CONTINUE)
    with pytest.raises(ValueError, match="unknown stream action"):
        streams.vocode("a", x[8:20], 8, 12, 7)
    streams.vocode("a", x[8:30], 8, 30, contract.STREAM_FINAL)  # the last window frees it
    assert len(streams) == 1
    assert streams.vocode("b", x[0:0], 0, 0, contract.STREAM_RELEASE).size == 0  # a cancelled stream's release
    assert len(streams) == 0
    streams.vocode("d", x[0:12], 0, 8, contract.STREAM_CONTINUE)
    with pytest.raises(ValueError, match="starts at token 9"):  # out of order: refused, and the stream freed
        streams.vocode("d", x[9:20], 9, 12, contract.STREAM_CONTINUE)
    assert len(streams) == 0
    streams.vocode("e", x[0:12], 0, 8, contract.STREAM_CONTINUE)
    clock.t = 10.5  # an entry that died mid-stream: its state goes after idle_s
    streams.vocode("f", x[0:12], 0, 8, contract.STREAM_CONTINUE)
    assert len(streams) == 1
    assert streams.vocoded_tokens == 12 * 5 + 22  # refused and released windows vocode nothing


@pytest.fixture(scope="module")
def stages(small_artifacts: Artifacts) -> InProcessStages:
    return InProcessStages(small_artifacts)


def _stream(stages: InProcessStages, profile: Profile, channel: RecordingChannel, **values: object) -> None:
    service = EntryService(contract.MODEL_STREAM, profile, stages, RecordingObserver())
    tensors = {"text": np.array(["今天天气不错，我们去公园散步吧。".encode()], np.object_)}
    dtypes = {s.name: s.tensor().np_dtype for s in contract.SAMPLING_PARAMS}
    for name, v in values.items():
        tensors[name] = np.array([v], dtypes.get(name, np.int32))
    service.stream(service.admit(tensors, {}, uuid.uuid4().hex), channel)


def test_served_pipeline_carries_the_vocoder_state_and_equals_the_windowed_mode_at_full_lookahead(
        stages: InProcessStages, small_artifacts: Artifacts) -> None:
    """The BLS pipeline on the ``cpu`` profile (carried) against the same profile windowed, greedy,
    at a lookahead of the receptive field: the same audio, fewer tokens vocoded, no state left."""
    profile = load_profile("cpu")
    assert profile.stream.carry_vocoder_state
    windowed = profile.model_copy(update={"stream": profile.stream.model_copy(update={"carry_vocoder_state": False})})
    rf = small_artifacts.receptive_field_tokens("hidden")
    audio, vocoded = [], []
    for p in (profile, windowed):
        channel = RecordingChannel()
        before = stages.carried[VocoderPath.HIDDEN].vocoded_tokens
        _stream(stages, p, channel, top_k=1, max_new_tokens=60, min_new_tokens=60, lookahead_tokens=rf)
        assert [e[0] for e in channel.ends] == ["final"], channel.events
        audio.append(np.concatenate(channel.chunks))
        vocoded.append(stages.carried[VocoderPath.HIDDEN].vocoded_tokens - before)
    assert audio[0].shape == audio[1].shape
    assert np.abs(audio[0] - audio[1]).max() <= 1e-5
    assert vocoded[0] > 0 and vocoded[1] == 0  # the windowed run never touched the carried streams
    assert len(stages.carried[VocoderPath.HIDDEN]) == 0


def test_a_cancelled_stream_frees_its_vocoder_state(stages: InProcessStages) -> None:
    carried = stages.carried[VocoderPath.HIDDEN]
    channel = RecordingChannel(cancel_after_chunks=2)
    _stream(stages, load_profile("cpu"), channel, max_new_tokens=600, min_new_tokens=600)
    assert len(channel.chunks) >= 2 and [e[0] for e in channel.ends] != ["error"]
    assert len(carried) == 0
