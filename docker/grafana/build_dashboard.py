#!/usr/bin/env python3
"""Build the Grafana dashboard for ChatTTS on Triton as JSON, from plain dicts.

    python docker/grafana/build_dashboard.py           # rewrite dashboards/chattts.json
    python docker/grafana/build_dashboard.py --check   # exit 1 if the committed JSON is stale

The generated file is committed (Grafana provisions it from docker/grafana/dashboards/) and
tests/unit/test_deploy_grafana.py checks that it equals what this script produces. Queries use the
recording rules of docker/prometheus/rules/recording.yml where one exists, so that the
dashboard and the alerts agree on what "p95" or "error ratio" means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT_PATH = Path(__file__).resolve().parent / "dashboards" / "chattts.json"

# The Prometheus data source provisioned by provisioning/datasources/prometheus.yml.
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}

# Grafana's grid is 24 columns wide; every panel here is half the width and 8 rows high.
GRID_COLUMNS = 24
PANEL_WIDTH = 12
PANEL_HEIGHT = 8

# Thresholds drawn on panels: the same numbers as the alerts in rules/alerts.yml.
TTFA_P95_LIMIT_SECONDS = 1.0
REQUEST_P95_LIMIT_SECONDS = 1.5
QUEUE_LIMIT_REQUESTS = 64  # profiles/gpu.toml entry.max_concurrent_streams
ERROR_RATIO_LIMIT = 0.05

RATE = "$__rate_interval"  # Grafana's safe rate window: at least four scrape intervals.


def target(expr: str, legend: str, ref_id: str) -> dict[str, Any]:
    """One PromQL query of a panel."""
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref_id,
    }


def timeseries(title: str, description: str, unit: str, queries: list[tuple[str, str]], *,
               threshold: float | None = None, minimum: float | None = 0,
               maximum: float | None = None) -> dict[str, Any]:
    """A time-series panel; ``threshold`` draws a red dashed line (an alert's limit)."""
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if threshold is not None:
        steps.append({"color": "red", "value": threshold})
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "thresholdsStyle": {"mode": "dashed" if threshold is not None else "off"},
        },
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)],
    }


def panels() -> list[dict[str, Any]]:
    """The dashboard's panels, in reading order (left to right, top to bottom); the gateway's
    row last."""
    return [
        timeseries(
            "Time to first audio (p50, p95)",
            "Request in to first audio chunk sent, whole service, over 5 minutes. "
            f"The alert fires when p95 stays above {TTFA_P95_LIMIT_SECONDS:g} s for 5 minutes.",
            "s",
            [("chattts:tts_time_to_first_audio_seconds:p50_5m", "p50"),
             ("chattts:tts_time_to_first_audio_seconds:p95_5m", "p95")],
            threshold=TTFA_P95_LIMIT_SECONDS),
        timeseries(
            "Request duration (p50, p95, p99)",
            "Request in to final response (the whole stream), over 5 minutes. "
            f"The alert fires when p95 stays above {REQUEST_P95_LIMIT_SECONDS:g} s for 5 minutes.",
            "s",
            [("chattts:tts_request_duration_seconds:p50_5m", "p50"),
             ("chattts:tts_request_duration_seconds:p95_5m", "p95"),
             ("chattts:tts_request_duration_seconds:p99_5m", "p99")],
            threshold=REQUEST_P95_LIMIT_SECONDS),
        timeseries(
            "Requests per second",
            "Finished requests per second, in all and by status (ok, error, cancelled).",
            "reqps",
            [("chattts:tts_request_total:rate1m", "all"),
             ("status:tts_request_total:rate1m", "{{status}}")]),
        timeseries(
            "Audio produced (audio seconds per second)",
            "Seconds of audio delivered per wall-clock second, all streams together: the "
            "service's throughput.",
            "none",
            [("chattts:tts_audio_seconds:rate1m", "audio s / s")]),
        timeseries(
            "Real-time factor (wall s per audio s)",
            "Request wall time per second of audio delivered, over 5 minutes. Below 1, each "
            "stream is produced faster than it plays.",
            "none",
            [("chattts:tts_real_time_factor:ratio_rate5m", "RTF")],
            threshold=1.0),
        timeseries(
            "Request queue size",
            "Requests waiting for admission, per server. At the profile's admission limit "
            f"({QUEUE_LIMIT_REQUESTS}) new requests are rejected; the HPA scales on this metric.",
            "short",
            [("max by (instance) (tts_request_queue_size)", "{{instance}}")],
            threshold=QUEUE_LIMIT_REQUESTS),
        timeseries(
            "Engine batch size",
            "Sequences per GPT decode step: mean over 5 minutes, and p50/p95 of the "
            "distribution. Higher means in-flight batching is earning throughput.",
            "short",
            [("chattts:tts_engine_batch_size:mean_rate5m", "mean"),
             (f"histogram_quantile(0.50, sum by (le) (rate(tts_engine_batch_size_bucket[{RATE}])))", "p50"),
             (f"histogram_quantile(0.95, sum by (le) (rate(tts_engine_batch_size_bucket[{RATE}])))", "p95")]),
        timeseries(
            "Triton queue time per request",
            "Mean time a request waited in Triton's scheduler queue before execute, over 5 "
            "minutes (decoupled models hand requests to the engine at once, so this stays "
            "small; the admission queue above is the one that grows).",
            "µs",
            [("chattts:nv_inference_queue_duration_us:per_request_rate5m", "mean")]),
        timeseries(
            "Active sequences",
            "Sequences being decoded by the engine, per server.",
            "short",
            [("sum by (instance) (tts_engine_active_sequences)", "{{instance}}")]),
        timeseries(
            "KV cache usage",
            "Share of the engine's KV cache buffer in use, per server.",
            "percentunit",
            [("max by (instance) (tts_kv_cache_usage_ratio)", "{{instance}}")],
            threshold=0.9, maximum=1),
        timeseries(
            "Error ratio",
            "Share of finished requests with status error, over 5 minutes. "
            f"The alert fires above {ERROR_RATIO_LIMIT:.0%} for 5 minutes.",
            "percentunit",
            [("chattts:tts_request_errors:ratio_rate5m", "errors / all")],
            threshold=ERROR_RATIO_LIMIT),
        timeseries(
            "Errors and rejections per second",
            "Failed and cancelled requests by status, admissions rejected by reason, and "
            "requests Triton itself failed (by model and reason).",
            "reqps",
            [(f'sum by (status) (rate(tts_request_total{{status!="ok"}}[{RATE}]))', "{{status}}"),
             (f"sum by (reason) (rate(tts_rejected_total[{RATE}]))", "rejected: {{reason}}"),
             (f"sum by (model, reason) (rate(nv_inference_request_failure[{RATE}]))",
              "triton {{model}}: {{reason}}")]),
        timeseries(
            "Process memory (RSS)",
            "Resident memory of the serving processes, per server and model. A line that "
            "only climbs under steady load is a leak.",
            "bytes",
            [("tts_process_resident_memory_bytes", "{{instance}} {{model}}")]),
        timeseries(
            "GPU memory",
            "GPU memory in use and in total, from Triton (per GPU) and from the models. "
            "The alert fires above 90% for 2 minutes.",
            "bytes",
            [("nv_gpu_memory_used_bytes", "used {{instance}} {{gpu_uuid}}"),
             ("nv_gpu_memory_total_bytes", "total {{instance}} {{gpu_uuid}}"),
             ("tts_gpu_memory_used_bytes", "used (models) {{instance}} {{model}}"),
             ("tts_gpu_memory_total_bytes", "total (models) {{instance}} {{model}}")]),
        timeseries(
            "GPU memory used (share)",
            "Highest GPU memory use per server, 0 to 1.",
            "percentunit",
            [("instance:gpu_memory_used_bytes:max_ratio", "{{instance}}")],
            threshold=0.9, maximum=1),
        timeseries(
            "Degraded mode",
            "1 while the models report degraded mode, per server; the alert fires after 5 minutes.",
            "short",
            [("max by (instance) (tts_degraded_mode)", "{{instance}}")],
            threshold=1, maximum=1),
        *gateway_panels(),
    ]


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[{RATE}])))"


