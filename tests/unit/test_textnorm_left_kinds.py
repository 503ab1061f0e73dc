"""Kinds still misread before 2026-12-08, each with seeded neighbours, with and without
WeTextProcessing: one-letter units after a spaced number (300 m. Then, 5 g of salt), inch marks
(a 65" TV), sizes with a unit on each side (12 ft x 15 ft), address abbreviations without a dot
(Main Ave, Apt 4, ext 204, PO Box), a season and episode (S02E04) and #1234 inside Chinese,
durations h:mm:ss after a duration word, 14h30 and 0900 hours, a card's expiry (Exp 09/27), Indian
and European digit grouping in amounts (₹1,50,000, €1.200,00), seasons and spans (2024/25,
1950s-60s, Q1-Q4, 18:30-次日2:00), slash abbreviations (w/, w/o, y/o), short domains (bit.ly),
spaced scores (3 - 1), chips' model numbers (7950X, Xbox 360), years before 1100 (in 1066), dial
codes (*67, *#06#) and factorials (5! = 120). Each kind is checked on random neighbours, one or two
whole readings, and the neighbours that must keep their reading."""

from __future__ import annotations

import random

import pytest

from chattts_serving.text.normalize import en_int, en_year, normalize
from tests.support.readings import read as _read

LIBRARY = pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


@LIBRARY
def test_a_one_letter_unit_after_a_spaced_number_is_said_where_no_letter_is_meant(library: bool) -> None:
    units = {"m": ("meter", "meters"), "g": ("gram", "grams"), "s": ("second", "seconds"), "L": ("liter", "liters"),
             "h": ("hour", "hours")}
    rng = random.Random("spaced-letters")
    for _ in range(40):
        unit, n = rng.choice(list(units)), rng.randint(2, 900)
        tail = rng.choice([". Then we rested.", ", then we rested.", " of it.", ";", "."])
        said = _read(f"We used {n} {unit}{tail}", library)
        assert f"{en_int(n)} {units[unit][1]}" in said, said
    assert normalize("We ran 300 m. Then", library=library).text == "We ran three hundred meters. Then"
    assert normalize("Add 5 g of salt and 1 L of water", library=library).text == \
        "Add five grams of salt and one liter of water"
    assert normalize("for 10 s, then", library=library).text == "for ten seconds, then"
    # letters that stay letters: a grade, am/pm, a plan's name, miles or metres after a vehicle
    for text, said in (("He got grade 5 A.", "He got grade five A."), ("at 5 p.m. today", "at five PM today"),
                       ("Plan B, then", "Plan B, then"), ("I drove 5 m.", "I drove five m."),
                       ("5 m away", "five meters away")):
        assert normalize(text, library=library).text == said, text


@LIBRARY
def test_an_inch_mark_says_inch_and_a_closing_quote_stays_silent(library: bool) -> None:
    rng = random.Random("inches")
    for _ in range(30):
        n = rng.randint(2, 98)
        mark = rng.choice(['"', "″"])
        en = _read(f"I bought a {n}{mark} TV.", library)
        assert f"{en_int(n)} inch TV" in en, en
        zh = _read(f"买了一台{n}{mark}电视。", library)
        assert "英寸电视" in zh, zh
    assert normalize('A 65" TV', library=library).text == "A sixty five inch TV"
    assert normalize('The screen is 65".', library=library).text == "The screen is sixty five inches."
    assert normalize('He said "I am 65" and left.', library=library).text == "He said I am sixty five and left."
    assert normalize("She is 5'6\" tall.", library=library).text == "She is five feet six inches tall."


