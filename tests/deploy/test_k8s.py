"""Kubernetes as far as it runs without a cluster.

- Every manifest of docker/k8s, and kustomize's build of them, validated strictly against the
  pinned Kubernetes release's schema (``kubernetes-validate --strict``).
- The reason for the /dev/shm volume, reproduced: a Python-backend stub in a /dev/shm smaller
  than its tensors fails with "Failed to increase the shared memory pool"; at the manifests'
  size it serves.
- The shipped Deployment as ``podman kube play`` runs it (``scripts/kube_play.py`` changes only
  what a cluster provides), two replicas as two pods, and every replica case of
  test_replicas.py run against those pods behind haproxy.

What only a cluster shows (the HPA controller, Service routing, prometheus-adapter) is not
here; docker/README.md says so. Figures go to ``results/deploy/k8s.json``, and the replica
cases' also to ``results/deploy/replicas-pod.json`` (as every fleet's, for the deploy report).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from chattts_serving.deploy.admin import new_token
from chattts_serving.deploy.server import TritonServer
from chattts_serving.runtime import Artifacts
from tests.support.servers import ROOT, free_port

from . import test_replicas as _replica_cases
from .balancer import Haproxy
from .conftest import MAX_STREAMS, REPLICAS, RESULTS, Fleet, _render, missing
from .fleet import IMAGE, ReplicaError
from .pods import DEPLOYMENT, PodBackend, _kube_play_module, podman

K8S = ROOT / "docker" / "k8s"
K8S_VERSION = "1.31.0"
"""The Kubernetes release the manifests are validated against (as in tests/support/deploy_files.py)."""
REPORT: dict[str, Any] = {"kubernetes_version": K8S_VERSION}
"""What this module found; written to results/deploy/k8s.json when the module ends."""


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "k8s.json").write_text(json.dumps(REPORT, indent=2) + "\n")


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def _validate(paths: list[Path]) -> tuple[int, str]:
    tool = _tool("kubernetes-validate")
    if tool is None:
        missing("kubernetes-validate is not installed: pip install -r docker/requirements-validate.txt")
    proc = subprocess.run([tool, "--kubernetes-version", K8S_VERSION, "--strict", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_every_manifest_and_the_kustomize_build_validate_strictly(tmp_path: Path) -> None:
    files = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    code, output = _validate(files)
    assert code == 0 and "WARN" not in output, output
    objects = output.count(" passed for resource ")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing("kubectl (its built-in kustomize builds docker/k8s) is not installed")
    built = tmp_path / "built.yaml"
    built.write_text(subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)
    code, built_output = _validate([built])
    assert code == 0 and "WARN" not in built_output, built_output
    REPORT["manifests_validated"] = {"files": len(files), "objects": objects,
                                     "kustomize_build_objects": built_output.count(" passed for resource "),
                                     "strict": True, "errors": 0}
    assert REPORT["manifests_validated"]["kustomize_build_objects"] == objects


# ----------------------------------------------------------------------------- /dev/shm

SHM_MODEL_CONFIG = """name: "shm_echo"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""
SHM_MODEL = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Returns its input: the tensor crosses the stub's shared memory both ways."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().copy())]) for r in requests]
'''
TENSOR_BYTES = 16 << 20
"""The request's tensor: 16 MiB of float32."""
TINY_SHM_BYTES = 4 << 20
"""A /dev/shm smaller than that tensor (the container runtimes' default, 64 MiB, is the same
failure for a tensor of 64 MiB or a few dozen model instances' pools)."""


def _manifest_shm_bytes() -> int:
    spec = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    (dshm,) = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    size = str(dshm["emptyDir"]["sizeLimit"])
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(size[:-2]) * units[size[-2:]] if size[-2:] in units else int(size)


def _serve_with_shm(repo: Path, shm_bytes: int, log: Path) -> tuple[str, str]:
    """tritonserver (the bundled one) on ``repo`` in a mount namespace of its own whose /dev/shm
    is a tmpfs of ``shm_bytes``; one inference of :data:`TENSOR_BYTES`. Returns (result, detail)."""
    import tritonclient.http as httpclient

    http = free_port()
    srv = TritonServer(repo, http_port=http, grpc_port=free_port(), metrics_port=free_port(), build_dir=ROOT / "build")
    wrap = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'mount -t tmpfs -o size={shm_bytes} tmpfs /dev/shm && exec "$@"', "sh"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(wrap + srv.command(), env=srv.environment(), stdout=out, stderr=subprocess.STDOUT)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "tritonserver not ready"
            try:
                if client.is_model_ready("shm_echo"):
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        data = np.ones(TENSOR_BYTES // 4, np.float32)
        tensor = httpclient.InferInput("IN", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        try:
            result = client.infer("shm_echo", [tensor]).as_numpy("OUT")
        except Exception as exc:  # the error is the finding
            return "error", str(exc)
        assert result is not None and np.array_equal(result, data)
        return "ok", ""
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_python_backend_stub_fails_in_a_too_small_dev_shm_and_serves_at_the_manifests_size(
        tmp_path: Path) -> None:
    """Why the Deployment mounts a sized memory emptyDir at /dev/shm and compose sets shm_size."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing("a /dev/shm of a given size needs root and unshare (a mount namespace)")
    repo = tmp_path / "repo"
    (repo / "shm_echo" / "1").mkdir(parents=True)
    (repo / "shm_echo" / "config.pbtxt").write_text(SHM_MODEL_CONFIG)
    (repo / "shm_echo" / "1" / "model.py").write_text(SHM_MODEL)
    manifests = _manifest_shm_bytes()
    tiny = _serve_with_shm(repo, TINY_SHM_BYTES, tmp_path / "tiny.log")
    sized = _serve_with_shm(repo, manifests, tmp_path / "sized.log")
    REPORT["dev_shm"] = {"tensor_bytes": TENSOR_BYTES,
                         "tiny_shm_bytes": TINY_SHM_BYTES, "tiny_result": tiny[0], "tiny_error": tiny[1][:300],
                         "manifest_shm_bytes": manifests, "manifest_result": sized[0]}
    assert tiny[0] == "error" and "Failed to increase the shared memory pool" in tiny[1], tiny
    assert sized == ("ok", ""), sized


# ----------------------------------------------------------------------------- the derived Deployment

def _paths(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of ``doc`` by its dotted path (list items by index)."""
    if isinstance(doc, dict):
        return {k: v for key, value in doc.items() for k, v in _paths(value, f"{prefix}{key}.").items()}
    if isinstance(doc, list):
        return {k: v for i, value in enumerate(doc) for k, v in _paths(value, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): doc}


def test_the_played_deployment_differs_from_the_shipped_one_only_where_a_cluster_is_missing(
        tmp_path: Path) -> None:
    kube_play = _kube_play_module()
    shipped = yaml.safe_load(DEPLOYMENT.read_text())
    derived = kube_play.derive(shipped, image="chattts-serving:0.1.0-cpu", replicas=2, models=tmp_path,
                               repository=tmp_path / "repo", env={"CHATTTS_ADMIN_TOKEN": "t"},
                               unset=frozenset({"CHATTTS_INFERENCE_KEY"}))
    assert shipped == yaml.safe_load(DEPLOYMENT.read_text()), "derive() must not change its input"
    before, after = _paths(shipped), _paths(derived)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    pod = "spec.template.spec."
    allowed = ("spec.replicas", f"{pod}tolerations.", f"{pod}initContainers.0.image",
               f"{pod}containers.0.image", f"{pod}containers.0.env.", f"{pod}containers.0.resources.",
               f"{pod}containers.0.ports.", f"{pod}volumes.", f"{pod}containers.0.volumeMounts.",
               f"{pod}restartPolicy", f"{pod}containers.1.")
    assert all(p.startswith(allowed) for p in changed), sorted(p for p in changed if not p.startswith(allowed))
    # what a cluster-less host keeps as shipped
    for kept in ("securityContext", "terminationGracePeriodSeconds"):
        assert derived["spec"]["template"]["spec"][kept] == shipped["spec"]["template"]["spec"][kept]
    (init,), (shipped_init,) = derived["spec"]["template"]["spec"]["initContainers"], \
        shipped["spec"]["template"]["spec"]["initContainers"]
    assert {**init, "image": None} == {**shipped_init, "image": None}
    server, keep_pod = derived["spec"]["template"]["spec"]["containers"]
    assert keep_pod["name"] == "keep-pod" and keep_pod["image"] == server["image"]
    shipped_server, = shipped["spec"]["template"]["spec"]["containers"]
    for kept in ("args", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe", "securityContext"):
        assert server[kept] == shipped_server[kept], kept
    assert "nvidia.com/gpu" not in json.dumps(derived)
    # podman 4.3 would publish the ports on the host (a second pod cannot start) and put
    # /dev/shm on one disk volume for all pods: both go, podman sizes each pod's /dev/shm
    assert "ports" not in server
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert set(mounts) == {"/models", "/opt/model_repository"}
    assert mounts["/models"] == next(m for m in shipped_server["volumeMounts"] if m["mountPath"] == "/models")
    volumes = {v["name"]: v for v in derived["spec"]["template"]["spec"]["volumes"]}
    assert set(volumes) == {"artifacts", "model-repository"}
    assert volumes["artifacts"]["hostPath"] == {"path": str(tmp_path.resolve()), "type": "Directory"}
    assert kube_play.quantity_bytes(kube_play.shm_size_limit(shipped)) == _manifest_shm_bytes()
    # still a valid Deployment
    path = tmp_path / "play.yaml"
    path.write_text(yaml.safe_dump(derived))
    code, output = _validate([path])
    assert code == 0 and "WARN" not in output, output


def test_deriving_refuses_a_required_secret_without_a_value_and_a_deployment_without_a_gpu(
        tmp_path: Path) -> None:
    kube_play = _kube_play_module()
    shipped = yaml.safe_load(DEPLOYMENT.read_text())
    with pytest.raises(kube_play.DeriveError, match="CHATTTS_INFERENCE_KEY comes from Secret chattts-inference"):
        kube_play.derive(shipped, image="x:1", replicas=2, models=tmp_path)
    cpu = kube_play.derive(shipped, image="x:1", replicas=2, models=tmp_path,
                           unset=frozenset({"CHATTTS_INFERENCE_KEY"}))
    with pytest.raises(kube_play.DeriveError, match=r"asks for no nvidia\.com/gpu"):
        kube_play.derive(cpu, image="x:1", replicas=2, models=tmp_path)
    with pytest.raises(kube_play.DeriveError, match="replicas"):
        kube_play.derive(shipped, image="x:1", replicas=0, models=tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "kube_play.py"), "--image", "x:1",
                           "--models", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--unset CHATTTS_INFERENCE_KEY" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- pods

@pytest.fixture(scope="module")
def fleet(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The replicas of test_replicas.py as the pods of the played Deployment, behind haproxy
    (this module's fleet: the replica cases imported below run against it). The image is
    ``CHATTTS_POD_IMAGE``, by default the CPU image of ``make image``."""
    if os.geteuid() != 0:
        missing("podman kube play runs rootful here: the test needs root")
    if shutil.which("haproxy") is None:
        missing("haproxy is not installed (apt-get install haproxy; make deploy-test installs it)")
    work = tmp_path_factory.mktemp("fleet-pod")
    repo = _render(small_artifacts, work / "repo")
    image = os.environ.get("CHATTTS_POD_IMAGE", IMAGE)
    REPORT["image"] = image
    try:
        backend = PodBackend(repo, small_artifacts.root, work, new_token(), image=image, replicas=REPLICAS)
    except ReplicaError as exc:
        if "in neither podman's store nor dockerd's" in str(exc):
            missing(f"the CPU image is not built: {exc}")
        raise
    REPORT["image_load_into_podman_s"] = round(backend.load_s or 0.0, 2)
    lb: Haproxy | None = None
    fl: Fleet | None = None
    try:
        replicas = [backend.start(i) for i in range(REPLICAS)]
        REPORT["pods"] = {"started": len(replicas), "addresses": [r.address for r in replicas],
                          "play_to_all_ready_s": round(backend.play_s or 0.0, 2)}
        lb = Haproxy(replicas, work)
        fl = Fleet(backend, replicas, lb, work)
        fl.all_up()
        yield fl
    finally:
        if fl is not None:
            REPORT["cases"] = fl.cases
            # as every fleet's figures (tests/deploy/conftest.py), for scripts/deploy_report.py's table
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "replicas-pod.json").write_text(json.dumps({
                "backend": "pod", "replicas": len(fl.replicas),
                "artifacts": "small (generated, build/test/artifacts-small)",
                "max_concurrent_streams_per_replica": MAX_STREAMS,
                "fleet_start_s": REPORT.get("pods", {}).get("play_to_all_ready_s"),
                "cases": fl.cases}, indent=2) + "\n")
        if lb is not None:
            lb.close()
        backend.close()


def _exec(backend: PodBackend, index: int, *command: str) -> str:
    return podman("exec", f"{backend.pod_name(index)}-triton", *command).stdout


def test_kube_play_runs_the_deployment_as_two_pods_as_shipped(fleet: Fleet) -> None:
    """Two pods, each with its own address and ready; the init container waited for the
    artifacts and exited 0; the server runs as the manifest's user, with the ulimits and the
    memory-backed /dev/shm it needs."""
    backend = fleet.backend
    assert isinstance(backend, PodBackend)
    pods = json.loads(podman("pod", "ps", "--format", "json").stdout)
    names = sorted(p["Name"] for p in pods)
    assert names == [backend.pod_name(i) for i in range(REPLICAS)], names
    addresses = [r.address for r in fleet.replicas]
    assert len(set(addresses)) == REPLICAS and all(addresses), addresses
    assert all(r.ready() for r in fleet.replicas)
    found: dict[str, Any] = {}
    for replica in fleet.replicas:
        containers = {c["Names"][0] if isinstance(c["Names"], list) else c["Names"]: c for c in json.loads(
            podman("ps", "--all", "--filter", f"pod={backend.pod_name(replica.index)}", "--format", "json").stdout)}
        init = containers.get(f"{backend.pod_name(replica.index)}-wait-for-artifacts")
        # podman removes an init container once it has run (init: always is kept); either way it did not fail
        assert init is None or init["ExitCode"] == 0, init
        ids = _exec(backend, replica.index, "id", "-u").strip()
        nofile = _exec(backend, replica.index, "sh", "-c", "ulimit -n").strip()
        shm = _exec(backend, replica.index, "sh", "-c", "stat -f -c '%T %b %S' /dev/shm").split()
        used = _exec(backend, replica.index, "sh", "-c", "du -sb /dev/shm | cut -f1").strip()
        found[replica.name] = {"uid": int(ids), "nofile": int(nofile), "dev_shm_fs": shm[0],
                               "dev_shm_bytes": int(shm[1]) * int(shm[2]), "dev_shm_used_bytes": int(used)}
        # The liveness probe (the deep probe: a 2-token synthesis) is a podman healthcheck;
        # without systemd podman cannot schedule it, so it is run once by hand.
        health = podman("healthcheck", "run", f"{backend.pod_name(replica.index)}-triton", check=False, timeout=60)
        found[replica.name]["liveness_probe"] = {"exit_code": health.returncode,
                                                 "output": (health.stdout + health.stderr).strip()[-300:]}
    REPORT["pods"]["inside"] = found
    for inside in found.values():
        assert inside["uid"] == 10001
        assert inside["nofile"] == 20000, "scripts/podman.sh's default_ulimits"
        assert inside["dev_shm_fs"] == "tmpfs", inside
        assert inside["dev_shm_bytes"] == backend.shm_bytes == _manifest_shm_bytes(), inside
        assert inside["liveness_probe"]["exit_code"] == 0, inside


# Every replica case of test_replicas.py, run here against the pods (this module's `fleet`), and
# the fixtures they use that are defined there.
for _name, _value in vars(_replica_cases).items():
    if _name.startswith("test_") or _name == "pg":
        globals()[_name] = _value
