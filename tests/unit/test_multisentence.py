"""The ``chattts`` segmentation and reference recordings, in process, equal ChatTTS'
``Chat.infer`` at greedy settings: the split, the first-piece audio prompt (``spk_smp`` byte for
byte, ``txt_smp``), every piece generated with that prompt, the group-padded vocoding; a single
sentence spoken with a reference recording and its transcript (with and without a speaker);
a given ``spk_smp`` with blank lines and a lone mark. The pipeline runs as in the server, over
:class:`inprocess.InProcessStages`; tests/server/test_refvoice_server.py runs it through Triton.

``Chat.infer`` deletes every sample with ``|x| <= 1e-5`` from each piece; the server does not
(docs/chattts-multisentence.md), so ours is compared with ChatTTS' waveform before that deletion,
every sample (tests/support/chattts_ref.py: greedy settings, the reference computed once per
session): a sample within float noise of 1e-5 falls on either side of it depending on the CPU.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.reference import AudioPrompt, encode_spk_smp
from chattts_serving.contract import Segmentation
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.boundary import FrontendCall, FrontendOutput
from chattts_serving.serving.entry import EntryService
from chattts_serving.serving.job import StreamResult, SynthesisJob
from chattts_serving.serving.pipeline import offline_audio
from chattts_serving.serving.profile import load_profile
from chattts_serving.serving.request import EntryRequest, Reference
from chattts_serving.text.refine import RefineParams
from chattts_serving.text.segments import SegmentRules, split_like_chattts
from tests.support.chattts_ref import GREEDY, VOICE, assert_same_audio, chat_infer, recording, strip_like_chattts
from tests.support.inprocess import InProcessStages, RecordingChannel, RecordingObserver


class Recording(InProcessStages):
    """The in-process stages, keeping every front-end call and its outputs (one per segment)."""

    def __init__(self, artifacts: Artifacts, voices: Any = None) -> None:
        super().__init__(artifacts, voices=voices)
        self.frontend_log: list[tuple[FrontendCall, list[FrontendOutput]]] = []

    def frontend(self, call: FrontendCall) -> list[FrontendOutput]:
        outs = super().frontend(call)
        self.frontend_log.append((call, outs))
        return outs


@pytest.fixture(scope="module")
def stages(small_artifacts: Artifacts) -> Recording:
    return Recording(small_artifacts)


def _ours(stages: Recording, text: str, max_new: int, reference: Reference | None = None,
          voice: str = str(VOICE)) -> tuple[np.ndarray, StreamResult]:
    stages.frontend_log.clear()
    req = EntryRequest(text=text, voice=voice, segmentation=Segmentation.CHATTTS, reference=reference,
                       params=SamplingParams(temperature=GREEDY, max_new_tokens=max_new, min_new_tokens=0))
    job = SynthesisJob(req=req, schedule=load_profile("cpu").stream.schedule(), emit_tokens=16, arrival_s=0.0)
    return offline_audio(job, stages)


@pytest.mark.parametrize("text,max_new", [("今天天气很好。我们一起去公园散步吧。", 120),
                                          ("今天天气很好。我们一起去公园散步吧。明天见。", 150),
                                          ("你还好吗？今天天气很好。我们一起去公园散步吧！明天见。", 150)])
def test_chattts_segmentation_equals_chat_infer(small_chat: Any, small_artifacts: Artifacts, stages: Recording,
                                                text: str, max_new: int) -> None:
    ours, result = _ours(stages, text, max_new)
    ref, params = chat_infer(small_chat, small_artifacts.root, text, max_new)
    pieces = split_like_chattts(text)
    assert result.segments == len(pieces) == text.count("。") and result.reference == "first_piece"
    assert result.normalized_text == [small_chat.normalizer(p, True, True).strip() for p in pieces]
    # the first-piece audio prompt: ChatTTS' spk_smp string byte for byte, its text as txt_smp
    (call, (first, *_)), = [(c, o) for c, o in stages.frontend_log if c.transient_reference]
    assert first.prompt_codes is not None and call.reference_audio is not None
    assert encode_spk_smp(first.prompt_codes) == params.spk_smp
    assert call.reference_text == params.txt_smp.strip() == result.normalized_text[0]
    assert len(first.prompt_codes) == contract.encoder_tokens(call.reference_audio.size)
    assert_same_audio(ours, ref)
    # every piece of the group is vocoded padded to the group's longest: 512 * T_max - 256 samples each
    longest = (ours.size // len(pieces) + contract.HOP_SAMPLES) // contract.SAMPLES_PER_TOKEN
    assert ours.size == len(pieces) * contract.samples_for_tokens(longest)
    if len(pieces) == 3:  # the padding is exercised: the pieces ended at different lengths
        assert result.tokens < 3 * longest


@pytest.mark.parametrize("speaker", [False, True])
def test_one_sentence_with_a_reference_recording_equals_chat_infer(small_chat: Any, small_artifacts: Artifacts,
                                                                   stages: Recording, speaker: bool) -> None:
    """ChatTTS' zero-shot use: ``InferCodeParams(spk_smp=sample_audio_speaker(wav), txt_smp=...)``,
    without a speaker vector (``[empty_spk]``, as ChatTTS' README shows it: our request gives
    no voice) and with one (the request's voice)."""
    rec = recording(small_chat)
    transcript = "这是一段参考录音。"
    text = "我们一起去公园散步吧。"
    ours, result = _ours(stages, text, 120, Reference(transcript=transcript, audio=rec),
                         voice=str(VOICE) if speaker else "")
    spk_smp = small_chat.sample_audio_speaker(rec.copy())
    ref, _ = chat_infer(small_chat, small_artifacts.root, text, 120, spk_smp=spk_smp, txt_smp=transcript,
                        speaker=speaker)
    ((call, (out,)),) = stages.frontend_log
    assert call.reference_audio is not None and out.prompt_codes is not None
    assert encode_spk_smp(out.prompt_codes) == spk_smp
    assert (out.spk_emb is not None) == speaker and result.reference == "recording"
    assert_same_audio(ours, ref)


@pytest.mark.parametrize("text,pieces", [("今天天气很好。\n明天见。\n", ["今天天气很好。", "明天见。", ""]),
                                         ("今天天气很好。。明天见。", ["今天天气很好。", "。", "明天见。"])])
def test_given_spk_smp_blank_lines_and_a_lone_mark_follow_chattts(small_chat: Any, small_artifacts: Artifacts,
                                                                  stages: Recording, text: str,
                                                                  pieces: list[str]) -> None:
    """With a spk_smp given there is no reference pass; a newline splits (and a trailing one
    makes an empty piece that ChatTTS still synthesises); a piece of only 。 is spoken too."""
    spk_smp = encode_spk_smp(np.random.default_rng(4).integers(0, 625, (60, 4)))
    prompt = AudioPrompt.from_spk_smp(spk_smp, "参考。")
    ours, result = _ours(stages, text, 80, Reference(transcript=prompt.transcript, codes=prompt.codes))
    ref, params = chat_infer(small_chat, small_artifacts.root, text, 80, spk_smp=spk_smp, txt_smp="参考。")
    assert result.normalized_text == pieces and result.reference == "spk_smp"
    assert params.spk_smp == spk_smp and not any(c.transient_reference for c, _ in stages.frontend_log)
    assert_same_audio(ours, ref)


def test_refine_text_then_the_first_piece_prompt_uses_the_refined_text(stages: Recording) -> None:
    """With refine-text (ChatTTS' default, untested against it here) every piece is refined
    first, and the reference pass speaks and transcribes the refined first piece."""
    req = EntryRequest(text="今天天气很好。我们一起去公园散步吧。", voice=str(VOICE), segmentation=Segmentation.CHATTTS,
                       refine=RefineParams(max_new_tokens=24, seed=3),
                       params=SamplingParams(max_new_tokens=20, min_new_tokens=20, seed=1))
    stages.frontend_log.clear()
    job = SynthesisJob(req=req, schedule=load_profile("cpu").stream.schedule(), emit_tokens=16, arrival_s=0.0)
    audio, result = offline_audio(job, stages)
    assert result.reference == "first_piece" and result.segments == 2
    assert audio.size == 2 * contract.samples_for_tokens(20)
    ((call, _),) = [(c, o) for c, o in stages.frontend_log if c.transient_reference]
    # the reference pass prompts the refined pieces again, piece 0's refined text its transcript
    assert call.speeds is not None and call.texts[0] == call.reference_text == result.normalized_text[0]
    # the text was normalised once: then one call built the refined code prompts, one the first-piece prompt
    assert [(c.speeds is None, c.refined_ids is not None) for c, _ in stages.frontend_log] == \
        [(True, False), (False, True), (False, False)]


@pytest.mark.parametrize("segmentation,refine,calls", [(Segmentation.CHATTTS, True, 3),
                                                      (Segmentation.CHATTTS, False, 2),
                                                      (Segmentation.STREAMING, True, 2),
                                                      (Segmentation.STREAMING, False, 1)])
def test_the_front_end_normalises_a_request_once(stages: Recording, segmentation: Segmentation, refine: bool,
                                                 calls: int) -> None:
    """One front-end call normalises and prompts every segment of a request; a later call only
    prompts the texts it made again (refine-text's code prompts, ChatTTS' first-piece prompt),
    so the calls do not grow with the number of segments."""
    text = "今天天气很好。我们一起去公园散步吧。明天见。"
    req = EntryRequest(text=text, voice=str(VOICE), segmentation=segmentation,
                       refine=RefineParams(max_new_tokens=8, seed=3) if refine else None,
                       params=SamplingParams(max_new_tokens=8, min_new_tokens=8, seed=1))
    before = stages.calls["frontend"]
    stages.frontend_log.clear()
    job = SynthesisJob(req=req, schedule=load_profile("cpu").stream.schedule(), emit_tokens=16, arrival_s=0.0,
                       segments=SegmentRules(max_chars=120, merge_chars=0))
    _, result = offline_audio(job, stages)
    assert result.segments == 3 and stages.calls["frontend"] - before == len(stages.frontend_log) == calls
    normalising = [c for c, _ in stages.frontend_log if c.speeds is None]
    assert len(normalising) == 1 and len(normalising[0].texts) == 3


def test_a_client_cancel_during_the_reference_pass_ends_the_stream_without_audio(stages: Recording) -> None:
    profile = load_profile("cpu")
    service = EntryService(contract.MODEL_STREAM, profile, stages, RecordingObserver())
    inputs = {"text": np.array(["今天天气很好。我们一起去公园散步吧。".encode()], np.object_),
              "segmentation": np.array([b"chattts"], np.object_),
              "max_new_tokens": np.array([1500], np.int32), "min_new_tokens": np.array([1500], np.int32)}
    job = service.admit(inputs, {}, "cancel-in-pass")
    channel = RecordingChannel()
    channel.cancelled = True  # the client is gone before the first audio
    service.stream(job, channel)
    assert [e[0] for e in channel.events] == ["final"] and channel.violations == []
    final = json.loads(channel.events[0][1])
    # the engine may have decoded a few steps before the cancel reached it: far from the 1500 asked
    assert final["stop_reason"] == "cancelled" and final["tokens"] < 100
    assert stages.engine.live_count() == 0


def test_a_voices_file_recording_replaces_the_reference_pass(small_chat: Any, small_artifacts: Artifacts,
                                                              tmp_path: Any) -> None:
    """A voice of the voices file brings its recording: no first-piece pass, its codes and
    transcript in every piece's prompt, no speaker vector (the entry names none)."""
    from chattts_serving.client import write_wav
    from chattts_serving.text.voices import VoiceBook

    write_wav(tmp_path / "reader.wav", recording(small_chat, seed=8), contract.SAMPLE_RATE_HZ)
    (tmp_path / "voices.toml").write_text('[voices]\nreader = { recording = "reader.wav", transcript = "参考。" }\n')
    stages = Recording(small_artifacts, voices=VoiceBook.load(tmp_path / "voices.toml"))
    audio, result = _ours(stages, "今天天气很好。明天见。", 12, voice="reader")
    assert result.reference == "voice" and result.segments == 2 and audio.size > 0
    outs = [o for _, call_outs in stages.frontend_log for o in call_outs]
    assert len(stages.frontend_log) == 1 and len(outs) == 2
    assert not any(c.transient_reference for c, _ in stages.frontend_log)
    assert all(o.spk_emb is None and o.prompt_codes is not None for o in outs)
    np.testing.assert_array_equal(outs[0].prompt_codes, stages.frontend_impl.voice_prompts["reader"].codes)


def test_strip_deletes_near_silent_samples_anywhere() -> None:
    w = np.array([0.0, 2e-5, -1e-5, 1e-5, 0.5, -3e-6, -0.2, 0.0], np.float32)
    np.testing.assert_array_equal(strip_like_chattts(w), np.array([2e-5, 0.5, -0.2], np.float32))


def test_same_audio_holds_across_the_deletion_threshold_and_nowhere_else() -> None:
    """A sample within float noise of 1e-5 on either side (kept by ``Chat.infer`` on one CPU,
    deleted on another) is still the same audio; a length or a sample apart is not."""
    ref = np.array([0.0, 1.0000001e-5, -0.3, 0.5], np.float32)
    ours = np.array([0.0, 0.9999999e-5, -0.3, 0.5], np.float32)
    assert strip_like_chattts(ours).size != strip_like_chattts(ref).size
    assert assert_same_audio(ours, ref) < 1e-11
    with pytest.raises(AssertionError):
        assert_same_audio(ours[:-1], ref)
    with pytest.raises(AssertionError):
        assert_same_audio(ours + np.array([0, 0, 2e-5, 0], np.float32), ref)


@pytest.mark.parametrize("default", ["streaming", "chattts"])
def test_the_profiles_segmentation_default_serves_a_request_that_sends_none(stages: Recording, tmp_path: Any,
                                                                            default: str) -> None:
    """``[frontend] segmentation`` of the profile (a TOML file) decides for a request without a
    ``segmentation`` input: ``chattts`` runs ChatTTS' split and first-piece reference pass,
    ``streaming`` neither; a request's own ``segmentation`` still wins."""
    import re

    from chattts_serving.serving.profile import PROFILES_DIR

    toml = (PROFILES_DIR / "cpu.toml").read_text(encoding="utf-8")
    toml, n = re.subn(r'(?m)^segmentation = "streaming"', f'segmentation = "{default}"', toml)
    assert n == 1
    (tmp_path / "profile.toml").write_text(toml, encoding="utf-8")
    profile = load_profile(tmp_path / "profile.toml")
    assert profile.frontend.segmentation == Segmentation(default)
    service = EntryService(contract.MODEL_STREAM, profile, stages, RecordingObserver())
    text = "今天天气很好。我们一起去公园散步吧。"

    def run(**extra: np.ndarray) -> dict[str, Any]:
        stages.frontend_log.clear()
        inputs = {"text": np.array([text.encode()], np.object_), "voice": np.array([str(VOICE).encode()], np.object_),
                  "max_new_tokens": np.array([12], np.int32), "min_new_tokens": np.array([12], np.int32), **extra}
        channel = RecordingChannel()
        service.stream(service.admit(inputs, {}, f"default-{default}"), channel)
        assert [e[0] for e in channel.events][-1] == "final" and channel.violations == [], channel.events
        return json.loads(channel.events[-1][1])

    info = run()
    passes = [c for c, _ in stages.frontend_log if c.transient_reference]
    assert info["segmentation"] == default
    if default == "chattts":  # ChatTTS' split at every 。 and its reference pass on piece 0
        assert (info["segments"], info["reference"], len(passes)) == (2, "first_piece", 1)
    else:
        assert (info["reference"], len(passes)) == ("", 0)
    other = "streaming" if default == "chattts" else "chattts"
    assert run(segmentation=np.array([other.encode()], np.object_))["segmentation"] == other