@LIBRARY
def test_a_size_with_a_unit_on_each_side_says_by(library: bool) -> None:
    units = {"ft": "feet", "m": "meters", "cm": "centimeters", "in": None, '"': "inch"}
    rng = random.Random("unit-sizes")
    for _ in range(40):
        unit = rng.choice([u for u, w in units.items() if w])
        a, b = rng.randint(2, 90), rng.randint(2, 90)
        space = "" if unit == '"' else rng.choice(["", " "])
        times = rng.choice([" x ", " × ", "×"] if unit.isalpha() else [" x ", " × ", "x", "×"])
        en = _read(f"The room is {a}{space}{unit}{times}{b}{space}{unit}.", library)
        assert " by " in en and " x " not in f" {en} " and en.count(units[unit] or "") == 2, en
        zh = _read(f"房间{a}米×{b}米。", library)
        assert "乘以" in zh, zh
    assert normalize("The room is 12 ft x 15 ft.", library=library).text == "The room is twelve feet by fifteen feet."
    assert normalize("A 3m x 4m rug", library=library).text == "A three meter by four meter rug"
    assert normalize("5kg x 3", library=library).text == "five kilograms x three"  # no unit after the second


@LIBRARY
def test_an_address_abbreviation_without_a_dot_is_its_word(library: bool) -> None:
    streets = {"Ave": "Avenue", "Rd": "Road", "Blvd": "Boulevard", "St": "Street", "Dr": "Drive", "Ln": "Lane"}
    rng = random.Random("addresses")
    for _ in range(40):
        abbr, n, flat = rng.choice(list(streets)), rng.randint(2, 9999), rng.randint(1, 40)
        name = rng.choice(["Main", "Oak", "Elm", "Park", "Lake"])
        said = _read(f"Send it to {n} {name} {abbr}, Apt {flat}.", library)
        assert f"{name} {streets[abbr]}, Apartment" in said, said
        ext = rng.randint(100, 9999)
        assert "extension " + " ".join(en_int(int(d)) for d in str(ext)) in _read(f"Call ext {ext} today.", library)
    assert normalize("12 Main Ave, Apt 4", library=library).text == "twelve Main Avenue, Apartment four"
    assert normalize("PO Box 123", library=library).text == "P O Box one two three"
    assert normalize("Ste 300", library=library).text == "Suite three hundred"
    # not an address: a title, a saint, a letter after no name
    for text in ("Ask Dr Smith about it.", "St Louis is big", "Visit Mount St Helens"):
        assert normalize(text, library=library).text == text


@LIBRARY
def test_a_season_and_episode_and_a_hash_number_in_chinese_are_said_in_its_words(library: bool) -> None:
    rng = random.Random("episodes")
    for _ in range(30):
        s, e = rng.randint(1, 30), rng.randint(1, 40)
        code = f"S{s:02d}E{e:02d}" if rng.random() < 0.7 else f"s{s}e{e}"
        en = _read(f"Watch {code} tonight.", library)
        assert f"season {en_int(s)} episode {en_int(e)}" in en, en
        zh = _read(f"我在看{code}这一集。", library)
        assert "第" in zh and "季第" in zh and "集这一集" in zh, zh
        n = rng.randint(100, 99999)
        pr = _read(f"请看PR #{n}的修改。", library)
        assert "number" not in pr and "号的修改" in pr, pr
    assert normalize("我在看S02E04这一集", library=library).text == "我在看第二季第四集这一集"
    assert normalize("请看PR #1234的修改", library=library).text == "请看PR 一二三四号的修改"
    # neighbours that keep their reading
    assert normalize("See #3 and # 4", library=library).text == "See number three and number four"
    assert normalize("订单号#12345已发货", library=library).text == "订单号幺二三四五已发货"


@LIBRARY
def test_a_duration_h_mm_ss_after_a_duration_word_is_hours_minutes_and_seconds(library: bool) -> None:
    rng = random.Random("durations")
    for _ in range(30):
        h, m, s = rng.randint(1, 9), rng.randint(10, 59), rng.randint(10, 59)
        lead = rng.choice(["The run took", "The marathon lasted", "She finished in", "He clocked"])
        en = _read(f"{lead} {h}:{m:02d}:{s:02d} today.", library)
        assert f"{en_int(h)} hour" in en and f"{en_int(m)} minutes and {en_int(s)} seconds" in en, en
        zh = _read(f"用时{h}:{m:02d}:{s:02d}。", library)
        assert "小时" in zh and "分" in zh and zh.endswith("秒。"), zh
    assert normalize("The run took 1:32:05", library=library).text == \
        "The run took one hour thirty two minutes and five seconds"
    assert normalize("用时1:32:05", library=library).text == "用时一小时三十二分五秒"
    assert normalize("The meeting is at 10:30:00.", library=library).text == "The meeting is at ten thirty."


