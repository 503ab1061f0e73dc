"""When a part dies: each kind of model process (Python-backend stub) SIGKILLed while streams run
on every door, under a supervised server and a gateway.

Triton 2.51 neither restarts a dead stub (decoupled or not: measured here, requests to it fail
"Stub process ... is not healthy." for good) nor reports it in its health; the supervisor
(:mod:`chattts_serving.deploy.supervisor`) sees the death through the stub's process file
descriptor and restarts the server at once. Each test checks that every stream in flight on
every door ends with an explicit, retryable error (no client waits: the entry's stall timeout
is set far above the hang bound here, so only the fast path can answer in time), and that the
same ports serve again afterwards, every door answering "unavailable, retry" (gRPC UNAVAILABLE,
HTTP 503 with ``Retry-After``), never a 500, while it restarts. The times from the kill to
each error and to serving again are recorded in ``build/test/recovery.json``
(docs/operations.md, "Faults and recovery").
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psutil
import pytest

from bench.machine import machine_info
from chattts_serving import contract
from chattts_serving.client import ClientError, SynthesisRequest, synthesize_offline, synthesize_stream
from chattts_serving.client.grpc_stream import iter_parts
from chattts_serving.client.sse import iter_sse_parts
from chattts_serving.deploy.admin import ADMIN_HEADER, TOKEN_ENV, TRITONSERVER_ENV
from chattts_serving.deploy.container import EXIT_MODEL_DIED
from chattts_serving.deploy.server import SHM_GLOB, TritonServer, stub_processes
from chattts_serving.deploy.supervisor import WAKE_S, Supervisor, supervised
from chattts_serving.errors import ErrorKind
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import HealthProfile
from tests.support.servers import BUILD, profile_server, running_gateway, serve_profile, wait_until

websockets = pytest.importorskip("websockets")

HANG_BOUND_S = 30.0
"""Longest a stream may take to hear of the death here: far below the stall timeout set below
(a client that waited for it would have waited for nothing), far above what the fast path takes."""
STALL_TIMEOUT_S = 300.0
TOKENS = 3500
TEXT = "这是一次故障测试，请继续听下去。"
"""One sentence: the ensemble door takes no more."""
LONG_TEXT = "".join(f"第{i}句话在这里。" for i in range(40))
"""Many sentences: the vLLM-Omni dialect has no ``min_new_tokens``, so its utterance is long by
its number of sentences."""
STUB_KINDS = (contract.MODEL_ENGINE, contract.MODEL_STREAM_ENTRY, contract.MODEL_FRONTEND, contract.MODEL_VOCODER,
              contract.MODEL_VOCODER_CODES, contract.MODEL_ENSEMBLE_VOCODER, contract.MODEL_OFFLINE_ENTRY)
RESULTS: dict[str, Any] = {}
RETRYABLE_CODES = ("backend_unavailable", "server_busy", "server_shutting_down")
"""The gateway's error codes that tell a client to retry (503s)."""


@dataclass
class Outcome:
    """What one stream saw: its first audio, its end (seconds, ``time.monotonic``), the error it
    ended with (None: it completed) and whether that error said the client may retry."""

    door: str
    first_audio: threading.Event = field(default_factory=threading.Event)
    end_t: float | None = None
    error: str | None = None
    retryable: bool | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self, body: Callable[[Outcome], None]) -> Outcome:
        def go() -> None:
            try:
                body(self)
            except Exception as exc:  # the outcome records whatever ended the stream
                if self.error is None:
                    self.error, self.retryable = f"{type(exc).__name__}: {exc}", _retryable_exception(exc)
            finally:
                self.end_t = time.monotonic()
                self.first_audio.set()
                self.done.set()
        threading.Thread(target=go, name=f"door-{self.door}", daemon=True).start()
        return self


def _retryable_exception(exc: BaseException) -> bool:
    """A transport failure (connection dropped, body cut short) is retryable by nature; a
    ClientError is when its kind says so."""
    if isinstance(exc, ClientError):
        return exc.connection or exc.kind in (ErrorKind.UNAVAILABLE, ErrorKind.BUSY)
    return isinstance(exc, (httpx.TransportError, OSError))


