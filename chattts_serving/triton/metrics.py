"""Prometheus metrics of the Python models, on Triton's metrics port (``pb_utils.MetricFamily``).

Names are the ones the alert rules and the dashboard in ``docker/`` use. The families are
created once per model instance and must stay referenced for the model's lifetime, then be
released by ``close()`` in the model's ``finalize``, and every update takes the model's metrics
lock (:mod:`~chattts_serving.triton.compat.unload`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from .. import contract

BATCH_BUCKETS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


class PingMetrics:
    """tts_pings_total{model} (counter): pings a model answered in ``execute``: the ones it sends
    itself to send queued final responses (:mod:`~chattts_serving.triton.compat.finals`) and the
    admission gate's liveness pings. Updated on the execute thread only."""

    def __init__(self, pb: Any, model: str) -> None:
        self._fam = pb.MetricFamily("tts_pings_total",
                                    "Pings a model answered (deferred final responses, gate liveness)",
                                    pb.MetricFamily.COUNTER)
        self.pings = self._fam.Metric(labels={"model": model})

    def answered(self) -> None:
        self.pings.increment(1.0)

    def close(self) -> None:
        """Release the family (the model unloads: see the module's docstring)."""
        del self.pings
        del self._fam


class VocoderMetrics:
    """tts_vocoder_tokens_total{model} (counter): tokens the vocoder model vocoded (window lengths
    summed: chunks, lookahead, context and crossfade edges; over the tokens generated it is the
    benchmark's ``vocoded_tokens_per_token``); tts_vocoder_carried_streams{model} (gauge):
    carried streams whose convolution state the model holds. Updated on the execute thread only."""

    def __init__(self, pb: Any, model: str) -> None:
        m = pb.MetricFamily
        self._fam = [m("tts_vocoder_tokens_total", "Tokens the vocoder vocoded (window lengths summed)", m.COUNTER),
                     m("tts_vocoder_carried_streams", "Streams whose vocoder state the model holds", m.GAUGE)]
        self.tokens = self._fam[0].Metric(labels={"model": model})
        self.streams = self._fam[1].Metric(labels={"model": model})

    def vocoded(self, tokens: int, carried_streams: int) -> None:
        self.tokens.increment(float(tokens))
        self.streams.set(float(carried_streams))

    def close(self) -> None:
        """Release the families (the model unloads: see the module's docstring)."""
        del self.tokens
        del self.streams
        del self._fam


class EngineMetrics:
    """:class:`~chattts_serving.engine.scheduler.EngineObserver` that publishes the GPT engine's state.

    tts_engine_batch_size (histogram, rows per decode step), tts_engine_decode_steps_total
    (counter), tts_engine_active_sequences (gauge, waiting + running), tts_kv_cache_usage_ratio
    (gauge, resident KV positions over the profile's max_batch_size x max_context_tokens);
    with ``memory``, the process's memory gauges, refreshed from the engine thread.
    """

    def __init__(self, pb: Any, model: str, kv_capacity_tokens: int, memory: MemoryGauges | None = None) -> None:
        labels = {"model": model}
        self._fam = [
            pb.MetricFamily("tts_engine_batch_size", "Sequences decoded together per GPT step",
                            pb.MetricFamily.HISTOGRAM),
            pb.MetricFamily("tts_engine_decode_steps_total", "Batched GPT decode steps", pb.MetricFamily.COUNTER),
            pb.MetricFamily("tts_engine_active_sequences", "Sequences waiting or running in the engine",
                            pb.MetricFamily.GAUGE),
            pb.MetricFamily("tts_kv_cache_usage_ratio", "Resident KV-cache positions over capacity",
                            pb.MetricFamily.GAUGE),
        ]
        self.batch = self._fam[0].Metric(labels=labels, buckets=BATCH_BUCKETS)
        self.steps = self._fam[1].Metric(labels=labels)
        self.active = self._fam[2].Metric(labels=labels)
        self.kv = self._fam[3].Metric(labels=labels)
        self.capacity = max(1, kv_capacity_tokens)
        self.memory = memory

    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        self.batch.observe(float(batch_size))
        self.steps.increment(1.0)
        self.active.set(float(live))
        self.kv.set(kv_tokens / self.capacity)
        if self.memory is not None:
            self.memory.maybe_update()

    def idle(self) -> None:
        self.active.set(0.0)
        self.kv.set(0.0)
        if self.memory is not None:
            self.memory.maybe_update()

    def close(self) -> None:
        """Delete the metrics, then their families (the backend's order), while the stub can
        still tell the server. Call once the engine thread has stopped; nothing may be
        recorded afterwards."""
        self.batch = self.steps = self.active = self.kv = None
        if self.memory is not None:
            self.memory.close()
        self._fam.clear()


