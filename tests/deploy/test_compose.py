"""The compose stack up on this machine: docker/compose.yaml with docker/compose.cpu.yaml, the
CPU image (``make image``), PostgreSQL and Prometheus built from Debian's packages.

One module-scoped stack (the `export` one-shot with small synthetic artifacts, Triton, the
gateway, PostgreSQL, Prometheus; Grafana is not started: its image can neither be pulled nor
built here) serves every check: a stream through the gateway over HTTP and over its WebSocket,
a stream over gRPC straight to Triton with the inference key (and none without it), a voice
saved through the gateway (PostgreSQL) and spoken with, and the HPA's metric query against
this Prometheus, higher under load than idle. Afterwards ``down -v``, and the engine stopped
(its bridges, iptables chains and ip_forward undone) when this module started it.

Docker Compose 1.29 (Debian's) runs copies of the two files made by scripts/compose_v1.py;
with a Compose v2 (``docker compose version``) the files run as they are.

Needs root and apt-get (scripts/containers.sh installs the engine): skipped otherwise, failed
under ``CI=1`` when the engine or the stack cannot start. Figures go to
results/deploy/compose.json and results/deploy/image.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
import yaml

from chattts_serving import contract
from chattts_serving.client import ClientError, SynthesisRequest, synthesize_stream
from tests.support.servers import ROOT, free_port

pytestmark = pytest.mark.timeout(3600)

CONTAINERS = ROOT / "scripts" / "containers.sh"
COMPOSE_V1 = ROOT / "scripts" / "compose_v1.py"
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILES = [DOCKER_DIR / "compose.yaml", DOCKER_DIR / "compose.cpu.yaml"]
ADAPTER_CONFIG = DOCKER_DIR / "k8s" / "prometheus-adapter-config.yaml"
RESULTS = ROOT / "results" / "deploy"
IMAGE = "chattts-serving:0.1.0-cpu"
PROJECT = "chattts-deploytest"
SERVICES = ["export", "triton", "gateway", "voices-db", "prometheus"]
HPA_METRIC = "tts_request_queue_size"
UP_TIMEOUT_S = 900.0
TEXT = "你好，欢迎使用语音合成。"
TOKENS = 16
"""Audio tokens per request (min = max): the synthetic model's audio has a known length."""
PCM_BYTES = 2 * contract.samples_for_tokens(TOKENS)
SPEECH = {"model": "chattts", "input": TEXT, "voice": "alloy", "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}


def missing(why: str) -> NoReturn:
    """A prerequisite is missing: skip, or fail under ``CI=1`` (CI must not pass a test that did not run)."""
    if os.environ.get("CI"):
        pytest.fail(f"compose test cannot run (CI=1, so this fails instead of skipping): {why}")
    pytest.skip(why)


def _sh(*args: str, timeout: float = 600.0, check: bool = True, env: dict[str, str] | None = None,
        cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class Stack:
    """The running stack: where its doors are, its secrets, and the figures of each check."""

    compose: list[str]
    env: dict[str, str]
    inference_key: str
    http: str
    grpc: str
    gateway: str
    prometheus: str
    startup_s: float
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, name: str, passed: bool, sent: int, completed: int, failed: int, **extra: Any) -> None:
        """One check's figures: requests sent, completed, failed with an explicit error, lost
        (sent but neither completed nor failed)."""
        self.checks[name] = {"passed": passed, "requests_sent": sent, "requests_completed": completed,
                             "requests_failed": failed, "requests_lost": sent - completed - failed, **extra}

    def logs(self) -> str:
        return _sh(*self.compose, "logs", "--no-color", "--tail", "40", check=False, env=self.env).stdout


def _compose_command(work: Path) -> list[str]:
    """Compose v2 on the files as they are, else 1.29 on scripts/compose_v1.py's copies; the
    test's own override (:func:`_test_override`) last."""
    files = [*COMPOSE_FILES, work / "compose.test.yaml"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        base = [docker, "compose"]
    elif shutil.which("docker-compose"):
        out = work / "compose-v1"
        _sh(str(ROOT / ".venv" / "bin" / "python"), str(COMPOSE_V1), "--out", str(out), *map(str, files))
        files = [out / f.name for f in files]
        base = ["docker-compose"]
    else:
        missing("no Docker Compose (scripts/containers.sh install puts Debian's docker-compose)")
    return [*base, "--project-directory", str(DOCKER_DIR), "-p", PROJECT, *[a for f in files for a in ("-f", str(f))]]


def _test_override(work: Path, ports: dict[str, int]) -> None:
    """Published ports on this host's loopback, on free ports (the stack's own 8080 and 9090
    may be taken here)."""
    override = {"services": {
        "triton": {"ports": _Tagged([f"127.0.0.1:{ports['http']}:8000", f"127.0.0.1:{ports['grpc']}:8001",
                                      f"127.0.0.1:{ports['metrics']}:8002"])},
        "gateway": {"ports": _Tagged([f"127.0.0.1:{ports['gateway']}:8080"])},
        "prometheus": {"ports": _Tagged([f"127.0.0.1:{ports['prometheus']}:9090"])},
    }}
    (work / "compose.test.yaml").write_text(yaml.dump(override, Dumper=_Dumper, sort_keys=False), encoding="utf-8")


class _Tagged(list):  # type: ignore[type-arg]
    """A list written with Compose's ``!override`` tag (replaces, not merges, the earlier one)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Tagged, lambda d, v: d.represent_sequence("!override", list(v)))


def _wait(what: str, probe: Any, timeout_s: float, stack_logs: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(2)
    raise AssertionError(f"{what} not ready after {timeout_s:.0f} s\n{stack_logs()}")


def _get_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status) == 200


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        missing("the compose test needs root and apt-get (Debian's docker.io, docker-compose)")
    was_running = subprocess.run(["bash", str(CONTAINERS), "status"], capture_output=True).returncode == 0
    started = subprocess.run(["bash", str(CONTAINERS), "start"], capture_output=True, text=True, timeout=1200)
    if started.returncode != 0:
        missing(f"the Docker engine did not start: {started.stderr[-2000:]}")
    env_line = _sh("bash", str(CONTAINERS), "env").stdout.strip()
    docker_host = env_line.split("=", 1)[1]
    env = {**os.environ, "DOCKER_HOST": docker_host}
    work = tmp_path_factory.mktemp("compose")
    try:
        if _sh("/usr/bin/docker", "image", "inspect", IMAGE, check=False, env=env).returncode != 0:
            _sh("bash", str(CONTAINERS), "image", timeout=3600, env=env)
        ports = {k: free_port() for k in ("http", "grpc", "metrics", "gateway", "prometheus")}
        _test_override(work, ports)
        key = secrets.token_urlsafe(32)
        env.update(CHATTTS_INFERENCE_KEY=key, CHATTTS_ADMIN_TOKEN=secrets.token_urlsafe(32),
                   CHATTTS_VOICES_DB_PASSWORD=secrets.token_urlsafe(16), CHATTTS_API_KEY="")
        compose = _compose_command(work)
        # PostgreSQL and Prometheus from Debian's packages, when not built yet.
        built = yaml.safe_load(_sh(*compose, "config", env=env).stdout)["services"]
        for service in ("voices-db", "prometheus"):
            if _sh("/usr/bin/docker", "image", "inspect", built[service]["image"], check=False, env=env).returncode:
                _sh(*compose, "build", service, timeout=1800, env=env)
        s = Stack(compose, env, key, http=f"127.0.0.1:{ports['http']}", grpc=f"127.0.0.1:{ports['grpc']}",
                  gateway=f"http://127.0.0.1:{ports['gateway']}", prometheus=f"http://127.0.0.1:{ports['prometheus']}",
                  startup_s=0.0)
        # What an interrupted earlier run may have left (its containers, volumes, network).
        _sh(*compose, "--profile", "export", "down", "-v", "--remove-orphans", timeout=300, env=env)
        t0 = time.monotonic()
        try:
            _sh(*compose, "--profile", "export", "up", "-d", *SERVICES, timeout=UP_TIMEOUT_S, env=env)
            _wait("triton", lambda: _get_ok(f"http://{s.http}/v2/health/ready"), UP_TIMEOUT_S, s.logs)
            _wait("gateway", lambda: _get_ok(f"{s.gateway}/health"), 120, s.logs)
            _wait("prometheus", lambda: _get_ok(f"{s.prometheus}/-/ready"), 120, s.logs)
            s.startup_s = time.monotonic() - t0
            yield s
        finally:
            _write_results(s)
            _sh(*compose, "--profile", "export", "down", "-v", "--remove-orphans", timeout=300, check=False, env=env)
    finally:
        if not was_running:
            # The engine goes as it came (bridges, iptables chains, ip_forward); the image
            # cache stays, so that the next run does not build again.
            _sh("bash", str(CONTAINERS), "stop", "--keep-images", timeout=300, check=False)


def _write_results(s: Stack) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compose.json").write_text(json.dumps({
        "artifacts": "small (synthetic, exported by the stack's export one-shot)",
        "compose": Path(s.compose[0]).name,
        "startup_s": round(s.startup_s, 2), "checks": s.checks}, indent=2) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- the checks

def test_the_image_and_its_size_are_recorded(stack: Stack) -> None:
    out = _sh("/usr/bin/docker", "image", "inspect", "-f", "{{.Size}}", IMAGE, env=stack.env)
    size = int(out.stdout.strip())
    path = RESULTS / "image.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(image=IMAGE, image_size_bytes=size)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    assert size > 0


def test_speech_streams_through_the_gateway(stack: Stack) -> None:
    sent = completed = failed = 0
    why = ""
    with httpx.Client(timeout=120) as client:
        for fmt in ("pcm", "wav"):
            sent += 1
            url = f"{stack.gateway}/v1/audio/speech"
            with client.stream("POST", url, json={**SPEECH, "response_format": fmt}) as r:
                body = b"".join(r.iter_bytes())
            whole = len(body) == PCM_BYTES if fmt == "pcm" else body[:4] == b"RIFF" and len(body) > PCM_BYTES
            if r.status_code == 200 and whole:
                completed += 1
            else:
                failed += 1
                why = f"{fmt}: HTTP {r.status_code}, {len(body)} bytes: {body[:300]!r}"
    stack.record("gateway_http", completed == sent, sent, completed, failed)
    assert completed == sent, f"{failed} of {sent} failed; last {why}\n{stack.logs()}"


def test_the_websocket_streams_sentence_by_sentence(stack: Stack) -> None:
    import websockets

    async def speak() -> tuple[int, dict[str, Any]]:
        url = stack.gateway.replace("http://", "ws://") + "/v1/audio/speech/stream"
        audio = 0
        async with websockets.connect(url, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "start", "voice": "alloy", "response_format": "pcm", "seed": 3,
                                      "max_new_tokens": TOKENS, "min_new_tokens": TOKENS}))
            for delta in ("你好，", "欢迎使用。", "今天天气", "很好。"):
                await ws.send(json.dumps({"type": "text", "text": delta}))
            await ws.send(json.dumps({"type": "end"}))
            async for msg in ws:
                if isinstance(msg, bytes):
                    audio += len(msg)
                    continue
                event = json.loads(msg)
                if event["type"] in ("done", "error"):
                    return audio, event
        return audio, {"type": "closed"}

    audio, last = asyncio.run(asyncio.wait_for(speak(), 180))
    ok = last["type"] == "done" and last["sentences"] == 2 and audio == 2 * PCM_BYTES
    stack.record("gateway_websocket", ok, 1, int(ok), int(last["type"] == "error"), sentences=last.get("sentences"))
    assert ok, (last, audio)


def test_grpc_streams_from_triton_with_the_inference_key_only(stack: Stack) -> None:
    request = SynthesisRequest(text=TEXT, voice="3", max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    result = synthesize_stream(stack.grpc, request, timeout_s=120, inference_key=stack.inference_key)
    with pytest.raises(ClientError, match="inference key"):
        synthesize_stream(stack.grpc, SynthesisRequest(text=TEXT), timeout_s=60, inference_key="x" * 32)
    ok = result.audio.size == contract.samples_for_tokens(TOKENS) and result.chunks >= 1
    stack.record("grpc_stream", ok, 2, int(ok), 1, ttfa_s=round(result.ttfa_s, 3),
                 note="the second request carries a wrong key and is refused")
    assert ok


def test_a_voice_saved_through_the_gateway_lives_in_postgresql_and_speaks(stack: Stack) -> None:
    name = f"deploy{secrets.token_hex(3)}"
    with httpx.Client(timeout=120) as client:
        created = client.post(f"{stack.gateway}/v1/audio/voices", json={"name": name, "seed": 1234})
        assert created.status_code == 201, created.text
        # It is in the voices-db service's PostgreSQL, not in the gateway's process.
        rows = _sh(*stack.compose, "exec", "-T", "voices-db", "psql", "-U", "chattts", "-d", "chattts", "-Atc",
                   "select count(*) from information_schema.tables where table_schema = 'public'",
                   env=stack.env).stdout.strip()
        assert int(rows) >= 1
        dump = _sh(*stack.compose, "exec", "-T", "voices-db", "pg_dump", "-U", "chattts", "-d", "chattts",
                   "--data-only", env=stack.env).stdout
        assert name in dump.lower()
        listed = client.get(f"{stack.gateway}/v1/audio/voices").json()
        assert name in {v["name"] for v in listed["saved_voices"]}
        r = client.post(f"{stack.gateway}/v1/audio/speech", json={**SPEECH, "voice": name, "response_format": "pcm"})
    ok = r.status_code == 200 and len(r.content) == PCM_BYTES
    stack.record("saved_voice", ok, 1, int(ok), int(not ok))
    assert ok, (r.status_code, r.text[:300])


def _hpa_query() -> str:
    """The adapter rule behind the HPA's metric, as prometheus-adapter would send it for the
    compose stack's one Triton (its series carry ``job``, not ``namespace``/``pod``)."""
    config = yaml.safe_load(yaml.safe_load(ADAPTER_CONFIG.read_text())["data"]["config.yaml"])
    rule = next(r for r in config["rules"] if r["name"]["as"] == HPA_METRIC)
    series = re.match(r"[a-z_]+", rule["seriesQuery"]).group(0)  # type: ignore[union-attr]
    return (rule["metricsQuery"].replace("<<.GroupBy>>", "job").replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'job="triton"'))


def _prom_max(prometheus: str, query: str, start: float, end: float) -> float | None:
    """The highest value of ``query`` evaluated every second from ``start`` to ``end`` (Unix s)."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    values = [float(v) for series in data["data"]["result"] for _, v in series["values"]]
    return max(values) if values else None


def test_the_hpa_metric_follows_the_load(stack: Stack) -> None:
    query = _hpa_query()
    # Idle: nothing in flight for several scrapes (5 s scrape interval).
    time.sleep(12)
    idle_start = time.time()
    time.sleep(15)
    idle = _prom_max(stack.prometheus, query, idle_start, time.time())
    assert idle is not None, f"no series for {query}: is Prometheus scraping triton:8002?"

    # Load: more concurrent streams than the cpu profile decodes at once, for several scrapes.
    stop = threading.Event()
    counts = {"sent": 0, "completed": 0, "failed": 0}
    lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                counts["sent"] += 1
            try:
                synthesize_stream(stack.grpc, SynthesisRequest(text=TEXT, max_new_tokens=3 * TOKENS,
                                                               min_new_tokens=3 * TOKENS),
                                  timeout_s=180, inference_key=stack.inference_key)
                key = "completed"
            except ClientError:
                key = "failed"
            with lock:
                counts[key] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(24)]
    load_start = time.time()
    for t in threads:
        t.start()
    time.sleep(30)
    load_end = time.time()
    stop.set()
    for t in threads:
        t.join(240)
    time.sleep(6)  # the last scrape of the load window
    loaded = _prom_max(stack.prometheus, query, load_start, load_end)
    ok = loaded is not None and loaded > idle
    stack.record("hpa_metric", ok, counts["sent"], counts["completed"], counts["failed"],
                 query=query, idle_max=idle, load_max=loaded, concurrency=len(threads))
    assert ok, f"{query}: idle {idle}, under load {loaded}"
    assert counts["sent"] == counts["completed"] + counts["failed"], counts
