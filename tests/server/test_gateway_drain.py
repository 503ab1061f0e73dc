"""The gateway's drain (``chattts_serving/gateway/drain.py``): a real gateway process
(``python -m chattts_serving.gateway``) in front of a real tritonserver gets a real SIGTERM while
long streams run on every door (HTTP pcm, SSE, our WebSocket, vLLM-Omni's WebSocket). New
requests are refused with 503 and ``Retry-After`` and readiness says not ready at once; streams
that end within the drain timeout deliver all their audio; streams longer than it end with the
explicit retryable error (close 1012 on the WebSockets, an ``error`` event on SSE, a cut body on
raw audio); the process exits 0."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from chattts_serving import contract
from chattts_serving.gateway.ws import WS_PATH, Close
from tests.support.servers import ROOT, Server, free_port, wait_until

websockets = pytest.importorskip("websockets")

API_KEY = "drain-key-3"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
HANG_S = 120.0
"""A bound that only detects a hang: never a timing claim."""


class Gateway:
    """A gateway process on a free port (its output in ``log``)."""

    def __init__(self, triton: Server, work: Path, drain_timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"gateway-{self.port}.log"
        env = dict(os.environ, CHATTTS_API_KEY=API_KEY)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chattts_serving.gateway", "--triton-url", triton.grpc_url,
                 "--port", str(self.port), "--ws-lookahead", "0", "--drain-timeout-s", str(drain_timeout_s)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not come up:\n" + self.output()
            time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def gateways(triton_server: Server, tmp_path: Path) -> Iterator[Any]:
    started: list[Gateway] = []

    def start(drain_timeout_s: float) -> Gateway:
        started.append(Gateway(triton_server, tmp_path, drain_timeout_s))
        return started[-1]

    try:
        yield start
    finally:
        for g in started:
            g.stop()


def _body(tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "tts-1", "voice": "alloy", "input": "这是一个很长的句子", "response_format": "pcm", "seed": 5,
            "max_new_tokens": tokens, "min_new_tokens": tokens, **extra}


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + WS_PATH


# --- one client per door; each sets ``started`` at its first audio and returns what it got -------

async def http_pcm(url: str, tokens: int, started: asyncio.Event) -> dict[str, Any]:
    got = bytearray()
    out: dict[str, Any] = {"cut": False}
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        try:
            async with client.stream("POST", url + "/v1/audio/speech", json=_body(tokens), headers=AUTH) as r:
                assert r.status_code == 200, await r.aread()
                async for chunk in r.aiter_bytes():
                    got += chunk
                    started.set()
        except httpx.RemoteProtocolError:  # the chunked body ended without its last chunk
            out["cut"] = True
    return {**out, "bytes": len(got)}


async def sse(url: str, tokens: int, started: asyncio.Event) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    audio = 0
    async with httpx.AsyncClient(timeout=HANG_S) as client, \
            client.stream("POST", url + "/v1/audio/speech", json=_body(tokens, stream_format="sse"), headers=AUTH) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                events.append(event)
                if event["type"] == "speech.audio.delta":
                    audio += len(base64.b64decode(event["audio"]))
                    started.set()
    return {"bytes": audio, "last": events[-1]}


async def _ws_utterance(url: str, messages: list[dict[str, Any]], started: asyncio.Event) -> dict[str, Any]:
    """Send ``messages`` on a new WebSocket and read until the server closes it: the audio
    bytes, the JSON events and the close code."""
    events: list[dict[str, Any]] = []
    audio = 0
    async with websockets.connect(_ws(url), additional_headers=AUTH, max_size=None) as ws:
        for message in messages:
            await ws.send(json.dumps(message))
        while True:
            try:
                msg = await ws.recv()
            except websockets.ConnectionClosed:
                break
            if isinstance(msg, bytes):
                audio += len(msg)
                started.set()
            else:
                events.append(json.loads(msg))
        return {"bytes": audio, "events": events, "close": ws.close_code}


async def our_ws(url: str, tokens: int, started: asyncio.Event) -> dict[str, Any]:
    return await _ws_utterance(url, [{"type": "start", "voice": "alloy", "seed": 5, "max_new_tokens": tokens,
                                      "min_new_tokens": tokens, "input": "这是一个很长的句子"}, {"type": "end"}],
                               started)


async def omni_ws(url: str, tokens: int, started: asyncio.Event) -> dict[str, Any]:
    return await _ws_utterance(url, [{"type": "session.config", "voice": "alloy", "seed": 5,
                                      "max_new_tokens": tokens, "min_new_tokens": tokens, "response_format": "pcm",
                                      "stream_audio": True},
                                     {"type": "input.text", "text": "这是一个很长的句子"}, {"type": "input.done"}],
                               started)


async def idle_omni_session(url: str, ready: asyncio.Event) -> dict[str, Any]:
    """A vLLM-Omni session that was configured and sends no text: no stream in flight."""
    events: list[dict[str, Any]] = []
    async with websockets.connect(_ws(url), additional_headers=AUTH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy"}))
        ready.set()
        while True:
            try:
                events.append(json.loads(await ws.recv()))
            except websockets.ConnectionClosed:
                break
        return {"events": events, "close": ws.close_code}


DOORS = {"http": http_pcm, "sse": sse, "ws": our_ws, "omni": omni_ws}


async def _run_streams(gw: Gateway, tokens: int, check_refusals: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start one long stream per door, SIGTERM the gateway once each has audio, check what a new
    request gets meanwhile (``check_refusals``), and return every stream's result and the idle
    session's."""
    started = {name: asyncio.Event() for name in DOORS}
    tasks = {name: asyncio.create_task(door(gw.url, tokens, started[name])) for name, door in DOORS.items()}
    idle_ready = asyncio.Event()
    idle = asyncio.create_task(idle_omni_session(gw.url, idle_ready))
    await asyncio.wait_for(asyncio.gather(idle_ready.wait(), *(e.wait() for e in started.values())), HANG_S)
    gw.proc.send_signal(signal.SIGTERM)
    if check_refusals:
        await _refusals(gw)
    results = {name: await asyncio.wait_for(task, HANG_S) for name, task in tasks.items()}
    return results, await asyncio.wait_for(idle, HANG_S)


