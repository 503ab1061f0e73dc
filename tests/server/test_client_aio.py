"""The asyncio gRPC streaming client (``chattts_serving.client.AioStreamClient``) against a real
tritonserver: the same audio as the thread-based client, many streams over one channel,
cancellation when the consumer stops, error kinds, an unreachable server, and the idle and
total timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import urllib.request

import numpy as np
import psutil
import pytest

from chattts_serving import contract
from chattts_serving.client import AioStreamClient, ClientError, SynthesisRequest, iter_parts
from chattts_serving.errors import ErrorKind
from tests.support.servers import Server, free_port, stub_processes

TOKENS = 24
TEXT = "你好，欢迎使用ChatTTS。"


def _request(seed: int = 3, tokens: int = TOKENS, text: str = TEXT) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice="alloy", seed=seed, max_new_tokens=tokens, min_new_tokens=tokens)


async def _collect(client: AioStreamClient, request: SynthesisRequest, **kw: float) -> tuple[np.ndarray, dict]:
    audio, info = [], {}
    async with contextlib.aclosing(client.stream(request, **kw)) as parts:
        async for part in parts:
            audio.append(part.audio)
            info.update(part.info or {})
    return np.concatenate(audio), info


def _cancelled_total(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tts_request_total{") and 'status="cancelled"' in line)


def test_same_audio_as_the_threaded_client_and_many_streams_share_one_channel(triton_server: Server) -> None:
    sync = np.concatenate([p.audio for p in iter_parts(triton_server.grpc_url, _request())])

    async def main() -> tuple[np.ndarray, list[tuple[np.ndarray, dict]]]:
        client = AioStreamClient(triton_server.grpc_url)
        try:
            alone, _ = await _collect(client, _request())
            return alone, await asyncio.gather(*(_collect(client, _request(seed=3 if i == 0 else 100 + i))
                                                 for i in range(8)))
        finally:
            await client.close()

    alone, results = asyncio.run(main())
    np.testing.assert_allclose(alone, sync, rtol=0, atol=1e-4)  # two syntheses: float noise (servers.SAME_PCM16_LSB)
    # batched with others, the vocoder's float sums may round differently
    np.testing.assert_allclose(results[0][0], sync, atol=1e-5)
    for audio, info in results:
        assert audio.size == contract.samples_for_tokens(TOKENS)
        assert info["final"] is True and info["sample_rate_hz"] == contract.SAMPLE_RATE_HZ
    assert not np.array_equal(results[1][0], results[2][0])  # different seeds, different audio


def test_closing_the_stream_early_cancels_the_request_on_the_server(triton_server: Server) -> None:
    before = _cancelled_total(triton_server.metrics_port)

    async def main() -> int:
        client = AioStreamClient(triton_server.grpc_url)
        received = 0
        try:
            async with contextlib.aclosing(client.stream(_request(tokens=2000))) as parts:
                async for part in parts:
                    received += part.audio.size
                    if received > 10_000:
                        break
        finally:
            await client.close()
        return received

    assert asyncio.run(main()) < contract.samples_for_tokens(2000)
    deadline = time.monotonic() + 20
    while _cancelled_total(triton_server.metrics_port) <= before:
        assert time.monotonic() < deadline, "the server never saw the cancel"
        time.sleep(0.1)


def test_server_errors_carry_their_kind_and_an_unreachable_server_is_a_connection_error(
        triton_server: Server) -> None:
    async def main() -> tuple[ClientError, ClientError, bool]:
        client = AioStreamClient(triton_server.grpc_url)
        nowhere = AioStreamClient(f"127.0.0.1:{free_port()}")
        try:
            with pytest.raises(ClientError) as invalid:
                await _collect(client, SynthesisRequest(text="，。"))
            with pytest.raises(ClientError) as unreachable:
                await _collect(nowhere, _request())
            return invalid.value, unreachable.value, await nowhere.ready(0.5)
        finally:
            await client.close()
            await nowhere.close()

    invalid, unreachable, ready = asyncio.run(main())
    assert invalid.kind == ErrorKind.INVALID and "nothing speakable" in invalid.message
    assert not invalid.message.startswith("[")
    assert unreachable.connection and not ready


def _gpt_stub(server: Server) -> psutil.Process:
    stub = stub_processes(server).get(contract.MODEL_ENGINE)
    assert stub is not None, "no Python backend stub of the GPT engine found"
    return stub


def test_a_stream_fails_when_the_server_goes_quiet_not_when_it_runs_long(triton_server: Server) -> None:
    """The idle timeout counts from the last response: a stream that keeps sending runs as long
    as it needs; one whose engine stops (SIGSTOP) fails after the idle timeout with DEADLINE."""
    idle_s = 2.0

    async def long_stream() -> tuple[int, float]:
        client = AioStreamClient(triton_server.grpc_url)
        t0 = time.monotonic()
        try:
            audio, _ = await _collect(client, _request(tokens=1500), idle_timeout_s=idle_s)
        finally:
            await client.close()
        return audio.size, time.monotonic() - t0

    samples, elapsed = asyncio.run(long_stream())
    assert samples == contract.samples_for_tokens(1500)
    print(f"\n1500 tokens streamed in {elapsed:.1f} s with an idle timeout of {idle_s:g} s")

    stub = _gpt_stub(triton_server)

    async def stalled() -> tuple[ClientError, int]:
        client = AioStreamClient(triton_server.grpc_url)
        received = 0
        try:
            with pytest.raises(ClientError) as info:
                async with contextlib.aclosing(client.stream(_request(tokens=2000), idle_timeout_s=idle_s)) as parts:
                    async for part in parts:
                        received += part.audio.size
                        if received and stub.status() != psutil.STATUS_STOPPED:
                            stub.send_signal(signal.SIGSTOP)
        finally:
            stub.send_signal(signal.SIGCONT)
            await client.close()
        return info.value, received

    try:
        error, received = asyncio.run(stalled())
    finally:
        stub.send_signal(signal.SIGCONT)
    assert received > 0 and error.kind == ErrorKind.DEADLINE
    assert f"for {idle_s:g} s" in error.message


def test_the_optional_total_cap_ends_a_stream_that_is_still_sending(triton_server: Server) -> None:
    async def main() -> ClientError:
        client = AioStreamClient(triton_server.grpc_url)
        try:
            with pytest.raises(ClientError) as info:
                await _collect(client, _request(tokens=2000, text=TEXT * 20), idle_timeout_s=30, max_duration_s=0.5)
            return info.value
        finally:
            await client.close()

    error = asyncio.run(main())
    assert error.kind == ErrorKind.DEADLINE and "within 0.5 s" in error.message
