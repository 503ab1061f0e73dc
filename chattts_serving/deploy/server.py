"""``chattts-serve``: run the ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel.

The wheel ships Triton 2.51 with the Python backend and a backend stub per Python version.
:class:`TritonServer` builds a backend directory of symlinks (the stub for this interpreter
next to ``libtriton_python.so``), puts this virtual environment's ``bin/`` first on the
server's PATH (the stub runs ``python3`` from there, so it sees this venv's site-packages),
starts the server, waits for ``/v2/health/ready`` and stops it with SIGINT (then SIGKILL).
The stub runs Python isolated (PYTHONPATH is ignored), hence the PATH. Its admin APIs
(logging, trace, shared memory, model repository, statistics) need the header of
:mod:`chattts_serving.deploy.admin`.

:class:`Supervisor` (``chattts-serve --restart-on-failure``) restarts the server when one of
its model processes dies or the deep probe (:mod:`chattts_serving.deploy.probe`) keeps failing:
Triton 2.51 neither restarts a dead Python-backend stub nor reports it in its health
(docs/triton-workarounds.md, "stuck model, nobody says so").
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
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from .. import contract
from ..serving.logs import log_event
from ..serving.profile import HealthProfile, ProfileError, load_profile
from .admin import (
    ADMIN_HEADER,
    RESTRICTED_APIS,
    TOKEN_ENV,
    AdminTokenError,
    new_token,
    publish,
    restriction_args,
    token_from_env,
)
from .gate import GateBuildError, build_gate, sanitizer_runtime
from .logscan import LogScanner
from .probe import ProbeResult, probe
from .render import RenderError, render_repository

SHM_GLOB = "/dev/shm/triton_python_backend_shm_region_*"
STUB_NAME = "triton_python_backend_stub"


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


def _ready(http_port: int, metrics_port: int) -> bool:
    """Triton answers ready on ``http_port`` and its metrics port accepts connections: the
    metrics service starts a few tens of milliseconds after the HTTP service (measured: 42 ms),
    and a scrape in between is refused."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as r:
            if r.status != 200:
                return False
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=1):
            return True
    except OSError:
        return False


class TritonServer:
    """A tritonserver process on a model repository; a context manager.

    Ports are TCP ports on 127.0.0.1 (HTTP, gRPC, metrics); ``log_path`` receives the
    server's stdout and stderr. The admin APIs are always restricted: ``admin_token`` is the
    header's value, by default the configured one (``$CHATTTS_ADMIN_TOKEN`` or the token file,
    :mod:`chattts_serving.deploy.admin`) or one generated for this object and kept nowhere
    (``admin_token_generated``); restarts keep it. ``sanitize``: the admission gate built with
    AddressSanitizer and UndefinedBehaviorSanitizer, their runtime loaded into tritonserver
    (``make soak SANITIZE=1``). Raises AdminTokenError when the configured token is unusable,
    OSError when its file cannot be read.
    """

    def __init__(self, repo: Path, *, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                 log_path: Path | None = None, build_dir: Path = Path("build"), exit_timeout_s: int = 10,
                 extra_args: tuple[str, ...] = (), admin_token: str | None = None, sanitize: bool = False) -> None:
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
        self._restriction = restriction_args(self.admin_token)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: object | None = None
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
                f"--metrics-port={self.metrics_port}", "--allow-metrics=true", "--allow-gpu-metrics=false",
                "--metrics-config=summary_latencies=true",
                "--disable-auto-complete-config", f"--exit-timeout-secs={self.exit_timeout_s}",
                "--log-verbose=0", *self._restriction, *self.extra_args]

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
        # The first start truncates the log; a restart appends, so the crash stays on record.
        out = open(self.log_path, "ab" if self.starts else "wb") if self.log_path else None  # noqa: SIM115
        self.starts += 1
        self._log = out
        self._shm_before = set(glob.glob(SHM_GLOB))
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"tritonserver exited with {self.proc.returncode}{self._tail()}")
            if _ready(self.http_port, self.metrics_port):
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

    def restart(self, stop_timeout_s: float = 30.0, ready_timeout_s: float = 180.0) -> TritonServer:
        """:meth:`stop` then :meth:`start` on the same ports and repository. Raises ServerError
        as :meth:`start` does."""
        self.stop(stop_timeout_s)
        return self.start(ready_timeout_s)

    def stub_counts(self) -> Counter[str]:
        """Live Python-backend stub processes of this server, counted per model (the model
        directory's name, e.g. ``chattts_gpt``; one per model instance). Empty when the server
        is not running. Zombies (killed, not yet reaped) do not count."""
        if self.proc is None or self.proc.poll() is not None:
            return Counter()
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return Counter()
        counts: Counter[str] = Counter()
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
            counts[Path(model_py).parent.parent.name if model_py else "?"] += 1
        return counts

    def supervise(self, health: HealthProfile, stop: threading.Event | None = None) -> None:
        """Run a :class:`Supervisor` over this (started) server until ``stop`` is set. Raises
        ServerError when a restart fails."""
        Supervisor(self, health).run(stop)

    @contextlib.contextmanager
    def supervised(self, health: HealthProfile) -> Iterator[Supervisor]:
        """A :class:`Supervisor` over this (started) server on a thread of its own for the
        duration of the ``with`` block (``chattts-demo``); a failed restart is logged by it."""
        stop = threading.Event()
        sup = Supervisor(self, health)

        def run() -> None:
            with contextlib.suppress(ServerError):  # logged as server_restart_failed
                sup.run(stop)
        thread = threading.Thread(target=run, name="supervisor", daemon=True)
        thread.start()
        try:
            yield sup
        finally:
            stop.set()
            thread.join(health.interval_s + health.probe_timeout_s + 5)

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@dataclass(frozen=True)
class CheckResult:
    """One supervisor check: ``ok``, the ``reason`` when not ok ("ok" otherwise), whether the
    deep probe ran as part of it (``probed``), and whether the failure calls for a restart at
    once (``fatal``: the process exited, or its log shows a crash or a corrupted heap)."""

    ok: bool
    reason: str = "ok"
    probed: bool = False
    fatal: bool = False


