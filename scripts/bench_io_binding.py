"""IO binding on or off (``[engine] io_binding``): the GPT step and the engine's decode loop.

Usage: python scripts/bench_io_binding.py ARTIFACTS [--batches 1,4,16] [--past 300] [--repeats 20]
          [--steps 40] [--precision fp32] [--providers CPUExecutionProvider] [--out results/x.json]

Two measurements, each with IO binding off and on, same session options (2 threads unless
--threads, spinning off), alternating off/on runs so that load from other processes hits both:

- raw step: one decode step (T = 1) of batch B over a past of P positions, the past as the
  engine holds it (a buffer with capacity for the new column), median of ``repeats`` calls;
- engine: B sequences admitted together, then ``steps`` decode steps of ``Engine.run_once``
  (sampling, streaming to a null sink, KV writes and growth included): median ms per step.

Prints a table and writes JSON. Medians; on a shared 2-core host expect +-20 % noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from chattts_serving.bench.rawstep import time_steps
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig, Sequence
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts, OrtOptions


class _Null:
    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: object) -> None:
        pass

    def error(self, exc: Exception) -> None:
        raise exc

    def cancelled(self) -> bool:
        return False


def raw_step_ms(runner: GptStepRunner, b: int, past: int, repeats: int) -> float:
    return statistics.median(time_steps(runner, b, past, repeats)) * 1e3


def engine_step_ms(runner: GptStepRunner, emb: Embeddings, b: int, steps: int) -> float:
    eng = Engine(runner, emb, EngineConfig(max_batch_size=b))
    rng = np.random.default_rng(1)
    for i in range(b):
        ids = rng.integers(200, 7000, 40)
        eng.submit(Sequence(ids, None, SamplingParams(seed=i, max_new_tokens=steps + 1, min_new_tokens=steps + 1),
                            _Null(), emit_tokens=4))
    eng.run_once()  # admission + prefill + the first decode step
    times = []
    for _ in range(steps - 1):
        t = time.perf_counter()
        eng.run_once()
        times.append(time.perf_counter() - t)
    while eng.live_count():
        eng.run_once()
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--past", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    ap.add_argument("--providers", default="CPUExecutionProvider")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    art = Artifacts.load(args.artifacts)
    emb = Embeddings(art)
    providers = tuple(args.providers.split(","))
    runners = {flag: GptStepRunner(art, OrtOptions(args.threads, False, providers, flag, args.precision))
               for flag in (False, True)}
    result: dict[str, object] = {"artifacts": str(args.artifacts), "past_tokens": args.past,
                                 "precision": args.precision, "providers": list(providers),
                                 "intra_op_threads": args.threads, "raw_step_ms": {}, "engine_step_ms": {}}
    for b in (int(x) for x in args.batches.split(",")):
        raw = {False: [], True: []}  # type: dict[bool, list[float]]
        eng = {False: [], True: []}  # type: dict[bool, list[float]]
        for _ in range(2):  # alternate off/on twice
            for flag in (False, True):
                raw[flag].append(raw_step_ms(runners[flag], b, args.past, args.repeats))
                eng[flag].append(engine_step_ms(runners[flag], emb, b, args.steps))
        result["raw_step_ms"][str(b)] = {"off": min(raw[False]), "on": min(raw[True])}  # type: ignore[index]
        result["engine_step_ms"][str(b)] = {"off": min(eng[False]), "on": min(eng[True])}  # type: ignore[index]
        print(f"B={b:3d}  raw step P={args.past}: off {min(raw[False]):7.2f} ms  on {min(raw[True]):7.2f} ms   "
              f"engine step: off {min(eng[False]):7.2f} ms  on {min(eng[True]):7.2f} ms", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
