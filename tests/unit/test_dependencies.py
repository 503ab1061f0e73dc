"""What the package imports is what pyproject.toml declares, and the reverse.

Every third-party module imported anywhere in ``chattts_serving`` or the benchmark beside it
(``bench/``; lazy imports included) must come from a declared dependency (main or an extra),
and every main dependency must be imported somewhere, or be listed below with the reason it is
needed without an import. A package our code imports must not ride on another package's
dependencies (pybase16384 did, through ChatTTS), and a declared one we no longer use must go
(tqdm did).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")

NOT_DECLARED = {
    "torch": "scripts/setup.sh installs torch==2.13.0 (CPU) first; declaring it would let a resolver pull CUDA",
    "triton_python_backend_utils": "Triton's Python backend provides it inside the stub",
}
"""Imported but deliberately not declared, with why."""
NOT_INSTALLED_HERE = {"cupy": "cupy-cuda12x", "pynvml": "nvidia-ml-py", "tomli": "tomli"}
"""Modules of extras (GPU) or markers (Python < 3.11) absent from this venv: their distributions."""
DECLARED_WITHOUT_IMPORT = {
    "requests": "ChatTTS imports it without declaring it",
    "nvidia-pytriton": "its bundled tritonserver is run by path (deploy/server.py finds the package by spec)",
    "vector-quantize-pytorch": "ChatTTS' DVAE imports it; pinned for the trained DVAE",
    "onnxscript": "torch.onnx's exporter needs it",
    "tomli": "read as tomllib's fallback on Python 3.10 (an import under a version check)",
}
"""Main dependencies needed without an import of theirs in our code, with why."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(requirement: str) -> str:
    return _norm(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))  # type: ignore[union-attr]


def _project() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imported_modules() -> set[str]:
    found: set[str] = set()
    for path in [*(ROOT / "chattts_serving").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"chattts_serving", "bench"}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return md.packages_distributions()


def _distributions(module: str) -> set[str]:
    dists = _installed().get(module) or [NOT_INSTALLED_HERE.get(module, f"<unknown: {module}>")]
    return {_norm(d) for d in dists}


def test_every_imported_package_is_declared() -> None:
    project = _project()
    declared = {_req_name(r) for r in project["dependencies"]}
    declared |= {_req_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    missing = {m: sorted(_distributions(m)) for m in _imported_modules() - set(NOT_DECLARED)
               if not _distributions(m) & declared}
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_every_main_dependency_is_imported_or_explained() -> None:
    used = set().union(*(_distributions(m) for m in _imported_modules()))
    unused = {_req_name(r) for r in _project()["dependencies"]} - used - set(DECLARED_WITHOUT_IMPORT)
    assert unused == set(), f"declared but imported nowhere in chattts_serving: {sorted(unused)}"