@LIBRARY
def test_a_time_written_with_h_or_in_hundreds_hours_is_a_clock_time(library: bool) -> None:
    rng = random.Random("h-times")
    for _ in range(30):
        h, m = rng.randint(13, 23), rng.choice([15, 30, 45])
        zh = _read(f"会议{h}h{m}开始。", library)
        assert "点" in zh and "分" in zh and "h" not in zh, zh
        en = _read(f"Meet at {h}h{m} sharp.", library)
        assert f"at {en_int(h)} {en_int(m)} sharp" in en, en
        mh, mm = rng.randint(0, 23), rng.choice([0, 5, 30])
        lead = "Report at" if mh >= 10 else rng.choice(["Report at", "Wake-up is"])
        mil = _read(f"{lead} {mh:02d}{mm:02d} hours.", library)
        assert "thousand" not in mil and "zero nine zero" not in mil and mil.endswith("hours."), mil
    assert normalize("会议14h30开始", library=library).text == "会议十四点三十分开始"
    assert normalize("Report at 0900 hours", library=library).text == "Report at oh nine hundred hours"
    assert normalize("at 1730 hours", library=library).text == "at seventeen thirty hours"
    # counts of hours and a duration stay what they were
    assert normalize("We logged 1200 hours of work", library=library).text == \
        "We logged one thousand two hundred hours of work"
    assert normalize("It took 1h30min", library=library).text == "It took one hour thirty minutes"


@LIBRARY
def test_a_cards_expiry_is_a_month_and_a_year(library: bool) -> None:
    rng = random.Random("expiry")
    for _ in range(30):
        m, y = rng.randint(1, 12), rng.randint(24, 39)
        lead = rng.choice(["Exp", "exp.", "EXP", "Expires", "valid thru", "Valid thru", "expiry date:"])
        said = _read(f"Card {lead} {m:02d}/{y}.", library)
        assert f"{MONTHS[m - 1]} {en_year(2000 + y)}" in said, said
    assert normalize("Card Exp 09/27", library=library).text == "Card expiry September twenty twenty seven"
    assert normalize("valid thru 03/29", library=library).text == "valid thru March twenty twenty nine"
    assert normalize("It will arrive 5/22.", library=library).text == "It will arrive May twenty second."


@LIBRARY
def test_an_amount_grouped_in_lakhs_or_with_dots_is_one_amount(library: bool) -> None:
    rng = random.Random("groupings")
    for _ in range(30):
        lakhs, rest = rng.randint(1, 99), rng.randint(0, 99999)
        value = lakhs * 100000 + rest
        digits = str(value)
        head, tail = digits[:-3], digits[-3:]
        pairs = ",".join([head[max(0, i - 2):i] for i in range(len(head), 0, -2)][::-1])
        sign = rng.choice(["₹", "Rs. ", "Rs "])
        en = _read(f"It costs {sign}{pairs},{tail} now.", library)
        assert en == f"It costs {en_int(value)} rupees now." or (value == 1 and "rupee" in en), en
        whole, cents = rng.randint(1000, 999999), rng.randint(0, 99)
        dotted = f"{whole:,}".replace(",", ".")
        eu = _read(f"It costs €{dotted},{cents:02d} today.", library)
        assert eu.startswith(f"It costs {en_int(whole)} euros"), eu
        zh = _read(f"价格是{dotted},{cents:02d}€。", library)
        assert "欧元" in zh and "，" not in zh, zh
    assert normalize("₹1,50,000", library=library).text == "十五万卢比"
    assert normalize("Rs. 1,50,000", library=library).text == "one hundred and fifty thousand rupees"
    assert normalize("It costs €1.200,00 today.", library=library).text == \
        "It costs one thousand two hundred euros today."
    # a decimal comma and a thousands comma keep their reading
    assert normalize("It costs €3,50.", library=library).text == "It costs three euros and fifty cents."
    assert normalize("€1,000 fee", library=library).text == "one thousand euros fee"