async def _refusals(gw: Gateway) -> None:
    """While the gateway drains: a new speech request and a new WebSocket are 503 with Retry-After
    (OpenAI's error object, code server_shutting_down), readiness is 503, liveness 200."""
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(100):  # the signal is taken at the server's next tick
            r = await client.get(gw.url + "/health")
            if r.status_code == 503:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 503 and r.json()["status"] == "draining", r.text
        assert r.json()["streams_in_flight"] >= len(DOORS)  # every stream was still running
        assert (await client.get(gw.url + "/health/live")).status_code == 200
        r = await client.post(gw.url + "/v1/audio/speech", json=_body(8), headers=AUTH)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
        assert r.json()["error"]["code"] == "server_shutting_down" and r.json()["error"]["type"] == "server_error"
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(_ws(gw.url), additional_headers=AUTH):
            pass
    assert refused.value.response.status_code == 503 and refused.value.response.headers["Retry-After"] == "1"
    assert json.loads(refused.value.response.body)["error"]["code"] == "server_shutting_down"


def _exit_code(gw: Gateway) -> int:
    try:
        return gw.proc.wait(HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail("the gateway did not exit after its drain:\n" + gw.output())


def _idle_session_ended(idle: dict[str, Any]) -> None:
    """A session between utterances is no stream: ended at once with the retryable error."""
    assert idle["close"] == Close.SERVICE_RESTART, idle
    assert [e["type"] for e in idle["events"]] == ["error"]
    assert idle["events"][0]["code"] == "server_shutting_down" and idle["events"][0]["retryable"] is True


def test_sigterm_refuses_new_requests_and_lets_every_stream_finish(gateways: Any) -> None:
    tokens = 600
    full = 2 * contract.samples_for_tokens(tokens)  # PCM16 bytes of one segment of exactly that many tokens
    gw = gateways(drain_timeout_s=HANG_S)
    results, idle = asyncio.run(_run_streams(gw, tokens, check_refusals=True))

    assert results["http"] == {"cut": False, "bytes": full}, results["http"]
    assert results["sse"]["bytes"] == full and results["sse"]["last"]["type"] == "speech.audio.done"
    ws = results["ws"]
    assert ws["bytes"] == full and ws["events"][-1]["type"] == "done" and ws["close"] == Close.NORMAL, ws["events"]
    omni = results["omni"]
    assert omni["bytes"] == full, omni["events"]
    types = [e["type"] for e in omni["events"]]
    # the utterance completes; the session then ends (its next utterance would be refused)
    assert types == ["audio.start", "audio.done", "session.done", "error"], types
    assert omni["events"][1]["error"] is False and omni["close"] == Close.SERVICE_RESTART
    _idle_session_ended(idle)
    assert _exit_code(gw) == 0, gw.output()
    assert "drained: exiting" in gw.output() and "without completing handshake" not in gw.output()


def test_streams_longer_than_the_drain_timeout_end_with_a_retryable_error(gateways: Any) -> None:
    tokens = 2000  # 43 s of audio: far longer than the drain timeout
    gw = gateways(drain_timeout_s=1)
    results, idle = asyncio.run(_run_streams(gw, tokens, check_refusals=False))
    full = 2 * contract.samples_for_tokens(tokens)

    http = results["http"]
    assert http["cut"] and 0 < http["bytes"] < full, http  # no terminating chunk: detectably incomplete
    assert wait_until(lambda: "ended by the drain" in gw.output(), 10)  # the gateway's own line says why ...
    assert "without completing response" not in gw.output()  # ... and uvicorn's error line is not added
    last = results["sse"]["last"]
    assert results["sse"]["bytes"] < full
    assert last["type"] == "error" and last["retryable"] is True, last
    assert last["error"]["code"] == "server_shutting_down" and last["error"]["type"] == "server_error"
    ws = results["ws"]
    assert ws["close"] == Close.SERVICE_RESTART == 1012 and ws["bytes"] < full, ws["events"][-2:]
    error = ws["events"][-1]
    assert error["type"] == "error" and (error["kind"], error["code"], error["retryable"]) == (
        "unavailable", "server_shutting_down", True), error
    omni = results["omni"]
    assert omni["close"] == Close.SERVICE_RESTART and omni["bytes"] < full
    error = omni["events"][-1]
    assert error["type"] == "error" and error["message"] and error["code"] == "server_shutting_down", error
    assert error["retryable"] is True and "session.done" not in [e["type"] for e in omni["events"]]
    _idle_session_ended(idle)
    assert _exit_code(gw) == 0, gw.output()
    assert "drain timeout (1 s)" in gw.output() and "drained: exiting" in gw.output(), gw.output()
