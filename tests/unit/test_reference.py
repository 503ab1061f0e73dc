"""Reference-recording voices and ChatTTS' split, against ChatTTS' own functions: the split
of ``Chat.infer``, ``spk_smp`` strings, the code prompt with ``txt_smp`` and audio codes
(ids, text mask, embeddings), the engine taking audio-prompt positions, recording checks,
recording files and the bounded prompt cache."""

from __future__ import annotations

import logging
import tracemalloc
from typing import Any

import numpy as np
import pytest
import torch

from chattts_serving import contract
from chattts_serving.audio.encoder import DvaeEncoderRunner
from chattts_serving.audio.reference import (
    AudioPrompt,
    PromptCache,
    RecordingError,
    ReferenceLimits,
    SpkSmpError,
    decode_spk_smp,
    encode_spk_smp,
    load_recording,
    prepare_recording,
    recording_key,
    resample_to_model_rate,
)
from chattts_serving.contract import SequenceMode
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import Sequence, make_sequence
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.text.refine import load_tokenizer, speech_prompt_ids
from chattts_serving.text.segments import chattts_groups, split_like_chattts
from chattts_serving.text.speaker import normalize_speaker
from tests.support.chattts_ref import assert_same_codes, sample_audio_with_knife_edges

SR = contract.SAMPLE_RATE_HZ


