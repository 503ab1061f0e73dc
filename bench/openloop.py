"""Open-loop arrivals: requests arrive on their own clock, not when a client is free.

The closed-loop levels send identical jobs in synchronised waves; their latency p95 over p50
is close to 1 by construction. Here requests arrive as a Poisson process at a rate near the
capacity measured at concurrency 16, with mixed texts (the benchmark sentences, 10 to 50
characters) and mixed token budgets, each on its own thread: a slow request does not slow the
arrivals, so queueing shows in the tail. Tail figures are ratios of p95 over p50 of the time
to first audio and of the real-time factor (latency per second of audio: the budgets differ, so
plain latency would mostly show the spread of the budgets).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .serverload import Job, ServerSession, stream_request
from .stats import RequestRecord, fmt, ratio

LOAD_FACTOR = 0.8
"""Offered load over the measured capacity: near it, below it (at 1.0 the queue grows without bound)."""
BUDGET_SCALES = (0.5, 1.0, 1.5, 2.0)
"""Token budgets of the open-loop requests, as multiples of the benchmark's budget, drawn uniformly."""


def open_loop_plan(sentences: Sequence[str], n: int, tokens: int, rate_per_s: float,
                   seed: int = 0) -> list[tuple[float, Job]]:
    """``n`` (arrival offset s, job) pairs: exponential gaps of mean ``1 / rate_per_s`` s
    (the first request at 0), texts cycling through ``sentences`` from a random start, budgets
    ``scale x tokens`` (scale from :data:`BUDGET_SCALES`), seeds 50000 + i; reproducible for
    one ``seed``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, size=n)
    offsets = np.concatenate([[0.0], np.cumsum(gaps[1:])]) if n else np.zeros(0)
    scales = rng.choice(np.asarray(BUDGET_SCALES), size=n)
    first = int(rng.integers(len(sentences)))
    return [(float(offsets[i]), Job(i, sentences[(first + i) % len(sentences)], 50000 + i,
                                    max(1, round(float(scales[i]) * tokens)))) for i in range(n)]


def run_open_loop(url: str, plan: Sequence[tuple[float, Job]], *, voice: str,
                  timeout_s: float) -> tuple[list[RequestRecord], float]:
    """Send each job of ``plan`` at its offset (s from now) on its own thread. Returns (records
    in job order, wall seconds from the first send to the last end)."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one(offset: float, job: Job) -> None:
        time.sleep(max(0.0, t0 + offset - time.perf_counter()))
        rec = stream_request(url, job, voice, t0, timeout_s)
        with lock:
            records.append(rec)

    threads = [threading.Thread(target=one, args=(off, job), name=f"open-{job.index}", daemon=True)
               for off, job in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(records, key=lambda r: r.index), time.perf_counter() - t0


def tail_ratios(summary: dict[str, Any]) -> dict[str, float | None]:
    """ttfa_p95_over_p50 and rtf_p95_over_p50 of a :meth:`ServerSession.measure` summary."""
    return {"ttfa_p95_over_p50": ratio(summary.get("ttfa_p95_s"), summary.get("ttfa_p50_s")),
            "rtf_p95_over_p50": ratio(summary.get("rtf_p95"), summary.get("rtf_p50"))}


def measure_open_loop(session: ServerSession, *, requests: int, tokens: int,
                      capacity_tokens_per_s: float | None, load_factor: float = LOAD_FACTOR) -> dict[str, Any]:
    """The open-loop phase: ``requests`` Poisson arrivals at ``load_factor`` x the capacity
    (``capacity_tokens_per_s``, generated tokens per second at the top closed-loop level)
    divided by the mean budget. Returns rate_per_s, load_factor, capacity_tokens_per_s,
    budgets (distinct budgets, tokens), the :meth:`ServerSession.measure` keys and
    :func:`tail_ratios`; {"skipped": reason} without a capacity to aim at."""
    if not capacity_tokens_per_s or requests <= 0:
        return {"skipped": "no capacity measured (no successful closed-loop level)"}
    mean_budget = float(np.mean([round(s * tokens) for s in BUDGET_SCALES]))
    rate = load_factor * capacity_tokens_per_s / mean_budget
    plan = open_loop_plan(session.sentences, requests, tokens, rate)
    session.progress(f"server open loop: {requests} Poisson arrivals at {rate:.2f} requests/s "
                     f"({load_factor:g} x capacity), budgets {sorted({j.tokens for _, j in plan})} tokens")
    summary = session.measure(lambda: run_open_loop(session.grpc_url, plan, voice=session.voice,
                                                    timeout_s=session.timeout_s))
    out = {"rate_per_s": rate, "load_factor": load_factor, "capacity_tokens_per_s": capacity_tokens_per_s,
           "budgets": sorted({j.tokens for _, j in plan}), **summary, **tail_ratios(summary)}
    session.progress(f"server open loop: {summary['ok']}/{requests} ok, TTFA p95/p50 "
                     f"{fmt(out['ttfa_p95_over_p50'])}, RTF p95/p50 {fmt(out['rtf_p95_over_p50'])}")
    return out
