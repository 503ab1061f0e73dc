"""Text front end: normalisation per language segment, control tokens, dropped characters,
the prompt's speed token, and voices (seeds, names, spk_emb strings, cache, determinism)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chattts_serving.export.weights import ADDED_TOKENS
from chattts_serving.runtime import Artifacts
from chattts_serving.text import normalize as textnorm
from chattts_serving.text import request_text
from chattts_serving.text.frontend import FrontEnd, FrontendError
from chattts_serving.text.normalize import normalize, split_languages
from chattts_serving.text.speaker import encode_spk_emb, speaker_from_seed
from chattts_serving.text.voices import (
    OPENAI_VOICES,
    SpeakerCache,
    Voice,
    VoiceBook,
    VoiceError,
    load_voices_file,
    parse_voices,
)

# (kind, language, input, expected normalised text)
CASES = [
    # cardinals, decimals, negatives, thousands separators, 两
    ("number", "zh", "我有3个苹果，12只猫。", "我有三个苹果，十二只猫。"),
    ("number", "zh", "共1,234,567人，温度-3.5度", "共一百二十三万四千五百六十七人，温度零下三点五度"),
    ("number", "zh", "2个人用了2000元和2年", "两个人用了两千元和两年"),
    ("number", "en", "I have 3 apples and 1,234 pears.",
     "I have three apples and one thousand two hundred and thirty four pears."),
    ("number", "en", "It fell to -3.5 degrees, code 007.",
     "It fell to minus three point five degrees, code zero zero seven."),
    ("number", "mixed", "我买了3个apple和5 pears", "我买了三个apple和 five pears"),
    ("ordinal", "zh", "他是第1名", "他是第一名"),
    ("ordinal", "en", "She came 2nd, I came 21st.", "She came second, I came twenty first."),
    ("fraction", "zh", "1/3的人", "三分之一的人"),
    ("fraction", "en", "Add 3/4 cup and 1/2 spoon, 2/3 of it.",
     "Add three quarters cup and one half spoon, two thirds of it."),
    ("fraction", "mixed", "约1/3的人 said 2/5 of it", "约三分之一的人 said two fifths of it"),
    ("range", "zh", "需要3-5天，或者10~20%的概率", "需要三到五天，或者百分之十到百分之二十的概率"),
    ("range", "en", "It takes 3-5 days, a 10%-20% chance, 5-10 km.",
     "It takes three to five days, a ten to twenty percent chance, five to ten kilometers."),
    # dates
    ("date", "zh", "今天是2024年3月5日", "今天是二零二四年三月五日"),
    ("date", "zh", "日期：2024-03-05", "日期，二零二四年三月五日"),
    ("date", "en", "Due 2024-03-05 or 12/25/2023.",
     "Due March fifth, twenty twenty four or December twenty fifth, twenty twenty three."),
    ("date", "en", "Born on March 5, 1990 and the 4th of July 1776.",
     "Born on March fifth, nineteen ninety and the fourth of July, seventeen seventy six."),
    ("date", "en", "In 1990 and the 1980s.", "In nineteen ninety and the nineteen eighties."),
    ("date", "mixed", "会议在2024/3/5, the deadline is 2024-03-08",
     "会议在二零二四年三月五日，the deadline is March eighth, twenty twenty four"),
    # times
    ("time", "zh", "会议10:30开始，下午2:05结束，8:00:15到达",
     "会议十点三十分开始，下午两点零五分结束，八点零分十五秒到达"),
    ("time", "zh", "明早9:00见", "明早九点整见"),
    ("time", "en", "Meet at 10:30 AM, leave at 5pm, back by 7:05.",
     "Meet at ten thirty AM, leave at five PM, back by seven oh five."),
    ("time", "mixed", "我们9:30见, see you at 9:30", "我们九点三十分见，see you at nine thirty"),
    # phone numbers
    ("phone", "zh", "电话13812345678", "电话幺三八，幺二三四，五六七八"),
    ("phone", "zh", "座机010-12345678，或+86 138-1234-5678",
     "座机零幺零，幺二三四五六七八，或加八六，幺三八，幺二三四，五六七八"),
    ("phone", "en", "Call (555) 123-4567 now.", "Call five five five, one two three, four five six seven now."),
    ("phone", "en", "Dial +44 20 7946 0958.",
     "Dial plus four four, two zero, seven nine four six, zero nine five eight."),
    ("phone", "mixed", "请拨打555-123-4567 for help", "请拨打五五五，幺二三，四五六七 for help"),
    # money
    ("money", "zh", "价格¥12.50，共100元，约$5", "价格十二元五角，共一百元，约五美元"),
    ("money", "zh", "找零3.05元，营收$1.5M，投资¥5万", "找零三元零五分，营收一百五十万美元，投资五万元"),
    ("money", "en", "It costs $12.50, €3, £1 or $0.99.",
     "It costs twelve dollars and fifty cents, three euros, one pound or ninety nine cents."),
    ("money", "en", "Revenue was $3 billion, up from $1.5M.",
     "Revenue was three billion dollars, up from one point five million dollars."),
    ("money", "mixed", "一杯咖啡$4.50, that is 32元", "一杯咖啡四点五美元，that is 三十二元"),
    # percentages
    ("percent", "zh", "增长了50%，下降了3.5%，千分之‰5", "增长了百分之五十，下降了百分之三点五，千分之千分号五"),
    ("percent", "en", "Up 50%, down -3.5%, 2‰ error.",
     "Up fifty percent, down minus three point five percent, two per mille error."),
    ("percent", "mixed", "准确率99.5%, recall 80%", "准确率百分之九十九点五，recall eighty percent"),
    # units
    ("unit", "zh", "跑了5km，用时1h，速度12km/h，体重70kg，气温25℃",
     "跑了五公里，用时一小时，速度十二公里每小时，体重七十千克，气温二十五摄氏度"),
    ("unit", "zh", "面积100m²，容量2L，内存16GB", "面积一百平方米，容量两升，内存十六GB"),
    ("unit", "en", "I ran 5 km in 30 min at 10 km/h; 1 kg, 2.5 GB, 98.6°F.",
     "I ran five kilometers in thirty minutes at ten kilometers per hour, one kilogram, two point five "
     "gigabytes, ninety eight point six degrees Fahrenheit."),
    ("unit", "mixed", "这台电脑有16GB内存, weighs 2 kg", "这台电脑有十六GB内存，weighs two kilograms"),
    # symbols
    ("symbol", "zh", "A&B公司，1+1=2，3×4", "A和B公司，一加一等于二，三乘以四"),
    ("symbol", "en", "Tom & Jerry, 3 < 5, a+b, #1 fan, email me@example.com",
     "Tom and Jerry, three less than five, a plus b, number one fan, email me at example dot com"),
    ("symbol", "mixed", "请联系support@chattts.ai或访问www.example.com",
     "请联系support 艾特 chattts 点 ai或访问www 点 example 点 com"),
    # file names: the dot is spoken, not a sentence end (and not a pause)
    ("file", "en", "Open config.yaml, then report_v2.pdf and archive.tar.gz.",
     "Open config dot yaml, then report underscore v two dot pdf and archive dot tar dot gz."),
    ("file", "zh", "请打开config.yaml文件，再看README.MD", "请打开config 点 yaml文件，再看README 点 MD"),
    ("file", "en", "It ends.Then Node.js starts, e.g. at 8.15.",
     "It ends. Then Node dot js starts, for example at eight fifteen."),
    # full-width / half-width punctuation and letters
    ("width", "zh", "ＡＢＣ１２３，全角！？（括号）", "ABC一百二十三，全角。括号"),
    ("width", "en", "Hello,world!How are you?Fine;thanks: ok.", "Hello, world. How are you. Fine, thanks, ok."),
    ("width", "mixed", "你好,world!“引号”and 'quotes'", "你好，world.引号and quotes"),
    ("width", "en", "Café naïve — façade…", "Cafe naive, facade."),
]


@pytest.mark.parametrize("kind, lang, text, expected", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_normalisation_verbalises_each_kind_per_language(kind: str, lang: str, text: str, expected: str) -> None:
    result = normalize(text)
    assert result.text == expected
    assert result.dropped == ()
    assert not any(c.isdigit() for c in result.text), "a digit survived normalisation"


@pytest.mark.parametrize("text", [c[2] for c in CASES] + ["你好[uv_break]世界[laugh]", "我爱你❤️"])
def test_output_survives_chattts_normaliser_unchanged(chattts_normalizer, text: str) -> None:
    """ChatTTS' Normalizer deletes what it cannot speak; after ours it finds nothing to delete."""
    out = normalize(text).text
    assert chattts_normalizer._count_invalid_characters(out) == set()
    again = chattts_normalizer(out, do_text_normalization=True, do_homophone_replacement=False)
    assert again.translate(str.maketrans("，。", ",.")) == out.translate(str.maketrans("，。", ",."))


