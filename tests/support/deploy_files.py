"""What the offline checks of the deployment files (tests/unit/test_deploy_*.py) share: the
paths under docker/, the server and probe command lines that the image, compose and Kubernetes
all run, the metric names PromQL may reference, the Kubernetes and compose readers, and the
command-line tools (hadolint, promtool, kubernetes-validate) found beside this interpreter or on
PATH. Importing it skips the importing test module without PyYAML
(docker/requirements-validate.txt)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pip install -r docker/requirements-validate.txt")

REPO = Path(__file__).resolve().parents[2]


DOCKER = REPO / "docker"


DOCKERFILE = DOCKER / "Dockerfile"


COMPOSE = DOCKER / "compose.yaml"


PROMETHEUS = DOCKER / "prometheus"


RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))


RULES_TEST = PROMETHEUS / "tests" / "alerts_test.yml"


GRAFANA = DOCKER / "grafana"


DASHBOARD_JSON = GRAFANA / "dashboards" / "chattts.json"


K8S = DOCKER / "k8s"


# Kubernetes release the manifests must be valid for (the schemas ship in kubernetes-validate).
K8S_VERSION = "1.31.0"


# The Triton image the server is built on: tritonserver 2.51, as bundled for the CPU tests.
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"


# The CPU variant's base: Debian made locally by scripts/containers.sh (no registry).
CPU_BASE_IMAGE = "chattts-debian-base:bookworm"


# The server command line: the image's CMD and the Kubernetes container's args
# (chattts-tritonserver: tritonserver with the admin APIs behind the token header, inference
# behind the inference key when one is set). In a container the ports bind every interface;
# models load explicitly so that the admin token can unload and load them.
SERVER_COMMAND = [
    "chattts-tritonserver",
    "--model-repository=/opt/model_repository",
    "--http-port=8000",
    "--grpc-port=8001",
    "--metrics-port=8002",
    "--http-address=0.0.0.0",
    "--grpc-address=0.0.0.0",
    "--metrics-address=0.0.0.0",
    "--model-control-mode=explicit",
    "--load-model=*",
    "--disable-auto-complete-config",
    "--metrics-config=summary_latencies=true",
]


# The deep health probe the image, compose and Kubernetes run (python3 is the image's).
PROBE_TIMEOUT_S = 20.0


PROBE_COMMAND = ["python3", "-m", "chattts_serving.deploy.probe", "--timeout-s", f"{PROBE_TIMEOUT_S:g}"]


def duration_s(text: str) -> float:
    """A Docker/compose duration such as ``25s``, ``1m30s`` or ``500ms`` in seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


# Metric families the models export (pb_utils.MetricFamily) and Triton's own that we use.
# Every PromQL expression may reference only these, their histogram series, and the
# recording rules of docker/prometheus/rules/recording.yml.
COUNTERS = {"tts_request_total", "tts_audio_seconds_total", "tts_rejected_total"}


HISTOGRAMS = {"tts_request_duration_seconds", "tts_time_to_first_audio_seconds", "tts_engine_batch_size"}


GAUGES = {
    "tts_request_queue_size",
    "tts_active_requests",
    "tts_engine_active_sequences",
    "tts_kv_cache_usage_ratio",
    "tts_degraded_mode",
    "tts_process_resident_memory_bytes",
    "tts_gpu_memory_used_bytes",
    "tts_gpu_memory_total_bytes",
}


TRITON_METRICS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_queue_duration_us",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_memory_total_bytes",
}


def _gateway_series() -> frozenset[str]:
    """Series names of the gateway's metric families, read from its registry (so that a
    dashboard query naming a gateway metric that does not exist fails)."""
    metrics = pytest.importorskip("chattts_serving.gateway.metrics", reason="pip install -e '.[gateway]'")
    return frozenset(sample.name for family in metrics.GatewayMetrics().registry.collect()
                     for sample in family.samples)


GATEWAY_SERIES = _gateway_series()


KNOWN_METRICS = frozenset(
    COUNTERS | GAUGES | TRITON_METRICS | GATEWAY_SERIES
    | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)


def find_tool(name: str) -> str | None:
    """A command-line tool from this interpreter's environment first, then from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def find_promtool() -> str:
    """promtool's path; skips the calling test when it is missing."""
    path = find_tool("promtool")
    if path is None:
        pytest.skip("promtool not found: apt-get update && apt-get install -y prometheus")
    return path


def run_tool(cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False, env=env)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, (
        f"{shlex.join(proc.args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under docker/k8s (the kustomization is not one)."""
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path, doc) for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return docs


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in k8s_docs() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name} under docker/k8s, found {len(found)}"
    return found[0]


def recording_rule_names() -> set[str]:
    return {rule["record"] for path in RULE_FILES for group in load_yaml(path)["groups"]
            for rule in group["rules"] if "record" in rule}


def all_rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            yield from group["rules"]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in all_rules() if "alert" in rule]


# PromQL words that look like identifiers but are not metric names.
_PROMQL_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2",
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "limitk", "limit_ratio",
})


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (a lexical scan, not a full parser).

    Strings, label matchers, range selectors and grouping label lists are removed first; of
    the identifiers left, those followed by ``(`` (functions, aggregations) and PromQL
    keywords are not metric names. Grafana variables (``$name``) are ignored.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])[A-Za-z_:][\w:]*", text):
        if text[match.end():].lstrip().startswith("(") or match.group(0) in _PROMQL_KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def unknown_metrics(expr: str) -> set[str]:
    return promql_metric_names(expr) - KNOWN_METRICS - recording_rule_names()


def promtool_parse(promtool: str, exprs: dict[str, str], tmp_path: Path) -> None:
    """Parse PromQL with Prometheus' own parser: each expression becomes a recording rule."""
    rules = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"parse_check:{i}", "expr": expr} for i, expr in enumerate(exprs.values())]}]}
    path = tmp_path / "parse_check.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    proc = run_tool([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, (
        "promtool rejected a query:\n" + proc.stdout + proc.stderr + "\nqueries:\n"
        + "\n".join(f"  [{i}] {where}: {expr}" for i, (where, expr) in enumerate(exprs.items())))


def load_compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


GATEWAY_MODULE = ["python3", "-m", "chattts_serving.gateway"]


def gateway_argv(argv: list[str]) -> Any:
    """The gateway's own parser applied to a container's command (after the module name)."""
    main = pytest.importorskip("chattts_serving.gateway.__main__", reason="pip install -e '.[gateway]'")
    assert argv[:3] == GATEWAY_MODULE, argv
    return main.parse_args(argv[3:])


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def build_dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
