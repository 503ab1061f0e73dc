"""Multi-sentence text and reference-recording voices through a real tritonserver: the
``chattts`` segmentation's offline audio (``chattts_offline``) equals ChatTTS' ``Chat.infer``
at greedy settings for a two- and a three-sentence text, and a sentence spoken with a
reference recording (sent at 16 kHz: the server resamples it) and its transcript; the
streaming door in that mode streams and ends with its final response; the CLI sends a WAV
file; refused references are INVALID (400) with clear messages, at admission.

``Chat.infer`` deletes every sample with ``|x| <= 1e-5``; the server does not, so the server's
audio is compared with ChatTTS' waveform before that deletion, every sample
(tests/support/chattts_ref.py): a sample within float noise of 1e-5 falls on either side of it
depending on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.reference import encode_spk_smp, resample_to_model_rate
from chattts_serving.client import (
    ClientError,
    SynthesisRequest,
    read_wav,
    synthesize_offline,
    synthesize_sse,
    synthesize_stream,
    write_wav,
)
from chattts_serving.errors import ErrorKind
from tests.support.chattts_ref import GREEDY, VOICE, assert_same_audio, chat_infer, recording

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300.0


def _greedy(text: str, max_new: int, **kw: Any) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice=kw.pop("voice", str(VOICE)), temperature=GREEDY,
                            max_new_tokens=max_new, min_new_tokens=0, segmentation="chattts", **kw)


@pytest.mark.parametrize("text,max_new", [("今天天气很好。我们一起去公园散步吧。", 120),
                                          ("今天天气很好。我们一起去公园散步吧。明天见。", 150)])
def test_chattts_segmentation_offline_equals_chat_infer(triton_server: Any, small_chat: Any, text: str,
                                                        max_new: int) -> None:
    res = synthesize_offline(triton_server.http_url, _greedy(text, max_new), timeout_s=TIMEOUT_S)
    ref, _ = chat_infer(small_chat, triton_server.artifacts.root, text, max_new)
    info = res.info
    assert info["segmentation"] == "chattts" and info["reference"] == "first_piece"
    assert info["segments"] == text.count("。") and info["final"] is True
    assert_same_audio(res.audio, ref)


def test_a_reference_recording_at_16_khz_equals_chat_infer_with_its_spk_smp(triton_server: Any,
                                                                            small_chat: Any) -> None:
    """The recording travels at 16 kHz; the server resamples it (libswresample) and encodes it:
    the audio equals ``Chat.infer`` given the ``spk_smp`` of that resampled recording and no
    speaker (the request names no voice), for one sentence."""
    rec16 = resample_16k(recording(small_chat, seed=21))
    transcript, text = "这是一段参考录音。", "我们一起去公园散步吧。"
    req = _greedy(text, 120, voice=None, reference_audio=rec16, reference_sample_rate_hz=16000,
                  reference_text=transcript)
    res = synthesize_offline(triton_server.http_url, req, timeout_s=TIMEOUT_S)
    spk_smp = small_chat.sample_audio_speaker(resample_to_model_rate(rec16, 16000).copy())
    ref, _ = chat_infer(small_chat, triton_server.artifacts.root, text, 120, spk_smp=spk_smp, txt_smp=transcript,
                        speaker=False)
    assert res.info["reference"] == "recording" and res.info["segments"] == 1
    assert_same_audio(res.audio, ref)


def resample_16k(audio24: np.ndarray) -> np.ndarray:
    """A 24 kHz recording brought to 16 kHz (what a client would send)."""
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio24, np.float32)[None, :], format="flt",
                                       layout="mono")
    frame.sample_rate = contract.SAMPLE_RATE_HZ
    res = av.AudioResampler(format="flt", layout="mono", rate=16000)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in [*res.resample(frame), *res.resample(None)]])


@pytest.mark.parametrize("synthesize,url", [(synthesize_stream, "grpc_url"), (synthesize_sse, "http_url")])
def test_chattts_segmentation_streams_after_the_reference_pass_and_ends(triton_server: Any, synthesize: Any,
                                                                        url: str) -> None:
    """The stream's first audio is piece 0 spoken with its own audio as the prompt; each piece
    is streamed at its own length (a stream cannot pad to the group's longest); the final
    response ends it with the whole info. Over SSE the same with a spk_smp (a JSON string)."""
    text = "今天天气很好。我们一起去公园散步吧。"
    extra: dict[str, Any] = {}
    if url == "http_url":
        extra = {"spk_smp": encode_spk_smp(np.random.default_rng(3).integers(0, 625, (40, 4))),
                 "reference_text": "参考。"}
    res = synthesize(getattr(triton_server, url), _greedy(text, 40, seed=1, **extra), timeout_s=TIMEOUT_S)
    info = res.info
    assert res.chunks > 1 and info["final"] is True and info["stop_reason"] in ("eos", "max_new_tokens")
    assert info["segmentation"] == "chattts" and info["segments"] == 2
    assert info["reference"] == ("spk_smp" if extra else "first_piece")
    assert res.audio.size == round(info["audio_s"] * contract.SAMPLE_RATE_HZ)
    assert res.audio.size <= 2 * contract.samples_for_tokens(40) and info["tokens"] <= 80


def test_the_cli_sends_a_wav_file_and_its_transcript(triton_server: Any, small_chat: Any, tmp_path: Path) -> None:
    wav = tmp_path / "ref.wav"
    write_wav(wav, recording(small_chat, seed=5), contract.SAMPLE_RATE_HZ)
    out = tmp_path / "out.wav"
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.client", "--url", triton_server.grpc_url,
                           "--text", "我们去散步吧。", "--reference-audio", str(wav), "--reference-text", "参考录音。",
                           "--max-new-tokens", "30", "--out", str(out), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["audio_s"] > 0 and out.is_file()
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.client", "--url", triton_server.grpc_url,
                           "--text", "我们去散步吧。", "--reference-audio", str(wav), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("chattts-client: error: a reference recording needs its transcript (txt_smp): "
                                   "the text spoken in it")


@pytest.mark.parametrize("flags,field", [
    (["--spk-smp", encode_spk_smp(np.random.default_rng(9).integers(0, 625, (30, contract.NUM_VQ))),
      "--reference-text", "参考。"], "spk_smp"),
    (["--segmentation", "chattts"], "segmentation"),
])
def test_the_cli_sends_spk_smp_and_segmentation(triton_server: Any, tmp_path: Path, flags: list[str],
                                                field: str) -> None:
    """``--spk-smp`` (+ ``--reference-text``) and ``--segmentation`` reach the server: the
    CLI's WAV is the direct gRPC stream of the request with that field, and not the one
    without it (for a two-sentence text, ``chattts``' first-piece audio prompt changes it)."""
    text, out = "今天天气很好。我们一起去公园散步吧。", tmp_path / "cli.wav"
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.client", "--url", triton_server.grpc_url,
                           "--text", text, "--voice", "7", "--seed", "3", "--max-new-tokens", "20",
                           "--min-new-tokens", "20", *flags, "--out", str(out), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    got = read_wav(out)[0]
    sent = ({"spk_smp": flags[1], "reference_text": flags[3]} if field == "spk_smp"
            else {"segmentation": "chattts"})
    base = SynthesisRequest(text=text, voice="7", seed=3, max_new_tokens=20, min_new_tokens=20)

    def direct(req: SynthesisRequest) -> np.ndarray:
        wav = tmp_path / "direct.wav"  # through the same 16-bit WAV the CLI writes
        write_wav(wav, synthesize_stream(triton_server.grpc_url, req, timeout_s=TIMEOUT_S).audio)
        return read_wav(wav)[0]

    np.testing.assert_array_equal(got, direct(replace(base, **sent)))
    without = direct(base)
    assert got.shape != without.shape or not np.array_equal(got, without)


SR = contract.SAMPLE_RATE_HZ
BAD = [
    ("too long", {"reference_audio": np.zeros(31 * SR, np.float32), "reference_text": "长。"},
     "reference recording is too long: 31.00 s, at most 30 s"),
    ("bad sample rate", {"reference_audio": np.zeros(SR, np.float32), "reference_sample_rate_hz": 4000,
                         "reference_text": "低。"}, "reference sample rate must be an integer in [8000, 48000] Hz"),
    ("transcript missing", {"reference_audio": np.zeros(SR, np.float32)}, "needs its transcript"),
    ("malformed spk_smp", {"spk_smp": "not an audio prompt", "reference_text": "参考。"}, "spk_smp "),
    ("both", {"spk_smp": "x", "reference_audio": np.zeros(SR, np.float32), "reference_text": "参考。"},
     "either reference_audio or spk_smp"),
    ("transcript alone", {"reference_text": "参考。"}, "send one of them"),
    ("unknown segmentation", {"segmentation": "paragraphs"}, "segmentation must be one of"),
]


@pytest.mark.parametrize("case,kw,fragment", BAD, ids=[b[0] for b in BAD])
def test_refused_references_are_invalid_with_a_clear_message(triton_server: Any, case: str, kw: dict[str, Any],
                                                             fragment: str) -> None:
    req = SynthesisRequest(text="今天天气很好。", **kw)
    with pytest.raises(ClientError) as stream_err:
        synthesize_stream(triton_server.grpc_url, req, timeout_s=60)
    with pytest.raises(ClientError) as offline_err:
        synthesize_offline(triton_server.http_url, req, timeout_s=60)
    for err in (stream_err.value, offline_err.value):
        assert err.kind == ErrorKind.INVALID and fragment in err.message, err.message
    assert offline_err.value.status == 400


def test_the_mode_benchmark_measures_each_kind(triton_server: Any) -> None:
    """bench/modes.py against the test server: every kind completes and reaches the server as
    meant (the source of its audio prompt); times are reported, never asserted."""
    from bench import load_sentences
    from bench.modes import MODE_KEYS, measure_modes, mode_figures, modes_markdown

    out = measure_modes(triton_server.grpc_url, load_sentences(), tokens=8, requests=1, voice="2")
    assert {k: v["ok"] for k, v in out.items()} == {"streaming": 1, "chattts": 1, "reference": 1}
    assert [out[k]["reference"] for k in MODE_KEYS] == ["", "first_piece", "recording"]
    figures = mode_figures(out)
    assert set(figures) == set(MODE_KEYS.values()) and all(v is not None and v > 0 for v in figures.values())
    assert mode_figures(None) == dict.fromkeys(MODE_KEYS.values())
    assert len([line for line in modes_markdown({"modes": out}) if line.startswith("| ")]) == 1 + len(MODE_KEYS)


def test_one_front_end_call_prepares_every_segment_as_single_calls_do(triton_server: Any) -> None:
    """``chattts_frontend`` takes a request's segments in one call (``segments``) and answers
    each as a call of its one ``text`` does; prompted again from its own texts and speeds
    (``segment_speeds``), it gives the same prompts without normalising again."""
    import tritonclient.grpc as grpcclient

    from chattts_serving.serving.boundary import frontend_outputs
    from chattts_serving.serving.request import FrontendCall, frontend_inputs

    def call(fc: FrontendCall) -> list[Any]:
        inputs = []
        for name, arr in frontend_inputs(fc).items():
            dtype = "BYTES" if arr.dtype == np.object_ else {"int32": "INT32", "bool": "BOOL",
                                                             "float32": "FP32"}[str(arr.dtype)]
            inputs.append(grpcclient.InferInput(name, list(arr.shape), dtype))
            inputs[-1].set_data_from_numpy(arr)
        names = [t.name for t in contract.FRONTEND_OUTPUTS if t not in contract.FRONTEND_REQUEST_OUTPUTS]
        with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            result = client.infer(contract.MODEL_FRONTEND, inputs,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in names])
        return frontend_outputs({n: result.as_numpy(n) for n in names})

    texts = ("[speed_3]今天是2024年3月5日。", "Mr Smith paid $3.50.", "。")
    together = call(FrontendCall(texts=texts, voice=str(VOICE), keep_unspeakable=True))
    alone = [call(FrontendCall(texts=(t,), voice=str(VOICE), keep_unspeakable=True))[0] for t in texts]
    assert [(o.input_ids.tolist(), o.normalized_text, o.dropped, o.speed) for o in together] == \
        [(o.input_ids.tolist(), o.normalized_text, o.dropped, o.speed) for o in alone]
    again = call(FrontendCall(texts=tuple(o.normalized_text for o in together), speeds=tuple(o.speed for o in together),
                              voice=str(VOICE)))
    assert [o.input_ids.tolist() for o in again] == [o.input_ids.tolist() for o in together]
