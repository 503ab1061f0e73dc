"""``POST /v1/audio/voices`` as voice-agent stacks send it, through the real gateway over a real
tritonserver: openai-python's ``audio.voices.create`` (a multipart form with the file as
``audio_sample``), ``curl -F``-style forms, vLLM-Omni's field names, MP3 and Ogg files made with
PyAV, and the refusals (not audio, no file, a body that is neither a form nor JSON). Also a
per-request ``reference_audio`` in MP3, decoded by the same path."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from chattts_serving.audio.formats import to_pcm16
from chattts_serving.gateway import GatewaySettings
from tests.support.servers import SAME_PCM16_LSB, Server, pcm16_gap, running_gateway

TOKENS = 16
SPEECH = {"model": "chattts", "input": "你好，今天天气很好。", "seed": 9, "max_new_tokens": TOKENS,
          "min_new_tokens": TOKENS, "response_format": "pcm"}
TRANSCRIPT = "这是一段参考录音。"
KEY = "upload-test-key"


def _tone(seconds: float = 2.0, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 210 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def _wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(to_pcm16(_tone(seconds, rate)))
    return buf.getvalue()


def _encoded(container: str, codec: str, rate: int) -> bytes:
    """Two seconds of the tone encoded by FFmpeg (PyAV): an MP3 or an Ogg/Opus file."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        samples = _tone(2.0, rate)
        frame_size = stream.codec_context.frame_size or 1024
        for i in range(0, len(samples), frame_size):
            frame = av.AudioFrame.from_ndarray(samples[None, i:i + frame_size], format="fltp", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def gateway(triton_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('voices') / 'voices.sqlite3'}"
    settings = GatewaySettings(triton_url=triton_server.grpc_url, voice_store=url, ws_lookahead=0, api_key=KEY)
    with running_gateway(settings) as gw:
        yield gw


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _speak(url: str, **fields: Any) -> bytes:
    r = httpx.post(url + "/v1/audio/speech", json={**SPEECH, **fields}, headers=_headers(), timeout=120)
    assert r.status_code == 200, r.text
    return r.content


def _form(url: str, files: Any, data: dict[str, str]) -> httpx.Response:
    return httpx.post(url + "/v1/audio/voices", files=files, data=data, headers=_headers(), timeout=120)


def test_openai_python_uploads_a_voice_that_then_speaks(gateway: str) -> None:
    client = OpenAI(base_url=gateway + "/v1", api_key=KEY)
    voice = client.audio.voices.create(name="Me", audio_sample=("me.wav", _wav(), "audio/wav"), consent="cons_1234",
                                       extra_body={"reference_text": TRANSCRIPT})
    assert (voice.id, voice.name, voice.object, voice.type) == ("me", "me", "audio.voice", "audio_sample")
    assert voice.created_at > 0
    by_name = client.audio.speech.create(model="tts-1", voice="me", input=SPEECH["input"], response_format="pcm",
                                         extra_body={k: SPEECH[k] for k in ("seed", "max_new_tokens",
                                                                            "min_new_tokens")}).content
    assert pcm16_gap(by_name, _speak(gateway, voice="none", reference_audio=base64.b64encode(_wav()).decode(),
                                     reference_text=TRANSCRIPT)) <= SAME_PCM16_LSB
    assert pcm16_gap(by_name, _speak(gateway, voice="alloy")) > SAME_PCM16_LSB
    deleted = client.audio.voices.delete("me")
    assert deleted.deleted and deleted.id == "me" and deleted.object == "audio.voice.deleted"


def test_openai_python_without_a_transcript_is_told_where_it_goes(gateway: str) -> None:
    client = OpenAI(base_url=gateway + "/v1", api_key=KEY)
    with pytest.raises(BadRequestError) as caught:
        client.audio.voices.create(name="notext", audio_sample=("me.wav", _wav(), "audio/wav"), consent="cons_1")
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "reference_text" and "extra_body" in error["message"]


@pytest.mark.parametrize("file_field, text_field", [("audio_sample", "reference_text"), ("file", "ref_text"),
                                                    ("audio", "transcript")])
def test_curl_style_forms_and_vllm_omni_names(gateway: str, file_field: str, text_field: str) -> None:
    """``curl -F audio_sample=@me.wav -F name=... -F reference_text=...`` and the aliases
    (vLLM-Omni's ``ref_text``, its ``speaker_description`` and ``consent`` accepted)."""
    name = f"form-{file_field}"
    r = _form(gateway, {file_field: ("me.wav", _wav(), "application/octet-stream")},
              {"name": name, text_field: TRANSCRIPT, "consent": "cons_9", "speaker_description": "calm"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["id"] == name and body["success"] is True and body["voice"]["kind"] == "recording"
    assert body["voice"]["transcript"] == TRANSCRIPT and body["voice"]["recording_s"] == 2.0


@pytest.mark.parametrize("container, codec, rate", [("mp3", "libmp3lame", 24000), ("ogg", "libopus", 48000)])
def test_compressed_recordings_save_and_speak_per_request_too(gateway: str, container: str, codec: str,
                                                              rate: int) -> None:
    """An MP3 or Ogg file saves, and the same file is a per-request ``reference_audio`` (the
    one decoding path): both speak alike."""
    data = _encoded(container, codec, rate)
    name = f"coded-{container}"
    r = _form(gateway, {"audio_sample": (f"me.{container}", data, "audio/mpeg")},
              {"name": name, "reference_text": TRANSCRIPT})
    assert r.status_code == 201, r.text
    assert abs(r.json()["voice"]["recording_s"] - 2.0) < 0.1
    by_name = _speak(gateway, voice=name)
    per_request = _speak(gateway, voice="none", reference_audio=base64.b64encode(data).decode(),
                         reference_text=TRANSCRIPT)
    assert pcm16_gap(by_name, per_request) <= SAME_PCM16_LSB
    as_data_url = _speak(gateway, voice="none", reference_text=TRANSCRIPT,
                         reference_audio=f"data:audio/{container};base64," + base64.b64encode(data).decode())
    assert pcm16_gap(by_name, as_data_url) <= SAME_PCM16_LSB


REFUSED_FORMS = [
    ("not-audio", {"audio_sample": ("notes.txt", b"these are notes, not audio" * 40, "text/plain")},
     {"name": "na", "reference_text": TRANSCRIPT}, "audio_sample", "not audio"),
    ("empty-file", {"audio_sample": ("e.wav", b"", "audio/wav")}, {"name": "ef", "reference_text": TRANSCRIPT},
     "audio_sample", "empty"),
    ("no-file", None, {"name": "nofile", "reference_text": TRANSCRIPT}, "audio_sample", "audio_sample=@"),
    ("file-as-text", None, {"name": "astext", "audio_sample": "me.wav", "reference_text": TRANSCRIPT},
     "audio_sample", "file itself"),
    ("two-files", {"audio_sample": ("a.wav", _wav(), "audio/wav"), "file": ("b.wav", _wav(), "audio/wav")},
     {"name": "two", "reference_text": TRANSCRIPT}, "file", "one recording"),
    ("other-file-field", {"sample": ("a.wav", _wav(), "audio/wav")}, {"name": "other", "reference_text": TRANSCRIPT},
     "sample", "audio_sample"),
    ("too-short", {"audio_sample": ("s.wav", _wav(0.1), "audio/wav")}, {"name": "short", "reference_text": "好。"},
     "audio_sample", "short"),
    ("prompt", None, {"name": "designed", "type": "prompt", "prompt": "a calm voice"}, "type", "text prompt"),
    ("embedding", None, {"name": "emb", "speaker_embedding": "[0.1, 0.2]"}, "speaker_embedding", "spk_emb"),
    ("unknown-field", {"audio_sample": ("a.wav", _wav(), "audio/wav")},
     {"name": "unk", "reference_text": TRANSCRIPT, "colour": "blue"}, "colour", "colour"),
]


@pytest.mark.parametrize("files, data, param, words", [r[1:] for r in REFUSED_FORMS], ids=[r[0] for r in REFUSED_FORMS])
def test_refused_forms_are_clear_400s_that_store_nothing(gateway: str, files: Any, data: dict[str, str], param: str,
                                                         words: str) -> None:
    r = _form(gateway, files, data)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert "Errno" not in error["message"] and "1094995529" not in error["message"]
    saved = httpx.get(gateway + "/v1/audio/voices", headers=_headers(), timeout=30).json()["saved_voices"]
    assert data["name"] not in [v["name"] for v in saved]


@pytest.mark.parametrize("content, ctype", [(b"name=me", "text/plain"), (b"[1, 2]", "application/json"),
                                            (b"", "application/json"), (b"\x00\x01binary", "")])
def test_a_body_that_is_neither_form_nor_json_names_both(gateway: str, content: bytes, ctype: str) -> None:
    headers = {**_headers(), **({"Content-Type": ctype} if ctype else {})}
    r = httpx.post(gateway + "/v1/audio/voices", content=content, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "multipart form" in message and "JSON object" in message, message


def test_a_per_request_reference_that_is_not_audio_is_a_clear_400(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/audio/speech", headers=_headers(), timeout=30,
                   json={**SPEECH, "voice": "none", "reference_text": TRANSCRIPT,
                         "reference_audio": base64.b64encode(b"plain text, no audio here" * 20).decode()})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "reference_audio" and "Errno" not in error["message"], error


def test_an_unknown_voice_names_the_saved_ones(gateway: str) -> None:
    r = _form(gateway, {"audio_sample": ("me.wav", _wav(), "audio/wav")},
              {"name": "listed", "reference_text": TRANSCRIPT})
    assert r.status_code == 201, r.text
    r = httpx.post(gateway + "/v1/audio/speech", json={**SPEECH, "voice": "nobody"}, headers=_headers(), timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "listed" in message and "GET /v1/audio/voices" in message, message
