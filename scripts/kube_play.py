"""Derive what `podman kube play` can run from the shipped Deployment (docker/k8s/deployment.yaml).

There is no Kubernetes control plane on a host without a cluster, but podman runs a
Deployment's pod template: one pod per replica, each with its own address, init containers,
probes, securityContext and volumes. What it cannot have is what a cluster provides, so only
that is changed, and everything else stays as shipped:

- the image (``chattts-serving:<tag>`` in every container) becomes the given one, e.g. the CPU
  image ``chattts-serving:0.1.0-cpu``; ``spec.replicas`` the given count;
- the GPU: the ``nvidia.com/gpu`` toleration and resource go, and the server's CPU/memory
  requests and limits become ones a small CPU host has (the memory limit stays above the
  ``/dev/shm`` emptyDir, which counts against it);
- the artifacts' PersistentVolumeClaim (which the export Job fills in a cluster) becomes a
  ``hostPath`` directory that holds ``artifacts/``, mounted at the same place (``/models``);
- environment variables read from Secrets (no API server holds them) take a given value, or
  are dropped (``--unset``, e.g. the inference key when the clients send none);
- optionally (``--repository``) a host directory is mounted over the image's rendered model
  repository, for a repository rendered with other knobs (the deploy tests' small admission
  limit).

Two changes are for podman 4.3 (Debian 12's), whose kube play differs from a kubelet:

- it publishes every ``containerPort`` on the host (hostPort defaults to containerPort), so a
  second pod cannot start: the ports go (they are informational in Kubernetes; each pod is
  reached at its own address, and the probes name ports podman does not resolve anyway);
- it turns the memory-backed ``/dev/shm`` emptyDir into one disk-backed volume shared by every
  pod, ignoring ``medium`` and ``sizeLimit``: the volume goes, and podman gives each pod a
  tmpfs /dev/shm of the size its configuration says (``scripts/podman.sh``, which the tests
  start with this volume's ``sizeLimit``; :func:`shm_size_limit`);
- it stops a pod whose last container exited (kube play's pods have exit policy ``stop``)
  and gives it a new address when one of its containers starts again; a kubelet keeps the
  pod and its address while it restarts the container: a ``keep-pod`` container that only
  waits for SIGTERM is added, so that the server's pod outlives the server's stop;
- it gives init containers the pod's restart policy, and with ``Always`` restarts the init
  container forever after it succeeds (a kubelet runs it once): the policy becomes
  ``OnFailure``, under which a crashed server (the image's command exits 70) is restarted as
  before and only a clean exit after SIGTERM is not (in a cluster, a new pod replaces it).

    python scripts/kube_play.py --image chattts-serving:0.1.0-cpu --replicas 2 \\
        --models /srv/chattts-models --unset CHATTTS_INFERENCE_KEY > play.yaml
    podman kube play play.yaml          # scripts/podman.sh podman kube play play.yaml

The output is still a Deployment: it validates against the same Kubernetes schema.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOYMENT = REPO / "docker" / "k8s" / "deployment.yaml"
SERVER_CONTAINER = "triton"
"""The Deployment's server container (the one with the GPU and the model repository)."""
IMAGE_NAME = "chattts-serving"
"""The image repository the shipped containers use (any tag)."""
ARTIFACTS_VOLUME = "artifacts"
GPU_RESOURCE = "nvidia.com/gpu"
CPU_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "500m", "memory": "1Gi"},
    "limits": {"memory": "6Gi"},
}
"""The server's resources on a CPU host: the small model fits; the limit stays above the
/dev/shm emptyDir (sizeLimit 2Gi), whose pages count against it."""


SHM_PATH = "/dev/shm"
KEEP_POD = "keep-pod"
"""The container added to keep podman's pod (and its address) while the server restarts."""


def shm_size_limit(deployment: dict[str, Any]) -> str:
    """The ``sizeLimit`` of the server's memory-backed /dev/shm volume (e.g. ``2Gi``)."""
    spec = _pod_spec(deployment)
    mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])
               if m["mountPath"] == SHM_PATH}
    for volume in spec["volumes"]:
        if volume["name"] in mounted and volume.get("emptyDir", {}).get("medium") == "Memory":
            return str(volume["emptyDir"]["sizeLimit"])
    raise DeriveError(f"no memory emptyDir with a sizeLimit mounted at {SHM_PATH}")