@LIBRARY
def test_a_season_a_decade_span_and_a_quarter_span_say_to(library: bool) -> None:
    rng = random.Random("spans")
    for _ in range(30):
        y = rng.randint(1950, 2040)
        short = (y + 1) % 100
        sep = rng.choice(["/", "-"])
        two_digits = short > 12 or short == 0
        written = f"{y}{sep}{short:02d}" if two_digits else f"{y}/{y + 1}"
        second = en_int(short) if two_digits and short else en_year(y + 1)
        en = _read(f"The {written} season was long.", library)
        assert en == f"The {en_year(y)} to {second} season was long.", en
        zh = _read(f"{written}赛季", library)
        assert "到" in zh and "分之" not in zh, zh
        d = rng.randrange(1900, 1980, 10)
        decades = _read(f"the {d}s-{(d + 10) % 100:02d}s", library)
        assert " to " in decades, decades
        a, b = rng.randint(1, 3), 4
        assert f"Q {en_int(a)} to Q {en_int(b)}" in _read(f"Sales grew from Q{a}-Q{b}.", library)
    assert normalize("The 2024/25 season", library=library).text == "The twenty twenty four to twenty five season"
    assert normalize("the 1999/2000 season", library=library).text == \
        "the nineteen ninety nine to two thousand season"
    assert normalize("the 1950s-60s", library=library).text == "the nineteen fifties to sixties"
    assert normalize("营业时间18:30-次日2:00", library=library).text == "营业时间十八点三十分到次日两点"
    # a year and a month, a range of pages keep their reading
    assert normalize("pages 10-20", library=library).text == "pages ten to twenty"
    assert normalize("2020-2024赛季", library=library).text == "二零二零到二零二四赛季"


@LIBRARY
def test_a_slash_abbreviation_is_its_word(library: bool) -> None:
    rng = random.Random("slashes")
    for _ in range(30):
        thing = rng.choice(["milk", "sugar", "ice", "cream", "lemon"])
        assert f"with {thing}" in _read(f"Tea w/ {thing}, please.", library)
        assert f"without {thing}" in _read(f"Tea w/o {thing}, please.", library)
        age = rng.randint(2, 99)
        assert f"{en_int(age)} year old man" in _read(f"A {age} y/o man was seen.", library)
        assert f"{en_int(age)} years old." in _read(f"He is {age} y/o.", library)
    assert normalize("w/ milk, w/o sugar", library=library).text == "with milk, without sugar"
    assert normalize("c/o John Smith", library=library).text == "care of John Smith"
    assert normalize("Status: N/A", library=library).text == "Status, not applicable"
    # a slash inside a name stays a name's
    assert normalize("the I/O bus", library=library).text == "the I O bus"
    assert normalize("A/B testing", library=library).text == "A B testing"


@LIBRARY
def test_a_short_domain_is_said_with_dot_not_split_as_a_sentence(library: bool) -> None:
    rng = random.Random("domains")
    for _ in range(20):
        name, tld = rng.choice([("bit", "ly"), ("youtu", "be"), ("goo", "gl"), ("t", "co"), ("x", "com")])
        said = _read(f"Visit {name}.{tld} now.", library)
        assert f"{name} dot {tld} now" in said, said
    assert normalize("Visit bit.ly", library=library).text == "Visit bit dot ly"
    assert normalize("He is really.Be careful", library=library).text == "He is really. Be careful"


@LIBRARY
def test_a_spaced_dash_between_a_matchs_numbers_is_a_score(library: bool) -> None:
    rng = random.Random("spaced-scores")
    for _ in range(30):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        lead = rng.choice(["The final score was", "They won", "United beat City", "It ended in a draw,"])
        said = _read(f"{lead} {a} - {b}.", library)
        assert f"{en_int(a)} to {en_int(b)}" in said, said
        zh = _read(f"比分 {a} - {b}。", library)
        assert "比" in zh[2:], zh
    assert normalize("The final score was 3 - 1.", library=library).text == "The final score was three to one."
    # arithmetic and a question stay minus, a spaced range says to as an unspaced one does
    assert normalize("5 - 3 = 2", library=library).text == "五减三等于二"
    assert normalize("What is 5 - 3?", library=library).text == "What is five minus three."
    assert normalize("5 - 3等于几？", library=library).text == "五减三等于几。"
    assert normalize("pages 10 - 20", library=library).text == "pages ten to twenty"
    assert normalize("I work 9 - 5.", library=library).text == "I work nine to five."


