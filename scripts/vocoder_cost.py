"""Where the vocoder's CPU goes per generated token, and what a chunk schedule costs.

Usage: python scripts/vocoder_cost.py ARTIFACTS [--rounds 5] [--threads 2] [--tokens 300]
          [--precisions fp32,int8] [--out results/vocoder_cost.json]

1. Cost of one window by length and batch: each vocoder path (hidden: Decoder + Vocos;
   codes: DVAE + Vocos) in each precision (int8: ``chattts-export --precision int8``) on
   windows of 8 to 256 tokens at batch 1, 4 and 16 (ms per call, median of ``--rounds``;
   precisions, paths and lengths interleaved per round), fitted as
   ``fixed_ms + per_token_ms x tokens`` per batch size.
2. What a stream of ``--tokens`` tokens costs under a schedule: the windows the server's
   chunker asks for (context, lookahead and crossfade edges included) under doubling chunks,
   the cpu profile's own schedule and rate-planned chunks at a few token rates (a simulated
   stream on a fake clock), priced with the fitted model at batch 1:
   tokens vocoded per generated token (the context overhead) and ms per generated token.

Prints Markdown and writes JSON. Timings on a shared host are noisy: compare within a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.runtime import Artifacts, OrtOptions
from chattts_serving.serving.profile import load_profile

LENGTHS = (8, 16, 32, 64, 128, 256)
BATCHES = (1, 4, 16)


def window_costs(art: Artifacts, opts: OrtOptions, rounds: int,
                 precisions: tuple[str, ...] = ("fp32",)) -> dict[str, Any]:
    """ms per call by path, batch and window length, and the linear fit per path and batch;
    keyed "hidden"/"codes" for fp32 and "hidden/int8"-style for the other precisions."""
    rng = np.random.default_rng(0)
    runners = {(p if prec == "fp32" else f"{p}/{prec}"): VocoderRunner(art, p, replace(opts, precision=prec))
               for prec in precisions for p in ("hidden", "codes")}
    inputs = {"hidden": lambda b, t: rng.standard_normal((b, t, art.hidden_size), dtype=np.float32),
              "codes": lambda b, t: rng.integers(0, 625, (b, t, contract.NUM_VQ)).astype(np.int32)}
    times: dict[str, dict[int, dict[int, list[float]]]] = {
        p: {b: {t: [] for t in LENGTHS} for b in BATCHES} for p in runners}
    for r in runners.values():
        r.run(inputs[r.path.value](1, 16))
    for _ in range(rounds):
        for b in BATCHES:
            for t in LENGTHS:
                for p, r in runners.items():
                    x = inputs[r.path.value](b, t)
                    t0 = time.perf_counter()
                    r.run(x)
                    times[p][b][t].append((time.perf_counter() - t0) * 1e3)
    out: dict[str, Any] = {}
    for p in runners:
        out[p] = {}
        for b in BATCHES:
            med = {t: statistics.median(v) for t, v in times[p][b].items()}
            slope, intercept = np.polyfit(np.array(LENGTHS, float), np.array([med[t] for t in LENGTHS]), 1)
            out[p][str(b)] = {"ms_per_call": {str(t): round(v, 2) for t, v in med.items()},
                              "fixed_ms": round(float(intercept), 2),
                              "per_token_ms": round(float(slope) / b, 4),
                              "per_token_ms_per_call": round(float(slope), 4)}
    return out


def windows_for(schedule: ChunkSchedule, tokens: int, rate_hz: float, vocode_ms: Any) -> list[tuple[int, int]]:
    """The (start, end) windows the chunker asks for, tokens arriving 4 at a time at ``rate_hz``
    on a fake clock, each window taking ``vocode_ms(length)``."""
    clock = [0.0]
    ch = StreamChunker(schedule, clock=lambda: clock[0])
    avail, out = 0, []
    while not ch.done:
        arrived = min(tokens, int(clock[0] * rate_hz) // 4 * 4)
        if arrived <= avail:
            arrived = min(tokens, avail + 4)
            clock[0] = max(clock[0], arrived / rate_hz)
        avail = arrived
        while (w := ch.next_window(avail, avail == tokens)) is not None:
            clock[0] += vocode_ms(w.end - w.start) / 1e3
            ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32))
            out.append((w.start, w.end))
    return out


def schedule_costs(fit: dict[str, Any], tokens: int) -> dict[str, Any]:
    base = load_profile("cpu").stream.schedule()
    doubling = replace(base, growth=2.0, growth_basis="chunk", rate_planned=False)
    schedules = {"doubling": doubling, f"{base.growth_basis}_growth_{base.growth}": base,
                 "rate_planned": replace(doubling, rate_planned=True)}
    out: dict[str, Any] = {}
    for path in fit:
        f = fit[path]["1"]

        def cost(n: int, f: dict[str, Any] = f) -> float:
            return float(f["fixed_ms"] + f["per_token_ms"] * n)

        for rtf in (0.3, 0.5, 0.8):
            rate = contract.SAMPLE_RATE_HZ / contract.SAMPLES_PER_TOKEN / rtf
            for name, sched in schedules.items():
                ws = windows_for(sched, tokens, rate, cost)
                vocoded = sum(e - s for s, e in ws)
                out[f"{path}_rtf{rtf}_{name}"] = {
                    "windows": len(ws), "tokens_vocoded_per_token": round(vocoded / tokens, 3),
                    "ms_per_token": round(sum(cost(e - s) for s, e in ws) / tokens, 3),
                    "fixed_share": round(len(ws) * f["fixed_ms"] / sum(cost(e - s) for s, e in ws), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--precisions", default="fp32", help="comma-separated: fp32, int8 (interleaved per round)")
    ap.add_argument("--out", type=Path, default=Path("results/vocoder_cost.json"))
    args = ap.parse_args()
    art = Artifacts.load(args.artifacts)
    precisions = tuple(args.precisions.split(","))
    fit = window_costs(art, OrtOptions(args.threads, False), args.rounds, precisions)
    result = {"artifacts": str(args.artifacts), "rounds": args.rounds, "threads": args.threads,
              "precisions": list(precisions),
              "windows": fit, "schedules": schedule_costs(fit, args.tokens)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print("| path | batch | fixed ms / call | ms / token of window |\n|---|---|---|---|")
    for p, by_b in fit.items():
        for b, v in by_b.items():
            print(f"| {p} | {b} | {v['fixed_ms']} | {v['per_token_ms']} |")
    print("\n| schedule | windows | tokens vocoded / token | ms / token | fixed share |\n|---|---|---|---|---|")
    for k, v in result["schedules"].items():
        print(f"| {k} | {v['windows']} | {v['tokens_vocoded_per_token']} | {v['ms_per_token']} | {v['fixed_share']} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
