"""The clients against a real tritonserver: gRPC streaming, HTTP offline, SSE, and the CLI
(which also exits cleanly when nothing listens).

With ``lookahead_tokens`` at least the vocoder's receptive field, the streamed chunks must
equal the offline decode of the same tokens; with the default (smaller) lookahead the seams
are crossfaded and only close, and the SNR is reported. The client library without a server:
tests/unit/test_client.py.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.client import (
    ClientError,
    SynthesisRequest,
    SynthesisResult,
    iter_chunks,
    iter_parts,
    synthesize_offline,
    synthesize_sse,
    synthesize_stream,
)
from chattts_serving.serving.profile import load_profile
from tests.support.servers import metric, wait_until

ROOT = Path(__file__).resolve().parents[2]
TEXT_ZH = "你好，欢迎使用流式语音合成服务。"
SEED = 7
MAX_NEW_TOKENS = 100
TIMEOUT_S = 60.0


def _request(**overrides: object) -> SynthesisRequest:
    fields: dict[str, object] = {"text": TEXT_ZH, "seed": SEED, "max_new_tokens": MAX_NEW_TOKENS}
    fields.update(overrides)
    return SynthesisRequest(**fields)  # type: ignore[arg-type]


def _cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chattts_serving.client", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` (same length), in dB."""
    noise = float(np.sum((test.astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return math.inf if noise == 0.0 else 10.0 * math.log10(signal / noise)


@pytest.fixture(scope="module")
def offline(triton_server: Any) -> SynthesisResult:
    """The reference: the whole utterance from chattts_offline over HTTP."""
    return synthesize_offline(triton_server.http_url, _request(), timeout_s=TIMEOUT_S)


def test_grpc_stream_arrives_in_growing_chunks(triton_server: Any) -> None:
    """Chunk sizes follow the cpu profile's schedule (first chunk first_chunk_tokens tokens
    less half the crossfade, then as the chunker sizes them from the request alone: the same
    sizes as the schedule run over the same tokens, the last window aside); what the client
    collected is what the server's final info says it sent."""
    from chattts_serving.audio.chunking import StreamChunker

    result = synthesize_stream(triton_server.grpc_url, _request(), timeout_s=TIMEOUT_S)
    info, stream = result.info, load_profile("cpu").stream
    assert info["final"] is True and info["chunks"] >= 2
    assert result.chunks == len(result.chunk_samples) == info["chunks"]
    assert result.chunk_samples[0] == stream.first_chunk_tokens * contract.SAMPLES_PER_TOKEN \
        - stream.crossfade_samples // 2
    n, ch, want, avail = info["tokens"], StreamChunker(stream.schedule()), [], 0
    while not ch.done:
        avail = min(n, avail + stream.emit_tokens)
        while (w := ch.next_window(avail, avail == n)) is not None:
            want.append(ch.emit(w, np.zeros(contract.samples_for_tokens(w.end - w.start), np.float32)).size)
    assert result.chunk_samples[:-2] == want[:len(result.chunk_samples) - 2]
    assert max(result.chunk_samples[1:-1], default=0) <= stream.max_chunk_tokens * contract.SAMPLES_PER_TOKEN
    assert result.audio.dtype == np.float32 and result.audio.ndim == 1
    assert result.audio.size == contract.samples_for_tokens(info["tokens"])  # one sentence
    assert info["audio_s"] == round(result.audio.size / contract.SAMPLE_RATE_HZ, 6)
    assert result.sample_rate_hz == info["sample_rate_hz"] == contract.SAMPLE_RATE_HZ
    assert 0 < result.ttfa_s <= result.total_s


def test_offline_has_whole_token_length(offline: SynthesisResult) -> None:
    """chattts_offline's one response holds the whole utterance: as many samples as the tokens
    the server says it generated give (512 n - 256)."""
    info = offline.info
    assert offline.chunks == info["chunks"] == 1
    assert offline.audio.size == contract.samples_for_tokens(info["tokens"]) and info["tokens"] > 0
    assert info["audio_s"] == round(offline.audio.size / contract.SAMPLE_RATE_HZ, 6)
    assert np.isfinite(offline.audio).all() and np.abs(offline.audio).max() > 0


def test_grpc_stream_equals_offline_with_full_lookahead(triton_server: Any, offline: SynthesisResult) -> None:
    rf = triton_server.artifacts.receptive_field_tokens("hidden")
    streamed = synthesize_stream(triton_server.grpc_url, _request(lookahead_tokens=rf), timeout_s=TIMEOUT_S)
    assert streamed.chunks >= 2
    assert streamed.audio.size == offline.audio.size
    assert float(np.max(np.abs(streamed.audio - offline.audio))) < 1e-4


def test_sse_stream_equals_offline_with_full_lookahead(triton_server: Any, offline: SynthesisResult) -> None:
    rf = triton_server.artifacts.receptive_field_tokens("hidden")
    streamed = synthesize_sse(triton_server.http_url, _request(lookahead_tokens=rf), timeout_s=TIMEOUT_S)
    assert streamed.chunks >= 2
    assert streamed.audio.size == offline.audio.size
    assert float(np.max(np.abs(streamed.audio - offline.audio))) < 1e-4


def test_default_lookahead_stream_is_close_to_offline(triton_server: Any, offline: SynthesisResult) -> None:
    streamed = synthesize_stream(triton_server.grpc_url, _request(), timeout_s=TIMEOUT_S)
    assert streamed.audio.size == offline.audio.size
    snr = snr_db(offline.audio, streamed.audio)
    print(f"default-lookahead stream vs offline: SNR {snr:.1f} dB over {streamed.chunks} chunks")
    assert math.isfinite(snr) and snr > 10.0


_metric = metric
_wait_for = wait_until


def test_closing_the_generator_early_cancels_and_frees_the_stream(triton_server: Any) -> None:
    """Closing the chunk generator cancels the request on the server: the engine drops the
    sequence (its active-sequence gauge is back to 0 long before the 2000 tokens it was asked
    for could have been decoded) and the request is counted as cancelled, not as ok."""
    port = triton_server.metrics_port
    cancelled = {"model": contract.MODEL_STREAM, "status": "cancelled"}
    ok = {"model": contract.MODEL_STREAM, "status": "ok"}
    assert _wait_for(lambda: _metric(port, "tts_engine_active_sequences") == 0)  # earlier tests are done
    before = _metric(port, "tts_request_total", **cancelled), _metric(port, "tts_request_total", **ok)
    chunks = iter_chunks(triton_server.grpc_url, _request(max_new_tokens=2000, min_new_tokens=2000),
                         timeout_s=TIMEOUT_S)
    first = next(chunks)
    assert first.size > 0
    assert _metric(port, "tts_engine_active_sequences") == 1
    steps_at_close = _metric(port, "tts_engine_decode_steps_total")
    chunks.close()  # stop_stream(cancel_requests=True)
    assert _wait_for(lambda: _metric(port, "tts_engine_active_sequences") == 0), "the sequence stayed in the engine"
    steps = _metric(port, "tts_engine_decode_steps_total") - steps_at_close
    print(f"\ndecode steps between closing the generator and the sequence leaving the engine: {steps:.0f}")
    assert steps < 500, "the engine kept decoding the closed stream"  # of about 1990 left
    assert _wait_for(lambda: _metric(port, "tts_request_total", **cancelled) == before[0] + 1), \
        "the request was not counted as cancelled"
    assert _metric(port, "tts_request_total", **ok) == before[1]
    # the server still serves the next stream
    again = synthesize_stream(triton_server.grpc_url, _request(max_new_tokens=20, min_new_tokens=20),
                              timeout_s=TIMEOUT_S)
    assert again.audio.size == contract.samples_for_tokens(20) and again.info["stop_reason"] == "max_new_tokens"


def test_server_error_is_client_error_with_message(triton_server: Any) -> None:
    bad = _request(top_k=0)
    calls = ((synthesize_stream, triton_server.grpc_url), (synthesize_offline, triton_server.http_url),
             (synthesize_sse, triton_server.http_url))
    for call, url in calls:
        with pytest.raises(ClientError, match="top_k"):
            call(url, bad, timeout_s=TIMEOUT_S)
    with pytest.raises(ClientError) as info:
        synthesize_offline(triton_server.http_url, bad, timeout_s=TIMEOUT_S)
    assert info.value.status == 400


def _finished_line(log_path: Path, request_id: str) -> dict[str, Any] | None:
    """The server's ``request_finished`` log line for ``request_id`` (None until written)."""
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if '"event":"request_finished"' in line and f'"request_id":"{request_id}"' in line:
            return dict(json.loads(line))
    return None


def test_cli_writes_wav_and_json(triton_server: Any, tmp_path: Path) -> None:
    """The WAV holds the audio the server says it sent (its request_finished log line: tokens,
    audio seconds, chunks), and the JSON summary agrees with it."""
    out = tmp_path / "out.wav"
    rid = f"cli-{time.monotonic_ns()}"
    proc = _cli("--url", triton_server.grpc_url, "--text", TEXT_ZH, "--seed", str(SEED), "--request-id", rid,
                "--max-new-tokens", "60", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert set(summary) == {"ttfa_s", "total_s", "audio_s", "rtf", "chunks", "sample_rate_hz", "request_id",
                            "dropped", "capped_segments"}
    assert summary["sample_rate_hz"] == contract.SAMPLE_RATE_HZ
    assert summary["request_id"] == rid and summary["dropped"] == []
    assert _wait_for(lambda: _finished_line(triton_server.log_path, rid) is not None, 10)
    server = _finished_line(triton_server.log_path, rid)
    assert server is not None and server["status"] == "ok" and server["segments"] == 1
    with wave.open(str(out), "rb") as w:
        assert w.getnchannels() == 1
        assert w.getsampwidth() == 2
        assert w.getframerate() == contract.SAMPLE_RATE_HZ
        frames = w.getnframes()
    assert frames == contract.samples_for_tokens(server["tokens"]) and 0 < server["tokens"] <= 60
    assert round(frames / contract.SAMPLE_RATE_HZ, 3) == server["audio_s"]
    # The summary's duration is the audio written, to the sample (one sample is 4.2e-5 s).
    assert summary["audio_s"] == pytest.approx(frames / contract.SAMPLE_RATE_HZ, abs=1e-6)
    assert summary["chunks"] == server["chunks"]
    assert summary["capped_segments"] == server["capped_segments"]


@pytest.mark.parametrize("protocol", ["grpc", "http", "sse"])
def test_cli_against_closed_port_exits_2_without_traceback(protocol: str) -> None:
    proc = _cli("--protocol", protocol, "--url", f"127.0.0.1:{_closed_port()}", "--text", "hello", "--json",
                timeout_s=30.0)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chattts-client: error: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http", "sse"])
def test_cli_empty_text_reports_server_error(triton_server: Any, protocol: str, tmp_path: Path) -> None:
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    out = tmp_path / "never.wav"
    proc = _cli("--protocol", protocol, "--url", url, "--text", "", "--out", str(out))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == "chattts-client: error: text is empty"
    assert not out.exists()


_SYNTHESIZERS = {"grpc": synthesize_stream, "http": synthesize_offline, "sse": synthesize_sse}


@pytest.mark.parametrize("protocol", sorted(_SYNTHESIZERS))
def test_info_reports_request_id_dropped_characters_and_capped_sentences(triton_server: Any, protocol: str) -> None:
    """What the server could not do is said, not hidden: the emoji is reported as not spoken,
    both sentences as cut at max_new_tokens; the client's request id comes back."""
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    rid = f"client-{protocol}-42"
    text = "你好😀，欢迎使用流式语音合成服务，我们一起来测试。今天天气很好，我们一起去公园散步吧。"  # 2 segments
    req = _request(text=text, max_new_tokens=12, min_new_tokens=12, request_id=rid)
    result = _SYNTHESIZERS[protocol](url, req, timeout_s=TIMEOUT_S)
    info = result.info
    assert set(contract.INFO_FINAL_KEYS) <= set(info)
    assert info["request_id"] == rid and info["final"] is True
    assert info["sample_rate_hz"] == contract.SAMPLE_RATE_HZ
    assert info["dropped"] == ["😀"] and info["segments"] == 2 and len(info["normalized_text"]) == 2
    assert "😀" not in "".join(info["normalized_text"])
    assert info["capped_segments"] == [0, 1] and info["stop_reason"] == contract.StopReason.MAX_TOKENS
    assert info["tokens"] == 24 and info["audio_s"] == pytest.approx(result.audio_s, abs=1e-5)
    assert info["chunks"] == result.chunks


def test_stream_header_info_comes_with_the_first_audio_and_ids_are_generated(triton_server: Any) -> None:
    parts = list(iter_parts(triton_server.grpc_url, _request(max_new_tokens=40), timeout_s=TIMEOUT_S))
    with_info = [p for p in parts if p.info]
    assert len(with_info) == 2
    header, final = with_info[0].info, with_info[1].info
    assert header is not None and final is not None
    assert with_info[0].audio.size > 0 and with_info[0] is parts[0]  # the first response: audio + header
    assert set(header) == set(contract.INFO_HEADER_KEYS) and header["final"] is False
    assert with_info[1] is parts[-1] and with_info[1].audio.size == 0 and final["final"] is True
    assert len(header["request_id"]) == 32 and header["request_id"] == final["request_id"]  # generated (uuid4 hex)
    assert final["stop_reason"] == contract.StopReason.MAX_TOKENS and final["capped_segments"] == [0]
    other = synthesize_stream(triton_server.grpc_url, _request(max_new_tokens=10), timeout_s=TIMEOUT_S)
    assert other.info["request_id"] != header["request_id"]


