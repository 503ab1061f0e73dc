"""Triton replicas for the deploy tests: one interface, several ways to run a replica.

A :class:`Backend` starts replica ``i`` and hands back a :class:`Replica` (its address and
ports, as a host or pod would have them), and can :meth:`~Backend.kill` it (SIGKILL of
tritonserver: the image's command ``chattts-tritonserver`` then exits 70, as a crash ends a
container), :meth:`~Backend.drain` it (what the Deployment's ``preStop`` runs: ``python -m
chattts_serving.deploy.drain`` against the replica's own metrics, then SIGTERM),
:meth:`~Backend.restart` it (the orchestrator starting it again at the same address) and
:meth:`~Backend.stop` it. Taking a replica out of the balancer before a drain is the balancer's
part (:mod:`.balancer`), as removing a terminating pod from its Service's endpoints is the
control plane's, not the pod's.

Backends: ``netns`` (:class:`NetnsBackend`: each replica the image's command as a process in a
network namespace of its own, on a bridge made here) and ``container``
(:class:`ContainerBackend`: ``docker run`` of the CPU image ``chattts-serving:0.1.0-cpu``). A
backend of another kind (pods of ``podman kube play``) registers a factory in :data:`BACKENDS`.

Every replica serves the same rendered model repository over the same artifacts (the small
generated config: two full-size replicas do not fit two cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from chattts_serving.deploy.admin import TOKEN_ENV, TRITONSERVER_ENV
from chattts_serving.deploy.server import TritonServer, bundled_triton

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
"""Every replica's ports, as in the image and the Deployment (each replica has its own address)."""
IMAGE = "chattts-serving:0.1.0-cpu"
"""The CPU image that ``make image`` builds (the container backend's replicas)."""
READY_TIMEOUT_S = 240.0
"""Longest wait for a replica's ``/v2/health/ready`` after its start, seconds (two replicas
load their models side by side on two cores)."""
STOP_TIMEOUT_S = 60.0
"""Longest wait for a replica's exit after SIGTERM before it is killed, seconds (Triton's exit
timeout, 30 s in the test command, and the unload)."""


class ReplicaError(RuntimeError):
    """A replica could not be started, did not become ready, or its drain failed."""


@dataclass
class Replica:
    """One replica: ``name``, the ``address`` its ports listen on (reachable from this host),
    and whatever its backend keeps of it (``handle``: a process, a container id)."""

    name: str
    index: int
    address: str
    handle: object = None
    log_path: Path | None = None
    exits: list[int] = field(default_factory=list)
    """The exit codes of its past runs (70: a model process or the server died)."""

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{GRPC_PORT}"

    @property
    def http_base(self) -> str:
        return f"http://{self.address}:{HTTP_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{METRICS_PORT}/metrics"

    def ready(self, timeout_s: float = 1.0) -> bool:
        """Triton's readiness (``/v2/health/ready`` is 200), as the balancer checks it."""
        try:
            with urllib.request.urlopen(f"{self.http_base}/v2/health/ready", timeout=timeout_s) as r:
                return int(r.status) == 200
        except OSError:
            return False


class Backend(Protocol):
    """How replicas are run. ``start`` returns once the replica is ready (raises
    :class:`ReplicaError` otherwise); ``kill`` SIGKILLs its tritonserver and returns at once;
    ``drain`` runs the preStop drain in the replica and then stops it with SIGTERM, returning
    the drain's JSON line (a dict); ``wait_exit`` waits for a killed replica's end and returns
    its exit code; ``restart`` starts a stopped replica again at the same address; ``stop``
    ends it (SIGTERM, then SIGKILL); ``close`` ends every replica and undoes every side effect."""

    name: str

    def start(self, index: int) -> Replica: ...
    def kill(self, replica: Replica) -> None: ...
    def wait_exit(self, replica: Replica, timeout_s: float = STOP_TIMEOUT_S) -> int: ...
    def drain(self, replica: Replica, timeout_s: float = 120.0) -> dict[str, object]: ...
    def restart(self, replica: Replica) -> None: ...
    def stop(self, replica: Replica) -> None: ...
    def close(self) -> None: ...