LATENCY_BUCKETS_S = list(contract.LATENCY_BUCKETS_S)


class MemoryGauges:
    """Memory of one model's process: tts_process_resident_memory_bytes{model} always, and on
    a GPU host tts_gpu_memory_used_bytes{model,gpu} / tts_gpu_memory_total_bytes{model,gpu},
    the memory in use and the capacity of the instance's GPU, read through NVML (the
    ``nvidia-ml-py`` package, installed with the ``gpu`` extra). They mirror Triton's own
    ``nv_gpu_memory_*`` for deployments that run without Triton's GPU metrics. Without NVML
    or a GPU (CPU hosts), the GPU series are not published at all.

    :meth:`maybe_update` refreshes at most every ``interval_s`` seconds; call it from the
    model's own threads, under the same lock as its other metric updates (concurrent metric
    calls crash Triton 2.51's Python backend). ``nvml``: the pynvml module to use (tests);
    None imports it.
    """

    def __init__(self, pb: Any, model: str, gpu_index: int | None = None, interval_s: float = 5.0,
                 nvml: Any = None) -> None:
        m = pb.MetricFamily
        self._fam = [m("tts_process_resident_memory_bytes", "Resident memory of the model's process", m.GAUGE)]
        self.rss = self._fam[0].Metric(labels={"model": model})
        self.interval_s = interval_s
        self._next_s = 0.0
        self._gpu: tuple[Any, Any, Any, Any] | None = None  # nvml, handle, used gauge, total gauge
        if gpu_index is not None:
            handle, nvml = _nvml_device(gpu_index, nvml)
            if handle is not None:
                labels = {"model": model, "gpu": str(gpu_index)}
                self._fam += [m("tts_gpu_memory_used_bytes", "GPU memory in use on the model's GPU", m.GAUGE),
                              m("tts_gpu_memory_total_bytes", "Memory capacity of the model's GPU", m.GAUGE)]
                self._gpu = (nvml, handle, self._fam[1].Metric(labels=labels), self._fam[2].Metric(labels=labels))
        self.refresh()

    @property
    def has_gpu(self) -> bool:
        """True when the GPU gauges are published."""
        return self._gpu is not None

    def maybe_update(self, now_s: float | None = None) -> bool:
        """Refresh the gauges if ``interval_s`` has passed (``now_s``: ``time.monotonic()``).
        Returns True when it refreshed. An NVML error stops the GPU gauges (logged once)."""
        now_s = time.monotonic() if now_s is None else now_s
        if now_s < self._next_s:
            return False
        self._next_s = now_s + self.interval_s
        self.refresh()
        return True

    def refresh(self) -> None:
        """Read and publish now (also done once at construction)."""
        self.rss.set(float(process_rss_bytes()))
        if self._gpu is not None:
            nvml, handle, used, total = self._gpu
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # NVMLError and friends: keep serving, stop reporting
                logging.getLogger(__name__).warning("NVML failed, GPU memory gauges stop: %s", exc)
                self._gpu = None
                return
            used.set(float(info.used))
            total.set(float(info.total))

    def close(self) -> None:
        """Delete the gauges, then their families; nothing may be refreshed afterwards."""
        self.rss = None
        self._gpu = None
        self._fam.clear()


