"""Issue #32's kinds: the ten inputs of the issue, and a seeded neighbour check per kind.

Each generator makes variants of its kind (other numbers, other context words, both languages,
punctuation around it) and asserts properties for every variant, not exact readings: no digit
or symbol survives unread, nothing is dropped (these variants hold only speakable characters),
an identifier is never read as a cardinal, a range always has its 到 / to. Seeded, so a failure
names its variant and reproduces. The corpus sentences are also read again with other digits
(every kind the corpus has).
"""

from __future__ import annotations

import collections
import random
import re
from collections.abc import Callable, Iterator

import pytest

from chattts_serving.text import normalize as textnorm
from chattts_serving.text.normalize import NormalizedText, normalize
from chattts_serving.text.normalize.letters import REGNAL_NAMES
from chattts_serving.text.normalize_report import load_corpus
from tests.support.readings import SPOKEN, assert_read

SEED = 32
VARIANTS = 60
ZH_CARDINAL = re.compile(r"[十百千万亿]")
EN_CARDINAL = re.compile(r"\b(?:hundred|thousand|million|and)\b")

ISSUE_EXAMPLES = [
    ("keys", "返回上一级请按*号键，重听请按#号键。", "返回上一级请按星号键，重听请按井号键。"),
    ("room", "您的房间是2508。", "您的房间是二五零八。"),
    ("roman", "本套书分为Ⅳ卷。", "本套书分为四卷。"),
    ("en-range", "Registration is open Oct 1-7.", "Registration is open October first to seventh."),
    ("title", "Please ask Dr. Chen about it.", "Please ask Doctor Chen about it."),
    ("decade", "She plays 70s rock every Friday.", "She plays seventies rock every Friday."),
    ("dot-time", "晚上8.15见。", "晚上八点十五分见。"),
    ("arithmetic", "9 - 4 = 5", "九减四等于五"),
    ("middot", "会议定于2019·2·10召开。", "会议定于二零一九年二月十日召开。"),
    ("currency", "价格是₩100，约合₹7。", "价格是一百韩元，约合七卢比。"),
]


@pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
@pytest.mark.parametrize("kind, text, expected", ISSUE_EXAMPLES, ids=[e[0] for e in ISSUE_EXAMPLES])
def test_issue_examples_read_as_a_listener_expects(kind: str, text: str, expected: str, library: bool) -> None:
    result = normalize(text, library=library)
    assert result.text == expected
    assert result.dropped == ()


NEW_CATEGORIES = ("keys", "identifier", "roman", "abbreviation", "english-range", "decade", "dot-time", "arithmetic",
                  "middot", "currency", "fraction")


def test_corpus_has_the_new_categories_in_both_languages() -> None:
    """Issue #32: at least 120 more sentences (476 before), each new category at least 12, each
    with Chinese and English sentences."""
    rows = load_corpus()
    per_category = collections.Counter(r.category for r in rows)
    assert len(rows) >= 476 + 120
    assert {c: per_category[c] for c in NEW_CATEGORIES if per_category[c] < 12} == {}
    for c in NEW_CATEGORIES:
        texts = [r.text for r in rows if r.category == c]
        assert any(re.search("[\u4e00-\u9fff]", t) for t in texts), f"{c}: no Chinese sentence"
        assert any(not re.search("[\u4e00-\u9fff]", t) for t in texts), f"{c}: no English sentence"


Check = Callable[[str, NormalizedText], None]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randint(0, 9)) for _ in range(n))


def keys(rng: random.Random) -> tuple[str, Check]:
    sym = rng.choice("*#＊＃")
    name_zh, name_en = ("星号", "star") if sym in "*＊" else ("井号", "pound")
    if rng.random() < 0.6:
        text = (rng.choice(["", "返回", "如需重听，", "结束后"]) + rng.choice(["请按", "按", "再按", "直接按"])
                + rng.choice(["", " "]) + sym + rng.choice(["号键", "键", "号", ""])
                + rng.choice(["。", "，谢谢。", "返回。", ""]))

        def check(text: str, r: NormalizedText) -> None:
            assert name_zh in r.text
    else:
        text = (rng.choice(["Press", "press", "Dial", "Then press"]) + " " + sym
                + rng.choice(["", " to confirm", " to go back", ".", " key."]))

        def check(text: str, r: NormalizedText) -> None:
            assert name_en in re.findall("[A-Za-z]+", r.text)
    return text, check


