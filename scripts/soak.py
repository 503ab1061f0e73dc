"""Soak test (a benchmark, not a test): N minutes of streams at concurrency K, then a report.

Starts the bundled tritonserver on the given artifacts, runs K closed-loop gRPC streaming
clients for ``--minutes`` (texts and seeds cycling, a few bad requests and client cancels mixed
in), samples the RSS of the server process tree every few seconds, and writes
``results/soak.json``: requests sent, completed, failed by kind, cancelled, **lost** (sent but
neither completed nor ended with an explicit error: must be 0), RSS over time and its drift.

    .venv/bin/python scripts/soak.py --artifacts artifacts/small --minutes 30 --concurrency 8
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

import psutil

from chattts_serving.client import ClientError, SynthesisRequest, iter_chunks, synthesize_stream
from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.serving.profile import load_profile

TEXTS = ["你好，欢迎使用流式语音合成服务。", "今天天气很好，我们去公园散步吧。", "请稍等，正在为您查询订单。",
         "ChatTTS 在 Triton 上流式输出。", "语音合成需要低延迟和高吞吐。"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/small"))
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--cancel-fraction", type=float, default=0.05, help="streams the client abandons mid-way")
    ap.add_argument("--bad-fraction", type=float, default=0.05, help="requests with invalid input")
    ap.add_argument("--out", type=Path, default=Path("results/soak.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chattts-soak-"))
    render_repository(load_profile("cpu"), args.artifacts, work / "repo")
    ports = _port(), _port(), _port()
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + args.minutes * 60
    url = f"127.0.0.1:{ports[1]}"

    def client(k: int) -> None:
        rng = random.Random(k)
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            kind = rng.choices(["ok", "bad", "cancel"],
                               [1 - args.bad_fraction - args.cancel_fraction, args.bad_fraction,
                                args.cancel_fraction])[0]
            text = "" if kind == "bad" else TEXTS[(k + i) % len(TEXTS)]
            req = SynthesisRequest(text=text, seed=i, max_new_tokens=args.tokens, min_new_tokens=args.tokens // 2)
            with lock:
                counts["sent"] += 1
            try:
                if kind == "cancel":
                    chunks = iter_chunks(url, req)
                    next(chunks)
                    chunks.close()
                    outcome = "cancelled"
                else:
                    synthesize_stream(url, req)
                    outcome = "completed"
            except ClientError as exc:
                outcome = "failed"
                with lock:
                    errors[exc.message.split(":")[0][:60]] += 1
            except Exception as exc:  # anything else is a lost request: count it, keep going
                outcome = "lost"
                with lock:
                    errors[f"client exception {type(exc).__name__}"] += 1
            with lock:
                counts[outcome] += 1

    rss: list[tuple[float, float]] = []
    with TritonServer(work / "repo", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                      log_path=work / "tritonserver.log", build_dir=work / "build") as srv:
        assert srv.proc is not None
        root = psutil.Process(srv.proc.pid)
        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.concurrency)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            rss.append((round(time.monotonic() - t0, 1), round(total / 2**20, 1)))
            time.sleep(5)
        for t in threads:
            t.join()
    n = len(rss)
    head = [r for _, r in rss[n // 10: n // 10 + max(1, n // 10)]] or [rss[0][1]]
    tail = [r for _, r in rss[-max(1, n // 10):]]
    report = {
        "minutes": args.minutes, "concurrency": args.concurrency, "tokens": args.tokens,
        "artifacts": str(args.artifacts), **counts,
        "lost": counts["sent"] - counts["completed"] - counts["failed"] - counts["cancelled"] + counts["lost"],
        "errors_by_kind": dict(errors),
        "rss_mb_start": sum(head) / len(head), "rss_mb_end": sum(tail) / len(tail),
        "rss_mb_over_time": rss,
    }
    report["rss_drift_pct"] = round(100 * (report["rss_mb_end"] / report["rss_mb_start"] - 1), 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "rss_mb_over_time"}, indent=2))


if __name__ == "__main__":
    main()