class RestartPolicy:
    """When to probe and when to restart, from the results of successive checks (no I/O).

    Check ``n`` (0-based since the last start) includes the deep probe when ``n`` is a multiple
    of ``probe_every`` (never when it is 0) and, once a probe has failed, on every check until
    one passes: otherwise the cheap checks in between would reset the count of a server
    that is up but cannot synthesise. ``failures`` consecutive failed checks call for a
    restart; any passing check resets the count.
    """

    def __init__(self, failures: int, probe_every: int) -> None:
        if failures < 1 or probe_every < 0:
            raise ValueError(f"need failures >= 1 and probe_every >= 0, got {failures}, {probe_every}")
        self.failures = failures
        self.probe_every = probe_every
        self.reset()

    def reset(self) -> None:
        """Forget the history (the server was just (re)started)."""
        self.checks = 0
        self.consecutive_failures = 0
        self.probe_failing = False

    def probe_due(self) -> bool:
        """Whether the next check should include the deep probe."""
        if self.probe_every == 0:
            return False
        return self.probe_failing or self.checks % self.probe_every == 0

    def record(self, result: CheckResult) -> bool:
        """Count ``result``; True when the server should be restarted now (the history is
        then reset)."""
        self.checks += 1
        if result.probed:
            self.probe_failing = not result.ok
        if result.ok:
            self.consecutive_failures = 0
            return False
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failures:
            self.reset()
            return True
        return False


FATAL_STOP_TIMEOUT_S = 5.0
"""How long a supervisor waits for a crashed server to stop before killing it: a process
whose heap is corrupted may never finish a clean stop."""


