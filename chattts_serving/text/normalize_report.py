"""``python -m chattts_serving.text.normalize_report``: accuracy per category on the normalisation corpus.

The corpus (``tests/data/textnorm/<category>.tsv``, one file per category, written by the team:
input, expected normalised text, what is reported as not spoken, a note) is read three ways:

- ``ours``: :func:`chattts_serving.text.normalize.normalize` with the library off (our rules alone);
- ``wetext``: the library alone, ``wetext`` with automatic language on the whole sentence
  (:func:`chattts_serving.text.wetext.library_alone`), followed only by our punctuation pass
  (:func:`chattts_serving.text.normalize.punctuate`: pause marks, control tokens, unspeakable
  characters; nothing the library left unread is read by us);
- ``shipped``: :func:`~chattts_serving.text.normalize.normalize` as the front end runs it (library on).

A row counts as correct when the normalised text equals the expected text exactly. The table
(Markdown, also pasted into docs/text-normalisation.md) has one row per category and a total; ``--failures``
lists the rows a mode gets wrong. Exit status 0.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import normalize as textnorm

CORPUS: Final = Path(__file__).resolve().parents[2] / "tests" / "data" / "textnorm"
"""The team's corpus in a source checkout: a folder of ``<category>.tsv`` files."""
COLUMNS: Final = ("input", "expected", "dropped", "note")
"""The columns of a corpus file, named by its first line that is not a comment."""
MODES: Final = ("ours", "wetext", "shipped")


@dataclass(frozen=True)
class CorpusRow:
    """One corpus sentence: ``dropped`` lists what must be reported as not spoken."""

    line: int
    category: str
    text: str
    expected: str
    dropped: tuple[str, ...]
    note: str


class CorpusError(ValueError):
    """A malformed corpus file (the message names the line)."""


def load_corpus(path: Path = CORPUS) -> list[CorpusRow]:
    """Read the corpus: every ``*.tsv`` of a folder (by name), or one file; a file's name is
    its category (``cardinal.tsv``: ``cardinal``). A file's first line is its header
    (:data:`COLUMNS`), every other line that is not empty a sentence (an input may start with
    ``#``: there are no comment lines).

    Raises:
        CorpusError: a folder without ``.tsv`` files, a header other than :data:`COLUMNS`, a
            line without the four tab-separated columns or with an empty input.
        OSError: a file cannot be read.
    """
    files = sorted(path.glob("*.tsv")) if path.is_dir() else [path]
    if not files:
        raise CorpusError(f"{path}: no .tsv corpus files")
    return [row for f in files for row in _load_file(f)]


def _load_file(path: Path) -> list[CorpusRow]:
    rows: list[CorpusRow] = []
    header_seen = False
    with path.open(encoding="utf-8", newline="") as f:
        for lineno, fields in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not fields:
                continue
            if not header_seen:
                if tuple(fields) != COLUMNS:
                    raise CorpusError(f"{path}:{lineno}: header must be {' '.join(COLUMNS)} (tab-separated)")
                header_seen = True
                continue
            if len(fields) != len(COLUMNS) or not fields[0]:
                raise CorpusError(f"{path}:{lineno}: expected {len(COLUMNS)} tab-separated columns with an input, "
                                  f"got {len(fields)}")
            text, expected, dropped, note = fields
            rows.append(CorpusRow(lineno, path.stem, text, expected, tuple(dropped.split()), note))
    return rows


def read(mode: str) -> Callable[[str], str]:
    """The normaliser of a mode (``ours``, ``wetext`` or ``shipped``): text in, normalised text out."""
    if mode == "ours":
        return lambda s: textnorm.normalize(s, library=False).text
    if mode == "shipped":
        return lambda s: textnorm.normalize(s, library=True).text
    if mode == "wetext":
        from .wetext import library_alone

        return lambda s: textnorm.punctuate(library_alone(s)).text
    raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")


@dataclass(frozen=True)
class Score:
    """Correct rows out of ``total`` for one category and mode; ``misses`` are the wrong rows
    with what the mode produced."""

    correct: int
    total: int
    misses: tuple[tuple[CorpusRow, str], ...]

    @property
    def percent(self) -> float:
        """Correct rows in percent of ``total`` (0 when empty)."""
        return 100.0 * self.correct / self.total if self.total else 0.0


def evaluate(rows: Sequence[CorpusRow], mode: str) -> dict[str, Score]:
    """Score a mode per category (insertion order of first appearance) plus ``"all"``."""
    fn = read(mode)
    hits: dict[str, list[int]] = {}
    misses: dict[str, list[tuple[CorpusRow, str]]] = {}
    for row in rows:
        out = fn(row.text)
        tally = hits.setdefault(row.category, [0, 0])
        tally[1] += 1
        if out == row.expected:
            tally[0] += 1
        else:
            misses.setdefault(row.category, []).append((row, out))
    scores = {c: Score(h[0], h[1], tuple(misses.get(c, ()))) for c, h in hits.items()}
    scores["all"] = Score(sum(s.correct for s in scores.values()), sum(s.total for s in scores.values()),
                          tuple(m for s in scores.values() for m in s.misses))
    return scores


def table(results: dict[str, dict[str, Score]]) -> str:
    """Markdown table: one row per category, one column per mode (percent and counts)."""
    modes = list(results)
    cats = list(next(iter(results.values())))
    lines = ["| category | sentences | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for c in cats:
        cells = [f"{results[m][c].percent:.0f} % ({results[m][c].correct})" for m in modes]
        name = "**all**" if c == "all" else c
        lines.append(f"| {name} | {results[modes[0]][c].total} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _failures(results: dict[str, dict[str, Score]]) -> Iterable[str]:
    for mode, scores in results.items():
        for row, out in scores["all"].misses:
            yield (f"[{mode}] {row.category}.tsv:{row.line}: {row.text}\n"
                   f"    expected {row.expected}\n    got      {out}")


def main(argv: list[str] | None = None) -> int:
    """Print the per-category table (and with ``--failures`` every wrong row); returns 0."""
    p = argparse.ArgumentParser(prog="python -m chattts_serving.text.normalize_report",
                                description="Accuracy per category of our rules, the wetext library alone and "
                                            "the shipped combination on the normalisation corpus.")
    p.add_argument("--corpus", type=Path, default=CORPUS, help=f"corpus folder or TSV file (default {CORPUS})")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes (default all three)")
    p.add_argument("--failures", action="store_true", help="also list every row a mode gets wrong")
    args = p.parse_args(argv)
    rows = load_corpus(args.corpus)
    results: dict[str, dict[str, Score]] = {}
    timings: dict[str, float] = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        read(mode)(rows[0].text)  # imports and first-use set-up are not timed
        t0 = time.perf_counter()
        results[mode] = evaluate(rows, mode)
        timings[mode] = (time.perf_counter() - t0) * 1000 / max(1, len(rows))
    print(f"Normalisation corpus: {len(rows)} sentences in {len({r.category for r in rows})} categories "
          f"({args.corpus.name}); exact match of the normalised text.\n")
    print(table(results))
    print("\nmean time per sentence: " + ", ".join(f"{m} {t:.2f} ms" for m, t in timings.items()))
    if args.failures:
        print()
        for line in _failures(results):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
