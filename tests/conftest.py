"""Shared fixtures: generated small-config artifacts and a real tritonserver serving them.

Artifacts are exported once into ``build/test/`` and reused across runs while their inputs
hash the same (the exporter's own up-to-date check). The server fixture renders the model
repository with the ``cpu`` profile and starts the bundled tritonserver on free ports.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.export.build import export_artifacts
from chattts_serving.export.weights import generate_checkpoint, read_sizes
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "test"
SMALL_SEED = 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def small_weights() -> Path:
    """A generated small-config checkpoint in ChatTTS' published layout."""
    root = BUILD / "weights-small"
    sizes = read_sizes(root / "asset") if (root / "asset").is_dir() else None
    if sizes is None or sizes.name != "small":
        generate_checkpoint(root, "small", SMALL_SEED)
    return root


@pytest.fixture(scope="session")
def small_artifacts(small_weights: Path) -> Artifacts:
    """The small checkpoint exported to ONNX (reused when up to date)."""
    out, _ = export_artifacts(small_weights, BUILD / "artifacts-small",
                              source={"kind": "synthetic", "size": "small", "seed": SMALL_SEED})
    return Artifacts.load(out)


@pytest.fixture(scope="session")
def small_chat(small_weights: Path):  # type: ignore[no-untyped-def]
    """The small checkpoint loaded through ChatTTS itself (the reference)."""
    from chattts_serving.export.weights import load_chat

    return load_chat(small_weights)


@dataclass(frozen=True)
class Server:
    """A running test server: its ports and the server object."""

    http_port: int
    grpc_port: int
    metrics_port: int
    server: TritonServer
    artifacts: Artifacts
    log_path: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"


@pytest.fixture(scope="session")
def triton_server(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real tritonserver on the rendered ``cpu`` repository over the small artifacts."""
    work = tmp_path_factory.mktemp("triton")
    repo = work / "model_repository"
    render_repository(load_profile("cpu"), small_artifacts.root, repo)
    ports = free_port(), free_port(), free_port()
    log_path = work / "tritonserver.log"
    srv = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], log_path=log_path,
                       build_dir=work / "build")
    srv.start()
    try:
        yield Server(*ports, server=srv, artifacts=small_artifacts, log_path=log_path)
    finally:
        srv.stop()