class Supervisor:
    """Restarts a :class:`TritonServer` whose model processes died or that stopped serving.

    Every ``health.interval_s`` seconds :meth:`check` compares the server's live stub
    processes per model with those present right after its start (Triton 2.51 neither
    restarts a killed stub nor reports it: ``/v2/health/ready`` stays 200) and, when
    :class:`RestartPolicy` says so, runs the deep probe (:func:`chattts_serving.deploy.probe.probe`,
    deadline ``health.probe_timeout_s``). After ``health.failures`` failed checks in a row it
    restarts the server (clean stop, same ports). A server process that exited, or whose log
    shows a crash or a corrupted heap (:mod:`~chattts_serving.deploy.logscan`: a process in that
    state may live on and answer "ready" while serving nothing), is restarted at the first check
    that sees it, its stop cut short (:data:`FATAL_STOP_TIMEOUT_S`). Every event is one JSON log line on stderr
    (:func:`chattts_serving.serving.logs.log_event`): ``supervisor_started``, ``health_check_failed``,
    ``server_restarting``, ``server_restarted``, ``server_restart_failed``.

    ``probe_fn(http_url, grpc_url, timeout_s)`` and ``wait(seconds) -> bool`` (True: stop)
    can be replaced in tests.
    """

    def __init__(self, server: TritonServer, health: HealthProfile,
                 probe_fn: Callable[[str, str, float], ProbeResult] | None = None) -> None:
        self.server = server
        self.health = health
        self.policy = RestartPolicy(health.failures, health.probe_every)
        self.probe_fn = probe_fn or (lambda http, grpc, timeout: probe(http, grpc, timeout,
                                                                       admin_token=server.admin_token))
        self.expected: Counter[str] = Counter()
        self.restarts = 0
        self.log = LogScanner(server.log_path)

    def baseline(self) -> None:
        """Record the stub processes of the freshly started server as the expected set; the log
        is read from its current end on (a restart appends to it)."""
        self.expected = self.server.stub_counts()
        self.policy.reset()
        self.log = LogScanner(self.server.log_path, start_at_end=True)

    def check(self, with_probe: bool) -> CheckResult:
        """The server process runs, every expected stub is alive and, ``with_probe``, the
        deep probe passes."""
        proc = self.server.proc
        signs = self.log.new_fatal_lines()
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            why = f"; its log: {signs[0][:200]}" if signs else ""
            return CheckResult(False, f"tritonserver is not running (exit code {code}){why}", fatal=True)
        if signs:
            return CheckResult(False, f"the server log shows a crash: {signs[0][:200]}", fatal=True)
        missing = self.expected - self.server.stub_counts()
        if missing:
            gone = ", ".join(f"{model} ({n} of {self.expected[model]})" for model, n in sorted(missing.items()))
            return CheckResult(False, f"model process(es) died: {gone}")
        if not with_probe:
            return CheckResult(True)
        res = self.probe_fn(f"127.0.0.1:{self.server.http_port}", f"127.0.0.1:{self.server.grpc_port}",
                            self.health.probe_timeout_s)
        return CheckResult(res.healthy, "ok" if res.healthy else f"probe: {res.reason}", probed=True)

    def step(self) -> bool:
        """One check, and a restart when the policy calls for one; True when it restarted.
        Raises ServerError when the restart fails."""
        result = self.check(self.policy.probe_due())
        if result.ok:
            self.policy.record(result)
            return False
        log_event("health_check_failed", level="warning", component="supervisor", reason=result.reason,
                  probed=result.probed, consecutive_failures=self.policy.consecutive_failures + 1,
                  failures_to_restart=1 if result.fatal else self.health.failures)
        if not self.policy.record(result) and not result.fatal:
            return False
        log_event("server_restarting", level="error", component="supervisor", reason=result.reason,
                  restarts=self.restarts)
        t0 = time.monotonic()
        try:
            self.server.restart(stop_timeout_s=FATAL_STOP_TIMEOUT_S if result.fatal else 30.0)
        except ServerError as exc:
            log_event("server_restart_failed", level="error", component="supervisor", error=str(exc).splitlines()[0])
            raise
        self.restarts += 1
        self.baseline()
        log_event("server_restarted", component="supervisor", reason=result.reason, restarts=self.restarts,
                  duration_ms=round((time.monotonic() - t0) * 1000, 1), stubs=dict(self.expected))
        return True

    def run(self, stop: threading.Event | None = None) -> None:
        """Check every ``interval_s`` seconds until ``stop`` is set (forever without one).
        Raises ServerError when a restart fails."""
        stop = stop or threading.Event()
        self.baseline()
        log_event("supervisor_started", component="supervisor", interval_s=self.health.interval_s,
                  failures=self.health.failures, probe_every=self.health.probe_every,
                  probe_timeout_s=self.health.probe_timeout_s, stubs=dict(self.expected))
        while not stop.wait(self.health.interval_s):
            self.step()


def main(argv: list[str] | None = None) -> int:
    apis = ", ".join(RESTRICTED_APIS)
    ap = argparse.ArgumentParser(prog="chattts-serve", description="Render the model repository and serve it "
                                 f"with the bundled tritonserver until Ctrl-C. The admin APIs ({apis}) need the "
                                 f"header '{ADMIN_HEADER}: ${TOKEN_ENV}'; when {TOKEN_ENV} is unset a token is "
                                 "generated and printed once on stderr.")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/small"))
    ap.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--log", type=Path, default=None, help="server log file (default: this terminal)")
    ap.add_argument("--restart-on-failure", action=argparse.BooleanOptionalAction, default=True,
                    help="supervise the server (default): restart it at once when it exits or its log shows a crash, "
                         "and when a model process dies or the deep probe keeps failing (knobs: the profile's [health] "
                         "table); events are JSON lines on stderr")
    args = ap.parse_args(argv)
    if not (args.artifacts / "manifest.json").is_file():
        print(f"chattts-serve: error: no exported artifacts in {args.artifacts} (no manifest.json): run "
              "`make export` or pass --artifacts DIR", file=sys.stderr)
        return 2
    try:
        profile = load_profile(args.profile)
        render_repository(profile, args.artifacts, args.repo)
    except (ProfileError, RenderError, FileNotFoundError) as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = TritonServer(args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                              metrics_port=args.metrics_port, log_path=args.log)
    except (AdminTokenError, OSError) as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 2
    if server.admin_token_generated:
        publish("chattts-serve", server.admin_token)

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
        if args.restart_on_failure:
            server.supervise(profile.health)
            return 0
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
