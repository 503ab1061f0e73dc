"""Nothing unreadable reaches the GPT silently: every character the loaded tokenizer would turn
into [UNK] is left out of the prompt and reported, checked in process with the tokenizer the
server loads (the small generated artifacts). Through a real tritonserver (info.dropped, the
CLI): tests/server/test_textnorm_unk.py.

The generated tokenizer has bert-base-chinese's layout but its Chinese characters run from
U+4E00 to U+9F9E, so 龟 (U+9F9F, in the real vocabulary) is [UNK] there and none of ChatTTS'
homophones replaces it: it stands for any character the loaded vocabulary lacks.
"""

from __future__ import annotations

import random

import pytest

from chattts_serving.runtime import Artifacts
from chattts_serving.text.frontend import FrontEnd, TokenizerVocabulary
from chattts_serving.text.voices import VoiceBook

MISSING = "龟"
"""In the generated tokenizer's vocabulary range gap (see the module docstring)."""


@pytest.fixture(scope="module")
def frontend(small_artifacts: Artifacts) -> FrontEnd:
    return FrontEnd(small_artifacts, max_text_chars=4096, default_voice_seed=2, voices=VoiceBook())


def _unk(fe: FrontEnd) -> int:
    return int(fe.tokenizer.unk_token_id)


def test_a_character_the_tokenizer_lacks_is_left_out_and_reported(frontend: FrontEnd) -> None:
    assert not frontend.vocabulary.known(MISSING)
    p = frontend.prepare(f"乌{MISSING}😀爬得很慢，a{MISSING}b[uv_break]好")
    assert p.dropped == (MISSING, "😀")
    assert p.normalized == "乌爬得很慢，a b[uv_break]好"
    assert _unk(frontend) not in p.input_ids.tolist()
    assert "[uv_break]" in frontend.tokenizer.convert_ids_to_tokens([int(i) for i in p.input_ids])


def test_text_of_only_unknown_characters_is_refused_with_them_named(frontend: FrontEnd) -> None:
    from chattts_serving.text.frontend import FrontendError

    with pytest.raises(FrontendError, match=f"nothing speakable.*{MISSING}"):
        frontend.prepare(MISSING * 3)


def test_known_characters_follow_the_tokenizers_own_normalisation(frontend: FrontEnd) -> None:
    voc = frontend.vocabulary
    assert all(voc.known(c) for c in "ABCxyz幺两零，。、,.")  # upper case is lower-cased by the tokenizer
    assert not voc.known("😀") and not voc.known("鿏")
    assert voc.remove_unknown("你好[laugh]世界") == ("你好[laugh]世界", ())


BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x3400, 0x4DBF),
          (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF)]
"""Latin, symbols, Greek, punctuation, kana, CJK (unified, extensions A and B, compatibility),
full-width forms, emoji."""


@pytest.mark.parametrize("seed", range(4))
def test_unk_never_reaches_the_gpt_whatever_the_text(frontend: FrontEnd, seed: int) -> None:
    """Random text from many Unicode blocks: no [UNK] id in the prompt, and every Chinese
    character of the input is either spoken (itself or ChatTTS' homophone for it) or reported."""
    rng = random.Random(seed)
    text = "".join(chr(rng.randint(*rng.choice(BLOCKS))) for _ in range(1500))
    text = text.replace("[", " ").replace("]", " ")  # bracketed words are tags, tested elsewhere
    p = frontend.prepare(text)
    assert _unk(frontend) not in p.input_ids.tolist()
    table = frontend.normalizer.homophones_map  # (2, N) code points: from, to
    homophones = {chr(a): chr(b) for a, b in zip(table[0].tolist(), table[1].tolist())}
    for c in {c for c in text if "\u4e00" <= c <= "\u9fff"}:
        spoken = c in p.normalized or homophones.get(c, c) in p.normalized
        assert spoken or c in p.dropped, f"{c!r} (U+{ord(c):04X}) neither spoken nor reported"
        assert frontend.vocabulary.known(c) or homophones.get(c, c) != c or c in p.dropped


def test_vocabulary_of_a_tokenizer_without_normaliser() -> None:
    class Plain:
        backend_tokenizer = type("B", (), {"normalizer": None})()

        @staticmethod
        def get_vocab() -> dict[str, int]:
            return {"a": 0, "##b": 1, "中": 2}

    voc = TokenizerVocabulary(Plain())
    assert voc.remove_unknown("a中c b") == ("a中 b", ("c",))
