"""docs/layout.md agrees with the tree: every path its table names exists, and every part of the
tree a reader looks for has a row.

The table's first column names each row's paths: the first from the repository root, the
others (``errors.py`` after ``chattts_serving/contract/``) beside it, else from the root
(``loadtest/`` after ``bench/``). A path in the second column is looked up from
the root, then in the row's folders, and a bare file name anywhere under them (``scheduler.py``
in the ``chattts_serving/engine/`` row). A path is a backquoted word that ends with ``/`` or a
file suffix; commands, model names and profile names are not. Which parts need a row: every
top-level folder of the repository and every top-level module and folder of
``chattts_serving/`` that git tracks or would track (hidden, ignored and generated ones, such
as ``build/``, ``artifacts/`` and ``results/``, are not parts of the tree).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"

CODE = re.compile(r"`([^`\s]+)`")
PATH_LIKE = re.compile(r"[\w.-]+(?:/[\w.-]+)*(?:/|\.(?:py|cc|h|md|toml|yaml|yml|cfg|tsv|html|sh|json|txt|j2))")
"""A backquoted word that names a path: a folder (``text/``) or a file with a suffix."""


@dataclass(frozen=True)
class Row:
    """One row of the table: the paths of its first column (resolved from the root as the
    module docstring says), their folders, and the words of its second column."""

    cell: str
    paths: tuple[Path, ...]
    what: str

    @property
    def folders(self) -> tuple[Path, ...]:
        return tuple(p if p.is_dir() else p.parent for p in self.paths)


def table_rows(text: str, root: Path) -> list[Row]:
    """The rows of the Markdown table in ``text`` (``| path | what |``), header left out."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0] == "path":
            continue
        names = [n for n in CODE.findall(cells[0]) if PATH_LIKE.fullmatch(n)]
        paths: list[Path] = []
        for i, name in enumerate(names):
            if i == 0:
                paths.append(root / name)
                continue
            beside = paths[0].parent / name
            paths.append(beside if beside.exists() else root / name)
        rows.append(Row(cells[0], tuple(paths), "|".join(cells[1:])))
    return rows


def missing_paths(text: str, root: Path) -> list[str]:
    """Each path the table names that does not exist, as ``row: `name` ...`` lines."""
    out = []
    for row in table_rows(text, root):
        for path in row.paths:
            if not path.exists():
                out.append(f"row {row.cell}: `{path.relative_to(root)}` (path column) does not exist")
        for name in CODE.findall(row.what):
            if not PATH_LIKE.fullmatch(name):
                continue
            bare = name.rstrip("/")
            candidates = [root / name, *(folder / name for folder in row.folders)]
            if any(c.exists() for c in candidates):
                continue
            if "/" not in bare and any(next(folder.rglob(bare), None) for folder in row.folders):
                continue
            looked = ", ".join(f"{f.relative_to(root)}/" for f in row.folders)
            out.append(f"row {row.cell}: `{name}` (what column) is neither under the root nor in {looked}")
    return out


def tree_parts(files: list[str], package: str = "chattts_serving") -> list[str]:
    """The parts that need a row, from the repository's file list (paths relative to the root):
    its top-level folders and the package's top-level modules and folders, ``/`` after a folder."""
    parts = set()
    for name in files:
        top, sep, rest = name.partition("/")
        if not sep or top.startswith("."):
            continue
        parts.add(top + "/")
        if top == package:
            first, sub, _ = rest.partition("/")
            if sub:
                parts.add(f"{package}/{first}/")
            elif first.endswith(".py") and first != "__init__.py":
                parts.add(f"{package}/{first}")
    return sorted(parts)


def unnamed_parts(text: str, root: Path, parts: list[str], package: str = "chattts_serving") -> list[str]:
    """The parts no row's path column names (itself, or a path inside it)."""
    named = [p for row in table_rows(text, root) for p in row.paths]
    out = []
    for part in parts:
        where = root / part
        if not any(p == where or where in p.parents for p in named):
            kind = "top-level folder of the repository" if part.count("/") == 1 and part.endswith("/") else \
                f"top-level part of {package}/"
            out.append(f"`{part}` ({kind}) is in no row's path column")
    return out


def _repository_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [n for n in out.decode().split("\0") if n and (ROOT / n).exists()]


def test_every_path_the_layout_names_exists() -> None:
    text = LAYOUT.read_text(encoding="utf-8")
    assert table_rows(text, ROOT), "docs/layout.md: no table found: the check would pass on anything"
    missing = missing_paths(text, ROOT)
    assert not missing, "docs/layout.md names paths that do not exist:\n" + "\n".join(missing)


def test_every_part_of_the_tree_has_a_row_in_the_layout() -> None:
    parts = tree_parts(_repository_files())
    assert "chattts_serving/serving/" in parts and "tests/" in parts, parts
    unnamed = unnamed_parts(LAYOUT.read_text(encoding="utf-8"), ROOT, parts)
    assert not unnamed, "docs/layout.md: give each a row, or name it in a row's path column:\n" + "\n".join(unnamed)


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """A renamed file, a folder without a row and a stale word of the second column each fail,
    named with their row; the second path of a cell is looked up beside the first, then from
    the root."""
    (tmp_path / "pkg" / "core").mkdir(parents=True)
    (tmp_path / "pkg" / "core" / "loop.py").write_text("")
    (tmp_path / "pkg" / "base.py").write_text("")
    (tmp_path / "tools").mkdir()
    table = ("| path | what |\n|---|---|\n"
             "| `pkg/core/`, `tools/` | the loop (`loop.py`), its `gone.py`, run by `make x` |\n"
             "| `pkg/contract.py`, `base.py` | names |\n")
    assert missing_paths(table, tmp_path) == [
        "row `pkg/core/`, `tools/`: `gone.py` (what column) is neither under the root nor in pkg/core/, tools/",
        "row `pkg/contract.py`, `base.py`: `pkg/contract.py` (path column) does not exist",
    ]
    parts = tree_parts(["pkg/core/loop.py", "pkg/base.py", "pkg/new.py", "pkg/__init__.py", "tools/a.sh",
                        "voices/v.toml", ".ci/x.yml", "README.md"], package="pkg")
    assert parts == ["pkg/", "pkg/base.py", "pkg/core/", "pkg/new.py", "tools/", "voices/"]
    assert unnamed_parts(table, tmp_path, parts, package="pkg") == [
        "`pkg/new.py` (top-level part of pkg/) is in no row's path column",
        "`voices/` (top-level folder of the repository) is in no row's path column",
    ]
