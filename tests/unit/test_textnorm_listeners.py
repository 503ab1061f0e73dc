"""Readings a listener notices at once (issue #43): codes inside running text, maths in a
Chinese sentence, medical readings, midnight, a sign before 百分之, titles before names through
the segments, inline numbered lists. The corpus holds the sentences (categories ``code-inline``,
``math``, ``vitals``, ``midnight``, ``title``, ``list``); here the neighbours of each kind and the
segmentation the server and both WebSocket dialects share. Over a real server:
tests/server/test_readings.py."""

from __future__ import annotations

import pytest

from chattts_serving.text.normalize import normalize
from chattts_serving.text.segments import SegmentRules, join_normalized, split_segments
from chattts_serving.text.sentences import SentenceSplitter, split_sentences

TITLES = ["Mr. Smith agreed on March 5, 2024.", "Ask Mr. Smith and Dr. Brown, e.g. today.",
          "Mrs. Lee arrived on May 1, 2023.", "Ms. Green and Prof. White met on 2024-03-05.",
          "We met Gen. Lee, Capt. Cook and St. Paul's choir vs. Lt. Dan."]


@pytest.mark.parametrize("text", TITLES)
def test_a_title_never_ends_a_segment_or_a_sentence(text: str) -> None:
    """``Mr.`` alone was a segment: spoken apart and joined to the name (MisterSmith)."""
    assert split_segments(text, SegmentRules(merge_chars=0)) == [text]
    assert split_sentences(text) == [text]


def test_a_sentence_end_after_a_title_like_word_still_ends_one() -> None:
    assert split_sentences("I bought pens, paper, etc. Then I left.") == ["I bought pens, paper, etc.",
                                                                       "Then I left."]
    assert split_segments("It rained. Mr. Smith left.", SegmentRules(merge_chars=0)) == ["It rained.",
                                                                                      " Mr. Smith left."]


NUMBER_MARKS = ["Beethoven's Symphony No. 5 is the one she played.", "See p. 12 for the whole plan of the day.",
                "Read pp. 45-67 before the lesson tomorrow.", "Call ext. 204 or Tel. 5551234 for the office.",
                "Under Art. 12 of the treaty the parties agree.", "See Para. 3 of the contract for the terms."]


@pytest.mark.parametrize("text", NUMBER_MARKS)
def test_a_mark_before_a_number_ends_no_segment_nor_sentence(text: str) -> None:
    """``Symphony No.`` was a segment of its own and ``5 is ...`` the next: No. spoken apart and
    five read as a count; the streaming splitter, fed a character at a time, agrees."""
    assert split_segments(text, SegmentRules(merge_chars=0)) == [text]
    assert split_sentences(text) == [text]
    splitter = SentenceSplitter()
    assert [s for ch in text for s in splitter.feed(ch)] + splitter.end() == [text]


def test_a_mark_before_a_word_still_ends_a_sentence() -> None:
    for text, sentences in (("I said no. Then I left.", ["I said no.", "Then I left."]),
                            ("Read it. No. Not that one.", ["Read it.", "No.", "Not that one."])):
        assert split_sentences(text) == sentences
        assert [s.strip() for s in split_segments(text, SegmentRules(merge_chars=0))] == sentences


@pytest.mark.parametrize("text", ["Thank you very much for calling our line today! 🎉",
                                  "Your order has shipped and arrives on Monday morning! :) See you.",
                                  "hi " + "😀" * 300, "😀" * 300 + " hello there.",
                                  "好的，我们明天上午十点准时见面！😀😀",
                                  "This is a sentence long enough to stand alone. [uv_break]"])
def test_every_segment_has_a_word_when_the_text_has_one(text: str) -> None:
    """A wordless piece (an emoji after a long sentence, a hard cut's run of emoji) goes with its
    neighbour: alone the front end would refuse it, and with it the whole request."""
    segments = split_segments(text)
    assert "".join(segments) == text
    assert all(any(c.isalnum() for c in s.replace("[uv_break]", "")) for s in segments), segments
    assert split_segments("🎉🎉") == ["🎉🎉"]