SEGMENTS = [
    ("中文和English混合", [("zh", "中文和"), ("en", "English"), ("zh", "混合")]),
    ("Hello 你好 world", [("en", "Hello "), ("zh", "你好 "), ("en", "world")]),
    ("，。", [("zh", "，。")]),
    ("", []),
    ("[laugh]好[uv_break] ok", [("zh", "[laugh]好[uv_break] "), ("en", "ok")]),
]


@pytest.mark.parametrize("text, expected", SEGMENTS)
def test_split_languages(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(s.lang, s.text) for s in split_languages(text)] == expected


def test_mixed_text_segments_follow_the_language_of_each_part() -> None:
    r = normalize("我在2024年买了3 apples, it cost $5.")
    assert [(s.lang, s.text) for s in r.segments] == [("zh", "我在二零二四年买了 "),
                                                      ("en", "three apples, it cost five dollars.")]


CONTROL = [
    ("你好[uv_break]世界[laugh]", "你好[uv_break]世界[laugh]", None),
    ("hello [lbreak] world [break_3][oral_2][laugh_1]", "hello [lbreak] world [break_3][oral_2][laugh_1]", None),
    ("[speed_2]慢慢说", "慢慢说", 2),
    ("快[speed_8]说[speed_1]", "快说", 8),
    ("[v_break]a[llbreak]", "[v_break]a[llbreak]", None),
]