ZH_ID_WORDS = ["房间", "房间号", "车牌号", "股票代码", "工号", "取件码", "座位号", "航班", "车次", "编号", "验证码"]
EN_ID_WORDS = ["Call", "call", "Dial", "room", "Room", "flight", "gate", "extension", "code"]


def identifiers(rng: random.Random) -> tuple[str, Check]:
    """A number after an identifier word, before 室, a hyphenated code or a parking space:
    digit by digit, never a cardinal, every digit read."""
    form = rng.randrange(5)
    digits = str(rng.randint(1, 9)) + _digits(rng, rng.randint(2, 7))
    if form == 0:
        text = (rng.choice(["您的", "我的", "", "请记住"]) + rng.choice(ZH_ID_WORDS) + rng.choice(["是", "", "：", " "])
                + digits + rng.choice(["。", "，请核对。", ""]))
        count = len(digits)
    elif form == 1:
        text = "我住在" + digits[:4] + rng.choice(["室", "号房", "房间"]) + rng.choice(["。", ""])
        count = len(digits[:4])
    elif form == 2:
        parts = [_digits(rng, rng.randint(1, 4)) for _ in range(rng.choice([2, 3, 3]))]
        text = rng.choice(["取件码", "您的取件码是", "提货码"]) + "-".join(parts) + rng.choice(["。", "，请尽快领取。"])
        count = sum(len(p) for p in parts)
    elif form == 3:
        code = rng.choice("ABCD") + str(rng.randint(1, 3)) + "-" + _digits(rng, rng.randint(2, 4))
        text = rng.choice(["请把车停在", "车位", "停车位："]) + code + rng.choice(["车位。", "。", ""])
        count = len(re.sub(r"\D", "", code))
    else:
        text = rng.choice(EN_ID_WORDS) + " " + digits[:rng.randint(3, 5)] + rng.choice([" now.", ".", " please", ""])
        count = len(re.sub(r"\D", "", text))

        def check_en(text: str, r: NormalizedText) -> None:
            assert not EN_CARDINAL.search(r.text), "an identifier read as a cardinal"
            words = r.text.replace(",", " ").replace(".", " ").split()
            assert sum(w in ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
                       for w in words) == count

        return text, check_en

    def check(text: str, r: NormalizedText) -> None:
        assert not ZH_CARDINAL.search(r.text), "an identifier read as a cardinal"
        assert len(re.findall("[零幺一二三四五六七八九]", r.text)) == count, "a digit went missing"

    return text, check


def roman(rng: random.Random) -> tuple[str, Check]:
    value = rng.randint(1, 12)
    uni = chr(0x2160 + value - 1)
    ascii_numeral = ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII"][value - 1]
    zh = textnorm.zh_number(str(value))
    form = rng.randrange(4)
    if form == 0:
        text = rng.choice(["第{}章", "分为{}卷", "这是{}期", "{}型", "全书共{}部"]).format(uni)
        text += rng.choice(["。", "，", ""])
        want = zh
    elif form == 1:
        text = rng.choice(["他患有{}型糖尿病。", "肺癌{}期。", "第{}卷。"]).format(ascii_numeral)
        want = zh
    elif form == 2:
        word = rng.choice(["Chapter", "Part", "World War", "Type", "Phase", "Volume"])
        text = f"{word} {rng.choice([uni, ascii_numeral])}{rng.choice(['.', ' is next.', ', then more'])}"
        want = textnorm.en_int(value)
    else:
        text = f"{rng.choice(REGNAL_NAMES)} {ascii_numeral}{rng.choice([' ruled.', '.', ' was king'])}"
        want = "the " + textnorm.en_ordinal(value)

    def check(text: str, r: NormalizedText) -> None:
        assert want in r.text

    return text, check


