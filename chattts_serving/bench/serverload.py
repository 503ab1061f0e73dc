"""This system under load: closed-loop gRPC streaming clients against a running Triton server.

Each concurrency level c runs a fixed list of requests through c client threads (each takes
the next request as soon as its previous stream ends). Around each level the server's process
tree is sampled with psutil (CPU seconds per process, RSS) and Triton's metrics endpoint is
scraped (per-model counters, the GPT engine's batch-size histogram).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..client.common import ClientError, SynthesisRequest
from ..client.grpc_stream import synthesize_stream
from .cpuload import system_busy_s
from .stats import (
    MetricKey,
    RequestRecord,
    diff_samples,
    engine_batches,
    model_stats,
    parse_prometheus,
    summarize,
)


def _label(proc: psutil.Process) -> str:
    """'tritonserver', the model name of a Python backend stub, or the process name."""
    try:
        cmd = proc.cmdline()
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    if name.startswith("triton_python_backend_stub") or (cmd and "python_backend_stub" in cmd[0]):
        if len(cmd) > 1 and cmd[1].endswith("model.py"):
            return Path(cmd[1]).parent.parent.name
        return "python_stub"
    return name


@dataclass
class _Window:
    t0: float
    cpu: dict[int, float]
    client_cpu: float
    system_busy: float


class TreeMonitor:
    """CPU time and RSS of a process and all its descendants (the server tree).

    ``begin()`` opens a measurement window; ``end(window)`` returns CPU % over it (100 = one
    core busy), CPU seconds per label (model name for backend stubs), the peak and final RSS
    of the tree in MiB, the CPU % of this (client) process, of the whole machine, and of
    everything else (other_cpu_percent: load from outside the benchmark, which skews it). A background thread samples
    RSS every ``interval_s`` seconds.
    """

    def __init__(self, root_pid: int, interval_s: float = 0.25) -> None:
        self.root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self._procs: dict[int, psutil.Process] = {}
        self._labels: dict[int, str] = {}
        self._peak_rss = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="tree-monitor", daemon=True)
        self.me = psutil.Process()

    def start(self) -> TreeMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _tree(self) -> list[psutil.Process]:
        try:
            current = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        with self._lock:
            for p in current:
                if p.pid not in self._procs:
                    self._procs[p.pid] = p
                    self._labels[p.pid] = _label(p)
            return [self._procs[p.pid] for p in current]

    def rss_bytes(self) -> int:
        total = 0
        for p in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_info().rss
        return total

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self.rss_bytes()
            with self._lock:
                self._peak_rss = max(self._peak_rss, rss)

    def _cpu(self) -> dict[int, float]:
        out = {}
        for p in self._tree():
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return out

    def begin(self) -> _Window:
        with self._lock:
            self._peak_rss = 0
        t = self.me.cpu_times()
        return _Window(time.perf_counter(), self._cpu(), t.user + t.system, system_busy_s())

    def end(self, w: _Window) -> dict[str, object]:
        wall = time.perf_counter() - w.t0
        cpu = self._cpu()
        by_label: dict[str, float] = {}
        for pid, s in cpu.items():
            label = self._labels.get(pid, "?")
            by_label[label] = by_label.get(label, 0.0) + s - w.cpu.get(pid, 0.0)
        t = self.me.cpu_times()
        rss = self.rss_bytes()
        with self._lock:
            peak = max(self._peak_rss, rss)
        total = sum(by_label.values())
        ranked = sorted(by_label.items(), key=lambda kv: -kv[1])
        client = t.user + t.system - w.client_cpu
        system = system_busy_s() - w.system_busy

        def pct(cpu_s: float) -> float | None:
            return 100.0 * cpu_s / wall if wall > 0 else None

        return {"cpu_percent": pct(total), "cpu_s": total,
                "cpu_s_by_process": {k: round(v, 3) for k, v in ranked},
                "rss_mb": rss / 2**20, "rss_mb_peak": peak / 2**20, "client_cpu_percent": pct(client),
                "system_cpu_percent": pct(system), "other_cpu_percent": pct(max(0.0, system - total - client))}


def scrape(metrics_url: str, timeout_s: float = 5.0) -> dict[MetricKey, float]:
    """Parsed samples of Triton's ``/metrics`` at ``metrics_url``; {} if unreachable."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as r:
            return parse_prometheus(r.read().decode("utf-8", errors="replace"))
    except OSError:
        return {}


@dataclass(frozen=True)
class Job:
    """One request of a level: its index, text and sampler seed."""

    index: int
    text: str
    seed: int


class WarmupError(RuntimeError):
    """The server failed its first request: measuring it would only measure errors."""


