"""Shared fixtures: generated small-config artifacts and a real tritonserver serving them.

Artifacts are exported once into ``build/test/`` and reused across runs while their inputs
hash the same (the exporter's own up-to-date check). The server fixture renders the model
repository with the ``cpu`` profile and starts the bundled tritonserver on free ports.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from chattts_serving.deploy.logscan import LogScanner
from chattts_serving.deploy.server import TritonServer
from chattts_serving.export.build import export_artifacts
from chattts_serving.export.weights import generate_checkpoint, read_sizes
from chattts_serving.runtime import Artifacts

from .support.servers import BUILD, Server, serve_profile

SMALL_SEED = 0


CRASH_MARKERS = ("Fatal Python error", "Segmentation fault", "is not healthy", "terminate called")
"""Server-log lines that say a stub process crashed (faulthandler's report, Triton's verdict)."""


def _servers_in(value: Any) -> list[TritonServer]:
    """The TritonServers a fixture value holds: itself, a ``Server``'s, or a dict's values."""
    if isinstance(value, TritonServer):
        return [value]
    if isinstance(getattr(value, "server", None), TritonServer):
        return [value.server]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, TritonServer)]
    return []


def server_log_report(server: TritonServer, tail_lines: int = 40, crash_lines: int = 80) -> str:
    """What a failing test's report shows of ``server``'s log: the first crash report (from
    the first line with a :data:`CRASH_MARKERS` entry, ``crash_lines`` long) and the last
    ``tail_lines`` lines. Empty when the server has no log file."""
    if server.log_path is None or not Path(server.log_path).is_file():
        return ""
    lines = Path(server.log_path).read_text(errors="replace").splitlines()
    first = next((i for i, line in enumerate(lines) if any(m in line for m in CRASH_MARKERS)), None)
    parts = []
    if first is not None:
        parts.append("--- first crash report ---\n" + "\n".join(lines[first:first + crash_lines]))
    parts.append(f"--- last {tail_lines} lines ---\n" + "\n".join(lines[-tail_lines:]))
    return f"{server.log_path}\n" + "\n".join(parts)


_SCANNERS: dict[int, LogScanner] = {}


def _new_fatal_lines(server: TritonServer) -> list[str]:
    """Crash signs (:mod:`chattts_serving.deploy.logscan`) written to ``server``'s log since the
    last look; none for a server whose test breaks it on purpose (``expect_fatal``)."""
    if server.log_path is None or getattr(server, "expect_fatal", False):
        return []
    scanner = _SCANNERS.setdefault(id(server), LogScanner(Path(server.log_path)))
    return scanner.new_fatal_lines()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test that used a real server fails when that server's log shows a crash or a
    corrupted heap while it ran (or, for a fixture's server, at its stop): such a server may
    live on and pass the test's checks. A failing test that used a real server gets that
    server's log (crash report and tail) as a report section: CI keeps only pytest's output,
    and a stub that died says why only there."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("call", "teardown") and not report.failed:
        signs = [(srv, line) for value in getattr(item, "funcargs", {}).values()
                 for srv in _servers_in(value) for line in _new_fatal_lines(srv)]
        if signs:
            report.outcome = "failed"
            report.longrepr = "the server log shows a crash:\n" + "\n".join(
                f"{srv.log_path}: {line}" for srv, line in signs[:20])
    if not report.failed:
        return
    seen: set[int] = set()
    for value in getattr(item, "funcargs", {}).values():
        for server in _servers_in(value):
            if id(server) not in seen and (text := server_log_report(server)):
                seen.add(id(server))
                report.sections.append(("tritonserver log", text))


@pytest.fixture(scope="session", autouse=True)
def _private_voice_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Gateways the tests start keep saved voices in a SQLite file of this session (the
    default store is a file in the user's home, which a developer's own voices would share)."""
    import os

    old = os.environ.get("CHATTTS_VOICE_STORE")
    os.environ["CHATTTS_VOICE_STORE"] = f"sqlite:///{tmp_path_factory.mktemp('voice-store') / 'voices.sqlite3'}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CHATTTS_VOICE_STORE", None)
        else:
            os.environ["CHATTTS_VOICE_STORE"] = old


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
def small_int8_artifacts(small_artifacts: Artifacts, small_weights: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """A copy of the small artifacts plus their int8 GPT graph (``chattts-export --precision int8``)."""
    import shutil

    from chattts_serving.export.variants import ensure_precision

    root = tmp_path_factory.mktemp("int8") / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    assert ensure_precision(root, small_weights, "int8")
    return Artifacts.load(root)


@pytest.fixture(scope="session")
def int8_library() -> Path:
    """Our int8 kernels' library (chattts_serving/int8_kernel.py). Where it cannot run here (no
    ONNX Runtime header, no compiler, a CPU without AVX-512 VNNI) the test skips, naming why;
    under CI it fails instead (the CI machines have all three)."""
    from chattts_serving import int8_kernel

    try:
        return int8_kernel.library()
    except int8_kernel.KernelUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the int8 kernels must run on CI machines: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def small_kv_artifacts(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """A copy of the small artifacts with calibrated int8 KV scales."""
    import shutil

    from chattts_serving.export.kvcache import calibrate_scales, write_scales

    root = tmp_path_factory.mktemp("kv") / "artifacts"
    shutil.copytree(small_artifacts.root, root)
    write_scales(root, calibrate_scales(root, steps=40), {"test": True})
    return Artifacts.load(root)


@pytest.fixture(scope="session")
def small_chat(small_weights: Path):  # type: ignore[no-untyped-def]
    """The small checkpoint loaded through ChatTTS itself (the reference)."""
    from chattts_serving.export.weights import load_chat

    return load_chat(small_weights)


@pytest.fixture(scope="session")
def triton_server(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real tritonserver on the rendered ``cpu`` repository over the small artifacts."""
    srv = serve_profile(small_artifacts, tmp_path_factory.mktemp("triton"))
    try:
        yield Server.of(srv, small_artifacts)
    finally:
        srv.stop()


