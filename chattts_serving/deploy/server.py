"""The ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel, run as a process.

The wheel ships Triton 2.51 with the Python backend and a backend stub per Python version.
:class:`TritonServer` builds a backend directory of symlinks (the stub for this interpreter
next to ``libtriton_python.so``), puts this virtual environment's ``bin/`` first on the
server's PATH (the stub runs ``python3`` from there, so it sees this venv's site-packages),
starts the server, waits for ``/v2/health/ready`` and stops it with SIGINT (then SIGKILL).
The stub runs Python isolated (PYTHONPATH is ignored), hence the PATH. Its admin APIs
(logging, trace, shared memory, model repository, statistics) need the header of
:mod:`chattts_serving.deploy.admin`. ``chattts-serve`` (:mod:`.serve`) runs one under a
:class:`~chattts_serving.deploy.supervisor.Supervisor`.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from .. import contract
from ..client.keys import inference_key_from_env
from .admin import inference_restriction_args, new_token, restriction_args, token_from_env
from .gate import GateBuildError, build_gate, sanitizer_runtime
from .loglevels import cuda_driver_present, filter_command

SHM_GLOB = "/dev/shm/triton_python_backend_shm_region_*"
SHM_SWEEP_WAIT_S = 5.0
"""How long a stop waits for the stopped server's stubs to let go of their shared-memory
regions (a killed stub lives on a moment); regions still held then are left (another
server's, or a stub that will not die)."""
STUB_NAME = "triton_python_backend_stub"
LOOPBACK = "127.0.0.1"
"""The address a server binds by default: reachable from this host only."""
WILDCARDS = ("0.0.0.0", "::", "")
"""Bind addresses that mean every interface (reached here through loopback)."""


def cpu_host_args() -> tuple[str, ...]:
    """Flags for a host without a CUDA driver: no pinned-memory pool (it needs CUDA; asking
    for one logs a warning at every start, and the server does without)."""
    return () if cuda_driver_present() else ("--pinned-memory-pool-byte-size=0",)


class ServerError(RuntimeError):
    """tritonserver could not be found, started, or did not become ready."""


def bundled_triton() -> Path:
    """Directory of the bundled server (``bin/tritonserver``, ``backends/python``, stubs)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError("nvidia-pytriton is not installed: run `make setup`")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise ServerError(f"no tritonserver binary under {root}")
    return root


def uses_gate(repo: Path) -> bool:
    """Whether a model of the repository ``repo`` runs on the admission gate's backend."""
    marker = f'backend: "{contract.GATE_BACKEND}"'
    return any(marker in cfg.read_text() for cfg in Path(repo).glob("*/config.pbtxt"))


def backend_dir(build_dir: Path, gate: bool = False, sanitize: bool = False) -> Path:
    """A backend directory whose ``python/`` holds the Python backend and this Python's stub,
    and, with ``gate``, ``chattts_gate/`` the admission gate (built if needed: :mod:`.gate`).
    With ``sanitize`` the gate is a sanitizer build and the stub a script that starts it without
    the sanitizer runtime tritonserver preloads (the stubs are not instrumented, and Python's
    allocator is no business of this check). Raises ServerError when the gate cannot be built."""
    root = bundled_triton()
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"the bundled Triton has no Python backend stub for Python {ver}")
    py = build_dir / "backends" / "python"
    py.mkdir(parents=True, exist_ok=True)
    for src in (root / "backends" / "python" / "libtriton_python.so",
                root / "backends" / "python" / "triton_python_backend_utils.py", stub):
        link = py / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    if sanitize:
        wrapper = py / stub.name
        wrapper.unlink()
        wrapper.write_text(f'#!/bin/sh\nunset LD_PRELOAD\nexec "{stub}" "$@"\n')
        wrapper.chmod(0o755)
    if gate:
        try:
            build_gate(build_dir / "backends", sanitize=sanitize)
        except GateBuildError as exc:
            raise ServerError(str(exc)) from None
    return build_dir / "backends"


def _region_in_use(path: str) -> bool:
    """True when some live process maps or holds the shared-memory file ``path``."""
    name = os.path.basename(path)
    for proc in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):
            if name in Path(proc, "cmdline").read_bytes().decode(errors="replace"):
                return True
    return False


def connect_host(address: str) -> str:
    """The host to reach a server bound to ``address`` from this machine (loopback for a
    wildcard, bracketed when IPv6)."""
    host = LOOPBACK if address in WILDCARDS else address
    return f"[{host}]" if ":" in host else host


