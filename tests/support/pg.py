"""A throwaway PostgreSQL server for tests: Debian's ``postgresql`` binaries (``initdb``,
``pg_ctl``) on a cluster in a temporary directory, on a free port, trust authentication on
127.0.0.1 only. PostgreSQL refuses to run as root: as root the cluster belongs to the
``postgres`` user (created when missing) and the commands run through ``runuser``."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import free_port


def _bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs else None


class PgServer:
    """One cluster: :meth:`start`, :meth:`stop` (as often as a test needs), :meth:`destroy`."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None or not (bindir / "pg_ctl").exists():
            pytest.skip("PostgreSQL is not installed (Debian package postgresql: scripts/debian_packages.sh)")
        self.bindir = bindir
        self.prefix: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="chattts-pg-"))
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
            shutil.chown(self.root, "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data = self.root / "data"
        self.port = free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        proc = subprocess.run([*self.prefix, str(self.bindir / tool), *args], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr[-2000:]}")

    def start(self) -> None:
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -F"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def running_pg() -> Iterator[PgServer]:
    """A started :class:`PgServer`, destroyed when the generator closes: the body of a module
    fixture (``yield from running_pg()``)."""
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()
