"""The pipeline's ceiling: the real stages in one process, no server.

A batch of sequences (the benchmark's texts, prompts from the real front end) is submitted to
the real GPT engine (:class:`~chattts_serving.engine.scheduler.Engine`, driven here with
``run_once``), and every stream's chunks are cut by the real chunk schedule
(:class:`~chattts_serving.audio.chunking.StreamChunker`) and vocoded by the real vocoder runner,
the ready windows of all streams batched into one call per window length, as the vocoder's
dynamic batcher does in the server. No Triton, no BLS, no gRPC, no front end inside the timed
part: what the server adds over this is what ``pipeline_efficiency_c16`` measures.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker, TokenWindow, ready_points
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.contract import VocoderPath
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.request import MAX_EMIT_POINTS
from chattts_serving.engine.scheduler import Engine
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts

from .cpuload import CpuWindow
from .stats import mean


def pipeline_prompts(artifacts_dir: Path, profile: Any, texts: Sequence[str],
                     voice: str) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(prompt ids (T,) int32, speaker vector (H,) float32 or None) of each text, from the real front
    end with ``profile``'s ``[frontend]`` settings (what the server's front end model sends)."""
    from chattts_serving.text.frontend import FrontEnd

    fp = profile.frontend
    fe = FrontEnd(Artifacts.load(artifacts_dir), fp.max_text_chars, fp.default_voice_seed, wetext=fp.wetext)
    return [(p.input_ids, p.spk_emb) for p in (fe.prepare(t, voice) for t in texts)]


class _Stream:
    """One sequence's sink and chunker."""

    def __init__(self, schedule: ChunkSchedule) -> None:
        self.sink = CollectingSink()
        self.chunker = StreamChunker(schedule)
        self.samples = 0

    def next_window(self) -> TokenWindow | None:
        if self.sink.errors:
            raise self.sink.errors[0]
        return self.chunker.next_window(self.sink.count, self.sink.reason is not None)

    def window_input(self, path: VocoderPath, w: TokenWindow) -> np.ndarray:
        rows = self.sink.all_hidden if path == VocoderPath.HIDDEN else self.sink.all_codes
        return rows[w.start:w.end]


def run_batch(engine: Engine, vocoder: VocoderRunner, schedule: ChunkSchedule,
              prompts: Sequence[tuple[np.ndarray, np.ndarray]], *, tokens: int, emit_tokens: int,
              seed: int = 0) -> dict[str, float | int]:
    """Generate ``tokens`` tokens (min = max) for every prompt at once and stream each through
    the chunk schedule and the batched vocoder. Returns wall_s, decode_s (engine iterations:
    prefill, decode steps, sampling), vocode_s (vocoder calls), decode_cpu_s and vocode_cpu_s
    (this process's CPU seconds, every thread, over the same spans), tokens (generated),
    tokens_per_s, vocoder_calls, windows and audio_s (seconds of audio emitted)."""
    path = VocoderPath(vocoder.path)
    streams = [_Stream(schedule) for _ in prompts]
    t0 = time.perf_counter()
    for i, ((ids, spk), st) in enumerate(zip(prompts, streams, strict=True)):
        params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, seed=seed + i)
        engine.submit(make_sequence(np.asarray(ids, np.int64), spk, params, st.sink, emit_tokens=emit_tokens,
                                    emit_at=ready_points(schedule, tokens, MAX_EMIT_POINTS),
                                    stream_id=f"minimal-{seed}-{i}"))
    decode_s = vocode_s = decode_cpu = vocode_cpu = 0.0
    calls = windows = 0
    while not all(st.chunker.done for st in streams):
        if not all(st.sink.done for st in streams):
            t, c = time.perf_counter(), time.process_time()
            engine.run_once()
            decode_s += time.perf_counter() - t
            decode_cpu += time.process_time() - c
        while True:  # every window that is ready, one per stream per round, batched by length
            ready = [(st, w) for st in streams if (w := st.next_window()) is not None]
            if not ready:
                break
            t, c = time.perf_counter(), time.process_time()
            for length in sorted({w.end - w.start for _, w in ready}):
                group = [(st, w) for st, w in ready if w.end - w.start == length]
                audio = vocoder.run(np.stack([st.window_input(path, w) for st, w in group]))
                calls += 1
                for row, (st, w) in enumerate(group):
                    st.samples += st.chunker.emit(w, audio[row]).size
            vocode_s += time.perf_counter() - t
            vocode_cpu += time.process_time() - c
            windows += len(ready)
    wall = time.perf_counter() - t0
    generated = sum(st.sink.count for st in streams)
    return {"wall_s": wall, "decode_s": decode_s, "vocode_s": vocode_s, "decode_cpu_s": decode_cpu,
            "vocode_cpu_s": vocode_cpu, "tokens": generated,
            "tokens_per_s": generated / wall if wall > 0 else 0.0, "vocoder_calls": calls, "windows": windows,
            "audio_s": sum(st.samples for st in streams) / contract.SAMPLE_RATE_HZ}


