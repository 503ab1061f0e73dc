"""The team's normalisation corpus (tests/data/textnorm/<category>.tsv) read exactly, one test
per file, the seven inputs of issue #11 one by one, and the per-category report."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile, profile_from_json
from chattts_serving.text import normalize as textnorm
from chattts_serving.text import wetext
from chattts_serving.text.frontend import FrontEnd
from chattts_serving.text.normalize_report import CORPUS, CorpusError, evaluate, load_corpus, table
from chattts_serving.text.voices import VoiceBook

ROWS = load_corpus()


def test_corpus_has_300_sentences_in_15_categories_of_at_least_10() -> None:
    per_category = collections.Counter(r.category for r in ROWS)
    assert len(ROWS) >= 300
    assert len(per_category) >= 15
    assert min(per_category.values()) >= 10, per_category
    assert len({r.text for r in ROWS}) == len(ROWS), "a sentence is in the corpus twice"


CORPUS_FILES = sorted(CORPUS.glob("*.tsv"))


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus_file_is_read_as_expected(path: Path) -> None:
    """What the front end ships (library on) gives every sentence of the file the expected text
    exactly, reports what it leaves out, in order, and leaves no digit; every miss is listed
    with its file and line."""
    rows = load_corpus(path)
    assert rows, f"{path.name}: no sentences"
    misses = []
    for row in rows:
        result = textnorm.normalize(row.text)
        where = f"{path.name}:{row.line}: {row.text}"
        if result.text != row.expected:
            misses.append(f"{where}\n    expected {row.expected}\n    got      {result.text}  ({row.note})")
        elif result.dropped != row.dropped:
            misses.append(f"{where}\n    dropped {result.dropped}, expected {row.dropped}")
        elif any(c.isdigit() for c in textnorm.CONTROL_TOKEN.sub("", result.text)):
            misses.append(f"{where}\n    a digit survived: {result.text}")
    assert not misses, "\n".join(misses)


ISSUE_EXAMPLES = [
    ("score", "他4-0获胜，从0-3追到3-3", "他四比零获胜，从零比三追到三比三"),
    ("time-range", "营业时间9:00-17:00，需要3-5天", "营业时间九点到十七点，需要三到五天"),
    ("unit-once", "17：20分出发，下午3:30分开始，15:16:36秒",
     "十七点二十分出发，下午三点三十分开始，十五点十六分三十六秒"),
    ("digit-groups", "客服电话 400 820 6666，卡号6222 0212 3456 7890",
     "客服电话四零零，八二零，六六六六，卡号六二二二，零二幺二，三四五六，七八九零"),
    ("liang", "2瓶水和2杯咖啡，还有2双鞋", "两瓶水和两杯咖啡，还有两双鞋"),
    ("approx-per-unit", "6000+小时；1809.93美元/盎司；7.5元/升",
     "六千多小时，一千八百零九点九三美元每盎司，七点五元每升"),
]


@pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
@pytest.mark.parametrize("kind, text, expected", ISSUE_EXAMPLES, ids=[e[0] for e in ISSUE_EXAMPLES])
def test_issue_examples_read_as_a_listener_expects(kind: str, text: str, expected: str, library: bool) -> None:
    assert textnorm.normalize(text, library=library).text == expected


def test_issue_example_unspeakable_character_is_reported_not_sent() -> None:
    """鿏 (U+9FCF) is in no bert-base-chinese vocabulary: it is left out and reported."""
    result = textnorm.normalize("元素鿏的符号是Mt")
    assert result.text == "元素的符号是Mt"
    assert result.dropped == ("鿏",)


def test_library_and_our_rules_agree_where_the_library_reads() -> None:
    """The kinds routed to the library read every corpus sentence as our rules do, so the
    profile knob that turns the library off changes no corpus reading."""
    assert evaluate(ROWS, "ours")["all"].correct == evaluate(ROWS, "shipped")["all"].correct == len(ROWS)


def _spy_library(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every span handed to the library (the real library still reads it)."""
    asked: list[str] = []
    real = wetext.read_zh

    def spy(span: str, left: str = "", right: str = "") -> str | None:
        asked.append(span)
        return real(span, left, right)

    monkeypatch.setattr(wetext, "read_zh", spy)
    return asked