def _request() -> SynthesisRequest:
    return SynthesisRequest(text=TEXT, seed=3, max_new_tokens=TOKENS, min_new_tokens=TOKENS)


def _grpc(url: str, model: str) -> Callable[[Outcome], None]:
    def body(o: Outcome) -> None:
        for part in iter_parts(url, _request(), timeout_s=600, model=model):
            if part.audio.size:
                o.first_audio.set()
    return body


def _sse(url: str) -> Callable[[Outcome], None]:
    def body(o: Outcome) -> None:
        for part in iter_sse_parts(url, _request(), timeout_s=600):
            if part.audio.size:
                o.first_audio.set()
    return body


def _speech_body(**extra: Any) -> dict[str, Any]:
    return {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "pcm",
            "max_new_tokens": TOKENS, "min_new_tokens": TOKENS, **extra}


def _gateway_pcm(url: str) -> Callable[[Outcome], None]:
    def body(o: Outcome) -> None:
        with httpx.stream("POST", url + "/v1/audio/speech", json=_speech_body(), timeout=600) as r:
            assert r.status_code == 200, r.read()
            for data in r.iter_bytes():
                if data:
                    o.first_audio.set()
    return body


def _gateway_sse(url: str) -> Callable[[Outcome], None]:
    def body(o: Outcome) -> None:
        with httpx.stream("POST", url + "/v1/audio/speech", json=_speech_body(stream_format="sse"), timeout=600) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    o.first_audio.set()
                elif event["type"] == "error":
                    o.error = json.dumps(event)
                    o.retryable = event.get("retryable") is True and event["error"]["code"] in RETRYABLE_CODES
                    return
    return body


def _ws_url(url: str) -> str:
    return url.replace("http", "ws", 1) + WS_PATH


def _websocket(url: str, messages: list[dict[str, Any]]) -> Callable[[Outcome], None]:
    """A WebSocket utterance of either dialect: ``messages`` sent, binary frames as audio, the
    first ``error`` event recorded (retryable as its ``retryable`` says), until the session
    ends or the socket closes."""
    async def main(o: Outcome) -> None:
        async with websockets.connect(_ws_url(url), max_size=None) as ws:
            for message in messages:
                await ws.send(json.dumps(message))
            try:
                async for msg in ws:
                    if isinstance(msg, bytes):
                        o.first_audio.set()
                        continue
                    event = json.loads(msg)
                    if event["type"] == "error" and o.error is None:
                        o.error = json.dumps(event)
                        o.retryable = event.get("retryable") is True
                    elif event["type"] == "session.done":
                        return
            except websockets.ConnectionClosed as closed:
                o.error = o.error or f"closed {closed.rcvd.code if closed.rcvd else None}"
    return lambda o: asyncio.run(main(o))


def _gateway_ws(url: str) -> Callable[[Outcome], None]:
    return _websocket(url, [{"type": "start", "voice": "alloy", "seed": 3, "max_new_tokens": TOKENS,
                             "min_new_tokens": TOKENS}, {"type": "text", "text": TEXT}, {"type": "end"}])


def _gateway_omni(url: str) -> Callable[[Outcome], None]:
    return _websocket(url, [{"type": "session.config", "voice": "alloy", "response_format": "pcm",
                             "stream_audio": True}, {"type": "input.text", "text": LONG_TEXT},
                            {"type": "input.done"}])


@dataclass
class Rig:
    """A supervised server and a gateway over it."""

    server: TritonServer
    supervisor: Supervisor
    gateway: str

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.server.http_port}"

    def probes(self) -> Probes:
        return Probes(self.grpc, self.http, self.gateway)


ARTIFACTS_ENV = "CHATTTS_RECOVERY_ARTIFACTS"
"""Artifacts to run these tests on instead of the small ones (``make recovery``: the full-size
ones, whose times then go to ``results/recovery.json``)."""


LONG_STREAMS: dict[str, dict[str, Any]] = {
    "entry": {"stall_timeout_s": STALL_TIMEOUT_S},
    "engine": {"max_new_tokens_cap": TOKENS, "max_context_tokens": 4096},
    "stream": {"growth": 1.0, "first_chunk_tokens": 2, "max_chunk_tokens": 2, "emit_tokens": 2}}
"""Profile changes under which a stream of thousands of tokens stays in flight for seconds
(many small chunks, each a vocoder call) and only the fast path can end it in time."""


