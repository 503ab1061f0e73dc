"""Sampling and prefill cost per engine step: the partition top-p/top-k against the full sort it
replaced, and where a prefill's time goes.

Usage: python scripts/bench_sampling.py [ARTIFACTS] [--rounds 7] [--steps 200] [--threads 2]
          [--out results/sampling.json]

1. ``sample_batch`` of the code mode as the engine calls it once per decode step (B rows x 4
   heads x 626 logits, ChatTTS' default parameters: temperature 0.3, top_p 0.7, top_k 20,
   repetition penalty 1.05 over a full 16-step history), at B = 1, 4 and 16: today's form
   against the one before (a stable argsort of every row, the penalty one row at a time),
   interleaved within each round on the same logits; ms per step, median over rounds, and the
   ratio new / old.
2. With ARTIFACTS (an exported artifact directory, full size for figures that mean anything):
   the parts of one engine prefill of the benchmark's first sentences (B = 1 and 4, voice 2):
   building the prompt embeddings, the GPT graph's prefill call, copying each row's prompt KV
   into the batch and sampling the first token; ms, median over rounds.

Timings on a shared 2-core host are noisy: compare within a run (ratios), not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.engine.sampling import (
    RequestSampler,
    _draw,
    _penalised,
    _top_p_top_k,
    sample_batch,
    top_p_top_k_full_sort,
)
from chattts_serving.params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed

BATCHES = (1, 4, 16)


def sample_batch_before(logits: np.ndarray, samplers: list[RequestSampler]) -> np.ndarray:
    """The code mode's ``sample_batch`` before the partition form: the penalty row by row, a
    stable argsort of every row for top-p/top-k (the reference of the A/B)."""
    b, q4, n = logits.shape[0], contract.NUM_VQ, contract.NUM_AUDIO_TOKENS
    x = logits.reshape(b * q4, n).astype(np.float32, copy=True)
    x /= np.repeat(np.array([s.params.temperature for s in samplers], np.float32), q4)[:, None]
    for i, s in enumerate(samplers):
        if s.params.repetition_penalty == 1.0 or not s.history:
            continue
        hist = np.stack(s.history)
        for q in range(q4):
            x[i * q4 + q] = _penalised(x[i * q4 + q], hist[:, q], s.params.repetition_penalty, n)
    top_p_top_k_full_sort(x, np.repeat(np.array([s.params.top_p for s in samplers], np.float32), q4),
                          np.repeat(np.array([s.params.top_k for s in samplers]), q4))
    codes = _draw(x, np.concatenate([s.rng.random(q4) for s in samplers]))
    return codes.reshape(b, q4).astype(np.int64)


def _samplers(b: int, rng: np.random.Generator) -> list[RequestSampler]:
    out = []
    for i in range(b):
        s = RequestSampler(SamplingParams(seed=i))
        for _ in range(contract.REPETITION_WINDOW):
            s.record(rng.integers(0, contract.EOS_CODE, contract.NUM_VQ))
        out.append(s)
    return out


def _filtered(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], None], x: np.ndarray, top_p: np.ndarray,
              top_k: np.ndarray) -> None:
    fn(x.copy(), top_p, top_k)


def _time(fn: Callable[[], object], steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) / steps * 1e3


def measure_sampling(rounds: int, steps: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    per: dict[int, dict[str, list[float]]] = {b: {"new": [], "old": [], "filter_new": [], "filter_old": []}
                                              for b in BATCHES}
    data = {}
    for b in BATCHES:
        # logits at ChatTTS' temperature scale: a few strong codes over a wide tail
        logits = (rng.normal(0, 1.0, (b, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS)) * 2.0).astype(np.float32)
        x = logits.reshape(-1, contract.NUM_AUDIO_TOKENS) / np.float32(0.3)
        data[b] = (logits, _samplers(b, rng), _samplers(b, rng), x)
    for _ in range(rounds):
        for b in BATCHES:
            logits, s_new, s_old, x = data[b]
            tp, tk = np.full(len(x), 0.7, np.float32), np.full(len(x), 20)
            runs: dict[str, Callable[[], object]] = {
                "new": partial(sample_batch, logits, s_new), "old": partial(sample_batch_before, logits, s_old),
                "filter_new": partial(_filtered, _top_p_top_k, x, tp, tk),
                "filter_old": partial(_filtered, top_p_top_k_full_sort, x, tp, tk)}
            for name, fn in runs.items():
                per[b][name].append(_time(fn, steps))
    out: dict[str, Any] = {}
    for b in BATCHES:
        med = {k: statistics.median(v) for k, v in per[b].items()}
        ratios = [n / o for n, o in zip(per[b]["new"], per[b]["old"])]
        out[str(b)] = {"sample_batch_ms_new": round(med["new"], 4), "sample_batch_ms_old": round(med["old"], 4),
                       "ratio_new_over_old": round(statistics.median(ratios), 3),
                       "top_p_top_k_ms_new": round(med["filter_new"], 4),
                       "top_p_top_k_ms_old": round(med["filter_old"], 4)}
    return out


def measure_prefill(artifacts: Path, rounds: int, threads: int) -> dict[str, Any]:
    from bench import load_sentences
    from chattts_serving.engine.gpt import Embeddings, GptStepRunner
    from chattts_serving.engine.kvbatch import KvBatch
    from chattts_serving.runtime import Artifacts, OrtOptions
    from chattts_serving.text.frontend import FrontEnd

    art = Artifacts.load(artifacts)
    emb = Embeddings(art)
    runner = GptStepRunner(art, OrtOptions(threads, False))
    fe = FrontEnd(art, max_text_chars=4096, default_voice_seed=2)
    prompts = [fe.prepare(t, "2") for t in load_sentences()[:4]]
    out: dict[str, Any] = {}
    for b in (1, 4):
        parts: dict[str, list[float]] = {"embeds": [], "graph": [], "kv_join": [], "first_sample": []}
        batch: KvBatch[object] = KvBatch(runner.new_cache(16, 1024))
        for _ in range(rounds):
            for r in range(b):
                batch.leave(r)
            seqs = prompts[:b]
            t0 = time.perf_counter()
            width = max(len(p.input_ids) for p in seqs)
            embeds = np.zeros((b, width, art.hidden_size), np.float32)
            for i, p in enumerate(seqs):
                embeds[i, :len(p.input_ids)] = emb.prompt(p.input_ids.astype(np.int64), p.spk_emb)
            lengths = np.array([len(p.input_ids) for p in seqs])
            t1 = time.perf_counter()
            logits, _hidden, cache = runner.prefill(embeds, lengths)
            t2 = time.perf_counter()
            for i in range(b):
                batch.join(object(), cache, i, int(lengths[i]))
            t3 = time.perf_counter()
            sample_batch(logits, [RequestSampler(SamplingParams(seed=i)) for i in range(b)])
            t4 = time.perf_counter()
            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                parts[k].append(v * 1e3)
        out[str(b)] = {"prompt_tokens": [len(p.input_ids) for p in prompts[:b]],
                       **{f"{k}_ms": round(statistics.median(v), 3) for k, v in parts.items()}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path, nargs="?")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/sampling.json"))
    args = ap.parse_args()
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_start": list(os.getloadavg()),
                              "rounds": args.rounds, "steps_per_round": args.steps,
                              "sampling_per_step": measure_sampling(args.rounds, args.steps)}
    if args.artifacts is not None:
        result["artifacts"] = str(args.artifacts)
        result["prefill"] = measure_prefill(args.artifacts, args.rounds, args.threads)
    result["load_avg_end"] = list(os.getloadavg())
    print("| B | sample_batch ms old | new | new/old | top-p/top-k ms old | new |\n|---|---|---|---|---|---|")
    for b, r in result["sampling_per_step"].items():
        print(f"| {b} | {r['sample_batch_ms_old']:.3f} | {r['sample_batch_ms_new']:.3f} | {r['ratio_new_over_old']:.2f}"
              f" | {r['top_p_top_k_ms_old']:.3f} | {r['top_p_top_k_ms_new']:.3f} |")
    for b, r in result.get("prefill", {}).items():
        print(f"prefill B={b}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
