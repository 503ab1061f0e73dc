"""This system under load: gRPC streaming clients against a running Triton server.

Each closed-loop concurrency level c runs a fixed list of requests through c client threads
(each takes the next request as soon as its previous stream ends). Every request records each
chunk's arrival and the server's ``info`` (generated tokens, degraded mode, vocoder path).
Around each measured phase the server's process tree is sampled with psutil (CPU seconds per
process, RSS) and Triton's metrics endpoint is scraped (per-model counters, the GPT engine's
batch-size histogram).
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
from typing import Any

import psutil

from chattts_serving import contract
from chattts_serving.client.common import SynthesisRequest
from chattts_serving.client.grpc_stream import iter_parts

from .cpuload import system_busy_s
from .outcomes import classify_error
from .stats import (
    MetricKey,
    RequestRecord,
    diff_samples,
    engine_batches,
    fmt,
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
    of the tree in MiB, the CPU % of the client (this process and its children outside the
    server tree: a burst's held streams, a gateway), of the whole machine, and of
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

    def _client_cpu_s(self) -> float:
        """CPU seconds of the client: this process and its children outside the server tree
        (a burst's process of held streams, a gateway), those already reaped included."""
        t = self.me.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        server = {p.pid for p in self._tree()}
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in self.me.children(recursive=True):
                if child.pid not in server:
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                        c = child.cpu_times()
                        total += c.user + c.system
        return total

    def begin(self) -> _Window:
        with self._lock:
            self._peak_rss = 0
        return _Window(time.perf_counter(), self._cpu(), self._client_cpu_s(), system_busy_s())

    def end(self, w: _Window) -> dict[str, object]:
        wall = time.perf_counter() - w.t0
        cpu = self._cpu()
        by_label: dict[str, float] = {}
        for pid, s in cpu.items():
            label = self._labels.get(pid, "?")
            by_label[label] = by_label.get(label, 0.0) + s - w.cpu.get(pid, 0.0)
        rss = self.rss_bytes()
        with self._lock:
            peak = max(self._peak_rss, rss)
        total = sum(by_label.values())
        ranked = sorted(by_label.items(), key=lambda kv: -kv[1])
        client = self._client_cpu_s() - w.client_cpu
        system = system_busy_s() - w.system_busy

        def pct(cpu_s: float) -> float | None:
            return 100.0 * cpu_s / wall if wall > 0 else None

        return {"cpu_percent": pct(total), "cpu_s": total,
                "cpu_s_by_process": {k: round(v, 3) for k, v in ranked},
                "rss_mb": rss / 2**20, "rss_mb_peak": peak / 2**20, "client_cpu_percent": pct(client),
                "system_cpu_percent": pct(system), "other_cpu_percent": pct(max(0.0, system - total - client))}


def scrape(metrics_url: str, timeout_s: float = 5.0) -> dict[MetricKey, float]:
    """Parsed samples of Triton's ``/metrics`` at ``metrics_url``; {} if unreachable. Raises
    ValueError when the answer is not a Prometheus text exposition."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as r:
            return parse_prometheus(r.read().decode("utf-8", errors="replace"))
    except OSError:
        return {}


@dataclass(frozen=True)
class Job:
    """One request of a phase: its index, text, sampler seed and token budget (min = max new
    tokens)."""

    index: int
    text: str
    seed: int
    tokens: int


class WarmupError(RuntimeError):
    """The server failed its first request: measuring it would only measure errors."""


def stream_request(url: str, job: Job, voice: str, phase_t0: float, timeout_s: float,
                   model: str = contract.MODEL_STREAM) -> RequestRecord:
    """Stream ``job`` to the entry model ``model`` (``chattts``, or ``chattts_ensemble`` whose
    chunks are put in order first) at ``url`` (gRPC ``host:port``) and record it: every
    non-empty chunk's arrival time and samples, and the server's ``info`` (generated tokens,
    degraded, vocoder). Never raises: a failure is a record with its
    :class:`~bench.outcomes.Outcome` and message."""
    req = SynthesisRequest(job.text, voice=voice, seed=job.seed, max_new_tokens=job.tokens,
                           min_new_tokens=job.tokens)
    times: list[float] = []
    samples: list[int] = []
    info: dict[str, object] = {}
    start = time.perf_counter()
    try:
        for part in iter_parts(url, req, timeout_s=timeout_s, model=model):
            if part.info:
                info.update(part.info)
            if part.audio.size:
                times.append(time.perf_counter() - start)
                samples.append(int(part.audio.size))
    except Exception as exc:  # a benchmark reports failures; it does not die on them
        outcome = classify_error(exc)
        return RequestRecord(job.index, job.text, start - phase_t0, None, time.perf_counter() - start, 0.0, 0, 0,
                             f"{outcome}: {type(exc).__name__}: {exc}", tokens_requested=job.tokens,
                             outcome=str(outcome))
    total = time.perf_counter() - start
    degraded = info.get("degraded")
    vocoder = info.get("vocoder")
    tokens = info.get("tokens")
    return RequestRecord(job.index, job.text, start - phase_t0, times[0] if times else None, total,
                         sum(samples) / contract.SAMPLE_RATE_HZ, len(times),
                         int(tokens) if isinstance(tokens, int | float) else 0, tokens_requested=job.tokens,
                         degraded=bool(degraded) if degraded is not None else None,
                         vocoder=str(vocoder) if vocoder is not None else None,
                         chunk_times_s=tuple(times), chunk_samples=tuple(samples))


SendFn = Callable[[str, Job, str, float, float], RequestRecord]
"""One request: (url, job, voice, phase start, timeout s) -> its record."""


def run_closed_loop(url: str, jobs: Sequence[Job], concurrency: int, *, voice: str,
                    timeout_s: float, send: SendFn | None = None) -> tuple[list[RequestRecord], float]:
    """Run ``jobs`` through ``concurrency`` client threads, each sending one request at a time
    with ``send`` (default :func:`stream_request`: a gRPC stream to ``url``). Returns (records
    in job order, wall seconds from the first send to the last end)."""
    send = send or stream_request
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
            rec = send(url, job, voice, t0, timeout_s)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=worker, name=f"client-{i}", daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sorted(records, key=lambda r: r.index), wall


@dataclass
class ServerSession:
    """A running server as the server phases see it: its gRPC ``host:port``, its metrics URL,
    a :class:`TreeMonitor` of its process tree, the benchmark sentences, the voice, the
    per-request timeout (s), the profile it serves (``profile``: a
    :class:`~chattts_serving.serving.profile.Profile`) and a progress callback."""

    grpc_url: str
    metrics_url: str
    monitor: TreeMonitor
    sentences: Sequence[str]
    voice: str
    profile: Any
    timeout_s: float = 600.0
    progress: Callable[[str], None] = lambda _m: None
    started_s: float | None = None
    """Seconds the server took to start (until ready)."""
    triton_version: str | None = None

    def measure(self, run: Callable[[], tuple[list[RequestRecord], float]]) -> dict[str, object]:
        """Run one measured phase (``run`` returns its records and wall seconds) and describe
        it: the :func:`~bench.stats.summarize` keys, engine_tokens_per_s
        (generated tokens per wall second, the same as tokens_per_s), engine (decode-step
        batch sizes from the metrics, or None), models (per-model Triton counters), the
        :class:`TreeMonitor` keys (cpu_percent, cpu_s_by_process, rss_mb, other_cpu_percent...),
        errors (first few messages) and records (per request)."""
        before = scrape(self.metrics_url)
        window = self.monitor.begin()
        records, wall = run()
        usage = self.monitor.end(window)
        delta = diff_samples(before, scrape(self.metrics_url))
        summary = summarize(records, wall)
        return {**summary, "engine_tokens_per_s": summary["tokens_per_s"], "engine": engine_batches(delta),
                "models": model_stats(delta), **usage,
                "errors": sorted({r.error for r in records if r.error})[:5],
                "records": [r.to_json() for r in records]}


IDLE_GAUGES = ("tts_request_queue_size", "tts_engine_active_sequences")
"""Gauges that are 0 on an idle server: accepted streams without audio, engine sequences."""


def busy_gauges(metrics_url: str) -> dict[str, float]:
    """The :data:`IDLE_GAUGES` summed over models, from the server's ``/metrics`` ({} if unreachable)."""
    samples = scrape(metrics_url)
    if not samples:
        return {}
    return {g: sum(v for (name, _), v in samples.items() if name == g) for g in IDLE_GAUGES}


def wait_idle(metrics_url: str, timeout_s: float = 120.0, interval_s: float = 0.25) -> float | None:
    """Wait until every :data:`IDLE_GAUGES` gauge is 0; returns the seconds waited, None when
    the server was still busy after ``timeout_s`` (or its metrics unreachable)."""
    t0 = time.perf_counter()
    while True:
        gauges = busy_gauges(metrics_url)
        if gauges and not any(gauges.values()):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            return None
        time.sleep(interval_s)


def level_jobs(sentences: Sequence[str], c: int, n: int, tokens: int) -> list[Job]:
    """The ``n`` jobs of closed-loop level ``c``: texts cycling through ``sentences``, seeds
    1000*c + i, ``tokens`` each."""
    return [Job(i, sentences[i % len(sentences)], 1000 * c + i, tokens) for i in range(n)]


def warm_up(session: ServerSession, top: int, tokens: int) -> None:
    """Unmeasured: one full request (lazy init of every stage), then a burst of ``top``
    requests with a short budget (ORT allocations for the large batch shapes).

    Raises :class:`WarmupError` when the first request fails."""
    url, voice, timeout = session.grpc_url, session.voice, session.timeout_s
    first, _ = run_closed_loop(url, [Job(0, session.sentences[0], 0, tokens)], 1, voice=voice, timeout_s=timeout)
    if first[0].error:
        raise WarmupError(f"the server failed the warm-up request: {first[0].error}")
    burst, _ = run_closed_loop(url, level_jobs(session.sentences, 0, top, min(tokens, 16)), top, voice=voice,
                               timeout_s=timeout)
    failed = [r.error for r in burst if r.error]
    if failed:
        session.progress(f"server: {len(failed)}/{top} warm-up burst requests failed, e.g. {failed[0]}")
    session.progress("server: warmed up")


def run_level(session: ServerSession, c: int, n: int, tokens: int) -> dict[str, object]:
    """Closed-loop level ``c``: ``n`` jobs (:func:`level_jobs`) through ``c`` client threads
    (with fewer jobs than ``c``, only that many streams run at once:
    ``effective_concurrency``). Returns concurrency, effective_concurrency and the
    :meth:`ServerSession.measure` keys."""
    jobs = level_jobs(session.sentences, c, n, tokens)
    level: dict[str, object] = {"concurrency": c, "effective_concurrency": min(c, n), **session.measure(
        lambda: run_closed_loop(session.grpc_url, jobs, c, voice=session.voice, timeout_s=session.timeout_s))}
    session.progress(f"server c={c}: {level['ok']}/{n} ok in {fmt(level['wall_s'])} s, "
                     f"TTFA p50 {fmt(level['ttfa_p50_s'])} s, latency p50 {fmt(level['latency_p50_s'])} s, "
                     f"{fmt(level['audio_s_per_s'])} audio s/s, real time {fmt(level['realtime_fraction'])}, "
                     f"{level['degraded_requests']} degraded")
    return level


def run_levels(session: ServerSession, *, levels: Sequence[int], requests_for: Callable[[int], int],
               tokens: int) -> list[dict[str, object]]:
    """Each closed-loop level of ``levels`` in turn (:func:`run_level`), ``requests_for(c)``
    requests of ``tokens`` tokens at level c."""
    return [run_level(session, c, requests_for(c), tokens) for c in levels]