def test_english_segments_are_joined_with_a_space_chinese_without() -> None:
    assert join_normalized(["Mister Smith agreed,", "Doctor Brown too."]) == "Mister Smith agreed, Doctor Brown too."
    assert join_normalized(["你好。", "再见。"]) == "你好。再见。"
    assert join_normalized(["Hello.", "你好。"]) == "Hello.你好。"


LISTS = [
    ("好的！我们一起看看：1. 打开设置。2. 点击保存。", ["好的！", "我们一起看看：", "1. 打开设置。", "2. 点击保存。"]),
    ("Here are the steps: 1. Open Settings. 2. Click Save.",
     ["Here are the steps:", "1. Open Settings.", "2. Click Save."]),
    ("我有两个建议，1. 多喝水。2. 早睡。", ["我有两个建议，", "1. 多喝水。", "2. 早睡。"]),
    ("步骤：1、打开设置；2、点击保存。", ["步骤：1、打开设置；", "2、点击保存。"]),
    ("步骤：(1)打开设置。(2)点击保存。", ["步骤：(1)打开设置。", "(2)点击保存。"]),
    ("步骤：①打开设置。②点击保存。", ["步骤：①打开设置。", "②点击保存。"]),
    ("步骤如下：\n1. 打开设置。\n2. 点击网络。", ["步骤如下：", "1. 打开设置。", "2. 点击网络。"]),
]


@pytest.mark.parametrize("text, sentences", LISTS)
def test_an_inline_list_number_goes_with_its_item(text: str, sentences: list[str]) -> None:
    """The WebSocket splitter (both dialects) and the HTTP segments: ``看看：1.`` is cut before
    the number; fed character by character or whole, the same sentences."""
    assert split_sentences(text) == sentences
    s = SentenceSplitter()
    assert [x for ch in text for x in s.feed(ch)] + s.end() == sentences
    assert [seg.strip() for seg in split_segments(text, SegmentRules(merge_chars=0))] == sentences


@pytest.mark.parametrize("marker", ["1.", "1. ", "1、", "(1)", "（1）", "1)", "①"])
@pytest.mark.parametrize("intro, zh", [("我们一起看看：", True), ("原因如下；", True), ("", True),
                                       ("Here is how: ", False)])
def test_a_list_number_reads_as_the_number_and_a_pause(marker: str, intro: str, zh: bool) -> None:
    item = "打开设置。" if zh else "Open the app."
    out = normalize(f"{intro}{marker}{item}").text
    if zh:
        assert out.endswith("一，打开设置。") and "一。" not in out
    else:
        assert out.endswith("one, Open the app.")


@pytest.mark.parametrize("text, expected", [
    ("第1、2、3名都有奖。", "第一、二、三名都有奖。"),
    ("这个问题见注①。", "这个问题见注一。"),
    ("他考了1.5分。", "他考了一点五分。"),
    ("分数是90、85、77。", "分数是九十、八十五、七十七。"),
    ("Our office: (02) 9876 5432.", "Our office, zero two, nine eight seven six, five four three two."),
])
def test_numbers_that_are_no_list_numbers_keep_their_reading(text: str, expected: str) -> None:
    assert normalize(text).text == expected


def _no_quantity(words: str) -> bool:
    return not any(c in words for c in "十百千万亿")


@pytest.mark.parametrize("seed", range(3))
def test_codes_in_running_text_are_read_digit_by_digit(seed: int) -> None:
    """Plates after any province, flats after a building, codes in brackets after a name: never
    an amount, whatever the digits and the words around them."""
    import random

    rng = random.Random(seed)
    for _ in range(40):
        digits = "".join(rng.choice("0123456789") for _ in range(5))
        province = rng.choice("京沪粤苏浙川鄂湘")
        plate = f"{province}{rng.choice('ABCDE')}{rng.choice(['·', ' ', ''])}{digits}"
        out = normalize(f"{rng.choice(['车牌', '那辆', ''])}{plate}{rng.choice(['的车', '。', '，请挪车'])}").text
        assert _no_quantity(out) and not any(c.isdigit() for c in out), (plate, out)
        flat = str(rng.randint(101, 3299))
        building = rng.choice(["5号楼", "12栋", "3单元", "B座", "2幢"])
        out = normalize(f"我住{building}{flat}，{rng.choice(['欢迎来玩', '很近'])}。").text
        assert _no_quantity(out.split("，")[0][4:]), (building, flat, out)
        code = "".join(rng.choice("0123456789") for _ in range(6))
        out = normalize(f"{rng.choice(['宁德时代', '贵州茅台', '腾讯控股'])}（{code}）今天涨停。").text
        assert _no_quantity(out) and not any(c.isdigit() for c in out), (code, out)