@pytest.mark.parametrize("text, expected, speed", CONTROL)
def test_control_tokens_are_kept_and_speed_is_extracted(text: str, expected: str, speed: int | None) -> None:
    r = normalize(text)
    assert r.text == expected
    assert r.speed == speed
    assert r.dropped == ()


def test_control_tokens_are_tokenizer_special_tokens() -> None:
    tokens = {m.group(0) for m in textnorm.CONTROL_TOKEN.finditer(" ".join(ADDED_TOKENS))}
    allowed = set(textnorm.CONTROL_WORDS) | {f"{k}_{i}" for k, n in textnorm.CONTROL_NUMBERED.items()
                                             for i in range(n)}
    assert {f"[{a}]" for a in allowed} == tokens
    assert {f"[{t}]" for t in textnorm.RESERVED_TOKENS} | tokens == set(ADDED_TOKENS)


@pytest.mark.parametrize("text", ["[break_9]", "[laugh_3]", "[speed_10]", "[oral_12]"])
def test_control_tokens_out_of_range_are_refused(text: str) -> None:
    with pytest.raises(textnorm.TextNormError, match="out of range"):
        normalize("你好" + text)


DROPPED = [
    ("我爱你❤️😀", "我爱你", ("❤", "😀")),
    ("こんにちは, 你好", "你好", ("こ", "ん", "に", "ち", "は")),
    ("Привет world", "world", ("П", "р", "и", "в", "е", "т")),
    ("[Stts]hello[spk_emb]", "hello", ("[Stts]", "[spk_emb]")),
    ("a*b^c", "a b c", ("*", "^")),
    ("[unknown] tag", "unknown, tag", ()),
]