# ---- ChatTTS' split --------------------------------------------------------------------------
def _chattts_pieces(text: str) -> list[str]:
    """The list ChatTTS 0.2.5's own ``Chat.infer(text, split_text=True)`` hands to ``_infer``
    (its split code runs unchanged; only ``_infer``, the synthesis after it, is replaced by a
    recorder, and no model is loaded)."""
    import ChatTTS

    class Recorder(ChatTTS.Chat):
        pieces: list[str] | None = None

        def _infer(self, text: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            self.pieces = list(text)
            return iter(())

    chat = Recorder(logging.getLogger("test_reference.chattts"))
    out = chat.infer(text, stream=True, skip_refine_text=True)
    return [] if chat.pieces is None and out == [] else list(chat.pieces or [])


EDGE_TEXTS = [
    "今天天气很好。我们一起去公园散步吧。", "今天天气很好。我们一起去公园散步吧", "今天。。明天。", "。", "",
    "Hello. World.", "Hello.World. ", "It costs 3.5 dollars. Really.", "Mr. Smith went home.", "end.",
    "a. \tb.  c", "一行\n二行", "一行\n\n二行\n", "\n", "第一句。第二句。\n第三句。", "Hi.\u3000there。",
    "a.\r\nb", "   ", "中文。English. 混合。", "...  ", "。。。",
]


@pytest.mark.parametrize("text", EDGE_TEXTS)
def test_split_equals_chattts_on_edge_cases(text: str) -> None:
    assert split_like_chattts(text) == _chattts_pieces(text)


def test_split_equals_chattts_on_random_texts() -> None:
    alphabet = ["。", ".", " ", "\t", "\n", "\u3000", "a", "好", "3", "!", "，", "\r", "[uv_break]"]
    rng = np.random.default_rng(0)
    for _ in range(300):
        text = "".join(alphabet[i] for i in rng.integers(0, len(alphabet), rng.integers(0, 14)))
        assert split_like_chattts(text) == _chattts_pieces(text), repr(text)


def test_split_keeps_the_rules_chattts_has() -> None:
    assert split_like_chattts("Hi. You.") == ["Hi. ", "You."]
    assert split_like_chattts("3.5 and 4.5.") == ["3.5 and 4.5."]
    assert split_like_chattts("一。\n二。三。") == ["一。", "二。三。"]  # a newline wins over 。
    assert split_like_chattts("a\n\nb\n") == ["a", "", "b", ""]  # empty pieces kept after newlines
    assert split_like_chattts("") == []


def test_groups_are_chattts_max_split_batch() -> None:
    assert chattts_groups(0) == []
    assert chattts_groups(3) == [range(0, 3)]
    assert chattts_groups(9) == [range(0, 4), range(4, 8), range(8, 9)]
    with pytest.raises(ValueError):
        chattts_groups(3, 0)


# ---- spk_smp ---------------------------------------------------------------------------------
def _recordings(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(SR // 2, 3 * SR))
        t = np.arange(length) / SR
        x = 0.2 * np.sin(2 * np.pi * (150 + 40 * i) * t) + rng.normal(0, 0.05, length)
        out.append(x.astype(np.float32))
    return out


def test_spk_smp_is_byte_identical_to_chattts_and_round_trips(small_chat, small_artifacts: Artifacts) -> None:
    """Our string of ChatTTS' codes is ChatTTS' string byte for byte; our codes are ChatTTS' but
    for any decided within float noise of a level boundary (tests/support/chattts_ref.py; none
    for these recordings, so the strings are identical too)."""
    encoder = DvaeEncoderRunner(small_artifacts)
    for wav in _recordings(4, seed=3):
        ref = small_chat.sample_audio_speaker(wav.copy())
        ref_codes, near = sample_audio_with_knife_edges(small_chat, wav)
        assert encode_spk_smp(ref_codes.T) == ref
        codes = encoder.run(wav)
        assert_same_codes(codes, ref_codes, near)
        if not near.any():
            assert encode_spk_smp(codes) == ref
        np.testing.assert_array_equal(decode_spk_smp(ref), ref_codes.T)
        np.testing.assert_array_equal(decode_spk_smp(ref), small_chat.speaker.decode_prompt(ref).numpy().T)
    codes = np.random.default_rng(1).integers(0, 625, (300, 4)).astype(np.int64)
    np.testing.assert_array_equal(decode_spk_smp(encode_spk_smp(codes)), codes)
    assert decode_spk_smp(encode_spk_smp(np.zeros((0, 4), np.int32))).shape == (0, 4)


def test_malformed_spk_smp_strings_raise_spk_smp_error(small_chat) -> None:  # type: ignore[no-untyped-def]
    good = encode_spk_smp(np.random.default_rng(2).integers(0, 625, (50, 4)))
    torch.manual_seed(0)
    spk_emb = small_chat.speaker.sample_random()  # a speaker vector string, not an audio prompt
    bad = ["", "   ", "not base16384 at all!", good[:3], good[: len(good) // 2], spk_emb,
           encode_spk_smp(np.zeros((2, 4), np.int32))[:-1] + "蘁"]
    for s in bad:
        with pytest.raises(SpkSmpError):
            decode_spk_smp(s)
    with pytest.raises(SpkSmpError, match="at most"):
        decode_spk_smp(good, max_tokens=10)
    for codes in (np.zeros((3, 3), np.int32), np.full((2, 4), 625), np.full((2, 4), -1), np.zeros((2, 4), np.float32)):
        with pytest.raises(SpkSmpError):
            encode_spk_smp(codes)
    assert issubclass(SpkSmpError, ValueError)


# ---- the code prompt ------------------------------------------------------------------------
def chattts_input_ids(text_ids: np.ndarray, prompt_codes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The one-row ``(input_ids (T+P, 4), text_mask (T+P,))`` that ChatTTS'
    ``Tokenizer.encode([prompt], 4, prompt=codes.T)`` returns for text ids (T,) and audio
    codes (P, 4): the text ids repeated on the 4 columns, then the codes; ``text_mask`` true
    on the text positions. The layout the engine's prefill reproduces from ``prompt_ids`` and
    ``prompt_codes`` (``Embeddings.prompt``)."""
    ids = np.repeat(np.asarray(text_ids, np.int64)[:, None], contract.NUM_VQ, axis=1)
    mask = np.ones(len(ids), bool)
    if prompt_codes is not None and len(prompt_codes):
        ids = np.concatenate([ids, np.asarray(prompt_codes, np.int64)])
        mask = np.concatenate([mask, np.zeros(len(prompt_codes), bool)])
    return ids, mask


@pytest.mark.parametrize("text,txt_smp,speed,speaker", [("今天天气很好。", "参考文本。", 5, True),
                                                        ("Hello world. ", "Some words", 3, True),
                                                        ("你好[uv_break]，[Stts]世界。", "一段[laugh]录音", 5, True),
                                                        ("明天见。", None, 7, True),
                                                        ("今天天气很好。", "参考文本。", 5, False)])
def test_code_prompt_equals_chattts_tokenizer_and_embed(small_chat, small_artifacts: Artifacts, text: str,
                                                        txt_smp: str | None, speed: int, speaker: bool) -> None:
    """ids, text mask and prefill embeddings equal ChatTTS' ``decorate_code_prompts`` +
    ``Tokenizer.encode(prompt=codes)`` + ``Embed`` + ``Speaker.apply``."""
    chat = small_chat
    tok = load_tokenizer(small_artifacts.root)
    codes = DvaeEncoderRunner(small_artifacts).run(_recordings(1, seed=5)[0])
    torch.manual_seed(4)
    spk = chat.speaker.sample_random() if speaker else None
    prompts = chat.speaker.decorate_code_prompts([text], f"[speed_{speed}]", txt_smp, spk)
    ref_ids, attn, text_mask = chat.tokenizer.encode(prompts, contract.NUM_VQ, prompt=torch.from_numpy(codes.T.copy()))
    ids = speech_prompt_ids(tok, text, speed, txt_smp, speaker)
    full, mask = chattts_input_ids(ids, codes)
    np.testing.assert_array_equal(full, ref_ids[0].numpy())
    np.testing.assert_array_equal(mask, text_mask[0].numpy())
    assert bool(attn.all())
    ref_emb = chat.embed(ref_ids, text_mask).clone()
    vec = None
    if spk is not None:
        chat.speaker.apply(ref_emb, spk, ref_ids, chat.tokenizer.spk_emb_ids, torch.device("cpu"))
        vec = normalize_speaker(chat.speaker._decode(spk).astype(np.float32))
    ours = Embeddings(small_artifacts).prompt(ids.astype(np.int64), vec, codes)
    assert ours.shape == (len(ids) + len(codes), small_artifacts.hidden_size)
    np.testing.assert_allclose(ours, ref_emb[0].numpy(), rtol=0, atol=1e-6)


def test_engine_takes_audio_prompt_codes_and_checks_them(small_artifacts: Artifacts) -> None:
    """A sequence with prompt codes prefills text + codes (its KV length counts both) and
    decodes as the same sequence run alongside others; bad codes and text mode are refused."""
    runner, emb = GptStepRunner(small_artifacts), Embeddings(small_artifacts)
    tok = load_tokenizer(small_artifacts.root)
    ids = speech_prompt_ids(tok, "今天天气很好。", 5, "参考。")
    codes = np.random.default_rng(0).integers(0, 625, (40, 4)).astype(np.int32)
    spk = normalize_speaker(np.random.default_rng(1).normal(size=small_artifacts.hidden_size).astype(np.float32))
    params = SamplingParams(temperature=1e-6, max_new_tokens=12, min_new_tokens=12)

    class Keep:
        def __init__(self) -> None:
            self.codes: list[np.ndarray] = []

        def tokens(self, c: np.ndarray, h: np.ndarray, reason: str) -> None:
            self.codes.append(c)

        def error(self, message: str) -> None:
            raise AssertionError(message)

        def cancelled(self) -> bool:
            return False

    def run(seqs: list[Sequence]) -> None:
        eng = Engine(runner, emb, EngineConfig())
        for s in seqs:
            eng.submit(s)
        while eng.live_count():
            eng.run_once()

    alone, together, plain = Keep(), Keep(), Keep()
    seq = make_sequence(ids, spk, params, alone, prompt_codes=codes)
    assert seq.request.prompt_length == len(ids) + len(codes)
    run([seq])
    run([make_sequence(ids, spk, params, plain), make_sequence(ids, spk, params, together, prompt_codes=codes)])
    a, t, p = (np.concatenate(k.codes) for k in (alone, together, plain))
    np.testing.assert_array_equal(a, t)
    assert len(a) == 12 and not np.array_equal(a, p)  # the audio prompt changes what is generated
    eng = Engine(runner, emb, EngineConfig(max_context_tokens=64))
    for bad, kw in [(np.full((3, 4), 625), {}), (np.zeros((3, 3), np.int32), {}), (np.zeros((3, 4), np.int32),
                                                                                      {"mode": SequenceMode.TEXT})]:
        with pytest.raises(ValueError):
            eng.submit(make_sequence(ids, None if kw else spk, params, Keep(), prompt_codes=bad, **kw))
    with pytest.raises(ValueError, match="context"):
        eng.submit(make_sequence(ids, spk, params, Keep(), prompt_codes=np.zeros((60, 4), np.int32)))


# ---- recordings and the cache ----------------------------------------------------------------
def test_recordings_are_checked_with_messages_for_the_client() -> None:
    lim = ReferenceLimits(min_s=0.5, max_s=2.0)
    ok = np.zeros(SR, np.float32)
    assert prepare_recording(ok, SR, lim).shape == (SR,)
    cases = [(np.zeros(3 * SR, np.float32), SR, "too long"), (np.zeros(SR // 4, np.float32), SR, "too short"),
             (ok, 4000, "sample rate"), (ok, 0, "sample rate"), (ok, 24000.5, "sample rate"), (ok, True, "sample rate"),
             (np.zeros((2, SR), np.float32), SR, "mono"), (np.zeros(SR, np.int16), SR, "float"),
             (np.full(SR, np.nan, np.float32), SR, "NaN")]
    for audio, rate, what in cases:
        with pytest.raises(RecordingError, match=what):
            prepare_recording(audio, rate, lim)  # type: ignore[arg-type]
    with pytest.raises(RecordingError, match="transcript"):
        AudioPrompt.from_spk_smp(encode_spk_smp(np.zeros((5, 4), np.int32)), "  ")


def test_recording_files_are_read_as_mono_float_at_their_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stereo 16-bit WAV (what a voices file usually points to) comes back averaged to mono in
    [-1, 1] at its own rate; a missing or non-audio file is a RecordingError."""
    import wave

    rate = 16000
    t = np.arange(rate) / rate
    left, right = 0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 440 * t)
    pcm = np.round(np.stack([left, right], 1) * 32767).astype("<i2")
    path = tmp_path / "ref.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    audio, got_rate = load_recording(path)
    assert got_rate == rate and audio.dtype == np.float32 and audio.shape == (rate,)
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-4)
    (tmp_path / "not.wav").write_text("hello")
    for bad in (tmp_path / "missing.wav", tmp_path / "not.wav"):
        with pytest.raises(RecordingError, match="cannot read"):
            load_recording(bad)


def test_resampling_keeps_duration_and_pitch() -> None:
    rate = 16000
    t = np.arange(2 * rate) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    out = resample_to_model_rate(tone, rate)
    assert abs(out.size - 2 * SR) <= 64
    spectrum = np.abs(np.fft.rfft(out[1000:-1000]))
    peak_hz = np.argmax(spectrum) * SR / (out.size - 2000)
    assert abs(peak_hz - 440.0) < 2.0
    np.testing.assert_array_equal(resample_to_model_rate(tone, SR), tone)


def test_prompt_cache_encodes_once_and_keeps_memory_flat_over_20_recordings(small_artifacts: Artifacts) -> None:
    encoder = DvaeEncoderRunner(small_artifacts)
    calls: list[int] = []

    def encode(wav: np.ndarray) -> np.ndarray:
        calls.append(wav.size)
        return encoder.run(wav)

    cache = PromptCache(encode, ReferenceLimits(max_s=3.0), max_entries=4)
    recs = _recordings(24, seed=9)
    first = cache.get(recs[0], SR, "第一段。")
    assert cache.get(recs[0], SR, "第一段。") is first and len(calls) == 1
    assert cache.get(recs[0], SR, "另一段。") is not first and len(calls) == 2  # transcript is part of the key
    assert recording_key(recs[0], SR, "a") != recording_key(recs[0], 16000, "a")
    largest = ReferenceLimits(max_s=3.0).max_tokens * contract.NUM_VQ * 4 + 64
    for r in recs[1:4]:
        cache.get(r, SR, "预热。")
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        held = []
        for r in recs[4:24]:  # 20 different recordings
            p = cache.get(r, SR, "参考。")
            np.testing.assert_array_equal(p.codes, encoder.run(r))
            held.append(tracemalloc.get_traced_memory()[0] - base)
            assert len(cache) <= 4 and cache.nbytes <= 4 * largest
        del p
    finally:
        tracemalloc.stop()
    assert cache.misses == 2 + 3 + 20 and cache.hits == 1
    # flat: what is held after the 20th recording is no more than after the 5th plus noise
    assert max(held[4:]) <= max(held[:5]) + 64 * 1024, held
    assert cache.get(recs[23], SR, "参考。") is not None and cache.hits == 2  # recent ones stay
    with pytest.raises(ValueError):
        PromptCache(encode, max_entries=0)


def test_profiles_carry_the_reference_limits() -> None:
    from chattts_serving.serving.profile import ProfileError, ReferenceProfile, load_profile

    for name in ("cpu", "gpu"):
        ref = load_profile(name).reference
        assert ref.limits().max_tokens == contract.encoder_tokens(int(ref.max_recording_s * SR))
        assert ref.prompt_cache_entries >= 1
    assert ReferenceProfile().limits() == ReferenceLimits()
    assert ReferenceLimits().max_tokens == contract.encoder_tokens(30 * SR) == 1406  # the number the docs quote
    assert contract.encoder_tokens(5 * SR) == 234  # the bench's 5 s reference (docs/chattts-multisentence.md)
    with pytest.raises(ValueError):
        ReferenceProfile(min_recording_s=5, max_recording_s=2)
    assert issubclass(ProfileError, ValueError)


# ---- reference voices of a voices file --------------------------------------------------------
def _write_wav(path, audio: np.ndarray, rate: int) -> None:  # type: ignore[no-untyped-def]
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def test_a_voices_file_recording_is_the_voice_and_its_transcript_precedes_the_text(
        small_artifacts: Artifacts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A ``{recording, transcript[, speaker]}`` entry (path relative to the voices file):
    encoded once at start, its codes in every call's output, its transcript as txt_smp, no
    speaker vector unless the entry names one; a request's own recording wins; a recording
    outside the limits fails the front end's start with the voice's name."""
    from chattts_serving.serving.frontend_service import FrontendService
    from chattts_serving.serving.request import FrontendCall
    from chattts_serving.text.frontend import FrontEnd, FrontendError
    from chattts_serving.text.voices import VoiceBook

    rec = _recordings(1, seed=31)[0]
    (tmp_path / "refs").mkdir()
    _write_wav(tmp_path / "refs" / "reader.wav", rec, SR)
    voices = tmp_path / "voices.toml"
    voices.write_text('[voices]\nreader = { recording = "refs/reader.wav", transcript = "参考录音。" }\n'
                      'reader7 = { recording = "refs/reader.wav", transcript = "参考录音。", speaker = 7 }\n')
    encoder = DvaeEncoderRunner(small_artifacts)
    fe = FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook.load(voices))
    service = FrontendService(fe, encoder.run)
    want = encoder.run(load_recording(tmp_path / "refs" / "reader.wav")[0])
    (out,) = service.prepare(FrontendCall(texts=("今天天气很好。",), voice="Reader"))
    assert out.prompt_codes is not None and out.spk_emb is None
    np.testing.assert_array_equal(out.prompt_codes, want)
    ids = speech_prompt_ids(fe.tokenizer, "今天天气很好。", 5, "参考录音。", speaker=False)
    np.testing.assert_array_equal(out.input_ids, ids)
    (with_speaker,) = service.prepare(FrontendCall(texts=("今天天气很好。",), voice="reader7"))
    assert with_speaker.spk_emb is not None and with_speaker.spk_emb.tobytes() == fe.speaker("7").tobytes()
    own = _recordings(1, seed=32)[0]
    (mine,) = service.prepare(FrontendCall(texts=("今天天气很好。",), voice="reader7", reference_text="别的。",
                                           reference_audio=own))
    np.testing.assert_array_equal(mine.prompt_codes, encoder.run(own))
    np.testing.assert_array_equal(mine.input_ids, speech_prompt_ids(fe.tokenizer, "今天天气很好。", 5, "别的。"))
    _write_wav(tmp_path / "refs" / "long.wav", np.zeros(4 * SR, np.float32), SR)
    voices.write_text('[voices]\nlong = { recording = "refs/long.wav", transcript = "长。" }\n')
    with pytest.raises(FrontendError, match=r"'long'.*too long"):
        FrontendService(FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook.load(voices)), encoder.run,
                        ReferenceLimits(max_s=3.0))
    voices.write_text('[voices]\nmissing = { recording = "refs/none.wav", transcript = "无。" }\n')
    with pytest.raises(FrontendError, match="not a file"):
        FrontEnd(small_artifacts, 4096, 2, voices=VoiceBook.load(voices))


def test_the_sample_voices_files_commented_examples_load_as_the_kinds_they_claim(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """voices/voices.toml's commented ``reader`` / ``reader7`` entries, uncommented next to a
    recording, are reference voices with the keys voices.py reads (recording relative to the
    file, transcript, optional speaker); the file as shipped loads with seeds only."""
    from pathlib import Path

    from chattts_serving.text.voices import load_voices_file

    shipped = Path(__file__).resolve().parents[2] / "voices" / "voices.toml"
    assert {v.kind for v in load_voices_file(shipped).values()} == {"seed"}
    lines = shipped.read_text(encoding="utf-8").splitlines()
    examples = [ln[2:] for ln in lines if ln.startswith("# reader")]
    assert len(examples) == 2
    _write_wav(tmp_path / "reader.wav", _recordings(1, seed=33)[0], SR)
    (tmp_path / "voices.toml").write_text("\n".join([*lines, *examples]) + "\n", encoding="utf-8")
    voices = load_voices_file(tmp_path / "voices.toml")
    reader, reader7 = voices["reader"], voices["reader7"]
    assert reader.kind == reader7.kind == "reference"
    assert reader.recording == (tmp_path / "reader.wav").resolve() and reader.transcript == "这是一段参考录音。"
    assert reader.speaker is None and reader7.speaker is not None and reader7.speaker.seed == 7