def test_routed_kinds_are_read_by_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Chinese spans of the routed kinds are handed to the library when it is on and never
    when it is off; a span the library cannot read (a signed percentage) stays ours."""
    assert {"year_month_day", "fraction", "percent", "ratio"} == textnorm.LIBRARY_KINDS
    asked = _spy_library(monkeypatch)
    assert textnorm.normalize("配比3:2，占50%，于2024-03-05", library=True).text == \
        "配比三比二，占百分之五十，于二零二四年三月五日"
    assert asked == ["3:2", "50%", "2024-03-05"]
    asked.clear()
    assert textnorm.normalize("配比3:2，占50%，于2024-03-05", library=False).text == \
        "配比三比二，占百分之五十，于二零二四年三月五日"
    assert asked == []
    assert textnorm.normalize("增长-2%", library=True).text == "增长负百分之二"


@pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
@pytest.mark.parametrize("text, expected", [
    ("圣诞节是12/25", "圣诞节是十二月二十五日"),
    ("截止12/31", "截止十二月三十一日"),
    ("大约11/12的时间", "大约十二分之十一的时间"),
    ("12/25的人", "二十五分之十二的人"),
    ("截止6/30", "截止六月三十日"),
    ("3/5的人", "五分之三的人"),
])
def test_month_day_or_fraction_is_decided_by_context_in_both_modes(text: str, expected: str, library: bool) -> None:
    """The library reads a/b with a of 10 to 12 as a date (11/12 -> 十一月十二日) and others as
    fractions (6/30 -> 三十分之六); context words decide instead, and the library's reading is used only where it
    is of the sort they choose, so the knob changes no reading."""
    assert textnorm.normalize(text, library=library).text == expected


def test_wetext_knob_switches_the_library_reading(small_artifacts: Artifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front end asks the library for the routed spans only with the knob on."""
    asked = _spy_library(monkeypatch)
    on = FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook(), wetext=True).prepare("约占50%")
    assert asked == ["50%"]
    asked.clear()
    off = FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook(), wetext=False).prepare("约占50%")
    assert asked == []
    assert on.normalized == off.normalized == "约占百分之五十"


def test_profile_knob_defaults_on_and_round_trips() -> None:
    for name in ("cpu", "gpu"):
        assert load_profile(name).frontend.wetext is True
    p = load_profile("cpu")
    off = p.model_copy(update={"frontend": p.frontend.model_copy(update={"wetext": False})})
    assert profile_from_json(off.model_dump_json()).frontend.wetext is False


def test_report_prints_accuracy_per_category_for_each_mode() -> None:
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.text.normalize_report"], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| category"))
    assert header == "| category | sentences | ours | wetext | shipped |"
    categories = {r.category for r in ROWS}
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert categories <= set(rows) and "**all**" in rows


def test_table_shows_percent_and_count() -> None:
    scores = {"ours": evaluate(ROWS[:3], "ours")}
    md = table(scores)
    assert md.splitlines()[0] == "| category | sentences | ours |"
    assert "| **all** | 3 | 100 % (3) |" in md


def test_malformed_corpus_line_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "c.tsv"
    bad.write_text("input\texpected\tdropped\tnote\n3个\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c\.tsv:2"):
        load_corpus(bad)
    assert CORPUS.is_dir()


def test_corpus_file_with_a_wrong_header_or_a_folder_without_files_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "c.tsv"
    bad.write_text("category\tinput\texpected\tdropped\tnote\ncardinal\t3个\t三个\t\t\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c\.tsv:1: header"):
        load_corpus(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match=r"no \.tsv"):
        load_corpus(tmp_path / "empty")
