"""The vocoder graphs in ONNX Runtime, free of Triton: windows through the offline graphs
(:class:`VocoderRunner`), or streams through the stateful graphs (:class:`StreamingVocoderRunner`,
one :class:`VocoderStream` per stream)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import contract
from ..contract import Precision, VocoderPath
from ..int8_kernel import EXPORTED, fastest_session
from ..runtime import Artifacts, OrtOptions, graph_path, make_session, resolve_precision

PROBE_TOKENS = 26
"""Tokens in the window that times an int8 vocoder's kernels at start-up (a mid-stream chunk
with its lookahead)."""


def _probe_window(path: VocoderPath, hidden_size: int, tokens: int) -> np.ndarray:
    """A window (T, H) float32 of random hidden states or (T, 4) int32 of codes (all 0) of ``path``."""
    if path is VocoderPath.HIDDEN:
        return np.random.default_rng(0).standard_normal((tokens, hidden_size), dtype=np.float32)
    return np.zeros((tokens, contract.NUM_VQ), np.int32)


def _path_names(path: VocoderPath | str) -> tuple[VocoderPath, str, str]:
    """(the path, its offline graph's ``contract.*_GRAPH`` name, that graph's input name) of a
    vocoder path or its value. Raises ValueError for another path."""
    try:
        vp = VocoderPath(path)
    except ValueError:
        raise ValueError(f"unknown vocoder path {path!r}; expected one of "
                         f"{sorted(p.value for p in contract.VOCODER_PATHS)}") from None
    if vp is VocoderPath.HIDDEN:
        return vp, contract.VOCODER_HIDDEN_GRAPH, contract.VO_HIDDEN.name
    return vp, contract.VOCODER_CODES_GRAPH, contract.VO_CODES.name


class VocoderRunner:
    """Runs one vocoder graph: windows (B, T, H) float32 or (B, T, 4) int32 -> audio
    (B, 512T-256) float32 (fp32 IO also for the fp16 and int8 variants, ``opts.precision``).
    ``path``: a :class:`~chattts_serving.contract.VocoderPath` or its value (a profile's or a
    model parameter's string). Raises ValueError for another path, FileNotFoundError when that
    variant was not exported (:func:`graph_path`)."""

    def __init__(self, artifacts: Artifacts, path: VocoderPath | str, opts: OrtOptions = OrtOptions()) -> None:
        self.path, self.source, self.input_name = _path_names(path)
        """The path; its graph's ``contract.*_GRAPH`` name (the fp32 file); the graph's input."""
        self.graph = graph_path(artifacts, self.source, opts.precision)
        """The graph file this runner runs (its precision's variant; ``auto`` resolved)."""
        self.kernel = EXPORTED
        """The int8 kernel it runs on (:func:`~chattts_serving.int8_kernel.fastest_session`)."""
        if resolve_precision(artifacts, opts.precision, self.source) is Precision.INT8:
            window = _probe_window(self.path, artifacts.hidden_size, PROBE_TOKENS)[None]
            self.session, self.kernel, _ = fastest_session(
                self.graph, opts, lambda s: s.run(["audio"], {self.input_name: window}))
        else:
            self.session = make_session(self.graph, opts)

    def warm_up(self, hidden_size: int, lengths: tuple[int, ...] = (17, 48, 96)) -> None:
        """Decode one window of each length before serving (first-run allocations)."""
        for n in lengths:
            shape = (1, n, hidden_size) if self.path is VocoderPath.HIDDEN else (1, n, contract.NUM_VQ)
            self.run(np.zeros(shape, np.float32 if self.path is VocoderPath.HIDDEN else np.int32))

    def run(self, windows: np.ndarray) -> np.ndarray:
        """Audio (B, 512T-256) float32 of windows (B, T, H) float32 (hidden path) or
        (B, T, 4) int32 codes (codes path), cast to that dtype."""
        dtype = np.float32 if self.path is VocoderPath.HIDDEN else np.int32
        return self.session.run(["audio"], {self.input_name: np.ascontiguousarray(windows, dtype=dtype)})[0]


class StreamingVocoderRunner:
    """Runs the stateful graph of one vocoder path (chattts_serving/export/streaming.py): one
    :class:`VocoderStream` per stream carries the convolutions' state from call to call, so a
    call vocodes only the tokens after the last commit (its chunk and its lookahead) instead of a
    window with left context and crossfade edges. Same ``path`` and ``opts`` as
    :class:`VocoderRunner`; the graph's precision is the one ``opts.precision`` resolves to for
    that path's offline graph. Raises ValueError for an unknown path, FileNotFoundError when the
    artifacts have no stateful graph in that precision (re-export: ``chattts-export``)."""

    def __init__(self, artifacts: Artifacts, path: VocoderPath | str, opts: OrtOptions = OrtOptions()) -> None:
        self.path, self.source, self.input_name = _path_names(path)
        self.dtype = np.float32 if self.path is VocoderPath.HIDDEN else np.int32
        stream_file = contract.VOCODER_STREAM_GRAPHS[self.source]
        entry = artifacts.manifest.get("streaming_vocoders", {}).get(stream_file)
        if not entry:
            raise FileNotFoundError(f"{artifacts.root} has no stateful vocoder graph {stream_file}: "
                                    "re-export with `chattts-export`")
        self.precision = resolve_precision(artifacts, opts.precision, self.source)
        variants = {Precision.FP32: stream_file, **{Precision(k): v for k, v in entry.get("variants", {}).items()}}
        if self.precision not in variants or not (artifacts.root / variants[self.precision]).is_file():
            raise FileNotFoundError(f"{artifacts.root} has no {self.precision} stateful vocoder graph for "
                                    f"{self.source}: re-export with `chattts-export ... --precision {self.precision}`")
        self.graph = artifacts.root / variants[self.precision]
        """The graph file this runner runs."""
        self.caches: tuple[tuple[int, int], ...] = tuple((int(c), int(r)) for c, r in entry["caches"])
        """(channels, radius in mel frames) of each convolution's cache, in the graph's input order."""
        self.spec_bins = int(entry["spec_bins"])
        self.spec_frames = int(entry["spec_cache_frames"])
        self.hop = int(entry["hop"])
        n_fft = int(entry["n_fft"])
        if n_fft % self.hop or self.hop * contract.MEL_FRAMES_PER_TOKEN != contract.SAMPLES_PER_TOKEN:
            raise ValueError(f"unsupported iSTFT: n_fft {n_fft}, hop {self.hop}")
        window = np.hanning(n_fft + 1)[:-1]  # periodic Hann, torch.hann_window's
        self.win_sq_blocks = (window ** 2).astype(np.float32).reshape(n_fft // self.hop, self.hop)
        """The squared window in hop-sized blocks: the iSTFT's envelope is their overlap-add."""
        self.kernel = EXPORTED
        """The int8 kernel it runs on (:func:`~chattts_serving.int8_kernel.fastest_session`)."""
        if self.precision is Precision.INT8:
            probe = _probe_window(self.path, artifacts.hidden_size, PROBE_TOKENS)

            def one_stream(session: Any) -> None:
                self.session = session
                self.open().vocode(probe, 0, final=True)

            self.session, self.kernel, _ = fastest_session(self.graph, opts, one_stream)
        else:
            self.session = make_session(self.graph, opts)

    def open(self) -> VocoderStream:
        """A fresh stream's state (nothing committed)."""
        return VocoderStream(self)

    def warm_up(self, hidden_size: int, lengths: tuple[int, ...] = (8, 12, 40)) -> None:
        """Vocode one final call of each length before serving (first-run allocations)."""
        for n in lengths:
            shape = (n, hidden_size) if self.path is VocoderPath.HIDDEN else (n, contract.NUM_VQ)
            self.open().vocode(np.zeros(shape, self.dtype), 0, final=True)

    def envelope(self, first_frame: int, frames: int) -> np.ndarray:
        """The iSTFT's window envelope (float32, ``hop * (frames + n_fft/hop - 1)`` samples) over
        the overlap-add of ``frames`` frames starting at global frame ``first_frame``: frames
        before the stream's start (negative) add nothing, as in the offline decode."""
        q = self.win_sq_blocks.shape[0]
        valid = (np.arange(first_frame, first_frame + frames) >= 0).astype(np.float32)
        env = np.zeros((frames + q - 1, self.hop), np.float32)
        for i in range(q):
            env[i:i + frames] += valid[:, None] * self.win_sq_blocks[i]
        return env.reshape(-1)


class VocoderStream:
    """One stream's state on a :class:`StreamingVocoderRunner`: the tokens committed so far, the
    convolutions' caches and the last spectra. Not thread-safe; one stream's calls in order."""

    def __init__(self, runner: StreamingVocoderRunner) -> None:
        self.runner = runner
        self.committed = 0
        """Tokens committed: the next call's window starts here."""
        self.done = False
        self._caches = [np.zeros((1, c, r), np.float32) for c, r in runner.caches]
        self._spec = np.zeros((1, runner.spec_bins, runner.spec_frames), np.float32)

    def nbytes(self) -> int:
        """Bytes of state this stream holds."""
        return int(self._spec.nbytes + sum(c.nbytes for c in self._caches))

    def vocode(self, tokens: np.ndarray, start: int, final: bool, carry_from: int | None = None) -> np.ndarray:
        """Audio (float32, 1-D) of the window ``tokens`` ((T, H) hidden or (T, 4) codes) of the
        tokens ``[start, start + T)``, as far as it is complete: global samples ``512 * start`` to
        ``512 * (start + T - 1)`` (the last token's samples need the next token), to the
        utterance's last sample (``contract.samples_for_tokens``) for a ``final`` call, which
        ends the stream. ``start`` must be where the call before committed (0 first); the call
        commits at token ``carry_from`` (``start <= carry_from < start + T``): the next window
        starts there, and the tokens after it are vocoded again, with their successors.

        A sample is computed from the carried state and this window's tokens, zero after the
        window (a final call's end pads as the offline decode does): at a lookahead of the
        receptive field the same as the offline decode's. Raises ValueError for a call out of
        order or a commit outside the window, and once the stream has ended."""
        if self.done:
            raise ValueError("this vocoder stream has ended")
        t = int(tokens.shape[0])
        end = start + t
        if start != self.committed:
            raise ValueError(f"window starts at token {start}, the stream has committed {self.committed}")
        if not final and (carry_from is None or not start <= carry_from < end):
            raise ValueError(f"a window [{start}, {end}) must commit a token inside it, not {carry_from}")
        r = self.runner
        fpt = contract.MEL_FRAMES_PER_TOKEN
        commit = 0 if final or carry_from is None else fpt * (carry_from - start)  # nothing is carried after the end
        feeds = {r.input_name: np.ascontiguousarray(tokens[None], dtype=r.dtype),
                 "commit": np.array([commit], np.int64),
                 "spec_cache": self._spec, **{f"cache_{i}": c for i, c in enumerate(self._caches)}}
        outs = r.session.run(None, feeds)
        raw, self._spec, self._caches = outs[0][0], outs[1], list(outs[2:])
        first_frame = fpt * start - r.spec_frames  # the raw samples start at hop * first_frame
        env = r.envelope(first_frame, fpt * t + r.spec_frames)
        half = contract.N_FFT // 2  # the iSTFT's centring
        lo = contract.SAMPLES_PER_TOKEN * start + half - r.hop * first_frame
        stop = contract.samples_for_tokens(end) if final else contract.SAMPLES_PER_TOKEN * (end - 1)
        hi = stop + half - r.hop * first_frame
        self.committed = end if final or carry_from is None else carry_from
        self.done = final
        return raw[lo:hi] / env[lo:hi]


class CarriedStreams:
    """The vocoder model's carried streams: one :class:`VocoderStream` per stream id, created by
    its first window (start 0), freed by its final window, by a release (the entry's stream was
    cancelled or failed), or after ``idle_s`` without a window (an entry that died mid-stream;
    checked at each call, on the injected ``clock``). At most ``max_streams`` at once: a new one
    beyond it is refused. Not thread-safe (the model's execute calls it)."""

    def __init__(self, runner: StreamingVocoderRunner, max_streams: int, idle_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runner, self.max_streams, self.idle_s, self.clock = runner, max_streams, idle_s, clock
        self._streams: dict[str, tuple[VocoderStream, float]] = {}
        self.vocoded_tokens = 0
        """Tokens vocoded so far (window lengths summed)."""

    def __len__(self) -> int:
        return len(self._streams)

    def nbytes(self) -> int:
        """Bytes of state held by the live streams."""
        return sum(s.nbytes() for s, _ in self._streams.values())

    def vocode(self, stream_id: str, tokens: np.ndarray, start: int, carry_from: int, action: int) -> np.ndarray:
        """The stream's window ``tokens`` (from token ``start``; :meth:`VocoderStream.vocode`),
        committing ``carry_from``; ``action`` one of ``contract.STREAM_*``. Raises ValueError
        for an unknown action, a window of a stream that does not exist and does not start at
        0, a first window while ``max_streams`` are live, and what :meth:`VocoderStream.vocode`
        refuses (the stream is then freed: its state no longer follows the audio sent)."""
        now = self.clock()
        self._evict(now)
        if action == contract.STREAM_RELEASE:
            self._streams.pop(stream_id, None)
            return np.zeros(0, np.float32)
        if action not in (contract.STREAM_CONTINUE, contract.STREAM_FINAL):
            raise ValueError(f"unknown stream action {action}")
        entry = self._streams.get(stream_id)
        if entry is None:
            if start != 0:
                raise ValueError(f"vocoder stream {stream_id!r} is not open (its window starts at token {start})")
            if len(self._streams) >= self.max_streams:
                raise ValueError(f"{self.max_streams} vocoder streams are open already")
            stream = self.runner.open()
        else:
            stream = entry[0]
        final = action == contract.STREAM_FINAL
        try:
            audio = stream.vocode(tokens, start, final, None if final else carry_from)
        except ValueError:
            self._streams.pop(stream_id, None)
            raise
        self.vocoded_tokens += int(tokens.shape[0])
        if final:
            self._streams.pop(stream_id, None)
        else:
            self._streams[stream_id] = (stream, now)
        return audio

    def _evict(self, now: float) -> None:
        for sid in [s for s, (_, seen) in self._streams.items() if now - seen > self.idle_s]:
            del self._streams[sid]