@pytest.mark.parametrize("text, expected, dropped", DROPPED)
def test_unspeakable_characters_are_reported_not_silently_dropped(text: str, expected: str,
                                                                 dropped: tuple[str, ...]) -> None:
    r = normalize(text)
    assert r.text == expected
    assert r.dropped == dropped


# --- the front end: prompt, speed, voices ------------------------------------------------

@pytest.fixture(scope="module")
def chattts_normalizer():  # type: ignore[no-untyped-def]
    from chattts_serving.text.frontend import _chattts_normalizer

    return _chattts_normalizer()


@pytest.fixture(scope="module")
def frontend(small_artifacts: Artifacts) -> FrontEnd:
    return FrontEnd(small_artifacts, max_text_chars=4096, default_voice_seed=2, voices=VoiceBook())


def _tokens(fe: FrontEnd, ids: np.ndarray) -> list[str]:
    return list(fe.tokenizer.convert_ids_to_tokens([int(i) for i in ids]))


def test_prompt_has_speed_token_and_no_spoken_tags(frontend: FrontEnd) -> None:
    p = frontend.prepare("[speed_2]今天是2024年3月5日[laugh]，温度25℃。")
    toks = _tokens(frontend, p.input_ids)
    assert toks[:3] == ["[Stts]", "[spk_emb]", "[speed_2]"] and toks[-1] == "[Ptts]"
    assert "[speed_5]" not in toks and "[laugh]" in toks
    assert p.speed == 2
    assert "二零二四年三月五日" in p.normalized and "摄氏度" in p.normalized
    assert "[UNK]" not in toks
    default = frontend.prepare("你好")
    assert _tokens(frontend, default.input_ids)[2] == "[speed_5]" and default.speed == 5


def test_prepare_reports_dropped_characters(frontend: FrontEnd) -> None:
    p = frontend.prepare("你好😀世界")
    assert p.dropped == ("😀",)
    assert p.normalized == "你好世界"


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"), ("  \n", "empty"), ("，。！", "nothing speakable"), ("😀😀", "nothing speakable"),
    ("好" * 4097, "limit"), ("你好[break_9]", "out of range"),
])
def test_prepare_refuses_with_clear_messages(frontend: FrontEnd, text: str, fragment: str) -> None:
    with pytest.raises(FrontendError, match=fragment):
        frontend.prepare(text)


def test_control_tokens_do_not_count_towards_the_length_limit(frontend: FrontEnd) -> None:
    p = frontend.prepare("[speed_3]" + "好" * 4096)
    assert p.speed == 3


VOICES = ["", "0", "7", str(2**32 - 1), "alloy", "ALLOY", "shimmer", "SPK"]


@pytest.mark.parametrize("voice", VOICES)
def test_same_text_and_voice_give_the_same_ids_and_speaker_bytes(small_artifacts: Artifacts, voice: str) -> None:
    a = FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook())
    b = FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook())
    if voice == "SPK":
        voice = encode_spk_emb(speaker_from_seed(99, a.std, a.mean))
    pa, pb, pa2 = a.prepare("今天天气很好, the weather is fine.", voice), b.prepare(
        "今天天气很好, the weather is fine.", voice), a.prepare("今天天气很好, the weather is fine.", voice)
    assert pa.input_ids.tobytes() == pb.input_ids.tobytes() == pa2.input_ids.tobytes()
    assert pa.spk_emb.tobytes() == pb.spk_emb.tobytes() == pa2.spk_emb.tobytes()
    assert pa.spk_emb.dtype == np.float32 and abs(float(np.linalg.norm(pa.spk_emb)) - 1.0) < 1e-2


