"""haproxy in front of the replicas, from the config users get (``docker/haproxy/haproxy.cfg``).

:class:`Haproxy` rewrites only what differs here: the listening addresses (127.0.0.1 and free
ports), the runtime API's socket, and the ``server`` lines of ``backend triton_grpc`` (one per
replica, at its address). Every setting that matters (per-RPC h2 balancing, leastconn, the
readiness check and its timing, timeouts, retries) is the file's own. Its runtime API answers
the servers' state (``show stat``) and takes a replica out before its drain (``set server ...
state drain``: no new stream goes to it, the streams it has run on).
"""

from __future__ import annotations

import csv
import re
import socket
import subprocess
import time
from pathlib import Path

from tests.support.servers import ROOT, free_port

from .fleet import GRPC_PORT, Replica

CONFIG = ROOT / "docker" / "haproxy" / "haproxy.cfg"
"""The config users get."""
BACKEND = "triton_grpc"


class BalancerError(RuntimeError):
    """haproxy is missing, its config is invalid, or it did not start."""


def render_config(template: str, replicas: list[Replica], grpc_port: int, stats_port: int, socket_path: Path) -> str:
    """``template`` (the text of :data:`CONFIG`) with its binds on 127.0.0.1 and the given
    ports, its runtime socket at ``socket_path`` and one ``server`` line per replica."""
    text = template.replace("bind :8001 ", f"bind 127.0.0.1:{grpc_port} ")
    text = text.replace("bind :8404", f"bind 127.0.0.1:{stats_port}")
    text = re.sub(r"stats socket \S+", f"stats socket {socket_path}", text)
    lines = text.splitlines()
    start = lines.index(f"backend {BACKEND}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    if not any(line.strip().startswith("server ") for line in lines[start:end]):
        raise BalancerError(f"{CONFIG} has no server line in backend {BACKEND}")
    body = [line for line in lines[start:end] if not line.strip().startswith("server ")]
    while body and not body[-1].strip():
        body.pop()
    body += [f"    server {r.name} {r.address}:{GRPC_PORT}" for r in replicas] + [""]
    return "\n".join(lines[:start] + body + lines[end:]) + "\n"


class Haproxy:
    """One haproxy process (``haproxy -db -f <config>``) for ``replicas``; :meth:`close` ends it."""

    def __init__(self, replicas: list[Replica], work: Path) -> None:
        self.grpc_port, self.stats_port = free_port(), free_port()
        self.socket_path = work / "haproxy.sock"
        self.config_path = work / "haproxy.cfg"
        self.log_path = work / "haproxy.log"
        self.config_path.write_text(render_config(CONFIG.read_text(), replicas, self.grpc_port, self.stats_port,
                                                  self.socket_path))
        check = subprocess.run(["haproxy", "-c", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode:
            raise BalancerError(f"haproxy -c: {check.stdout}{check.stderr}")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config_path)], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while not self.socket_path.exists() or not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BalancerError(f"haproxy did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.stats_port}/metrics"

    def _answers(self) -> bool:
        try:
            self.command("show info")
        except OSError:
            return False
        return True

    def command(self, line: str) -> str:
        """One runtime API command; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket_path))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the replicas: name -> its row (``status``: UP, DOWN, DRAIN, MAINT,
        with a transition as 'UP 1/2'; ``scur``: streams now; ``stot``: streams in all)."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(text.splitlines())
        return {r["svname"]: r for r in rows if r["pxname"] == BACKEND and r["svname"] not in ("FRONTEND", "BACKEND")}

    def status(self, name: str) -> str:
        return self.servers()[name]["status"]

    def set_state(self, name: str, state: str) -> None:
        """``state``: ``ready``, ``drain`` or ``maint`` (haproxy's admin states)."""
        answer = self.command(f"set server {BACKEND}/{name} state {state}").strip()
        if answer:
            raise BalancerError(f"set server {name} state {state}: {answer}")

    def wait_status(self, name: str, prefix: str, timeout_s: float = 30.0) -> float:
        """Seconds until ``name``'s status starts with ``prefix``; raises on timeout."""
        start = time.monotonic()
        while not self.status(name).startswith(prefix):
            if time.monotonic() - start > timeout_s:
                raise BalancerError(f"{name} still {self.status(name)!r}, not {prefix!r}, after {timeout_s:g} s")
            time.sleep(0.02)
        return time.monotonic() - start

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.socket_path.unlink(missing_ok=True)