TITLES = {"Dr.": "Doctor", "Prof.": "Professor", "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz"}


def abbreviations(rng: random.Random) -> tuple[str, Check]:
    title = rng.choice(list(TITLES))
    name = rng.choice(["Chen", "Smith", "Li", "Brown", "Garcia"])
    tail = rng.choice(["etc.", "vs. the rest", "e.g. tomorrow", "in St. Louis", "on Main St."])
    text = f"{rng.choice(['Ask', 'Please call', 'We met'])} {title} {name} {tail}"

    def check(text: str, r: NormalizedText) -> None:
        assert TITLES[title] in re.findall("[A-Za-z]+", r.text)
        assert not re.search(r"\b(?:Dr|Prof|Mrs?|Ms|St|etc|vs|e\.g)\.", r.text), "an abbreviation left as written"

    return text, check


MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec", "January",
          "March", "October", "December"]


def en_ranges(rng: random.Random) -> tuple[str, Check]:
    """Date ranges and weekday ranges: always a to (or the word written between them)."""
    sep = rng.choice(["-", "–", " - ", "—"])
    if rng.random() < 0.6:
        a = rng.randint(1, 27)
        b = rng.randint(a + 1, 28)
        month = rng.choice(MONTHS)
        body = rng.choice([f"{month} {a}{sep}{b}", f"{a}{sep}{b} {month}"])
        body += rng.choice(["", ", 2024", ", 1999"])
    else:
        days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Monday", "Friday"]
        body = f"{rng.choice(days)}{sep}{rng.choice(days)}"
    text = rng.choice(["Open ", "We are away ", "Registration runs ", ""]) + body + rng.choice([".", "!", " only."])

    def check(text: str, r: NormalizedText) -> None:
        assert " to " in r.text

    return text, check


def decades(rng: random.Random) -> tuple[str, Check]:
    n = rng.randint(1, 9) * 10
    if rng.random() < 0.5:
        text = f"{rng.choice(['She loves', 'We play', 'They watch'])} {n}s {rng.choice(['rock', 'movies', 'fashion'])}."
        word = textnorm.en_int(n)
        want = word[:-1] + "ies" if word.endswith("y") else word + "s"  # seventies, tens
    else:
        text = f"{rng.choice(['Wait', 'It took', 'Only'])} {n}s{rng.choice(['.', ' to load.', ', then retry.'])}"
        want = textnorm.en_int(n) + " seconds"

    def check(text: str, r: NormalizedText) -> None:
        assert want in r.text

    return text, check


def dot_times(rng: random.Random) -> tuple[str, Check]:
    h, m = rng.randint(0, 12), rng.randint(0, 59)
    if rng.random() < 0.6:
        text = rng.choice(["晚上", "早上", "下午", "今晚", "明早", "凌晨"]) + f"{h}.{m:02d}"
        text += rng.choice(["见。", "出发", "开会。"])

        def check(text: str, r: NormalizedText) -> None:
            assert re.search("点(?:整|零?[一二三四五六七八九十]+分)", r.text), "not read as a clock time"
    else:
        text = f"{rng.choice(['See you at', 'It starts at', 'Leave at'])} {h}.{m:02d}{rng.choice(['.', 'pm.', ' am.'])}"

        def check(text: str, r: NormalizedText) -> None:
            assert "point" not in r.text

    return text, check


def arithmetic(rng: random.Random) -> tuple[str, Check]:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op = rng.choice(["-", "+", "×", "/", "*", "−"])
    sp = rng.choice(["", " "])
    text = f"{a}{sp}{op}{sp}{b}{sp}={sp}{rng.randint(0, 999)}"
    if rng.random() < 0.5:
        text = rng.choice(["算一算：", "答案：", ""]) + text + rng.choice(["。", ""])
        words = {"-": "减", "−": "减", "+": "加", "×": "乘以", "*": "乘以", "/": "除以"}

        def check(text: str, r: NormalizedText) -> None:
            assert words[op] in r.text and "等于" in r.text and "到" not in r.text and "比" not in r.text
    else:
        text = rng.choice(["We know that ", "Check: "]) + text + "."
        words = {"-": "minus", "−": "minus", "+": "plus", "×": "times", "*": "times", "/": "divided by"}

        def check(text: str, r: NormalizedText) -> None:
            assert words[op] in r.text and "equals" in r.text and " to " not in r.text

    return text, check


