"""The normaliser's vocabularies are data files: every ``normalize/data/*.tsv`` is declared,
loads with its declared columns and lists each key once; the tables that point at each other
agree; a malformed file is refused with its name and line."""

from __future__ import annotations

from importlib import resources

import pytest

from chattts_serving.text.normalize import tables, vocabulary
from chattts_serving.text.normalize.vocabulary import COLUMNS, VocabularyError, parse, rows

DATA = resources.files(vocabulary.__package__).joinpath("data")
FILES = sorted(p.name.removesuffix(".tsv") for p in DATA.iterdir() if p.name.endswith(".tsv"))


def test_every_data_file_is_declared_and_every_declared_file_exists() -> None:
    assert set(FILES) == set(COLUMNS)


@pytest.mark.parametrize("name", FILES)
def test_vocabulary_file_loads_with_its_columns_and_unique_keys(name: str) -> None:
    text = DATA.joinpath(f"{name}.tsv").read_text(encoding="utf-8")
    assert tuple(text.split("\n", 1)[0].split("\t")) == COLUMNS[name]
    loaded = rows(name)
    assert loaded, f"{name}.tsv has no rows"
    keys = [r[0] for r in loaded]
    assert len(keys) == len(set(keys))
    assert all(len(r) == len(COLUMNS[name]) for r in loaded)
    assert all(cell == cell.strip() for r in loaded for cell in r), "a cell with spaces around it"


@pytest.mark.parametrize("name, column", [(n, c) for n, cols in COLUMNS.items() for c in cols
                                          if c in ("liang", "glued", "ends_sentence")])
def test_yes_no_columns_hold_yes_or_no(name: str, column: str) -> None:
    i = COLUMNS[name].index(column)
    assert {r[i] for r in rows(name)} <= set(vocabulary.YES)


def test_tables_that_point_at_each_other_agree() -> None:
    assert [int(r[0]) for r in rows("months")] == list(range(1, 13))
    assert [int(r[0]) for r in rows("weekdays")] == list(range(1, 8))
    assert {r[1] for r in rows("punctuation")} == {"pause", "end", "silent"}
    assert set(tables.CURRENCY_OF.values()) <= set(tables.CURRENCIES)
    assert all(p.isdigit() for _, p, _ in rows("multipliers"))
    assert all(len(c) == 1 for name in ("provinces", "roman_counters_zh") for (c,) in rows(name))
    assert set(tables.TEMPERATURE_UNITS) == {"℃", "°C", "℉", "°F"}


def test_malformed_vocabulary_is_refused_with_its_line() -> None:
    cols = ("symbol", "chinese")
    assert parse("symbol\tchinese\n%\t百分号\n\n", cols, "s.tsv") == (("%", "百分号"),)
    with pytest.raises(VocabularyError, match=r"s\.tsv:1: header"):
        parse("symbol\tenglish\n%\tpercent\n", cols, "s.tsv")
    with pytest.raises(VocabularyError, match=r"s\.tsv:3: expected 2 cells"):
        parse("symbol\tchinese\n%\t百分号\n‰\n", cols, "s.tsv")
    with pytest.raises(VocabularyError, match=r"s\.tsv:3: '%' is listed twice"):
        parse("symbol\tchinese\n%\t百分号\n%\t百分之\n", cols, "s.tsv")
    with pytest.raises(VocabularyError, match="yes or no"):
        vocabulary.yes("true")
