"""The normaliser's vocabularies: word lists and tables kept as TSV files in ``data/``.

Each file is one vocabulary (units, currencies, month names, the context words of a rule, ...):
UTF-8, tab-separated, its first line naming the columns of :data:`COLUMNS`, one entry a row,
no quoting (a cell may hold ``"`` or ``#``). The first column is the key: no two rows share it.
Extending a vocabulary is adding a row; a new file needs its columns declared here. Each file
is read once, when the module that uses it is imported.
"""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources
from typing import Final

WORD: Final = ("word",)
"""A list of context words: one word or phrase a row."""

COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    # tables
    "months": ("number", "name", "abbreviations"),
    "weekdays": ("number", "name", "abbreviations"),
    "units": ("symbol", "chinese", "english_one", "english_many", "liang", "glued"),
    "currencies": ("code", "chinese", "english_one", "english_many", "minor_one", "minor_many", "written_after"),
    "currency_signs": ("sign", "currency"),
    "currency_code_aliases": ("code", "currency"),
    "multipliers": ("word", "power_of_ten", "english"),
    "symbols": ("symbol", "chinese", "english"),
    "symbols_between_numbers": ("symbol", "chinese", "english"),
    "greek_letters": ("letter", "chinese", "english"),
    "punctuation": ("mark", "role"),
    "titles": ("abbreviation", "reading"),
    "abbreviations": ("abbreviation", "reading", "ends_sentence"),
    "measure_words": WORD,
    "provinces": ("character",),
    "stock_exchanges": ("suffix",),
    "roman_counters_zh": ("character",),
    # context words of the rules that choose between two readings
    "score_before": WORD,
    "score_after": WORD,
    "score_sentence": WORD,
    "score_words_en": WORD,
    "identifier_before": WORD,
    "identifier_after": WORD,
    "identifier_before_en": WORD,
    "temperature_before": WORD,
    "range_units": WORD,
    "er_before": WORD,
    "date_before": WORD,
    "date_before_en": WORD,
    "date_after": WORD,
    "date_adverbs": WORD,
    "fraction_before": WORD,
    "approximately_before": WORD,
    "duration_before": WORD,
    "pace_before": WORD,
    "countdown_before": WORD,
    "day_parts": WORD,
    "day_words": WORD,
    "seconds_before_en": WORD,
    "decade_after": WORD,
    "thousands_sentence": WORD,
    "blood_pressure_before": WORD,
    "year_labels": WORD,
    "year_words_en": WORD,
    "date_words": WORD,
    "roman_after_words": WORD,
    "regnal_names": WORD,
    "rating_before": WORD,
    "event_after": WORD,
    "model_before": WORD,
    "model_families": ("prefix", "first_digit"),
    "street_words_en": WORD,
    "us_states": WORD,
    "named_day_after": WORD,
    "service_after": WORD,
    "ampere_before": WORD,
    "base_pair_sentence": WORD,
    "bit_rate_sentence": WORD,
    "dose_before": WORD,
    "metre_after_en": WORD,
    "dose_frequencies": ("abbreviation", "chinese", "english"),
}
"""Every vocabulary file (``data/<name>.tsv``) and its columns, as its header line names them."""

YES: Final = ("yes", "no")
"""The values of a yes/no column."""


class VocabularyError(ValueError):
    """A vocabulary file that does not match its declared columns (the message names the file
    and line)."""


@functools.cache
def rows(name: str) -> tuple[tuple[str, ...], ...]:
    """The rows of ``data/<name>.tsv`` (:func:`parse`), read once.

    Raises:
        KeyError: ``name`` is not in :data:`COLUMNS`.
        VocabularyError: see :func:`parse`.
    """
    columns = COLUMNS[name]
    text = resources.files(__package__).joinpath("data", f"{name}.tsv").read_text(encoding="utf-8")
    return parse(text, columns, f"{name}.tsv")


def parse(text: str, columns: tuple[str, ...], source: str) -> tuple[tuple[str, ...], ...]:
    """The rows of a vocabulary file's ``text`` in file order, each as many cells as ``columns``
    (empty lines skipped); ``source`` names the file in errors.

    Raises:
        VocabularyError: a header other than ``columns``, a row with another number of cells,
            an empty key, a key used twice.
    """
    out: list[tuple[str, ...]] = []
    keys: set[str] = set()
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    for lineno, cells in enumerate(reader, start=1):
        if lineno == 1:
            if tuple(cells) != columns:
                raise VocabularyError(f"{source}:1: header must be {' '.join(columns)} (tab-separated)")
            continue
        if not cells:
            continue
        if len(cells) != len(columns) or not cells[0]:
            raise VocabularyError(f"{source}:{lineno}: expected {len(columns)} cells with a key, got {len(cells)}")
        if cells[0] in keys:
            raise VocabularyError(f"{source}:{lineno}: {cells[0]!r} is listed twice")
        keys.add(cells[0])
        out.append(tuple(cells))
    return tuple(out)


def words(name: str) -> tuple[str, ...]:
    """The first column of ``data/<name>.tsv``: a list of words, in file order."""
    return tuple(r[0] for r in rows(name))


def yes(cell: str) -> bool:
    """A yes/no cell (:data:`YES`) as a bool.

    Raises:
        VocabularyError: a cell other than ``yes`` or ``no``.
    """
    if cell not in YES:
        raise VocabularyError(f"expected yes or no, got {cell!r}")
    return cell == "yes"