def middle_dots(rng: random.Random) -> tuple[str, Check]:
    dot = rng.choice("·・‧")
    if rng.random() < 0.5:
        y, m, d = rng.randint(1950, 2049), rng.randint(1, 12), rng.randint(1, 28)
        text = rng.choice(["会议定于", "合同于", ""]) + f"{y}{dot}{m}{dot}{d}" + rng.choice(["召开。", "到期。", ""])

        def check(text: str, r: NormalizedText) -> None:
            assert "年" in r.text and "月" in r.text and "日" in r.text
    else:
        m, d = rng.randint(1, 12), rng.randint(1, 31)
        text = f"{m}{dot}{d}" + rng.choice(["事件。", "地震", "晚会"])

        def check(text: str, r: NormalizedText) -> None:
            assert "月" not in r.text and not ZH_CARDINAL.search(r.text.replace("十二", "").replace("十一", ""))

    return text, check


CURRENCY_WORDS = {"₩": ("韩元", "won"), "₹": ("卢比", "rupee"), "₽": ("卢布", "ruble"), "฿": ("泰铢", "baht"),
                  "₫": ("越南盾", "dong"), "₱": ("比索", "peso"), "₺": ("里拉", "lira"), "R$": ("雷亚尔", "rea"),
                  "HK$": ("港元", "Hong Kong dollar"), "NT$": ("新台币", "New Taiwan dollar"),
                  "₪": ("谢克尔", "shekel")}


def currencies(rng: random.Random) -> tuple[str, Check]:
    sign = rng.choice(list(CURRENCY_WORDS))
    amount = rng.choice([str(rng.randint(1, 99999)), f"{rng.randint(1, 99)},{rng.randint(0, 999):03d}"])
    zh = rng.random() < 0.5
    text = (rng.choice(["价格是", "一共"]) + sign + amount + "。") if zh else f"It costs {sign}{amount}."

    def check(text: str, r: NormalizedText) -> None:
        assert CURRENCY_WORDS[sign][0 if zh else 1] in r.text

    return text, check


def signed_fractions(rng: random.Random) -> tuple[str, Check]:
    sign = rng.choice(["-", "−", "+"])
    a, b = rng.randint(1, 12), rng.randint(2, 31)
    zh = rng.random() < 0.5
    text = (rng.choice(["结果是", "斜率为", ""]) + f"{sign}{a}/{b}" + rng.choice(["。", ""])) if zh else \
        f"The slope is {sign}{a}/{b}."

    def check(text: str, r: NormalizedText) -> None:
        if zh:
            assert ("正" if sign == "+" else "负") + textnorm.zh_number(str(b)) + "分之" in r.text
        else:
            assert ("plus " if sign == "+" else "minus ") in r.text

    return text, check


def liang_money(rng: random.Random) -> tuple[str, Check]:
    """2 before 元/块 reads 两 with or without decimals; 两 never in a fraction."""
    if rng.random() < 0.5:
        cents = rng.choice(["", f".{rng.randint(1, 9)}", f".{rng.randint(1, 99):02d}"])
        text = rng.choice(["这支笔", "找零", "一共"]) + f"2{cents}" + rng.choice(["元", "块"]) + "。"

        def check(text: str, r: NormalizedText) -> None:
            assert re.search("两[元块]", r.text)
    else:
        text = f"{rng.randint(1, 9)}又2分之{rng.randint(1, 9)}" + rng.choice(["", "个小时", "。"])

        def check(text: str, r: NormalizedText) -> None:
            assert "两" not in r.text and "二分之" in r.text

    return text, check


