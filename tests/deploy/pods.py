"""Replicas as pods of the shipped Deployment, run by ``podman kube play`` (no cluster here).

:class:`PodBackend` is a backend of :mod:`.fleet`'s interface (``"pod"`` in
:data:`~.fleet.BACKENDS`). Its pods come from ``docker/k8s/deployment.yaml`` itself, changed only
where a cluster is missing (``scripts/kube_play.py``: the CPU image, no GPU, the artifacts'
claim as a host directory, no Secrets) plus the fleet's own rendered repository mounted over the
image's (its small admission limit): one ``kube play`` starts every replica at once, as a
Deployment's rollout does, each pod with its own address on podman's bridge.

What the kubelet would do is done here by hand: ``kill`` SIGKILLs the server container's
tritonserver (found with ``podman top``), after which the image's command exits 70 and podman
restarts the container (the pod's ``restartPolicy: Always``); ``drain`` runs the container's
``preStop`` command with ``podman exec``, then ``podman stop`` (SIGTERM, the grace period);
``restart`` starts it again in the same pod, at the same address.

podman runs with ``scripts/podman.sh``'s configuration (runc, default ulimits, its own state
directory); the CPU image is copied from dockerd when podman does not have it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from chattts_serving.deploy.render import PROFILE_JSON, render_repository
from chattts_serving.serving.profile import Profile
from tests.support.servers import ROOT

from .fleet import BACKENDS, IMAGE, METRICS_PORT, STOP_TIMEOUT_S, Replica, ReplicaError, _wait_ready, drain_result

PODMAN_SH = ROOT / "scripts" / "podman.sh"
DEPLOYMENT = ROOT / "docker" / "k8s" / "deployment.yaml"
CONTAINER = "triton"
"""The Deployment's server container."""
MODELS_MOUNT = Path("/models")
"""Where the Deployment mounts the artifacts' volume (the server reads ``/models/artifacts``)."""
REPOSITORY_MOUNT = "/opt/model_repository"
"""The image's model repository (the Deployment's ``--model-repository``)."""
PLAY_DIR = ROOT / "build" / "test" / "k8s"
"""Host files the pods mount: readable by the pods' user (10001), unlike pytest's 0700 temp dirs."""