def _chattts_speaker(chat, seed: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The speaker ChatTTS gives a voice seed: ``torch.manual_seed(seed)`` then
    ``chat.sample_random_speaker()`` (an spk_emb string), decoded by ChatTTS: (H,) float16."""
    import torch

    torch.manual_seed(seed)
    return np.asarray(chat.speaker._decode(chat.sample_random_speaker()))


def _chattts_applied(spk: np.ndarray) -> bytes:
    """What ChatTTS' ``Speaker.apply`` puts at the prompt's [spk_emb] position for a decoded
    speaker (F.normalize of the float16 tensor, then float32), as float32 bytes."""
    import torch
    import torch.nn.functional as F

    return F.normalize(torch.from_numpy(spk), p=2.0, dim=0, eps=1e-12).float().numpy().tobytes()


@pytest.mark.parametrize("seed", [0, 2, 7, 1234, 2**32 - 1])
def test_speaker_from_seed_is_chattts_manual_seed_then_sample_random_speaker(small_chat, small_artifacts: Artifacts,
                                                                             seed: int) -> None:  # type: ignore[no-untyped-def]
    ref = _chattts_speaker(small_chat, seed)
    stats = np.load(small_artifacts.root / "speaker_stats.npz")  # what the front end samples from
    ours = speaker_from_seed(seed, stats["std"], stats["mean"])
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (small_artifacts.hidden_size,)
    assert ours.tobytes() == ref.astype(np.float32).tobytes()


def test_voice_kinds_resolve_to_the_speakers_chattts_applies(small_chat, frontend: FrontEnd) -> None:  # type: ignore[no-untyped-def]
    """Default voice, seeds, names and spk_emb strings give, bit for bit, the vector ChatTTS
    itself would put into the prompt for that seed (or that spk_emb)."""
    def expected(seed: int) -> bytes:
        return _chattts_applied(_chattts_speaker(small_chat, seed))

    assert frontend.speaker("").tobytes() == expected(2)
    assert frontend.speaker("17").tobytes() == expected(17)
    assert frontend.speaker(str(2**32 - 1)).tobytes() == expected(2**32 - 1)
    assert frontend.speaker("nova").tobytes() == expected(OPENAI_VOICES["nova"])
    import torch

    torch.manual_seed(5)
    emb = small_chat.sample_random_speaker()  # an spk_emb string made by ChatTTS itself
    assert frontend.speaker(emb).tobytes() == _chattts_applied(small_chat.speaker._decode(emb)) == expected(5)
    assert frontend.speaker("alloy").tobytes() != frontend.speaker("echo").tobytes()


@pytest.mark.parametrize("voice, fragment", [
    ("not-a-voice!", "unknown voice"), ("nobody", "unknown voice 'nobody'"), ("-1", "out of range"),
    (str(2**32), "out of range"),
])
def test_bad_voices_are_refused(frontend: FrontEnd, voice: str, fragment: str) -> None:
    with pytest.raises(FrontendError, match=fragment):
        frontend.prepare("你好", voice)


def test_openai_voice_names_are_all_known_and_distinct() -> None:
    book = VoiceBook()
    for name in ("alloy", "echo", "fable", "onyx", "nova", "shimmer"):
        assert book.resolve(name, 2).kind == "seed"
    assert len(set(OPENAI_VOICES.values())) == len(OPENAI_VOICES)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_voices_file_maps_names_to_seeds_and_spk_emb(tmp_path: Path, small_artifacts: Artifacts,
                                                     suffix: str) -> None:
    stats = np.load(small_artifacts.root / "speaker_stats.npz")
    emb = encode_spk_emb(speaker_from_seed(11, stats["std"], stats["mean"]))
    path = tmp_path / f"voices{suffix}"
    if suffix == ".toml":
        path.write_text(f'[voices]\nnarrator = 42\nAlloy = 5\ncustom = "{emb}"\n', encoding="utf-8")
    else:
        path.write_text(json.dumps({"narrator": 42, "Alloy": 5, "custom": emb}), encoding="utf-8")
    book = VoiceBook(load_voices_file(path))
    assert book.resolve("Narrator", 2) == Voice("seed", seed=42, name="narrator")
    assert book.resolve("alloy", 2).seed == 5  # the file overrides the built-in name
    fe = FrontEnd(small_artifacts, 4096, 2, voices=book)
    assert fe.speaker("custom").tobytes() == fe.speaker("11").tobytes()


def test_voices_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"voices": {"host": 77}}), encoding="utf-8")
    monkeypatch.setenv("CHATTTS_VOICES", str(path))
    assert VoiceBook.load().resolve("host", 2).seed == 77
    monkeypatch.setenv("CHATTTS_VOICES", str(tmp_path / "missing.toml"))
    with pytest.raises(VoiceError, match="cannot read"):
        VoiceBook.load()


def test_repository_sample_voices_file_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "voices" / "voices.toml"
    assert load_voices_file(path)


@pytest.mark.parametrize("data, fragment", [
    ({"bad name!": 1}, "voice name"), ({"x": -5}, "out of range"),
    ({"x": 1.5}, "integer seed, a spk_emb string or a reference"),
    ({"x": True}, "integer seed, a spk_emb string or a reference"), ({"x": ""}, "empty"),
    ({"voices": [1, 2]}, "mapping"),
])
def test_malformed_voices_are_refused(data: dict, fragment: str) -> None:
    with pytest.raises(VoiceError, match=fragment):
        parse_voices(data)


def test_bad_spk_emb_in_voices_file_fails_at_load(small_artifacts: Artifacts) -> None:
    with pytest.raises(FrontendError, match="'broken'"):
        FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook({"broken": Voice("spk_emb", spk_emb="蘁淰敥")}))


def test_speaker_cache_is_bounded_lru_and_read_only(small_artifacts: Artifacts) -> None:
    stats = np.load(small_artifacts.root / "speaker_stats.npz")
    cache = SpeakerCache(stats["std"], stats["mean"], max_entries=3)
    first = cache.get(Voice("seed", seed=1))
    for s in range(2, 6):
        cache.get(Voice("seed", seed=s))
    assert len(cache) == 3
    assert cache.misses == 5 and cache.hits == 0
    cache.get(Voice("seed", seed=5))
    assert cache.hits == 1
    again = cache.get(Voice("seed", seed=1))  # evicted, recomputed identically
    assert again.tobytes() == first.tobytes() and cache.misses == 6
    with pytest.raises(ValueError):
        again[0] = 1.0


def test_speed_is_carried_to_every_sentence_segment() -> None:
    segments = ["[speed_2]第一句。", "第二句。", "third one [speed_7]."]
    carried = request_text.carry_speed(segments)
    assert [normalize(s).speed for s in carried] == [2, 2, 2]
    assert request_text.carry_speed(["一。", "二。"]) == ["一。", "二。"]
    assert request_text.speed_of("a [speed_12] b") is None and request_text.speed_of("[speed_0]") == 0


@pytest.mark.parametrize("text, ok", [
    ("好" * 4096, True),
    ("好" * 4096 + "\n", True),                      # a text file's final newline does not count
    ("好" * 4090 + "[uv_break]" * 3, True),           # control tokens do not count ...
    ("好" * 4097, False),
    ("[uv_break]" * 900, False),                      # ... but the raw text is bounded too (2x)
])
def test_every_entry_point_counts_the_length_alike(text: str, ok: bool) -> None:
    from chattts_serving.errors import RequestError
    from chattts_serving.gateway.speech import SpeechRequest, build_request
    from chattts_serving.serving.request import EntryLimits, parse_entry

    limits = EntryLimits(max_new_tokens_cap=2048, max_text_chars=4096)

    inputs = {"text": np.array([text.encode()], dtype=np.object_)}
    if ok:
        assert parse_entry(inputs, limits).text == text
        assert build_request(SpeechRequest(model="tts-1", input=text, voice="alloy"), ("tts-1",), 4096).text == text
    else:
        # the spoken count, or the raw one with its own limit ("text has 2 characters" said nothing)
        why = "with its control tokens; the limit is 8192" if text.startswith("[") else "the limit is 4096"
        with pytest.raises(RequestError, match=why):
            parse_entry(inputs, limits)
        with pytest.raises(Exception, match=why):
            build_request(SpeechRequest(model="tts-1", input=text, voice="alloy"), ("tts-1",), 4096)
