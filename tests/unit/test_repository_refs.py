"""Nothing in the repository points outside it: a reader who clones it finds every page, note
and path it names (links of the Markdown pages, and the paths docs, docstrings and comments
name). Checked over the files git tracks (or would track: not ignored)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OUTSIDE = re.compile(r"\.\./shared\b|\bshared/(?:NOTES|TRITON|STYLE)\.md|/work/(?:main|wt|shared)\b")
"""A team note beside the checkout, or a path of one machine's checkouts."""

REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:chattts_serving/)?(?:audio|bench|client|deploy|engine|export|gate|gateway|serving|text|triton"
    r"|tests|scripts|profiles|loadtest|docker|model_repository)/[\w./-]*\w\.(?:py|cc|html|h|md|toml|sh|json|yaml"
    r"|yml|j2|tsv|png))")
"""A path of this repository as docs and docstrings write it: from the root, or from the package
(``serving/pipeline.py`` is ``chattts_serving/serving/pipeline.py``)."""

MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def outside_references(text: str) -> list[str]:
    """The matches of :data:`OUTSIDE` in ``text``."""
    return [m.group(0) for m in OUTSIDE.finditer(text)]


def broken_links(md: Path, text: str, root: Path = ROOT) -> list[str]:
    """Relative links of a Markdown file that leave ``root`` or name no file in it."""
    bad = []
    for target in MD_LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue
        resolved = (md.parent / target).resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            bad.append(target)
    return bad


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The :data:`REPO_PATH` matches of ``text`` that name no file of ``root``."""
    return [m for m in REPO_PATH.findall(text)
            if not any((base / m).exists() for base in (root, root / "chattts_serving"))]


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    assert outside_references("see ../shared/NOTES.md") == ["../shared"]
    assert outside_references("(measured in shared/TRITON.md)") == ["shared/TRITON.md"]
    assert outside_references("cd /work/main && make") == ["/work/main"]
    assert outside_references("/dev/shm and a shared memory region") == []
    assert missing_paths("see `serving/pipeline.py` and tests/conftest.py") == []
    assert missing_paths("moved: `serving/profiles.py`, chattts_serving/gateway/static/index.html") == [
        "serving/profiles.py"]
    page = tmp_path / "docs" / "a.md"
    page.parent.mkdir()
    (tmp_path / "docs" / "b.md").write_text("")
    links = "[b](b.md) [web](https://x.org/y) [up](../../etc/passwd) [gone](c.md#x)"
    assert broken_links(page, links, root=tmp_path) == ["../../etc/passwd", "c.md"]


def test_no_file_of_the_repository_points_outside_it() -> None:
    found = []
    for path in _files():
        if path == Path(__file__).resolve():
            continue
        text = _text(path)
        if text is None:
            continue
        found += [f"{path.relative_to(ROOT)}: {ref}" for ref in outside_references(text)]
        if path.suffix in (".py", ".md", ".cc", ".h", ".toml", ".sh", ".yaml", ".yml", ".j2"):
            found += [f"{path.relative_to(ROOT)}: no such file {ref}" for ref in missing_paths(text)]
        if path.suffix == ".md":
            found += [f"{path.relative_to(ROOT)}: link {ref}" for ref in broken_links(path, text)]
    assert not found, "\n".join(found)


SPHINX_REF = re.compile(
    r":(?:mod|class|func|meth|data|attr|exc):`[~!]?(?:[^`<]*<)?((?:chattts_serving|bench)(?:\.\w+)+)>?`")
"""A cross-reference of a docstring to a name of the package or of the benchmark beside it
(``:class:`~chattts_serving.x.Y```, ``:func:`~bench.x.f```)."""


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_docstring_reference_to_the_package_names_something_that_exists() -> None:
    """A module that moved, or a name that was renamed, leaves no reference behind."""
    refs = {(str(path.relative_to(ROOT)), ref) for path in [*(ROOT / "chattts_serving").rglob("*.py"),
                                                            *(ROOT / "bench").rglob("*.py")]
            for ref in SPHINX_REF.findall(path.read_text())}
    assert refs, "the pattern finds nothing: the check would pass on anything"
    assert sorted(f"{f}: {ref}" for f, ref in refs if not _resolves(ref)) == []
