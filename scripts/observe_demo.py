#!/usr/bin/env python3
"""Observability demo without Docker: our server, a real Prometheus, some load, the dashboard PNG.

    .venv/bin/python scripts/observe_demo.py                       # artifacts/small, 3 min of load
    .venv/bin/python scripts/observe_demo.py --artifacts artifacts/full --load-minutes 5 --keep

1. renders the model repository (``cpu`` profile) over ``--artifacts`` and starts the bundled
   tritonserver on free ports (log in ``<work>/tritonserver.log``);
2. starts Prometheus (``/usr/bin/prometheus``) with the repository's config
   (docker/prometheus/prometheus.yml: 5 s scrapes, 15 s rule evaluation) and rules
   (docker/prometheus/rules/), the compose target ``triton:8002`` pointed at this server;
3. runs ``--load-minutes`` of load with ``chattts_serving.client`` in threads, concurrency
   stepping through ``--concurrency`` (e.g. 2,6,12,4): streamed realtime and batch-priority
   requests (the ``priority`` input), offline requests, and a few bad ones (out-of-range
   parameters, which are refused; empty text, which fails inside the pipeline);
4. waits for the last scrape and rule evaluation and draws ``--out`` with
   scripts/dashboard_png.py from the dashboard's own queries.

With ``--keep`` both servers stay up afterwards (Prometheus' UI at the printed URL) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from chattts_serving.client import ClientError, SynthesisRequest, synthesize_offline, synthesize_stream
from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.serving.profile import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_png  # the sibling script, found through the line above

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_DIR = ROOT / "docker" / "prometheus"

TEXTS = ("你好，欢迎使用流式语音合成服务。", "今天天气很好，我们去公园散步吧。",
         "请稍等，正在为您查询订单，大约需要三分钟。", "ChatTTS 在 Triton 上流式输出音频。",
         "语音合成需要低延迟和高吞吐。", "这是一个比较长的句子，用来测试多个音频块的流式输出效果。",
         "Thank you for calling, how can I help you today?", "最后一句，谢谢大家的耐心。")


@dataclass(frozen=True)
class PriorityRequest(SynthesisRequest):
    """A :class:`SynthesisRequest` that also sends the entry models' ``priority`` input."""

    priority: str | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_config(metrics_port: int, prometheus_port: int) -> dict:
    """The repository's prometheus.yml with its targets on this machine and absolute rule paths."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    config["rule_files"] = [str(p) for p in sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))]
    for job in config["scrape_configs"]:
        target = f"127.0.0.1:{metrics_port}" if job["job_name"] == "triton" else f"127.0.0.1:{prometheus_port}"
        for static in job["static_configs"]:
            static["targets"] = [target]
    return config


def start_prometheus(binary: str, work: Path, metrics_port: int) -> tuple[subprocess.Popen[bytes], str]:
    """Start Prometheus on a free port; returns the process and its base URL once ready."""
    port = free_port()
    config_path = work / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(prometheus_config(metrics_port, port), sort_keys=False), encoding="utf-8")
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115  (kept open for the process' life)
    proc = subprocess.Popen([binary, f"--config.file={config_path}", f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}; see {work / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise RuntimeError("prometheus not ready after 30 s")


class Load:
    """Client threads against one server; the number of active threads follows a schedule."""

    def __init__(self, grpc_url: str, http_url: str, seed: int = 0) -> None:
        self.grpc_url, self.http_url = grpc_url, http_url
        self.active = 0
        self.outcomes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rng = random.Random(seed)

    def _one(self, rng: random.Random) -> str:
        """One request of a random kind; returns its outcome label."""
        text = rng.choice(TEXTS)
        tokens = rng.randint(60, 360)
        kind = rng.choices(["realtime", "batch", "offline", "bad_param", "empty"], [70, 15, 8, 5, 2])[0]
        try:
            if kind in ("realtime", "batch"):
                synthesize_stream(self.grpc_url, PriorityRequest(text=text, seed=rng.randint(0, 999),
                                                                 max_new_tokens=tokens, priority=kind), timeout_s=300)
            elif kind == "offline":
                synthesize_offline(self.http_url, PriorityRequest(text=text, seed=rng.randint(0, 999),
                                                                  max_new_tokens=tokens // 2), timeout_s=300)
            elif kind == "bad_param":
                synthesize_stream(self.grpc_url, SynthesisRequest(text=text, temperature=50.0), timeout_s=60)
            else:
                synthesize_stream(self.grpc_url, SynthesisRequest(text=""), timeout_s=60)
            return f"{kind}:ok"
        except ClientError as exc:
            reason = "busy" if "busy" in exc.message else "refused"
            return f"{kind}:{reason}"

    def _worker(self, index: int) -> None:
        rng = random.Random(self._rng.random() + index)
        while not self._stop.is_set():
            with self._lock:
                idle = index >= self.active
            if idle:
                time.sleep(0.2)
                continue
            outcome = self._one(rng)
            with self._lock:
                self.outcomes[outcome] += 1
            time.sleep(rng.uniform(0.0, 0.5))  # think time

    def run(self, schedule: list[int], seconds: float) -> None:
        """Run ``seconds`` in len(schedule) equal phases of that many concurrent clients."""
        threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(max(schedule))]
        for t in threads:
            t.start()
        phase_s = seconds / len(schedule)
        for n in schedule:
            with self._lock:
                self.active = n
            print(f"  {time.strftime('%H:%M:%S')} concurrency {n} for {phase_s:.0f} s", flush=True)
            time.sleep(phase_s)
        self._stop.set()
        for t in threads:
            t.join(timeout=320)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=ROOT / "artifacts" / "small")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--load-minutes", type=float, default=3.0)
    ap.add_argument("--concurrency", default="2,6,12,4", help="clients per phase, comma separated (default 2,6,12,4)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    ap.add_argument("--prometheus-bin", default="/usr/bin/prometheus")
    ap.add_argument("--work", type=Path, default=None, help="folder for repository, logs and TSDB (default: temp)")
    ap.add_argument("--keep", action="store_true", help="leave both servers running until Ctrl-C")
    args = ap.parse_args(argv)
    schedule = [int(x) for x in args.concurrency.split(",") if x.strip()]
    work = args.work or Path(tempfile.mkdtemp(prefix="chattts-observe-"))
    work.mkdir(parents=True, exist_ok=True)

    render_repository(load_profile(args.profile), args.artifacts, work / "model_repository")
    ports = free_port(), free_port(), free_port()
    server = TritonServer(work / "model_repository", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                          log_path=work / "tritonserver.log", build_dir=work / "build")
    prom: subprocess.Popen[bytes] | None = None
    try:
        print(f"starting tritonserver on {args.artifacts} (log {work / 'tritonserver.log'})", flush=True)
        server.start()
        prom, prom_url = start_prometheus(args.prometheus_bin, work, ports[2])
        print(f"Prometheus at {prom_url} (scraping metrics port {ports[2]})", flush=True)
        time.sleep(20)  # a quiet baseline before the load
        load = Load(f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[0]}")
        print(f"load for {args.load_minutes:g} min, concurrency phases {schedule}", flush=True)
        t_start = time.time()
        load.run(schedule, args.load_minutes * 60)
        t_end = time.time()
        print("outcomes:", dict(sorted(load.outcomes.items())), flush=True)
        time.sleep(35)  # the last scrapes and two rule evaluations (5 s / 15 s in prometheus.yml)
        minutes = (time.time() - t_start) / 60 + 1.0
        subtitle = (f"{args.artifacts.name} artifacts, {args.profile} profile, 2 CPU cores · "
                    f"{(t_end - t_start) / 60:.1f} min of load, concurrent clients {' → '.join(map(str, schedule))}: "
                    "streamed realtime/batch, offline, and bad requests")
        panels = dashboard_png.render(prom_url, minutes, args.out, subtitle=subtitle)
        empty = [p.title for p in panels if not p.series]
        print(f"wrote {args.out}" + (f" (panels without data: {empty})" if empty else ""), flush=True)
        if args.keep:
            print(f"Prometheus UI: {prom_url}   (Ctrl-C stops both servers)", flush=True)
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=15)
            except subprocess.TimeoutExpired:
                prom.kill()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
