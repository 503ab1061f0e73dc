"""The hardware ceiling: the exported GPT decode step alone in ONNX Runtime, no server.

One decode step of batch B over a past of P positions yields B tokens; tokens/s = B / step
time: what the GPT alone could do, before sampling, chunking and vocoding (the minimal
pipeline, :mod:`bench.minimal`, adds those).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.engine.kernels import choose_kernels
from chattts_serving.runtime import Artifacts, OrtOptions


def measure_raw_step(artifacts_dir: Path, opts: OrtOptions, batches: Sequence[int], *, past_tokens: int,
                     repeats: int, rounds: int = 3, warmup: int = 3, seed: int = 0) -> dict[str, object]:
    """Median wall time of one decode step (T = 1) per batch size, on random inputs.

    Inputs: embeddings (B, 1, H) float32 and a KV cache of B rows holding a random past of
    ``past_tokens`` positions each in the graph's KV dtype, run as the engine runs it
    (:meth:`GptStepRunner.decode`, the cache bound in place). Each
    of ``rounds`` rounds times ``repeats`` steps per batch size (after ``warmup`` untimed ones);
    the figure is the median of the rounds' medians. Returns {"past_tokens",
    "intra_op_threads", "allow_spinning", "precision", "repeats", "rounds", "batches": {str(B):
    {"step_ms_p50", "step_ms_min", "tokens_per_s", "round_step_ms_p50": [per round]}}, "kernel",
    "attention"}
    (tokens_per_s = B / median step seconds; kernel: the int8 kernel the start-up probe chose,
    :meth:`~chattts_serving.engine.kernels.KernelChoice.as_dict`, None for an fp32 or fp16 graph;
    attention: the attention over an int8 cache it chose, None for another cache).
    """
    art = Artifacts.load(artifacts_dir)
    runner = GptStepRunner(art, opts)
    kernel, attention = choose_kernels(runner)  # the kernels the engine would choose on this host
    rng = np.random.default_rng(seed)
    per_round: dict[int, list[list[float]]] = {b: [] for b in batches}
    for _ in range(rounds):
        for b in batches:
            per_round[b].append(time_steps(runner, b, past_tokens, repeats, warmup, rng))
    out: dict[str, dict[str, object]] = {}
    for b, rounds_times in per_round.items():
        medians = [float(np.median(t)) for t in rounds_times]
        med = float(np.median(medians))
        out[str(b)] = {"step_ms_p50": med * 1e3, "step_ms_min": float(min(min(t) for t in rounds_times)) * 1e3,
                       "tokens_per_s": b / med, "round_step_ms_p50": [m * 1e3 for m in medians]}
    return {"past_tokens": past_tokens, "intra_op_threads": opts.intra_op_threads,
            "allow_spinning": opts.allow_spinning, "precision": str(opts.precision), "repeats": repeats,
            "rounds": rounds, "batches": out, "kernel": kernel.as_dict() if kernel is not None else None,
            "attention": attention.as_dict() if attention is not None else None}


def time_steps(runner: GptStepRunner, batch: int, past_tokens: int, repeats: int, warmup: int = 3,
               rng: np.random.Generator | None = None) -> list[float]:
    """Wall times in s of ``repeats`` decode steps (after ``warmup`` untimed ones) of batch
    ``batch`` over a random past of ``past_tokens`` positions, held where and as the engine
    holds it (the runner's array backend and KV dtype; IO binding when its options ask)."""
    art = runner.art
    rng = np.random.default_rng(0) if rng is None else rng
    embeds = rng.standard_normal((batch, 1, art.hidden_size), dtype=np.float32)
    cache = runner.new_cache(batch, past_tokens + 1)
    for buf in cache.buffers:
        buf[...] = cache.backend.to_device(rng.standard_normal(buf.shape, dtype=np.float32).astype(runner.kv_dtype))
    lengths = np.full(batch, past_tokens, np.int64)
    for _ in range(warmup):
        runner.decode(embeds, cache, lengths)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        runner.decode(embeds, cache, lengths)  # writes column past_tokens in place each time
        times.append(time.perf_counter() - t)
    return times