def drain_result(out: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The JSON line that ``chattts_serving.deploy.drain`` prints last; ReplicaError with its
    exit code and stderr when it printed none."""
    try:
        result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ReplicaError(f"drain printed no result ({out.returncode}): {out.stderr[-800:]}") from None
    return result


def _run(*cmd: str, check: bool = True, timeout: float = 60.0,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode:
        raise ReplicaError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc


def _wait_ready(replica: Replica, alive: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not alive():
            raise ReplicaError(f"{replica.name} exited before it was ready: {what()}")
        if replica.ready():
            return
        time.sleep(0.25)
    raise ReplicaError(f"{replica.name} not ready after {READY_TIMEOUT_S:g} s: {what()}")


def _tail(path: Path | None, lines: int = 25) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def server_args(repo: Path, build_dir: Path, address: str = "0.0.0.0", exit_timeout_s: int = 30) -> list[str]:
    """tritonserver's arguments for a replica (those of :class:`TritonServer`, on the fixed
    ports and ``address``), without the binary and the admin restriction flags, which
    ``chattts-tritonserver`` adds itself. Builds the admission gate into ``build_dir`` once."""
    srv = TritonServer(repo, http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
                       build_dir=build_dir, address=address, exit_timeout_s=exit_timeout_s, admin_token="x" * 32)
    return [a for a in srv.command()[1:]
            if not a.startswith(("--http-restricted-api", "--grpc-restricted-protocol"))]


class NetnsBackend:
    """Replicas as processes, each in a network namespace of its own: a veth pair from the
    namespace to a bridge on this host, an address on a /24 of its own (10.231.N.0/24, N from
    this process id), nothing else reachable from inside. The process is the image's command,
    ``python -m chattts_serving.deploy.container`` (``chattts-tritonserver``), running the
    bundled tritonserver on ports 8000-8002 of every interface of its namespace.

    Side effects, undone by :meth:`close` (and by :meth:`__init__` when it fails half way):
    the namespaces ``<tag>r<i>``, the veths ``<tag>h<i>`` (their peers go with the namespace),
    the bridge ``<tag>br``. No forwarding, NAT or iptables rule is needed (only this host talks
    to the replicas)."""

    name = "netns"

    def __init__(self, repo: Path, build_dir: Path, work: Path, admin_token: str) -> None:
        if os.geteuid() != 0:
            raise ReplicaError("network namespaces need root")
        self.repo, self.work, self.admin_token = repo, work, admin_token
        self.tag = f"cht{os.getpid() % 100000}"
        self.subnet = f"10.231.{os.getpid() % 200 + 20}"
        self.bridge = f"{self.tag}br"
        self.namespaces: list[str] = []
        self.replicas: list[Replica] = []
        self.args = server_args(repo, build_dir)
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def _namespace(self, index: int) -> tuple[str, str]:
        ns, host, peer = f"{self.tag}r{index}", f"{self.tag}h{index}", f"{self.tag}n{index}"
        address = f"{self.subnet}.{10 + index}"
        if ns not in self.namespaces:
            _run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "link", "set", host, "master", self.bridge)
            _run("ip", "link", "set", host, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", peer)
            _run("ip", "-n", ns, "link", "set", peer, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns, address

    def _environment(self) -> dict[str, str]:
        env = TritonServer(self.repo, admin_token=self.admin_token).environment()
        env[TRITONSERVER_ENV] = str(bundled_triton() / "bin" / "tritonserver")
        env[TOKEN_ENV] = self.admin_token
        return env

    def _spawn(self, replica: Replica) -> None:
        ns = f"{self.tag}r{replica.index}"
        assert replica.log_path is not None
        with open(replica.log_path, "ab") as log:
            replica.handle = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "chattts_serving.deploy.container", *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=self._environment(), start_new_session=True)
        proc = self._proc(replica)
        _wait_ready(replica, lambda: proc.poll() is None, lambda: _tail(replica.log_path))

    @staticmethod
    def _proc(replica: Replica) -> subprocess.Popen[bytes]:
        assert isinstance(replica.handle, subprocess.Popen)
        return replica.handle

    def start(self, index: int) -> Replica:
        _ns, address = self._namespace(index)
        replica = Replica(f"replica-{index}", index, address, log_path=self.work / f"replica-{index}.log")
        self.replicas.append(replica)
        self._spawn(replica)
        return replica

    def _tritonserver(self, replica: Replica) -> psutil.Process | None:
        proc = self._proc(replica)
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(proc.pid).children(recursive=True):
                if child.name() == "tritonserver":
                    return child
        return None

    def kill(self, replica: Replica) -> None:
        server = self._tritonserver(replica)
        if server is None:
            raise ReplicaError(f"{replica.name} has no tritonserver to kill")
        server.send_signal(signal.SIGKILL)

    def wait_exit(self, replica: Replica, timeout_s: float = STOP_TIMEOUT_S) -> int:
        proc = self._proc(replica)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_all(replica)
            code = proc.wait()
        self._kill_namespace(replica)
        replica.exits.append(code)
        return code

    def drain(self, replica: Replica, timeout_s: float = 120.0) -> dict[str, object]:
        """The Deployment's preStop, run in the replica's namespace against its own metrics,
        then the SIGTERM that the kubelet sends after it; returns the drain's JSON line."""
        ns = f"{self.tag}r{replica.index}"
        out = _run("ip", "netns", "exec", ns, sys.executable, "-m", "chattts_serving.deploy.drain",
                   "--metrics-url", f"http://127.0.0.1:{METRICS_PORT}/metrics", "--timeout-s", f"{timeout_s:g}",
                   check=False, timeout=timeout_s + 30)
        result = drain_result(out)
        self._proc(replica).send_signal(signal.SIGTERM)
        result["exit_code"] = self.wait_exit(replica)
        return result

    def restart(self, replica: Replica) -> None:
        if self._proc(replica).poll() is None:
            raise ReplicaError(f"{replica.name} is still running")
        self._spawn(replica)

    def _kill_namespace(self, replica: Replica) -> None:
        """SIGKILL whatever still runs in the replica's namespace once its command has ended
        (the model processes of a killed server), as a container's end takes all of its
        processes with it."""
        ns = f"{self.tag}r{replica.index}"
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def _kill_all(self, replica: Replica) -> None:
        proc = self._proc(replica)
        with contextlib.suppress(psutil.NoSuchProcess):
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in family:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session: stubs whose server died first

    def stop(self, replica: Replica) -> None:
        if not isinstance(replica.handle, subprocess.Popen) or replica.handle.poll() is not None:
            return
        replica.handle.send_signal(signal.SIGTERM)
        try:
            replica.handle.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill_all(replica)
            replica.handle.wait()
        self._kill_namespace(replica)  # no stub outlives its replica

    def close(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                self.stop(replica)
            with contextlib.suppress(Exception):
                self._kill_namespace(replica)
        for ns in self.namespaces:  # the veth's peer is in it: deleting it deletes the pair
            _run("ip", "netns", "del", ns, check=False)
            host = ns.replace(f"{self.tag}r", f"{self.tag}h")
            if _run("ip", "link", "show", host, check=False).returncode == 0:  # a process held the namespace
                _run("ip", "link", "del", host, check=False)
        self.namespaces.clear()
        _run("ip", "link", "del", self.bridge, check=False)


CONTAINERS_SOCKET = Path(os.environ.get("CONTAINERS_STATE", "/var/lib/chattts-containers")) / "docker.sock"
"""The socket of the Docker engine that ``scripts/containers.sh`` starts (``make image``)."""
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
"""Debian's client, as scripts/containers.sh uses it."""


def docker_env() -> dict[str, str]:
    """This environment, with ``DOCKER_HOST`` at :data:`CONTAINERS_SOCKET` unless it names one."""
    env = dict(os.environ)
    if "DOCKER_HOST" not in env and CONTAINERS_SOCKET.exists():
        env["DOCKER_HOST"] = f"unix://{CONTAINERS_SOCKET}"
    return env


def docker_image_present(image: str = IMAGE) -> bool:
    """Whether ``docker image inspect`` finds ``image`` (a daemon runs and the image is built)."""
    try:
        return subprocess.run([DOCKER, "image", "inspect", image], capture_output=True, timeout=30,
                              env=docker_env()).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class ContainerBackend:
    """Replicas as containers of the CPU image on Docker's default bridge, each with its own
    address (``docker inspect``), running the image's own command; the test's rendered
    repository (its profile changes) mounted over the image's ``/opt/model_repository`` with
    its artifact paths turned into the image's ``/models/artifacts``, where the artifacts are
    mounted; ``/dev/shm`` sized for the Python backend. ``kill`` SIGKILLs the container's
    tritonserver (found from this host: ``docker top``), ``drain`` runs the preStop command with
    ``docker exec`` and then ``docker stop`` (SIGTERM), ``restart`` is ``docker start``.
    :meth:`close` removes the containers."""

    name = "container"

    def __init__(self, repo: Path, artifacts: Path, work: Path, admin_token: str, image: str = IMAGE) -> None:
        self.artifacts, self.work, self.admin_token, self.image = artifacts.resolve(), work, admin_token, image
        self.repo = work / "container-repo"
        shutil.copytree(repo, self.repo, ignore=shutil.ignore_patterns("__pycache__"))
        for config in self.repo.glob("*/config.pbtxt"):  # the paths as the container sees them
            text = config.read_text().replace(f'"{self.artifacts}"', '"/models/artifacts"')
            config.write_text(text.replace(f"{Path(repo).resolve()}/", "/opt/model_repository/"))
        for path in [self.repo, *self.repo.rglob("*")]:  # the image's user (10001) reads it
            path.chmod(0o755 if path.is_dir() else 0o644)
        self.tag = f"chattts-deploy-{os.getpid()}"
        self.replicas: list[Replica] = []

    def _docker(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return _run(DOCKER, *args, check=check, timeout=timeout, env=docker_env())

    def _address(self, replica: Replica) -> str:
        out = self._docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                           str(replica.handle))
        return out.stdout.strip()

    def _running(self, replica: Replica) -> bool:
        out = self._docker("inspect", "-f", "{{.State.Running}}", str(replica.handle), check=False)
        return out.stdout.strip() == "true"

    def _logs(self, replica: Replica) -> str:
        """The container log's model load failures and its last lines."""
        out = self._docker("logs", str(replica.handle), check=False)
        lines = (out.stdout + out.stderr).splitlines()
        failures = [line[:600] for line in lines if "failed to load '" in line][:3]
        return "\n".join([*failures, *lines[-15:]])[-5000:]

    def start(self, index: int) -> Replica:
        name = f"{self.tag}-{index}"
        self._docker("run", "-d", "--name", name, "--shm-size", "1g",
                     "-e", f"{TOKEN_ENV}={self.admin_token}",
                     "-v", f"{self.repo}:/opt/model_repository:ro", "-v", f"{self.artifacts}:/models/artifacts:ro",
                     self.image)
        replica = Replica(f"replica-{index}", index, "", handle=name)
        self.replicas.append(replica)
        replica.address = self._address(replica)
        _wait_ready(replica, lambda: self._running(replica), lambda: self._logs(replica))
        return replica

    def kill(self, replica: Replica) -> None:
        out = self._docker("top", str(replica.handle), "-eo", "pid,comm")
        pids = [int(line.split()[0]) for line in out.stdout.splitlines()[1:] if line.split()[1:] == ["tritonserver"]]
        if not pids:
            raise ReplicaError(f"{replica.name} has no tritonserver to kill")
        os.kill(pids[0], signal.SIGKILL)

    def wait_exit(self, replica: Replica, timeout_s: float = STOP_TIMEOUT_S) -> int:
        out = self._docker("wait", str(replica.handle), timeout=timeout_s)
        code = int(out.stdout.strip() or -1)
        replica.exits.append(code)
        return code

    def drain(self, replica: Replica, timeout_s: float = 120.0) -> dict[str, object]:
        out = self._docker("exec", str(replica.handle), "python3", "-m", "chattts_serving.deploy.drain",
                           "--metrics-url", f"http://127.0.0.1:{METRICS_PORT}/metrics", "--timeout-s", f"{timeout_s:g}",
                           check=False, timeout=timeout_s + 30)
        result = drain_result(out)
        start = time.monotonic()
        self._docker("stop", "-t", f"{STOP_TIMEOUT_S:.0f}", str(replica.handle), timeout=STOP_TIMEOUT_S + 30)
        result["exit_code"] = self.wait_exit(replica)
        result["stop_s"] = round(time.monotonic() - start, 3)
        if result["exit_code"] != 0:  # why, for the failure message and the results file
            result["log_tail"] = self._logs(replica)
        return result

    def restart(self, replica: Replica) -> None:
        self._docker("start", str(replica.handle))
        replica.address = self._address(replica)
        _wait_ready(replica, lambda: self._running(replica), lambda: self._logs(replica))

    def stop(self, replica: Replica) -> None:
        self._docker("stop", "-t", f"{STOP_TIMEOUT_S:.0f}", str(replica.handle), check=False,
                     timeout=STOP_TIMEOUT_S + 30)

    def close(self) -> None:
        for replica in self.replicas:
            self._docker("rm", "-f", str(replica.handle), check=False)


BackendFactory = Callable[[Path, Path, Path, Path, str], Backend]
"""``factory(repo, artifacts, build_dir, work, admin_token)``: a backend of one kind."""

BACKENDS: dict[str, BackendFactory] = {
    "netns": lambda repo, _artifacts, build, work, token: NetnsBackend(repo, build, work, token),
    "container": lambda repo, artifacts, _build, work, token: ContainerBackend(repo, artifacts, work, token),
}
"""The backends by name (``CHATTTS_DEPLOY_BACKENDS`` picks among them; other modules add theirs)."""