def _ready(http_port: int, metrics_port: int, host: str = LOOPBACK) -> bool:
    """Triton answers ready on ``http_port`` and its metrics port accepts connections: the
    metrics service starts a few tens of milliseconds after the HTTP service (measured: 42 ms),
    and a scrape in between is refused. ``host``: :func:`connect_host`'s."""
    try:
        with urllib.request.urlopen(f"http://{host}:{http_port}/v2/health/ready", timeout=1) as r:
            if r.status != 200:
                return False
        with socket.create_connection((host.strip("[]"), metrics_port), timeout=1):
            return True
    except OSError:
        return False


def stub_processes(server_pid: int) -> dict[int, str]:
    """The live Python-backend stub processes of the tritonserver ``server_pid``: process id ->
    model (the model directory's name, e.g. ``chattts_gpt``; one process per model instance).
    Zombies (killed, not yet reaped) do not count; empty when the server is gone."""
    try:
        children = psutil.Process(server_pid).children()
    except psutil.Error:
        return {}
    pids: dict[int, str] = {}
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if not cmd or Path(cmd[0]).name != STUB_NAME:
            continue
        model_py = next((a for a in cmd[1:] if a.endswith("model.py")), None)
        pids[child.pid] = Path(model_py).parent.parent.name if model_py else "?"
    return pids