_BINARY_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity with a binary suffix (``2Gi``) or none, in bytes."""
    suffix = quantity[-2:]
    if suffix in _BINARY_SUFFIXES and quantity[:-2].isdigit():
        return int(quantity[:-2]) * _BINARY_SUFFIXES[suffix]
    if quantity.isdigit():
        return int(quantity)
    raise DeriveError(f"not a quantity this script reads: {quantity!r}")


class DeriveError(ValueError):
    """The Deployment does not have the shape this derivation expects (e.g. it was renamed)."""


def _pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _model_repository(container: dict[str, Any]) -> str:
    for arg in container.get("args", []):
        if arg.startswith("--model-repository="):
            return str(arg.split("=", 1)[1])
    raise DeriveError(f"container {container['name']}: no --model-repository= argument")


def derive(deployment: dict[str, Any], *, image: str, replicas: int, models: Path,
           repository: Path | None = None, env: dict[str, str] | None = None,
           unset: frozenset[str] = frozenset(),
           resources: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """The Deployment ``deployment`` (parsed YAML, left unchanged) as `podman kube play` runs it
    on a host without a GPU or a cluster; see the module docstring for each change.

    ``models``: host directory holding ``artifacts/`` (mounted where the PVC was);
    ``repository``: host directory mounted over the server's ``--model-repository``;
    ``env``: values for environment variables the Deployment reads from Secrets (any other
    such variable is dropped when optional or listed in ``unset``, and is an error otherwise).
    """
    if deployment.get("kind") != "Deployment":
        raise DeriveError(f"not a Deployment: {deployment.get('kind')}")
    if replicas < 1:
        raise DeriveError(f"replicas must be at least 1, not {replicas}")
    env = dict(env or {})
    out = copy.deepcopy(deployment)
    out["spec"]["replicas"] = replicas
    spec = _pod_spec(out)

    tolerations = [t for t in spec.get("tolerations", []) if t.get("key") != GPU_RESOURCE]
    if tolerations:
        spec["tolerations"] = tolerations
    else:
        spec.pop("tolerations", None)

    containers = spec.get("initContainers", []) + spec["containers"]
    for container in containers:
        if container["image"].split(":")[0] == IMAGE_NAME:
            container["image"] = image
        kept = []
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref is None:
                kept.append(var)
            elif var["name"] in env:
                kept.append({"name": var["name"], "value": env[var["name"]]})
            elif var["name"] in unset or ref.get("optional"):
                continue
            else:
                raise DeriveError(f"{var['name']} comes from Secret {ref['name']}: give --env "
                                  f"{var['name']}=VALUE or --unset {var['name']}")
        if kept:
            container["env"] = kept
        else:
            container.pop("env", None)

    servers = [c for c in spec["containers"] if c["name"] == SERVER_CONTAINER]
    if len(servers) != 1:
        raise DeriveError(f"expected one container named {SERVER_CONTAINER!r}")
    server = servers[0]
    if GPU_RESOURCE not in server.get("resources", {}).get("limits", {}):
        raise DeriveError(f"the {SERVER_CONTAINER} container asks for no {GPU_RESOURCE}: not the GPU Deployment")
    server["resources"] = copy.deepcopy(resources or CPU_RESOURCES)

    spec["restartPolicy"] = "OnFailure"
    spec["containers"].append({
        "name": KEEP_POD, "image": server["image"], "imagePullPolicy": server.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", "-c", "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                    "signal.pause()"],
        "resources": {"requests": {"cpu": "1m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}}})
    server.pop("ports", None)
    dshm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    if [m["mountPath"] for m in server["volumeMounts"] if m["name"] in {v["name"] for v in dshm}] != [SHM_PATH]:
        raise DeriveError(f"expected one memory emptyDir mounted at {SHM_PATH}")
    spec["volumes"] = [v for v in spec["volumes"] if v not in dshm]
    server["volumeMounts"] = [m for m in server["volumeMounts"] if m["mountPath"] != SHM_PATH]

    volumes = {v["name"]: v for v in spec["volumes"]}
    artifacts = volumes.get(ARTIFACTS_VOLUME)
    if artifacts is None or "persistentVolumeClaim" not in artifacts:
        raise DeriveError(f"no volume {ARTIFACTS_VOLUME!r} from a PersistentVolumeClaim")
    del artifacts["persistentVolumeClaim"]
    artifacts["hostPath"] = {"path": str(Path(models).resolve()), "type": "Directory"}

    if repository is not None:
        spec["volumes"].append({"name": "model-repository",
                                "hostPath": {"path": str(Path(repository).resolve()), "type": "Directory"}})
        server["volumeMounts"].append({"name": "model-repository", "mountPath": _model_repository(server),
                                       "readOnly": True})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", type=Path, default=DEPLOYMENT, help="the Deployment to derive from")
    ap.add_argument("--image", required=True, help="image for the chattts-serving containers")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--models", type=Path, required=True, help="host directory that holds artifacts/")
    ap.add_argument("--repository", type=Path, help="host model repository mounted over the image's")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="value of an environment variable the Deployment reads from a Secret")
    ap.add_argument("--unset", action="append", default=[], metavar="NAME",
                    help="drop an environment variable the Deployment reads from a Secret")
    args = ap.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    try:
        doc = yaml.safe_load(args.deployment.read_text(encoding="utf-8"))
        out = derive(doc, image=args.image, replicas=args.replicas, models=args.models,
                     repository=args.repository, env=env, unset=frozenset(args.unset))
    except DeriveError as exc:
        print(f"kube_play: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump(out, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
