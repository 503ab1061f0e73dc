"""``chattts-tritonserver``, the image's command: tritonserver with the admin restriction (and
the inference key's, when one is configured), under a :class:`~.supervisor.Supervisor` that
stops it, and ends this program with :data:`EXIT_MODEL_DIED`, the moment one of its model
processes dies or it crashes.

Why: Triton 2.51 restarts no dead model process and keeps answering "ready"
(docs/triton-workarounds.md, "stuck model, nobody says so"); in a container the streams of
that process would wait for the stall timeout and the server for the liveness probe (90 s).
Ended at once, every client hears of it within about a second (its connection drops: a
retryable error) and the orchestrator (compose's ``restart: unless-stopped``, Kubernetes'
``restartPolicy: Always``) starts a fresh container. SIGTERM and SIGINT are passed on to
tritonserver (its own graceful stop) and the program exits with its exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from ..client.keys import inference_key_from_env
from ..serving.logs import log_event
from ..serving.profile import HealthProfile
from .admin import TRITONSERVER_ENV, inference_restriction_args, new_token, publish, restriction_args, token_from_env
from .server import connect_host, stub_processes
from .supervisor import FATAL_STOP_TIMEOUT_S, ServerStopped, Supervisor

EXIT_MODEL_DIED = 70
"""This program's exit code when it stopped tritonserver because a model process died or the
server crashed (EX_SOFTWARE): the orchestrator restarts the container."""

WATCH = HealthProfile(interval_s=5.0, failures=1, probe_every=0, probe_timeout_s=20.0)
"""The supervisor's checks in a container: process deaths and crash signs only; the deep probe
is the container's own health check (HEALTHCHECK, the livenessProbe)."""


def _flag(args: list[str], name: str, default: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in tritonserver's ``args``."""
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return default


class ContainerServer:
    """tritonserver started from the image's command line, as the supervisor sees a server:
    its process, its model processes, and a restart that stops it and raises
    :class:`ServerStopped` (the container restarts, not the process)."""

    log_path: Path | None = None

    def __init__(self, command: list[str], admin_token: str) -> None:
        self.command = command
        self.admin_token = admin_token
        self.address = _flag(command, "http-address", "0.0.0.0")
        self.http_port = int(_flag(command, "http-port", "8000"))
        self.grpc_port = int(_flag(command, "grpc-port", "8001"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{connect_host(self.address)}:{self.http_port}/v2/health/ready",
                                        timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def stub_pids(self) -> dict[int, str]:
        if self.proc is None or self.proc.poll() is not None:
            return {}
        return stub_processes(self.proc.pid)

    def stub_counts(self) -> Counter[str]:
        return Counter(self.stub_pids().values())

    def stop(self, timeout_s: float) -> None:
        """SIGINT, then SIGKILL after ``timeout_s``; its model processes go with it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        stubs = list(self.stub_pids())
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in stubs:  # orphans of a killed server
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart(self, stop_timeout_s: float = FATAL_STOP_TIMEOUT_S) -> None:
        self.stop(stop_timeout_s)
        raise ServerStopped("tritonserver stopped; the orchestrator restarts the container")


def tritonserver_command(args: list[str], prog: str) -> tuple[list[str], str]:
    """The tritonserver command line for the image's ``args`` (the binary, ``$TRITONSERVER``,
    else ``tritonserver`` on PATH; ``args``; the restriction flags) and the admin token it
    carries (generated and published when none is configured). Raises ValueError for a
    restriction flag in ``args`` and for an unusable token or key, OSError when a token or key
    file cannot be read."""
    if any(a.startswith(("--http-restricted-api", "--grpc-restricted-protocol")) for a in args):
        raise ValueError("the admin API restriction is added here; do not pass it")
    token = token_from_env()
    key = inference_key_from_env()
    if token is None:
        token = new_token()
        publish(prog, token)
    binary = os.environ.get(TRITONSERVER_ENV) or "tritonserver"
    return [binary, *args, *restriction_args(token), *inference_restriction_args(key)], token


def main(argv: list[str] | None = None) -> int:
    """Run tritonserver with ``argv`` (default: this program's arguments) until it exits, a
    signal stops it, or a model process dies (:data:`EXIT_MODEL_DIED`)."""
    prog = "chattts-tritonserver"
    args = sys.argv[1:] if argv is None else argv
    try:
        command, token = tritonserver_command(args, prog)
    except (ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    server = ContainerServer(command, token)
    stop = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        stop.set()
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        server.start()
    except OSError as exc:
        print(f"{prog}: error: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    assert server.proc is not None
    while not stop.is_set() and server.proc.poll() is None and not server.ready():
        time.sleep(0.2)
    if not stop.is_set() and server.proc.poll() is None:
        try:
            Supervisor(server, WATCH).run(stop)  # type: ignore[arg-type]
        except ServerStopped:
            return EXIT_MODEL_DIED
    code = server.proc.wait()
    log_event("server_exited", component="container", exit_code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
