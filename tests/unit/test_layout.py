"""The package's shape: folders that follow the data, arrows that point one way.

Every import inside ``chattts_serving`` (module level and inside functions alike) is read
from the source; the tests check that no two modules import each other through any path, that
each folder imports only the layers below it (the Triton adapters import the core, never the
reverse; clients import only the contract and the error codec), that the benchmark (``bench/``
at the repository root, not installed) imports the package and never the reverse, and that every
Triton ``model.py`` is a thin adapter over :mod:`chattts_serving.triton.models`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "chattts_serving"
BENCH = ROOT / "bench"
ROOTS = ("chattts_serving", "bench")
"""Top-level packages whose imports are read: the installed package and the benchmark."""

BASE = {"contract", "errors", "params", "runtime", "native", "int8_kernel"}
CORE = BASE | {"text", "engine", "audio"}
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "native": set(),
    "int8_kernel": {"native", "runtime"},
    "errors": {"contract"},
    "params": {"contract"},
    "runtime": {"contract"},
    "text": BASE,
    "engine": BASE,
    "audio": BASE,
    "serving": CORE,
    "triton": CORE | {"serving"},
    "client": {"contract", "errors"},
    "export": CORE,
    "gateway": {"contract", "errors", "client", "audio", "text"},
    "deploy": BASE | {"serving", "client"},
    "demo": BASE | {"serving", "client", "export", "deploy"},
}
"""Which top-level parts of the package each part may import (besides itself). Layers:
base (names, errors, parameters, artifacts) < core (text, engine, audio) < serving (the
Triton-free pipeline) < adapters (Triton models, clients, export) < applications."""


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the modules of :data:`ROOTS` that ``path`` imports (a name imported
    from a package counts as its submodule when one of that name exists)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in ROOTS)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in ROOTS:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return found - {mod}


FILES = sorted([*PKG.rglob("*.py"), *BENCH.rglob("*.py")])
MODULES = {module_name(p) for p in FILES}
GRAPH = {module_name(p): imports_of(p) & MODULES for p in FILES}


def part(module: str) -> str:
    """The top-level part of the package ``module`` is in; "" for the package itself and for
    the benchmark, which may import any part."""
    head, _, rest = module.partition(".")
    return rest.split(".")[0] if head == "chattts_serving" and rest else ""


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle, direct or through a chain, lazy imports included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_every_part_imports_only_the_layers_below_it() -> None:
    bad = []
    for mod, deps in GRAPH.items():
        src = part(mod)
        if not src:
            continue
        assert src in ALLOWED, f"{mod}: a new top-level part; give it a place in ALLOWED"
        for dep in deps:
            dst = part(dep)
            if dst and dst != src and dst not in ALLOWED[src]:
                bad.append(f"{mod} -> {dep}")
    assert bad == []


def test_the_package_never_imports_the_benchmark() -> None:
    """``bench/`` is not installed: an import of it from the package would fail outside a
    checkout. The graph sees the benchmark's own imports of the package."""
    bad = [f"{mod} -> {dep}" for mod, deps in GRAPH.items() if mod.split(".")[0] == "chattts_serving"
           for dep in deps if dep.split(".")[0] == "bench"]
    assert bad == []
    assert "chattts_serving.contract" in GRAPH["bench.run"]


def test_the_check_sees_imports_and_would_fail_on_a_reverse_arrow() -> None:
    """The graph is real: the engine model imports the engine, and an arrow from the core
    to the Triton layer would be refused by the table."""
    assert "chattts_serving.engine.scheduler" in GRAPH["chattts_serving.triton.models.engine"]
    assert "chattts_serving.text.request_text" in GRAPH["chattts_serving.serving.request"]
    assert "triton" not in ALLOWED["serving"] and "serving" not in ALLOWED["engine"]


@pytest.mark.parametrize("model_py", sorted((ROOT / "model_repository").glob("*/1/model.py")),
                         ids=lambda p: p.parent.parent.name)
def test_every_model_py_is_a_thin_adapter(model_py: Path) -> None:
    text = model_py.read_text()
    assert len(text.splitlines()) <= 15
    tree = ast.parse(text)
    sources = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert sources == {"chattts_serving.triton.models"}
    assert not (PKG / "triton_glue.py").exists()