def ranges(rng: random.Random) -> tuple[str, Check]:
    """a-b and a~b with a unit or a percent: always 到 / to."""
    a = rng.randint(1, 50)
    b = a + rng.randint(1, 50)
    sep = rng.choice(["-", "~", "～", "至"])
    if rng.random() < 0.5:
        text = rng.choice(["需要", "大约", "温度"]) + f"{a}{sep}{b}" + rng.choice(["天", "个", "%", "℃", "公里"]) + "。"

        def check(text: str, r: NormalizedText) -> None:
            assert ("至" if sep == "至" else "到") in r.text
    else:
        text = f"It takes {a}{sep if sep != '至' else '-'}{b} {rng.choice(['days', 'hours', 'km'])}."

        def check(text: str, r: NormalizedText) -> None:
            assert " to " in r.text

    return text, check


GENERATORS: dict[str, Callable[[random.Random], tuple[str, Check]]] = {
    "keys": keys, "identifiers": identifiers, "roman": roman, "abbreviations": abbreviations,
    "en_ranges": en_ranges, "decades": decades, "dot_times": dot_times, "arithmetic": arithmetic,
    "middle_dots": middle_dots, "currencies": currencies, "signed_fractions": signed_fractions,
    "liang_money": liang_money, "ranges": ranges,
}


def _variants(name: str) -> Iterator[tuple[int, str, Check]]:
    rng = random.Random(f"{SEED}-{name}")
    for i in range(VARIANTS):
        text, check = GENERATORS[name](rng)
        yield i, text, check


@pytest.mark.parametrize("library", [True, False], ids=["shipped", "ours"])
@pytest.mark.parametrize("name", list(GENERATORS))
def test_every_variant_of_a_kind_is_read(name: str, library: bool) -> None:
    failures = []
    for i, text, check in _variants(name):
        result = normalize(text, library=library)
        try:
            assert_read(text, result)
            check(text, result)
        except AssertionError as exc:
            failures.append(f"variant {i}: {text!r} -> {result.text!r}: {exc}")
    assert failures == []


ROWS = [r for r in load_corpus() if r.category != "control"]


@pytest.mark.parametrize("seed", range(3))
def test_corpus_sentences_with_other_digits_are_read(seed: int) -> None:
    """Every corpus sentence with each digit run replaced by random digits of its length: no
    digit or symbol survives and only what the sentence reports is dropped (the control-token
    sentences keep their token numbers)."""
    rng = random.Random(f"{SEED}-corpus-{seed}")
    failures = []
    for row in ROWS:
        text = re.sub(r"\d+", lambda m: "".join(str(rng.randint(1 if i == 0 and m.group(0)[0] != "0" else 0, 9))
                                                for i in range(len(m.group(0)))), row.text)
        result = normalize(text)
        if not SPOKEN.fullmatch(textnorm.CONTROL_TOKEN.sub("", result.text)) or result.dropped != row.dropped:
            failures.append(f"{row.category}.tsv:{row.line}: {text!r} -> {result.text!r} {result.dropped}")
    assert failures == []


@pytest.mark.parametrize("text, zh, en", [
    ("25kg", "二十五千克", "twenty five kilograms"),
    ("03:04pm", "下午三点零四分", "three oh four PM"),
    ("3.5%", "百分之三点五", "three point five percent"),
    ("2024-03-05", "二零二四年三月五日", "March fifth, twenty twenty four"),
])
def test_language_reads_text_without_context_of_its_own(text: str, zh: str, en: str) -> None:
    assert normalize(text, language="zh").text == zh
    assert normalize(text, language="en").text == en
    assert normalize(text, language="auto").text in (zh, en)


def test_language_does_not_override_the_words_around_a_number() -> None:
    for language in ("zh", "en", "auto"):
        assert normalize("我有3个苹果", language=language).text == "我有三个苹果"
        assert normalize("I have 3 apples", language=language).text == "I have three apples"


def test_an_unknown_language_is_refused() -> None:
    with pytest.raises(textnorm.TextNormError, match="language"):
        normalize("25kg", language="fr")
