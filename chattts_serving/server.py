"""``chattts-serve``: run the ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel.

The wheel ships Triton 2.51 with the Python backend and a backend stub per Python version.
:class:`TritonServer` builds a backend directory of symlinks (the stub for this interpreter
next to ``libtriton_python.so``), puts this virtual environment's ``bin/`` first on the
server's PATH (the stub runs ``python3`` from there, so it sees this venv's site-packages),
starts the server, waits for ``/v2/health/ready`` and stops it with SIGINT (then SIGKILL).
See ../shared/TRITON.md for why each step is needed.
"""

from __future__ import annotations

import argparse
import contextlib
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
from pathlib import Path
from types import TracebackType

from .profile import ProfileError, load_profile
from .render import RenderError, render_repository

SHM_GLOB = "/dev/shm/triton_python_backend_shm_region_*"


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


def backend_dir(build_dir: Path) -> Path:
    """A backend directory whose ``python/`` holds the Python backend and this Python's stub."""
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
    return build_dir / "backends"


def _region_in_use(path: str) -> bool:
    """True when some live process maps or holds the shared-memory file ``path``."""
    name = os.path.basename(path)
    for proc in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):
            if name in Path(proc, "cmdline").read_bytes().decode(errors="replace"):
                return True
    return False


def _ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class TritonServer:
    """A tritonserver process on a model repository; a context manager.

    Ports are TCP ports on 127.0.0.1 (HTTP, gRPC, metrics); ``log_path`` receives the
    server's stdout and stderr.
    """

    def __init__(self, repo: Path, *, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                 log_path: Path | None = None, build_dir: Path = Path("build"), exit_timeout_s: int = 10,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.repo = Path(repo).resolve()
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.log_path = log_path
        self.build_dir = Path(build_dir).resolve()
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: object | None = None
        self._shm_before: set[str] = set()

    def command(self) -> list[str]:
        root = bundled_triton()
        return [str(root / "bin" / "tritonserver"), f"--model-repository={self.repo}",
                f"--backend-directory={backend_dir(self.build_dir)}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}", "--allow-metrics=true", "--allow-gpu-metrics=false",
                "--metrics-config=summary_latencies=true",
                "--disable-auto-complete-config", f"--exit-timeout-secs={self.exit_timeout_s}",
                "--log-verbose=0", *self.extra_args]

    def start(self, ready_timeout_s: float = 180.0) -> TritonServer:
        """Start and wait until ready. Raises ServerError with the log's tail on failure, and at
        once when a port is already taken."""
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    raise ServerError(f"port {port} is already in use (another server?)") from None
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
        out = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115
        self._log = out
        self._shm_before = set(glob.glob(SHM_GLOB))
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"tritonserver exited with {self.proc.returncode}{self._tail()}")
            if _ready(self.http_port):
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"tritonserver not ready after {ready_timeout_s:.0f} s{self._tail()}")

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
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # A server that hit its exit timeout leaves stub processes behind in its process
        # group (and their shared-memory regions): end them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for f in set(glob.glob(SHM_GLOB)) - self._shm_before:
            if not _region_in_use(f):
                with contextlib.suppress(OSError):
                    os.unlink(f)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
        self.proc = None

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chattts-serve", description="Render the model repository and serve it "
                                 "with the bundled tritonserver until Ctrl-C.")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/small"))
    ap.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--log", type=Path, default=None, help="server log file (default: this terminal)")
    args = ap.parse_args(argv)
    if not (args.artifacts / "manifest.json").is_file():
        print(f"chattts-serve: error: no exported artifacts in {args.artifacts} (no manifest.json): run "
              "`make export` or pass --artifacts DIR", file=sys.stderr)
        return 2
    try:
        render_repository(load_profile(args.profile), args.artifacts, args.repo)
    except (ProfileError, RenderError, FileNotFoundError) as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 2
    server = TritonServer(args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, log_path=args.log)

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM (systemd, docker stop, kill) and SIGINT stop the server like Ctrl-C; a shell
    # starts background jobs with SIGINT ignored, so restore its handler explicitly.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        server.start()
        print(f"chattts-serve: ready (HTTP {args.http_port}, gRPC {args.grpc_port}, metrics {args.metrics_port});"
              " Ctrl-C stops", flush=True)
        assert server.proc is not None
        server.proc.wait()
        return server.proc.returncode if server.proc else 0
    except KeyboardInterrupt:
        print("chattts-serve: stopping", flush=True)
        return 0
    except ServerError as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