def measure_pipeline(artifacts_dir: Path, profile: Any, prompts: Sequence[tuple[np.ndarray, np.ndarray]], *,
                     tokens: int, repeats: int) -> dict[str, Any]:
    """The minimal pipeline with ``profile``'s engine, vocoder and stream settings, over all
    ``prompts`` at once (one batch: use as many as the server level it is compared with),
    ``repeats`` times after one untimed run. Its stages run one after the other, so the
    vocoder gets as many threads as the engine when the profile gives it fewer (in the server
    it shares the cores with the running step; here it would leave one idle).

    Returns batch, tokens (budget per sequence), vocoder (path), vocoder_threads, repeats, runs
    (each :func:`run_batch`'s keys plus ``cpu``, the
    :class:`~bench.cpuload.CpuWindow` of that run) and the medians over the
    runs: tokens_per_s, decode_s, vocode_s, decode_cpu_s, vocode_cpu_s, wall_s;
    other_cpu_percent (mean over the runs: load from outside the benchmark)."""
    art = Artifacts.load(artifacts_dir)
    engine = Engine(GptStepRunner(art, profile.ort("engine")), Embeddings(art), profile.engine.engine_config())
    engine.warm_up()
    vocoder_opts, engine_threads = profile.ort("vocoder"), profile.ort("engine").intra_op_threads
    fewer = vocoder_opts.intra_op_threads and (not engine_threads or vocoder_opts.intra_op_threads < engine_threads)
    if fewer:  # 0 threads: ORT's default, every core
        vocoder_opts = replace(vocoder_opts, intra_op_threads=engine_threads)
    vocoder = VocoderRunner(art, profile.stream.default_vocoder, vocoder_opts)
    vocoder.warm_up(art.hidden_size)
    schedule = profile.stream.schedule().windowed()  # its vocoder decodes each window alone
    emit = profile.stream.emit_tokens
    run_batch(engine, vocoder, schedule, prompts, tokens=min(tokens, 16), emit_tokens=emit, seed=10**6)
    runs: list[dict[str, Any]] = []
    for r in range(repeats):
        window = CpuWindow()
        stats: dict[str, Any] = dict(run_batch(engine, vocoder, schedule, prompts, tokens=tokens, emit_tokens=emit,
                                               seed=1000 * r))
        stats["cpu"] = window.stop()
        runs.append(stats)

    def med(key: str) -> float | None:
        return float(np.median([r[key] for r in runs])) if runs else None

    return {"batch": len(prompts), "tokens": tokens, "vocoder": str(profile.stream.default_vocoder),
            "vocoder_threads": vocoder_opts.intra_op_threads, "repeats": repeats, "runs": runs,
            "tokens_per_s": med("tokens_per_s"), "decode_s": med("decode_s"),
            "vocode_s": med("vocode_s"), "decode_cpu_s": med("decode_cpu_s"), "vocode_cpu_s": med("vocode_cpu_s"),
            "wall_s": med("wall_s"),
            "other_cpu_percent": mean([r["cpu"]["other_cpu_percent"] or 0.0 for r in runs])}