def _nvml_device(index: int, nvml: Any) -> tuple[Any, Any]:
    """(NVML handle of GPU ``index``, the nvml module), or (None, None) without NVML/GPU."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[import-not-found, no-redef]
        nvml.nvmlInit()
        return nvml.nvmlDeviceGetHandleByIndex(index), nvml
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_InvalidArgument, ...
        return None, None


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class EntryMetrics:
    """Request-level metrics of an entry model (``chattts``, ``chattts_offline``): the
    :class:`~chattts_serving.serving.entry.EntryObserver` of the server.

    tts_request_total{status,priority}; tts_request_duration_seconds and
    tts_time_to_first_audio_seconds (histograms, from our own clocks: Triton's durations stop
    when a decoupled ``execute`` returns); tts_audio_seconds_total; tts_rejected_total{reason};
    tts_request_queue_size (accepted streams not yet producing audio); tts_active_requests
    (accepted requests in flight: what ``python -m chattts_serving.deploy.drain`` waits for);
    tts_degraded_mode; tts_degraded_requests_total (requests admitted in the degraded mode);
    and the process's memory (:class:`MemoryGauges`, refreshed as requests finish).
    """

    def __init__(self, pb: Any, model: str) -> None:
        self.pb, self.model = pb, model
        m = pb.MetricFamily
        self._fam = {
            "requests": m("tts_request_total", "Finished requests by status and priority", m.COUNTER),
            "duration": m("tts_request_duration_seconds", "Request duration, arrival to last audio", m.HISTOGRAM),
            "ttfa": m("tts_time_to_first_audio_seconds", "Arrival to first audio chunk", m.HISTOGRAM),
            "audio": m("tts_audio_seconds_total", "Seconds of audio sent", m.COUNTER),
            "rejected": m(contract.REJECTED_METRIC, contract.REJECTED_HELP, m.COUNTER),
            "queue": m("tts_request_queue_size", "Accepted requests that have not produced audio yet", m.GAUGE),
            "active": m(contract.ACTIVE_METRIC, "Accepted requests in flight (admitted, not yet finished)", m.GAUGE),
            "degraded": m("tts_degraded_mode", "1 while the service runs in its cheaper mode", m.GAUGE),
            "degraded_requests": m("tts_degraded_requests_total", "Requests admitted while the service ran in its "
                                   "cheaper mode (told so in their info)", m.COUNTER),
        }
        self.memory = MemoryGauges(pb, model)
        labels = {"model": model}
        self._counters: dict[tuple[object, ...], Any] = {}
        self.duration = self._fam["duration"].Metric(labels=labels, buckets=LATENCY_BUCKETS_S)
        self.ttfa = self._fam["ttfa"].Metric(labels=labels, buckets=LATENCY_BUCKETS_S)
        self.audio = self._fam["audio"].Metric(labels=labels)
        self.queue = self._fam["queue"].Metric(labels=labels)
        self.active = self._fam["active"].Metric(labels=labels)
        self.degraded = self._fam["degraded"].Metric(labels=labels)
        # Every metric update takes this lock (chattts_serving/triton/compat/unload.py).
        self.lock = threading.Lock()
        self._closed = False

    def _counter(self, family: str, **labels: str) -> Any:
        key = (family, *sorted(labels.items()))
        if key not in self._counters:
            self._counters[key] = self._fam[family].Metric(labels={"model": self.model, **labels})
        return self._counters[key]

    def finished(self, status: str, priority: str, duration_s: float, audio_s: float,
                 ttfa_s: float | None) -> None:
        with self.lock:
            if self._closed:
                return
            self._counter("requests", status=status, priority=priority).increment(1.0)
            self.duration.observe(duration_s)
            if ttfa_s is not None:
                self.ttfa.observe(ttfa_s)
            if audio_s > 0:
                self.audio.increment(audio_s)
            self.memory.maybe_update()

    def rejected(self, reason: str, count: int = 1) -> None:
        with self.lock:
            if not self._closed:
                self._counter("rejected", reason=reason).increment(float(count))

    def set_queue(self, waiting: int) -> None:
        with self.lock:
            if not self._closed:
                self.queue.set(float(waiting))

    def set_active(self, active: int) -> None:
        with self.lock:
            if not self._closed:
                self.active.set(float(active))

    def set_degraded(self, on: bool) -> None:
        with self.lock:
            if not self._closed:
                self.degraded.set(1.0 if on else 0.0)

    def degraded_request(self) -> None:
        with self.lock:
            if not self._closed:
                self._counter("degraded_requests").increment(1.0)

    def close(self) -> None:
        """Delete the metrics, then their families, while the stub can still tell the server;
        later updates (a worker thread still finishing) are dropped."""
        with self.lock:
            self._closed = True
            self._counters.clear()
            self.duration = self.ttfa = self.audio = self.queue = self.active = self.degraded = None
            self.memory.close()
            self._fam.clear()
