"""Kinds a new user's trial found misread (2026-12-06), each with its neighbours: a tilde after
a word that already says "about", a tilde spaced on one side after a quantity with its unit,
a unit before a range's tilde in English, a split of a hundred or a whole score written as a
fraction, and a note letter's sharp (C#, F#). Seeded variants in both languages, read with and
without WeTextProcessing; the checks are properties (what must be said, what must not), not
whole readings."""

from __future__ import annotations

import random
import re

import pytest

from chattts_serving.text.normalize import normalize
from tests.support.readings import read as _read

LIBRARY = pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
EN_APPROX = ("about", "approximately", "around", "roughly", "nearly", "almost")
ZH_APPROX = ("约", "大约", "大概", "将近", "接近", "差不多")
EN_UNITS = {"kg": "kilograms", "km": "kilometers", "cm": "centimeters", "km/h": "kilometers per hour"}


@LIBRARY
def test_a_tilde_after_a_word_that_says_about_is_not_read_again(library: bool) -> None:
    rng = random.Random("approx")
    for _ in range(40):
        n, unit = rng.randint(2, 900), rng.choice(["", "kg", "km", "%"])
        word = rng.choice(EN_APPROX)
        word = word.capitalize() if rng.random() < 0.3 else word
        en = _read(f"{word} ~{n}{unit} people.", library)
        assert en.lower().count(word.lower()) == 1 and "about about" not in en.lower(), en
        if word.lower() != "about":
            assert "about" not in en.lower(), en
        zword = rng.choice(ZH_APPROX)
        zh = _read(f"今天{zword}~{n}{unit}。", library)
        assert zh.count("约") == zword.count("约"), zh  # no 约 of the tilde's own beside it
    assert normalize("It weighs ~50kg.", library=library).text == "It weighs about fifty kilograms."
    assert normalize("会场~100人。", library=library).text == "会场约一百人。"


@LIBRARY
def test_a_tilde_spaced_on_one_side_after_a_quantity_with_another_unit_is_about(library: bool) -> None:
    """100km/h ~50kg is two quantities (the second about): both units are read and no range;
    with the same unit on both sides (5km ~10km) or the tilde spaced alike (5km ~ 10km) it is a
    range, and its first unit is read in English too."""
    rng = random.Random("tilde-units")
    for _ in range(40):
        a, b = rng.randint(2, 300), rng.randint(2, 300)
        u1, u2 = rng.sample(list(EN_UNITS), 2)
        two = _read(f"At {a}{u1} ~{b}{u2} it stops.", library)
        assert EN_UNITS[u1] in two and EN_UNITS[u2] in two and " to " not in two, two
        same = normalize(f"At {a}{u1} ~{b}{u1} it stops.", library=library).text
        assert " to " in same and same.count(EN_UNITS[u1]) == 2, same
        spaced = normalize(f"At {a}{u1} ~ {b}{u1} it stops.", library=library).text
        assert " to " in spaced and spaced.count(EN_UNITS[u1]) == 2, spaced
        zh = _read(f"速度{a}{u1} ~{b}{u2}。", library)
        assert "到" not in zh, zh
    assert normalize("about 100km/h ~50kg", library=library).text == \
        "about one hundred kilometers per hour about fifty kilograms"
    assert normalize("需要3 ~5天", library=library).text == "需要三到五天"  # bare numbers: still a range


@LIBRARY
def test_a_split_of_a_hundred_and_a_whole_score_are_no_fractions(library: bool) -> None:
    rng = random.Random("splits")
    for _ in range(30):
        a = rng.randrange(5, 100, 5)
        b = 100 - a
        en = _read(f"It was a {a}/{b} split.", library)
        assert not re.search(r"\b\w+(?:ths|halves|quarters)\b", en), en  # no fraction's denominator
        zh = _read(f"按{a}/{b}分成。", library)
        assert "比" in zh and "分之" not in zh, zh
        n = rng.randint(3, 10)
        score = normalize(f"I rate it {n}/{n}.", library=library).text
        assert "out of" in score, score
    assert normalize("50/50 chance", library=library).text == "fifty fifty chance"
    assert normalize("20/20 vision", library=library).text == "twenty twenty vision"
    assert normalize("11/10 would buy again", library=library).text == "eleven out of ten would buy again"
    for text, fraction in (("add 3/4 cup", "three quarters"), ("1/2 cup", "one half"), ("3/2 of it", "three halves"),
                           ("2/3的人", "三分之二")):
        assert fraction in normalize(text, library=library).text


@LIBRARY
def test_a_note_letters_sharp_is_read(library: bool) -> None:
    for text, expected in (("Use C# daily.", "Use C sharp daily."),
                           ("I like F# and C#.", "I like F sharp and C sharp."),
                           ("a G# minor chord", "a G sharp minor chord")):
        assert normalize(text, library=library).text == expected
    assert "sharp" in normalize("用C#写的程序。", library=library).text
    for text in ("#话题#", "AB# x", "xC# y", "issue #12"):
        assert "sharp" not in normalize(text, library=library).text, text


@LIBRARY
def test_a_word_in_greek_is_unspoken_whole_and_lone_letters_are_named(library: bool) -> None:
    """Ελληνικά read 兰姆达兰姆达 (its two λ named, the rest reported unspoken): a run of Greek
    letters holding one with no name (accented, final sigma) is a word in Greek, reported
    whole; a lone letter or a run of nameable ones (αβγ, Δx, π) is still read by name."""
    for word in ("Ελληνικά", "λόγος", "καλημέρα", "Αθήνα"):
        for text in (f"{word} test.", f"希腊语{word}很难。"):
            r = normalize(text, library=library)
            assert set(word) <= set(r.dropped), (text, r.dropped)
            assert not re.search("兰姆达|lambda|alpha|阿尔法", r.text), r.text
    assert normalize("αβγ test", library=library).text == "alpha beta gamma test"
    assert normalize("the λ value", library=library).text == "the lambda value"
    assert normalize("π ≈ 3.14", library=library).text.startswith("派")


@LIBRARY
def test_a_letter_prefixed_code_after_an_identifier_word_is_read_part_by_part(library: bool) -> None:
    """编号A-1023 read 'A one thousand and twenty three' (English in a Chinese sentence): after a
    word that introduces an identifier, letters, a hyphen and digits are a code (A杠幺零二三;
    English: CA one zero two three); elsewhere the letters and the number in the sentence's
    language (F-16: F sixteen, 型号是X-100型: 一百)."""
    rng = random.Random("prefixed-codes")
    for _ in range(30):
        letters = "".join(rng.choice("ABCDEFGHKMNPRSTXYZ") for _ in range(rng.randint(1, 2)))
        num = str(rng.randint(100, 99999))
        zh = _read(f"您的{rng.choice(['编号', '订单号', '房间', '航班', '工号'])}是{letters}-{num}。", library)
        assert f"{letters}杠" in zh and not re.search("[十百千万]|[a-z]", zh), zh
        en = _read(f"Your {rng.choice(['flight', 'room', 'order', 'ticket'])} is {letters}-{num}.", library)
        assert not re.search(r"\b(?:hundred|thousand)\b", en), en
        plain = _read(f"它在{letters}-{num}号楼。", library)
        assert not re.search(r"[a-z]{3,}", plain), plain  # never English words in a Chinese sentence
    assert normalize("The F-16 flew.", library=library).text == "The F sixteen flew."
    assert normalize("编号A-1023。", library=library).text == "编号A杠幺零二三。"