def gateway_panels() -> list[dict[str, Any]]:
    """The OpenAI gateway's row (its own /metrics, tts_gateway_*): what users of
    /v1/audio/speech see, next to what Triton sees."""
    return [
        timeseries(
            "Gateway: time to first audio (p50, p95)",
            "Request received by the gateway to first encoded audio bytes, all replicas, against "
            "Triton's own p95: the gap is the gateway's overhead (HTTP, gRPC relay, encoding).",
            "s",
            [(_quantile(0.5, "tts_gateway_time_to_first_audio_seconds"), "gateway p50"),
             (_quantile(0.95, "tts_gateway_time_to_first_audio_seconds"), "gateway p95"),
             ("chattts:tts_time_to_first_audio_seconds:p95_5m", "triton p95")],
            threshold=TTFA_P95_LIMIT_SECONDS),
        timeseries(
            "Gateway: requests and errors per second",
            "Speech requests finished by status, and errors by kind (400s are invalid, 503s busy, "
            "unavailable or deadline) and phase (before_audio: an HTTP status; mid_stream: a cut stream).",
            "reqps",
            [(f"sum by (status) (rate(tts_gateway_requests_total[{RATE}]))", "{{status}}"),
             (f"sum by (kind, phase) (rate(tts_gateway_errors_total[{RATE}])) > 0", "error {{kind}} ({{phase}})")]),
        timeseries(
            "Gateway: streams in flight",
            "Speech streams each gateway replica relays now (--max-streams answers 503 beyond it).",
            "short",
            [("sum by (instance) (tts_gateway_streams_in_flight)", "{{instance}}")]),
        timeseries(
            "Gateway: audio relayed (audio seconds per second)",
            "Seconds of audio the gateway relayed per wall-clock second, and its request duration p95.",
            "none",
            [(f"sum(rate(tts_gateway_audio_seconds_total[{RATE}]))", "audio s / s"),
             (_quantile(0.95, "tts_gateway_request_duration_seconds"), "request duration p95 (s)")]),
    ]


def build() -> dict[str, Any]:
    """The whole dashboard, with panel ids and grid positions assigned."""
    laid_out = []
    per_row = GRID_COLUMNS // PANEL_WIDTH
    for i, panel in enumerate(panels()):
        panel = {"id": i + 1, **panel,
                 "gridPos": {"h": PANEL_HEIGHT, "w": PANEL_WIDTH,
                             "x": (i % per_row) * PANEL_WIDTH, "y": (i // per_row) * PANEL_HEIGHT}}
        laid_out.append(panel)
    return {
        "uid": "chattts-serving",
        "title": "ChatTTS serving",
        "description": "ChatTTS streamed from Triton: latency, throughput, engine, errors, memory. "
                       "Generated by docker/grafana/build_dashboard.py; edit that, not this file.",
        "tags": ["chattts", "tts", "triton"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [],
        "panels": laid_out,
    }


def render() -> str:
    """The dashboard as the exact text of the committed JSON file."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT_PATH, help=f"output file (default {OUT_PATH})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(build()['panels'])} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