@LIBRARY
def test_a_chips_number_with_its_letters_is_a_model_number(library: bool) -> None:
    rng = random.Random("chips")
    for _ in range(30):
        n = rng.choice([3600, 5800, 5900, 7600, 7700, 7900, 7950, 9950])
        suffix = rng.choice(["X", "XT", "X3D"])
        said = _read(f"The Ryzen {n}{suffix} is fast.", library)
        assert "thousand" not in said and "hundred and" not in said, said
        k = rng.choice([12700, 13900, 14900, 12400])
        cpu = _read(f"Intel i9 {k}K chip", library)
        assert "thousand" not in cpu, cpu
    assert normalize("Ryzen 7950X", library=library).text == "Ryzen seventy nine fifty X"
    assert normalize("Xbox 360", library=library).text == "Xbox three sixty"
    assert normalize("我买了锐龙7950X处理器", library=library).text == "我买了锐龙七九五零X处理器"
    # a colour temperature and a count keep their reading
    assert normalize("a 6500K bulb", library=library).text == "a six thousand five hundred K bulb"
    assert normalize("Boeing 747", library=library).text == "Boeing seven forty seven"


@LIBRARY
def test_a_year_before_1100_is_said_as_a_year(library: bool) -> None:
    rng = random.Random("early-years")
    for _ in range(30):
        y = rng.randint(1010, 1099)
        lead = rng.choice(["in", "In", "since", "the year", "until"])
        said = _read(f"It began {lead} {y}, they say.", library)
        assert en_year(y) in said and "thousand" not in said, said
        assert "thousand" not in _read(f"{y} AD", library)
        assert "thousand" in _read(f"There are {y} people.", library)
    assert normalize("in 1066", library=library).text == "in ten sixty six"
    assert normalize("AD 1005", library=library).text == "AD ten oh five"
    assert normalize("in 1024 bytes", library=library).text == "in one thousand and twenty four bytes"


@LIBRARY
def test_a_dial_code_says_its_stars_and_hashes(library: bool) -> None:
    rng = random.Random("dial-codes")
    for _ in range(20):
        code = rng.choice(["*67", "*69", "*#06#", "#31#", "*123#", "*72"])
        said = _read(f"Dial {code} first.", library)
        assert said.count("star") == code.count("*") and said.count("hash") == code.count("#"), said
        zh = _read(f"请拨{code}查询。", library)
        assert zh.count("星号") == code.count("*") and zh.count("井号") == code.count("#"), zh
    assert normalize("Dial *67 first", library=library).text == "Dial star sixty seven first"
    assert normalize("*#06#", library=library).text == "星号井号零六井号"
    assert normalize("press #", library=library).text == "press pound"
    assert normalize("A *5* star hotel", library=library).text == "A five star hotel"  # emphasis


@LIBRARY
def test_a_factorial_in_a_calculation_is_said(library: bool) -> None:
    rng = random.Random("factorials")
    for _ in range(20):
        n = rng.randint(2, 12)
        said = _read(f"{n}! equals a lot.", library)
        assert f"{en_int(n)} factorial equals" in said, said
        zh = _read(f"{n}!等于多少？", library)
        assert "的阶乘等于" in zh, zh
        assert _read(f"I got {n}!", library) == f"I got {en_int(n)}."
    assert normalize("5! equals 120", library=library).text == "five factorial equals one hundred and twenty"
    assert normalize("3! + 4! = 30", library=library).text == "三的阶乘加四的阶乘等于三十"
    assert normalize("I got 5! Then I left.", library=library).text == "I got five. Then I left."
