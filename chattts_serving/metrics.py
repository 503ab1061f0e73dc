"""Prometheus metrics of the Python models, on Triton's metrics port (``pb_utils.MetricFamily``).

Names are the ones the alert rules and the dashboard in ``docker/`` use. The families are
created once per model instance and must stay referenced for the model's lifetime.
"""

from __future__ import annotations

from typing import Any

BATCH_BUCKETS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


class EngineMetrics:
    """:class:`~chattts_serving.engine.EngineObserver` that publishes the GPT engine's state.

    tts_engine_batch_size (histogram, rows per decode step), tts_engine_decode_steps_total
    (counter), tts_engine_active_sequences (gauge, waiting + running), tts_kv_cache_usage_ratio
    (gauge, resident KV positions over the profile's max_batch_size x max_context_tokens).
    """

    def __init__(self, pb: Any, model: str, kv_capacity_tokens: int) -> None:
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

    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        self.batch.observe(float(batch_size))
        self.steps.increment(1.0)
        self.active.set(float(live))
        self.kv.set(kv_tokens / self.capacity)

    def idle(self) -> None:
        self.active.set(0.0)
        self.kv.set(0.0)