@pytest.mark.parametrize("text, expected", [
    ("门票（300元）已售罄。", "门票，三百元，已售罄。"),
    ("这栋楼2000平方米。", "这栋楼两千平方米。"),
    ("5号楼1200万卖了。", "五号楼一千二百万卖了。"),
    ("这套房子是3室2厅。", "这套房子是三室两厅。"),
])
def test_amounts_near_codes_stay_amounts(text: str, expected: str) -> None:
    assert normalize(text).text == expected


@pytest.mark.parametrize("text, zh", [
    ("已知a²-b²=0，求a。", "已知a的平方减b的平方等于零，求a。"),
    ("√3约等于1.732。", "根号三约等于一点七三二。"),
    ("∛27=3。", "三次根号二十七等于三。"),
    ("已知y³-8=0。", "已知y的立方减八等于零。"),
    ("已知x≠y，且x≤5。", "已知x不等于y，且x小于等于五。"),
])
def test_a_formula_in_a_chinese_sentence_is_read_in_chinese(text: str, zh: str) -> None:
    """Its letters are variables, no reason to leave Chinese; under ``zh`` and ``auto`` alike."""
    for language in ("auto", "zh"):
        out = normalize(text, language=language)
        assert out.text == zh and not out.dropped
    assert all(seg.lang == "zh" or len(seg.text.strip(" ，。")) == 1 for seg in normalize(text).segments)


@pytest.mark.parametrize("sup, zh, en", [("²", "的平方", "squared"), ("³", "的立方", "cubed"),
                                         ("ⁿ", "的n次方", "to the n"), ("⁴", "的四次方", "to the power of four")])
@pytest.mark.parametrize("var", ["a", "x", "2", "(a+b)"])
def test_powers_are_read_in_both_languages(sup: str, zh: str, en: str, var: str) -> None:
    assert zh in normalize(f"已知{var}{sup}=1。").text
    assert en in normalize(f"We know {var}{sup} = 1 here.", language="en").text


@pytest.mark.parametrize("text, expected", [
    ("血压135/85mmHg。", "血压一百三十五，八十五毫米汞柱。"),
    ("血压为128/82。", "血压为一百二十八，八十二。"),
    ("血压135/85mmHg，血氧98%，体温37.2℃。",
     "血压一百三十五，八十五毫米汞柱，血氧百分之九十八，体温三十七点二摄氏度。"),
    ("Blood pressure is 135/85.", "Blood pressure is one hundred and thirty five over eighty five."),
    ("完成了3/4的工作。", "完成了四分之三的工作。"),
])
def test_a_blood_pressure_is_no_fraction(text: str, expected: str) -> None:
    out = normalize(text)
    assert out.text == expected and not out.dropped


@pytest.mark.parametrize("time", ["24:00", "24:00:00", "00:00"])
def test_midnight_in_english(time: str) -> None:
    assert normalize(f"The store is open until {time}.").text == "The store is open until midnight."
    assert "twenty four" not in normalize(f"Open from 8:00 to {time} daily.").text


@pytest.mark.parametrize("sign, word", [("-", "负"), ("−", "负"), ("+", "正")])
@pytest.mark.parametrize("head", ["百分之", "千分之"])
def test_a_sign_before_a_written_percentage_is_read(sign: str, word: str, head: str) -> None:
    assert normalize(f"同比{sign}{head}5。").text == f"同比{word}{head}五。"