class TritonServer:
    """A tritonserver process on a model repository; a context manager.

    Ports are TCP ports (HTTP, gRPC, metrics) bound on ``address`` (default loopback,
    :data:`LOOPBACK`; ``0.0.0.0`` for every interface); ``log_path`` receives the server's
    stdout and stderr. ``inference_key``: inference needs the header of
    :data:`~chattts_serving.client.keys.INFERENCE_HEADER` with this value (default: the
    configured one, ``$CHATTTS_INFERENCE_KEY`` or its file; None: inference is open). Models
    are loaded explicitly (all at start), so that the admin token's ``model-repository`` API
    can load and unload them. The admin APIs are always restricted: ``admin_token`` is the
    header's value, by default the configured one (``$CHATTTS_ADMIN_TOKEN`` or the token file,
    :mod:`chattts_serving.deploy.admin`) or one generated for this object and kept nowhere
    (``admin_token_generated``); restarts keep it. ``sanitize``: the admission gate built with
    AddressSanitizer and UndefinedBehaviorSanitizer, their runtime loaded into tritonserver
    (``make soak SANITIZE=1``). Raises AdminTokenError when the configured token is unusable,
    OSError when its file cannot be read.
    """

    def __init__(self, repo: Path, *, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                 log_path: Path | None = None, build_dir: Path = Path("build"), exit_timeout_s: int = 10,
                 extra_args: tuple[str, ...] = (), admin_token: str | None = None, sanitize: bool = False,
                 address: str = LOOPBACK, inference_key: str | None = None) -> None:
        self.repo = Path(repo).resolve()
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.log_path = log_path
        self.build_dir = Path(build_dir).resolve()
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = extra_args
        self.sanitize = sanitize
        configured = admin_token or token_from_env()
        self.admin_token = configured or new_token()
        self.admin_token_generated = configured is None
        self.address = address
        self.inference_key = inference_key or inference_key_from_env()
        self._restriction = restriction_args(self.admin_token) + inference_restriction_args(self.inference_key)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: object | None = None
        self._filter: subprocess.Popen[bytes] | None = None
        """The process between the server and its log on a host without a CUDA driver (:meth:`_spawn`)."""
        self._shm_before: set[str] = set()
        self.starts = 0
        """Successful and failed start attempts so far (a restart appends to the log file)."""
        self.expect_fatal = False
        """Set by whoever breaks this server on purpose (fault tests): crash signs in its log
        (:mod:`~chattts_serving.deploy.logscan`) are then expected, not reported."""

    def command(self) -> list[str]:
        root = bundled_triton()
        return [str(root / "bin" / "tritonserver"), f"--model-repository={self.repo}",
                f"--backend-directory={backend_dir(self.build_dir, uses_gate(self.repo), self.sanitize)}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}", f"--http-address={self.address}",
                f"--grpc-address={self.address}", f"--metrics-address={self.address}",
                "--model-control-mode=explicit", "--load-model=*",
                "--allow-metrics=true", "--allow-gpu-metrics=false",
                "--metrics-config=summary_latencies=true",
                "--disable-auto-complete-config", f"--exit-timeout-secs={self.exit_timeout_s}",
                "--log-verbose=0", *self._restriction, *cpu_host_args(), *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The server's environment: this one with this venv's ``bin/`` first on PATH (the
        stubs run its ``python3``), the interpreter's libpython found, and, with ``sanitize``,
        the sanitizer runtime preloaded. Raises ServerError when that runtime is missing."""
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("OMP_NUM_THREADS", "1")
        # The stub links libpython3.X dynamically; point it at the library of the interpreter
        # this venv was made from, so that its stdlib extension modules match (a pyenv
        # 3.11.7 stdlib under Debian's 3.11.2 libpython fails to import _ssl).
        libdir = sysconfig.get_config_var("LIBDIR")
        ldlib = sysconfig.get_config_var("LDLIBRARY")
        if libdir and ldlib and (Path(libdir) / ldlib).exists():
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
        if self.sanitize:
            # The gate's sanitizer build needs the runtime loaded first; its reports go to the
            # server log, where the log scan (deploy/logscan.py) finds them. Leaks are not
            # checked: tritonserver frees little at exit by design.
            try:
                env["LD_PRELOAD"] = sanitizer_runtime()
            except GateBuildError as exc:
                raise ServerError(str(exc)) from None
            env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:halt_on_error=1"
            env["UBSAN_OPTIONS"] = "print_stacktrace=1"
        return env

    def start(self, ready_timeout_s: float = 180.0) -> TritonServer:
        """Start and wait until ready. Raises ServerError with the log's tail on failure, and at
        once when a port is already taken."""
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
            with socket.socket(family) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.address or "0.0.0.0", port))
                except OSError as exc:
                    why = "already in use (another server?)" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
                    raise ServerError(f"port {port} on {self.address or '0.0.0.0'}: {why}") from None
        env = self.environment()
        # The first start truncates the log; a restart appends, so the crash stays on record.
        out = open(self.log_path, "ab" if self.starts else "wb") if self.log_path else None  # noqa: SIM115
        self.starts += 1
        self._log = out
        self._shm_before = set(glob.glob(SHM_GLOB))
        self.proc = self._spawn(env, out)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._end_filter()  # the log is whole before its tail is read
                raise ServerError(f"tritonserver exited with {self.proc.returncode}{self._tail()}")
            if _ready(self.http_port, self.metrics_port, connect_host(self.address)):
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"tritonserver not ready after {ready_timeout_s:.0f} s{self._tail()}")

    def _spawn(self, env: dict[str, str], out: IO[bytes] | None) -> subprocess.Popen[bytes]:
        """Start tritonserver, its output to ``out`` (None: this process's stdout). On a host
        without a CUDA driver the output passes through :mod:`.loglevels`, which re-levels the
        two errors every start there logs (docs/triton-workarounds.md, "CUDA errors on a CPU
        host"); the filter has a session of its own and ends at the server's last line."""
        cmd = self.command()
        if cuda_driver_present():
            self._filter = None
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        read, write = os.pipe()
        try:
            self._filter = subprocess.Popen(filter_command(), stdin=read, stdout=out, start_new_session=True)
            return subprocess.Popen(cmd, stdout=write, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except BaseException:
            os.close(write)
            write = -1
            self._end_filter()
            raise
        finally:  # the server and its stubs hold the only write ends: the filter's input ends with them
            os.close(read)
            if write >= 0:
                os.close(write)

    def _end_filter(self, timeout_s: float = 5.0) -> None:
        """Wait until the log filter has written the server's last line (its input ended with
        the server's process group), then reap it; killed after ``timeout_s``."""
        if self._filter is None:
            return
        try:
            self._filter.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._filter.kill()
            self._filter.wait()
        self._filter = None

    def _tail(self, lines: int = 30) -> str:
        if not self.log_path or not Path(self.log_path).is_file():
            return ""
        text = Path(self.log_path).read_text(errors="replace").splitlines()[-lines:]
        return "\n--- tritonserver log (tail) ---\n" + "\n".join(text)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT, wait up to ``timeout_s``, then SIGKILL the process group; remove shared
        memory regions a killed server leaves behind."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # A server that hit its exit timeout leaves stub processes behind in its process
        # group (and their shared-memory regions): end them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        left = set(glob.glob(SHM_GLOB)) - self._shm_before
        deadline = time.monotonic() + SHM_SWEEP_WAIT_S
        while left:  # a stub just killed may live on a moment with its region mapped: wait for it
            for f in [f for f in left if not _region_in_use(f)]:
                with contextlib.suppress(OSError):
                    os.unlink(f)
                left.discard(f)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self._end_filter()
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
        self.proc = None

    def restart(self, stop_timeout_s: float = 30.0, ready_timeout_s: float = 180.0) -> TritonServer:
        """:meth:`stop` then :meth:`start` on the same ports and repository. Raises ServerError
        as :meth:`start` does."""
        self.stop(stop_timeout_s)
        return self.start(ready_timeout_s)

    def stub_pids(self) -> dict[int, str]:
        """Live Python-backend stub processes of this server (:func:`stub_processes`); empty
        when the server is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return {}
        return stub_processes(self.proc.pid)

    def stub_counts(self) -> Counter[str]:
        """Live stub processes per model (:meth:`stub_pids`)."""
        return Counter(self.stub_pids().values())

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
