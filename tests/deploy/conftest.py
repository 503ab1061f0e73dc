"""Fixtures of the deploy tests: a fleet of Triton replicas behind haproxy, per backend.

``CHATTTS_DEPLOY_BACKENDS`` (comma-separated; default ``netns,container``) names the backends
of :data:`tests.deploy.fleet.BACKENDS` whose fleets the replica tests run against. A missing
prerequisite (root, haproxy, the CPU image, PostgreSQL) skips, except under ``CI=1``, where it
fails: CI must not pass a deploy test that did not run. Each backend's figures go to
``results/deploy/replicas-<backend>.json`` (``scripts/deploy_report.py`` merges them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import tomllib

from chattts_serving.deploy.admin import new_token
from chattts_serving.deploy.render import render_repository
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import PROFILES_DIR, Profile
from tests.support.servers import ROOT

from .balancer import Haproxy
from .fleet import BACKENDS, Backend, Replica, docker_image_present

RESULTS = ROOT / "results" / "deploy"
"""Where each deploy module writes its figures (one JSON file per module or backend)."""
REPLICAS = 2
MAX_STREAMS = 3
"""Each replica's ``entry.max_concurrent_streams``: small, so that the busy case fills it."""


def missing(why: str) -> NoReturn:
    """A prerequisite is missing: skip, or fail under ``CI=1``."""
    if os.environ.get("CI"):
        pytest.fail(f"deploy test cannot run (CI=1, so this fails instead of skipping): {why}")
    pytest.skip(why)


def backend_names() -> list[str]:
    names = [n.strip() for n in os.environ.get("CHATTTS_DEPLOY_BACKENDS", "netns,container").split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise pytest.UsageError(f"CHATTTS_DEPLOY_BACKENDS: unknown backend(s) {unknown}; known: {sorted(BACKENDS)}")
    return names


@dataclass
class Fleet:
    """Replicas of one backend behind one haproxy; ``cases`` collects each test's figures."""

    backend: Backend
    replicas: list[Replica]
    lb: Haproxy
    work: Path
    cases: dict[str, Any] = field(default_factory=dict)

    def take_out(self, replica: Replica) -> None:
        """What the control plane does to a terminating pod: no new stream goes to it."""
        self.lb.set_state(replica.name, "drain")

    def put_back(self, replica: Replica, timeout_s: float = 120.0) -> float:
        """Back in the balancer once ready again; seconds until haproxy has it UP."""
        self.lb.set_state(replica.name, "ready")
        return self.lb.wait_status(replica.name, "UP", timeout_s)

    def all_up(self) -> None:
        for r in self.replicas:
            self.lb.wait_status(r.name, "UP", 30)


def _prerequisites(name: str) -> None:
    if os.geteuid() != 0:
        missing("the deploy tests need root (network namespaces, containers)")
    if shutil.which("haproxy") is None:
        missing("haproxy is not installed (apt-get install haproxy; make deploy-test installs it)")
    if name == "netns" and shutil.which("ip") is None:
        missing("iproute2's ip is not installed")
    if name == "container" and not docker_image_present():
        missing("no docker daemon with the image chattts-serving:0.1.0-cpu (make image)")


def _render(artifacts: Artifacts, out: Path) -> Path:
    data = tomllib.loads((PROFILES_DIR / "cpu.toml").read_text())
    data["entry"]["max_concurrent_streams"] = MAX_STREAMS
    render_repository(Profile.model_validate(data), artifacts.root, out)
    return out


@pytest.fixture(scope="module", params=backend_names())
def fleet(request: pytest.FixtureRequest, small_artifacts: Artifacts,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """:data:`REPLICAS` replicas of the backend ``request.param`` behind haproxy; everything
    is undone afterwards, whatever failed. Writes ``results/deploy/replicas-<backend>.json``."""
    name = str(request.param)
    _prerequisites(name)
    work = tmp_path_factory.mktemp(f"fleet-{name}")
    repo = _render(small_artifacts, work / "repo")
    started = time.monotonic()
    backend = BACKENDS[name](repo, small_artifacts.root, ROOT / "build" / "test" / "deploy", work, new_token())
    lb: Haproxy | None = None
    replicas: list[Replica] = []
    try:
        replicas = [backend.start(i) for i in range(REPLICAS)]
        start_s = time.monotonic() - started
        lb = Haproxy(replicas, work)
        fl = Fleet(backend, replicas, lb, work)
        fl.all_up()
        yield fl
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"replicas-{name}.json").write_text(json.dumps({
            "backend": name, "replicas": len(replicas), "artifacts": "small (generated, build/test/artifacts-small)",
            "max_concurrent_streams_per_replica": MAX_STREAMS, "fleet_start_s": round(start_s, 2),
            "cases": fl.cases}, indent=2) + "\n")
    finally:
        if lb is not None:
            lb.close()
        backend.close()