def _kube_play_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kube_play", ROOT / "scripts" / "kube_play.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def podman(*args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """podman with scripts/podman.sh's configuration."""
    proc = subprocess.run([str(PODMAN_SH), "podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise ReplicaError(f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc


def podman_sh(*args: str, timeout: float = 900.0,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """scripts/podman.sh start|load|stop (``env``: added to this process's environment)."""
    proc = subprocess.run([str(PODMAN_SH), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if proc.returncode:
        raise ReplicaError(f"scripts/podman.sh {' '.join(args)} failed ({proc.returncode}): "
                           f"{(proc.stdout + proc.stderr).strip()[-800:]}")
    return proc


def _readable(path: Path) -> None:
    """``path`` and everything under it readable (and directories searchable) by any user."""
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))


class PodBackend:
    """Replicas as the pods of one ``podman kube play`` of the derived Deployment. The first
    :meth:`start` plays it with ``replicas`` pods and waits for pod 0; later starts wait for
    their pod. ``play_s`` is the time from ``kube play`` until every pod started so far was
    ready (the pods' start-up time)."""

    name = "pod"

    def __init__(self, repo: Path, artifacts: Path, work: Path, admin_token: str, image: str = IMAGE,
                 replicas: int = 2) -> None:
        self.work, self.admin_token, self.image, self.replicas_wanted = work, admin_token, image, replicas
        self.replicas: list[Replica] = []
        self.played_at: float | None = None
        self.play_s: float | None = None
        self.play_yaml = work / "kube-play.yaml"
        self.load_s: float | None = None
        self.kube_play = _kube_play_module()
        self.shipped = yaml.safe_load(DEPLOYMENT.read_text())
        # each pod's /dev/shm: podman's own tmpfs, as large as the Deployment's emptyDir
        self.shm_bytes = self.kube_play.quantity_bytes(self.kube_play.shm_size_limit(self.shipped))
        podman_sh("start", env={"CHATTTS_PODMAN_SHM_SIZE": str(self.shm_bytes)})
        try:
            self._prepare(repo, artifacts)
        except BaseException:
            podman_sh("stop")
            raise

    def _prepare(self, repo: Path, artifacts: Path) -> None:
        started = time.monotonic()
        podman_sh("load", self.image)
        self.load_s = time.monotonic() - started
        # The artifacts in a directory of their own as /models holds them, and the fleet's
        # repository re-rendered for the artifacts' path inside the pod.
        if PLAY_DIR.exists():
            shutil.rmtree(PLAY_DIR)
        self.models = PLAY_DIR / "models"
        shutil.copytree(artifacts, self.models / "artifacts")
        profile = Profile.model_validate_json((repo / PROFILE_JSON).read_text())
        self.repo = PLAY_DIR / "repository"
        render_repository(profile, MODELS_MOUNT / "artifacts", self.repo)
        # The configs name files of the repository by the path it was rendered at; in the pod
        # it is mounted where the server's --model-repository says.
        for config in self.repo.glob("*/config.pbtxt"):
            config.write_text(config.read_text().replace(str(self.repo.resolve()), REPOSITORY_MOUNT))
        _readable(PLAY_DIR)
        for parent in PLAY_DIR.parents:  # the path to it searchable by the pods' user
            if parent == Path("/"):
                break
            parent.chmod(parent.stat().st_mode | 0o111)
        doc = self.kube_play.derive(self.shipped, image=self.image,
                               replicas=self.replicas_wanted, models=self.models, repository=self.repo,
                               env={"CHATTTS_ADMIN_TOKEN": self.admin_token},
                               unset=frozenset({"CHATTTS_INFERENCE_KEY"}))
        self.deployment = doc
        self.play_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))

    @staticmethod
    def pod_name(index: int) -> str:
        """podman names a Deployment's pods ``<name>-pod-<i>`` and their containers
        ``<pod>-<container>``."""
        return f"chattts-triton-pod-{index}"

    def container(self, replica: Replica) -> str:
        return f"{self.pod_name(replica.index)}-{CONTAINER}"

    def inspect(self, replica: Replica) -> dict[str, Any]:
        out = podman("container", "inspect", self.container(replica))
        data: list[dict[str, Any]] = json.loads(out.stdout)
        return data[0]

    def _address(self, replica: Replica) -> str:
        out = podman("pod", "inspect", self.pod_name(replica.index))
        info = json.loads(out.stdout)
        infra = (info[0] if isinstance(info, list) else info)["InfraContainerID"]
        net = json.loads(podman("container", "inspect", infra).stdout)[0]["NetworkSettings"]
        address = net.get("IPAddress") or next(iter(net["Networks"].values()))["IPAddress"]
        return str(address)

    def _running(self, replica: Replica) -> bool:
        return bool(self.inspect(replica)["State"]["Running"])

    def logs(self, replica: Replica, lines: int = 25) -> str:
        out = podman("logs", "--tail", str(lines), self.container(replica), check=False)
        return (out.stdout + out.stderr)[-3000:]

    def start(self, index: int) -> Replica:
        if self.played_at is None:
            self.played_at = time.monotonic()
            podman("kube", "play", str(self.play_yaml), timeout=300)
        replica = Replica(f"replica-{index}", index, "", handle=self.pod_name(index))
        replica.address = self._address(replica)
        self.replicas.append(replica)
        _wait_ready(replica, lambda: self._alive(replica), lambda: self.logs(replica))
        self.play_s = time.monotonic() - self.played_at
        return replica

    def _alive(self, replica: Replica) -> bool:
        state = self.inspect(replica)["State"]
        # podman restarts a container that exited (restartPolicy: Always); while its init
        # container waits, the server container has not started yet.
        return bool(state["Running"]) or state.get("Status") in {"created", "initialized", "configured"}

    def _tritonserver_pid(self, replica: Replica) -> int:
        out = podman("top", self.container(replica), "hpid", "comm")
        for line in out.stdout.splitlines()[1:]:
            fields = line.split()
            if fields[1:] == ["tritonserver"]:
                return int(fields[0])
        raise ReplicaError(f"{replica.name} has no tritonserver to kill")

    def kill(self, replica: Replica) -> None:
        state = self.inspect(replica)["State"]
        replica.handle = (state["Pid"], datetime.now(timezone.utc).isoformat())
        os.kill(self._tritonserver_pid(replica), signal.SIGKILL)

    def wait_exit(self, replica: Replica, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """The exit code of the run that ended (podman may already have restarted it)."""
        before = replica.handle if isinstance(replica.handle, tuple) else None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.inspect(replica)["State"]
            if not state["Running"] or (before is not None and state["Pid"] != before[0]):
                code = self._last_exit_code(replica, state)
                replica.exits.append(code)
                return code
            time.sleep(0.1)
        raise ReplicaError(f"{replica.name} did not exit within {timeout_s:g} s")

    def _last_exit_code(self, replica: Replica, state: dict[str, Any]) -> int:
        if not state["Running"]:
            return int(state["ExitCode"])
        # restarted already: the exit is in podman's events ("died", with its exit code)
        since = replica.handle[1] if isinstance(replica.handle, tuple) else "10m"
        deadline = time.monotonic() + 10
        while True:
            out = podman("events", "--stream=false", "--since", since, "--filter",
                         f"container={self.container(replica)}", "--filter", "event=died", "--format", "json")
            codes = [json.loads(line).get("ContainerExitCode") for line in out.stdout.splitlines() if line.strip()]
            codes = [c for c in codes if c is not None]
            if codes:
                return int(codes[-1])
            if time.monotonic() > deadline:
                raise ReplicaError(f"{replica.name} restarted but podman recorded no exit code")
            time.sleep(0.2)

    def drain(self, replica: Replica, timeout_s: float = 120.0) -> dict[str, object]:
        """The container's preStop command (from the Deployment) in the container, then the
        SIGTERM of ``podman stop``; returns the drain's JSON line with ``exit_code``."""
        (server,) = [c for c in self.deployment["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER]
        command = list(server["lifecycle"]["preStop"]["exec"]["command"])
        command[command.index("--timeout-s") + 1] = f"{timeout_s:g}"
        assert f":{METRICS_PORT}/" in command[command.index("--metrics-url") + 1]
        out = podman("exec", self.container(replica), *command, check=False, timeout=timeout_s + 30)
        result = drain_result(out)
        replica.handle = None
        podman("stop", "-t", f"{STOP_TIMEOUT_S:.0f}", self.container(replica), timeout=STOP_TIMEOUT_S + 30)
        result["exit_code"] = self.wait_exit(replica)
        return result

    def restart(self, replica: Replica) -> None:
        """Start it again in its pod (after a crash podman may have done so already: the
        played pods' restart policy is OnFailure)."""
        deadline = time.monotonic() + 5
        while not self._running(replica) and time.monotonic() < deadline:
            if self.inspect(replica)["State"]["ExitCode"] == 0:
                break  # a clean stop: nothing restarts it
            time.sleep(0.1)
        if not self._running(replica):
            started = podman("start", self.container(replica), check=False)
            if started.returncode and not self._running(replica):
                raise ReplicaError(f"podman start {self.container(replica)}: {started.stderr.strip()[-800:]}")
        _wait_ready(replica, lambda: self._alive(replica), lambda: self.logs(replica))
        if self._address(replica) != replica.address:
            raise ReplicaError(f"{replica.name} came back at another address")

    def stop(self, replica: Replica) -> None:
        podman("stop", "-t", f"{STOP_TIMEOUT_S:.0f}", self.container(replica), check=False,
               timeout=STOP_TIMEOUT_S + 30)

    def close(self) -> None:
        if self.played_at is not None:
            podman("kube", "down", str(self.play_yaml), check=False, timeout=STOP_TIMEOUT_S * 2 + 30)
        podman_sh("stop")
        if PLAY_DIR.exists():
            shutil.rmtree(PLAY_DIR)


BACKENDS.setdefault("pod", lambda repo, artifacts, _build, work, token: PodBackend(repo, artifacts, work, token))