def _one(url: str, job: Job, tokens: int, voice: str, level_t0: float, timeout_s: float) -> RequestRecord:
    req = SynthesisRequest(job.text, voice=voice, seed=job.seed, max_new_tokens=tokens, min_new_tokens=tokens)
    start = time.perf_counter()
    try:
        res = synthesize_stream(url, req, timeout_s=timeout_s)
    except ClientError as exc:
        return RequestRecord(job.index, job.text, start - level_t0, None, time.perf_counter() - start, 0.0, 0,
                             tokens, f"{exc.status}: {exc.message}")
    except Exception as exc:  # a benchmark reports failures; it does not die on them
        return RequestRecord(job.index, job.text, start - level_t0, None, time.perf_counter() - start, 0.0, 0,
                             tokens, f"{type(exc).__name__}: {exc}")
    ttfa = res.ttfa_s if res.chunks else None
    return RequestRecord(job.index, job.text, start - level_t0, ttfa, res.total_s, res.audio_s, res.chunks,
                         tokens)


def run_closed_loop(url: str, jobs: Sequence[Job], concurrency: int, *, tokens: int, voice: str,
                    timeout_s: float) -> tuple[list[RequestRecord], float]:
    """Run ``jobs`` through ``concurrency`` client threads, each streaming one request at a time
    over gRPC. Returns (records in job order, wall seconds from the first send to the last end)."""
    todo: queue.Queue[Job] = queue.Queue()
    for j in jobs:
        todo.put(j)
    records: list[RequestRecord] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def worker() -> None:
        while True:
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            rec = _one(url, job, tokens, voice, t0, timeout_s)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=worker, name=f"client-{i}", daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sorted(records, key=lambda r: r.index), wall


def run_levels(grpc_url: str, metrics_url: str, server_pid: int, sentences: Sequence[str], *,
               levels: Sequence[int], requests_for: Callable[[int], int], tokens: int, voice: str,
               timeout_s: float = 600.0,
               progress: Callable[[str], None] = lambda _m: None) -> list[dict[str, object]]:
    """Warm the server up, then run each concurrency level and measure it.

    Raises :class:`WarmupError` when the first warm-up request fails. Level c sends
    ``requests_for(c)`` requests (with fewer requests than c, only that many streams run at
    once: ``effective_concurrency``) (texts cycling through ``sentences``, seeds
    1000*c + i), each asking exactly ``tokens`` tokens. Returns one dict per level: concurrency,
    the :func:`~chattts_serving.bench.stats.summarize` keys, engine_tokens_per_s (tokens per
    wall second), engine (decode-step batch sizes from the metrics, or None), models (per-model
    Triton counters), the :class:`TreeMonitor` keys (cpu_percent, rss_mb, ...), errors (first
    few messages) and records (per request).
    """
    monitor = TreeMonitor(server_pid).start()
    try:
        # warm-up, unmeasured: one full request (lazy init of every stage), then a burst at the
        # highest level with a short budget (ORT allocations for the large batch shapes)
        first, _ = run_closed_loop(grpc_url, [Job(0, sentences[0], 0)], 1, tokens=tokens, voice=voice,
                                   timeout_s=timeout_s)
        if first[0].error:
            raise WarmupError(f"the server failed the warm-up request: {first[0].error}")
        top = max(levels)
        burst, _ = run_closed_loop(grpc_url, [Job(i, sentences[i % len(sentences)], i) for i in range(top)], top,
                                   tokens=min(tokens, 16), voice=voice, timeout_s=timeout_s)
        failed = [r.error for r in burst if r.error]
        if failed:
            progress(f"server: {len(failed)}/{top} warm-up burst requests failed, e.g. {failed[0]}")
        progress("server: warmed up")
        out = []
        for c in levels:
            n = requests_for(c)
            jobs = [Job(i, sentences[i % len(sentences)], 1000 * c + i) for i in range(n)]
            before = scrape(metrics_url)
            window = monitor.begin()
            records, wall = run_closed_loop(grpc_url, jobs, c, tokens=tokens, voice=voice,
                                            timeout_s=timeout_s)
            usage = monitor.end(window)
            delta = diff_samples(before, scrape(metrics_url))
            summary = summarize(records, wall)
            level: dict[str, object] = {
                "concurrency": c, "effective_concurrency": min(c, n), **summary,
                "engine_tokens_per_s": summary["tokens_per_s"],
                "engine": engine_batches(delta), "models": model_stats(delta), **usage,
                "errors": sorted({r.error for r in records if r.error})[:5],
                "records": [r.to_json() for r in records],
            }
            out.append(level)
            progress(f"server c={c}: {summary['ok']}/{n} ok in {wall:.1f} s, "
                     f"TTFA p50 {_fmt(summary['ttfa_p50_s'])} s, "
                     f"latency p50 {_fmt(summary['latency_p50_s'])} s, "
                     f"{_fmt(summary['audio_s_per_s'])} audio s/s")
        return out
    finally:
        monitor.stop()


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