@pytest.fixture(scope="module")
def rig(small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One server for the module, restarted by its supervisor after each kill; many small
    chunks (each a vocoder call) keep a stream of thousands of tokens in flight for seconds."""
    chosen = os.environ.get(ARTIFACTS_ENV)
    artifacts = Artifacts.load(Path(chosen)) if chosen else small_artifacts
    out = Path("results/recovery.json") if chosen else BUILD / "recovery.json"
    srv = serve_profile(artifacts, tmp_path_factory.mktemp("part-dies"), **LONG_STREAMS)
    srv.expect_fatal = True  # its stubs are killed on purpose: Triton may abort with one
    health = HealthProfile(interval_s=5.0, failures=3, probe_every=0, probe_timeout_s=30.0)
    try:
        with supervised(srv, health) as sup, running_gateway(GatewaySettings(triton_url=f"127.0.0.1:{srv.grpc_port}")) \
                as gw:
            yield Rig(srv, sup, gw)
    finally:
        srv.stop(timeout_s=5.0)
        out.parent.mkdir(parents=True, exist_ok=True)
        report = {"artifacts": str(artifacts.root), "machine": machine_info(), "kinds": RESULTS}
        out.write_text(json.dumps(report, indent=2) + "\n")


SHORT = SynthesisRequest(text="恢复了。", max_new_tokens=4, min_new_tokens=4)


@dataclass
class Probes:
    """Short requests on three doors of a server (its gRPC and HTTP ``host:port``, the
    gateway's base URL over it) and what they answered while it was not serving: each failure
    as (door, what it said)."""

    grpc_url: str
    http_url: str
    gateway_url: str
    failures: list[tuple[str, str]] = field(default_factory=list)
    wrong: list[tuple[str, str]] = field(default_factory=list)
    """Failures that were not a retryable "unavailable" (a 500, an INTERNAL, a 503 without
    Retry-After)."""

    def grpc(self) -> bool:
        try:
            return synthesize_stream(self.grpc_url, SHORT, timeout_s=30).audio.size > 0
        except ClientError as exc:
            self._record("grpc", f"{exc.kind} {exc.message}", exc.connection or exc.kind == ErrorKind.UNAVAILABLE)
            return False

    def offline(self) -> bool:
        try:
            return synthesize_offline(self.http_url, SHORT, timeout_s=30).audio.size > 0
        except ClientError as exc:
            self._record("offline", f"{exc.status} {exc.kind} {exc.message}",
                         exc.connection or exc.kind == ErrorKind.UNAVAILABLE)
            return False

    def gateway(self) -> bool:
        body = {"model": "tts-1", "input": SHORT.text, "voice": "alloy", "response_format": "pcm",
                "max_new_tokens": 4, "min_new_tokens": 4}
        try:
            r = httpx.post(self.gateway_url + "/v1/audio/speech", json=body, timeout=30)
        except httpx.HTTPError as exc:  # the gateway itself runs on: a transport error is wrong
            self._record("gateway", repr(exc), False)
            return False
        if r.status_code == 200 and r.content:
            return True
        error = r.json()["error"] if r.headers.get("content-type", "").startswith("application/json") else {}
        code = error.get("code", "")
        said = f"{r.status_code} {code}" if r.status_code == 503 else f"{r.status_code} {code}: {error.get('message')}"
        self._record("gateway", said, r.status_code == 503 and code in RETRYABLE_CODES and "retry-after" in r.headers)
        return False

    def _record(self, door: str, said: str, retryable: bool) -> None:
        self.failures.append((door, said))
        if not retryable:
            self.wrong.append((door, said))

    def all_serve(self) -> bool:
        """One probe of each door; True when all three served."""
        return all([self.grpc(), self.offline(), self.gateway()])

    def until_serving(self, timeout_s: float) -> bool:
        """Probe all three doors until each has served once (True), or ``timeout_s`` passes."""
        serving: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for door, probe in (("grpc", self.grpc), ("offline", self.offline), ("gateway", self.gateway)):
                if door not in serving and probe():
                    serving.add(door)
            if len(serving) == 3:
                return True
            time.sleep(0.1)
        return False


@pytest.mark.parametrize("model", STUB_KINDS)
def test_a_killed_model_process_ends_every_stream_on_every_door_with_a_retryable_error_and_the_server_serves_again(
        rig: Rig, model: str) -> None:
    assert rig.probes().until_serving(120), "the server does not serve before the kill"
    restarts = rig.supervisor.restarts
    doors = {"grpc": _grpc(rig.grpc, contract.MODEL_STREAM), "ensemble": _grpc(rig.grpc, contract.MODEL_ENSEMBLE),
             "sse": _sse(rig.http), "gateway_pcm": _gateway_pcm(rig.gateway), "gateway_sse": _gateway_sse(rig.gateway),
             "gateway_ws": _gateway_ws(rig.gateway), "gateway_omni": _gateway_omni(rig.gateway)}
    # The many-sentence door takes longest to its first audio: it starts first, the others once
    # it plays, so that no stream is near its end when the part is killed.
    slow = Outcome("gateway_omni").run(doors.pop("gateway_omni"))
    assert slow.first_audio.wait(120), "gateway_omni: no audio before the kill"
    outcomes = [slow, *(Outcome(door).run(body) for door, body in doors.items())]
    for o in outcomes:
        assert o.first_audio.wait(120), f"{o.door}: no audio before the kill"
    ended = [(o.door, o.error) for o in outcomes if o.done.is_set()]
    assert not ended, f"streams ended before the kill (too short for this host?): {ended}"
    pid = next(p for p, m in rig.server.stub_pids().items() if m == model)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for o in outcomes:
        assert o.done.wait(HANG_BOUND_S), f"{o.door}: still waiting {HANG_BOUND_S:.0f} s after {model} died"
    probes = rig.probes()  # while the server restarts, every door says "unavailable, retry": never a 500
    assert probes.until_serving(180), f"the server does not serve again after the restart: {probes.failures}"
    serving_s = time.monotonic() - killed_at
    # the supervisor counts a restart once its server is ready: a probe can be served first
    assert wait_until(lambda: rig.supervisor.restarts > restarts, 30), "the server serves again without a restart"
    assert not probes.wrong, probes.wrong
    errors = {o.door: o.error for o in outcomes}
    for o in outcomes:
        assert o.error is not None, f"{o.door}: completed although {model} died mid-stream"
        assert o.retryable, f"{o.door}: the error does not say retry: {o.error}"
    assert all("internal_error" not in (e or "") for e in errors.values()), errors
    # a stream that was playing lost its server: no client says it could not connect
    assert all("cannot connect" not in (e or "") and "unreachable" not in (e or "") for e in errors.values()), errors
    RESULTS[model] = {"kill_to_error_s": {o.door: round((o.end_t or 0) - killed_at, 3) for o in outcomes},
                      "kill_to_serving_s": round(serving_s, 3), "errors": errors,
                      "refusals_while_restarting": sorted(set(probes.failures))}
    print(json.dumps(RESULTS[model], indent=1, ensure_ascii=False))


def test_a_model_the_admin_unloads_and_loads_is_no_death_to_the_supervisor(rig: Rig) -> None:
    """Explicit model control: the offline entry's process exits when the admin unloads it and
    a new one starts when it loads again; the supervisor restarts nothing (Triton's repository
    index says the model is not READY while its process is gone), and streams are served
    throughout."""
    restarts = rig.supervisor.restarts
    model = f"http://{rig.http}/v2/repository/models/{contract.MODEL_OFFLINE_ENTRY}"
    headers = {ADMIN_HEADER: rig.server.admin_token}
    assert httpx.post(f"{model}/unload", headers=headers, timeout=60).status_code == 200
    assert wait_until(lambda: rig.server.stub_counts()[contract.MODEL_OFFLINE_ENTRY] == 0, 60)
    assert rig.probes().grpc()
    time.sleep(2 * WAKE_S)  # the supervisor has woken for the exit and checked
    assert rig.supervisor.restarts == restarts
    assert rig.supervisor.expected[contract.MODEL_OFFLINE_ENTRY] == 0
    assert httpx.post(f"{model}/load", headers=headers, timeout=120).status_code == 200
    assert rig.probes().until_serving(60)
    assert rig.supervisor.restarts == restarts


def test_while_a_server_stops_and_starts_or_reloads_its_door_every_door_says_unavailable(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """A clean restart (the supervisor's after failed probes, a rolling update's) and the admin
    unloading and loading the ``chattts`` door: requests on every door meanwhile are refused
    as unavailable (gRPC UNAVAILABLE, HTTP 503, the gateway's 503 with ``Retry-After``), never
    a 500."""
    srv = serve_profile(small_artifacts, tmp_path)
    try:
        with running_gateway(GatewaySettings(triton_url=f"127.0.0.1:{srv.grpc_port}")) as gw:
            probes = Probes(f"127.0.0.1:{srv.grpc_port}", f"127.0.0.1:{srv.http_port}", gw)
            assert probes.until_serving(120)
            stop = threading.Event()

            def keep_probing() -> None:
                while not stop.is_set():
                    probes.all_serve()
            prober = threading.Thread(target=keep_probing, name="prober", daemon=True)
            prober.start()
            try:
                srv.restart()
                assert probes.until_serving(120), probes.failures
                restarted = len(probes.failures)
                door = f"http://127.0.0.1:{srv.http_port}/v2/repository/models/{contract.MODEL_STREAM}"
                headers = {ADMIN_HEADER: srv.admin_token}
                assert httpx.post(f"{door}/unload", headers=headers, timeout=60).status_code == 200
                assert httpx.get(f"{gw}/health", timeout=30).status_code == 503  # not ready without its door
                time.sleep(1.0)  # the probes meet the unloaded door
                assert httpx.post(f"{door}/load", headers=headers, timeout=60).status_code == 200
                assert probes.until_serving(120), probes.failures
                assert httpx.get(f"{gw}/health", timeout=30).status_code == 200
            finally:
                stop.set()
                prober.join(120)
    finally:
        srv.stop()
    assert restarted > 0 and len(probes.failures) > restarted, "the probes never met the restart or the reload"
    assert not probes.wrong, probes.wrong


def test_in_a_container_a_dead_model_process_stops_the_server_and_its_command_exits_70(
        small_artifacts: Artifacts, tmp_path: Path) -> None:
    """The image's command (``chattts-tritonserver``) watches its model processes itself: the
    GPT engine's killed, the stream in flight ends with a retryable error, tritonserver is
    stopped and the command exits :data:`~chattts_serving.deploy.container.EXIT_MODEL_DIED`
    for the orchestrator to restart the container."""
    srv = profile_server(small_artifacts, tmp_path, **LONG_STREAMS)
    binary, *args = srv.command()
    args = [a for a in args if not a.startswith(("--http-restricted-api", "--grpc-restricted-protocol"))]
    env = {**srv.environment(), TRITONSERVER_ENV: binary, TOKEN_ENV: srv.admin_token}
    regions = set(glob.glob(SHM_GLOB))
    log = tmp_path / "container.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chattts_serving.deploy.container", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        grpc = f"127.0.0.1:{srv.grpc_port}"

        def watched() -> bool:
            return proc.poll() is None and '"event":"supervisor_started"' in log.read_text(errors="replace")
        assert wait_until(watched, 180), log.read_text()[-3000:]
        assert Probes(grpc, "", "").grpc()
        stream = Outcome("grpc").run(_grpc(grpc, contract.MODEL_STREAM))
        assert stream.first_audio.wait(120) and not stream.done.is_set(), stream.error
        server = psutil.Process(proc.pid).children()[0]
        (engine,) = [p for p, m in stub_processes(server.pid).items() if m == contract.MODEL_ENGINE]
        os.kill(engine, signal.SIGKILL)
        assert stream.done.wait(HANG_BOUND_S), "the stream still waits after the engine died"
        assert stream.error is not None and stream.retryable, stream.error
        assert proc.wait(60) == EXIT_MODEL_DIED
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"')]
        stopped = [e for e in events if e.get("event") == "server_stopped"]
        assert stopped and contract.MODEL_ENGINE in stopped[0]["reason"], events
    finally:
        if proc.poll() is None:  # the command, its tritonserver and their model processes
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            proc.kill()
            proc.wait(30)
        for region in set(glob.glob(SHM_GLOB)) - regions:  # a killed server's shared memory
            with contextlib.suppress(OSError):
                os.unlink(region)
