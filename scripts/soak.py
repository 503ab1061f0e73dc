"""Soak test (a benchmark, not a test): N minutes of streams at concurrency K, then an account.

Starts the bundled tritonserver on the given artifacts, runs K closed-loop gRPC streaming
clients for ``--minutes`` (texts and seeds cycling, a few bad requests and client cancels mixed
in, every request with its own request id), samples the RSS of the server process tree every
few seconds, and writes ``results/soak.json``.

Every request ends in exactly one outcome (:class:`chattts_serving.bench.outcomes.Outcome`):
completed, refused busy, refused invalid, cancelled (the client abandoned the stream and the
server logged it as cancelled), server error, client timeout or transport error. A cancel the
server does not confirm counts in no outcome. The soak passes when

* ``lost = sent - sum(outcomes)`` is 0, and server errors, client timeouts and transport
  errors are 0;
* every outcome agrees with the server's own record of that request id (its
  ``request_finished`` / ``request_rejected`` log events);
* the server's counters over the soak agree: ``tts_request_total{status="ok"}`` = completed,
  ``{status="cancelled"}`` = cancelled, ``{status="error"}`` = 0,
  ``tts_rejected_total{reason="invalid"}`` = refused invalid, ``{reason="busy"}`` = refused busy;
* at the end the server is idle: ``tts_engine_active_sequences`` and ``tts_request_queue_size``
  are 0.

The exit status is 0 on a pass, 1 otherwise.

    .venv/bin/python scripts/soak.py --artifacts artifacts/small --minutes 30 --concurrency 8
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from chattts_serving.bench.outcomes import FAILURES, Outcome, classify_error, count_outcomes
from chattts_serving.bench.serverload import busy_gauges, scrape, wait_idle
from chattts_serving.bench.stats import diff_samples
from chattts_serving.client import SynthesisRequest, iter_chunks, synthesize_stream
from chattts_serving.contract import MANIFEST, MODEL_STREAM
from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.serving.profile import load_profile

TEXTS = ["你好，欢迎使用流式语音合成服务。", "今天天气很好，我们去公园散步吧。", "请稍等，正在为您查询订单。",
         "ChatTTS 在 Triton 上流式输出。", "语音合成需要低延迟和高吞吐。"]

SERVER_STATUS: dict[str, set[str]] = {
    str(Outcome.COMPLETED): {"ok"}, str(Outcome.CANCELLED): {"cancelled"},
    str(Outcome.REFUSED_INVALID): {"rejected:invalid", "invalid"}, str(Outcome.REFUSED_BUSY): {"rejected:busy"},
}
"""For each client outcome, the server records that agree with it (the ``status`` of
``request_finished``, or ``rejected:<reason>`` of ``request_rejected``)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_records(log_path: Path) -> dict[str, str]:
    """{request id: the server's last word on it} from the structured lines of the server log:
    ``request_finished`` gives its status, ``request_rejected`` ``rejected:<reason>``."""
    out: dict[str, str] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("model") != MODEL_STREAM or not ev.get("request_id"):
            continue
        if ev.get("event") == "request_finished":
            out[ev["request_id"]] = str(ev.get("status"))
        elif ev.get("event") == "request_rejected":
            out[ev["request_id"]] = f"rejected:{ev.get('reason')}"
    return out


def reconcile(client: dict[str, str], cancels: set[str], server: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Final outcome per request id, and the disagreements with the server.

    ``client``: the outcome the client saw for each request id (a cancel the client made is
    recorded as ``cancel_requested`` and its id is in ``cancels``); ``server``: the server's
    records (:func:`server_records`). A client cancel is CANCELLED when the server logged it
    cancelled, COMPLETED when the server had already finished it (the cancel came too late), and
    left without an outcome (lost) when the server has no such record."""
    final: dict[str, str] = {}
    mismatches: list[str] = []
    for rid, outcome in client.items():
        said = server.get(rid)
        if rid in cancels:
            if said == "cancelled":
                final[rid] = str(Outcome.CANCELLED)
            elif said == "ok":
                final[rid] = str(Outcome.COMPLETED)
            else:
                mismatches.append(f"{rid}: cancelled by the client, server says {said}")
            continue
        final[rid] = outcome
        agree = SERVER_STATUS.get(outcome)
        if agree is not None and said not in agree:
            mismatches.append(f"{rid}: client saw {outcome}, server says {said}")
    return final, mismatches


def counter_deltas(before: dict[Any, float], after: dict[Any, float]) -> dict[str, float]:
    """``tts_request_total`` by status and ``tts_rejected_total`` by reason of the entry model
    over the soak: {"status:ok": n, ..., "rejected:busy": n, ...}."""
    out: dict[str, float] = collections.Counter()
    for (name, labels), v in diff_samples(before, after).items():
        lab = dict(labels)
        if lab.get("model") != MODEL_STREAM:
            continue
        if name == "tts_request_total":
            out[f"status:{lab.get('status')}"] += v
        elif name == "tts_rejected_total":
            out[f"rejected:{lab.get('reason')}"] += v
    return {k: round(v) for k, v in out.items()}


def counters_agree(outcomes: dict[str, int], counters: dict[str, float]) -> list[str]:
    """Disagreements between the client's outcome counts and the server's counters."""
    expected = {"status:ok": outcomes[str(Outcome.COMPLETED)], "status:cancelled": outcomes[str(Outcome.CANCELLED)],
                "status:error": 0, "rejected:invalid": outcomes[str(Outcome.REFUSED_INVALID)],
                "rejected:busy": outcomes[str(Outcome.REFUSED_BUSY)]}
    return [f"{k}: server counted {counters.get(k, 0)}, clients saw {v}" for k, v in expected.items()
            if counters.get(k, 0) != v]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/small"))
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--cancel-fraction", type=float, default=0.05, help="streams the client abandons mid-way")
    ap.add_argument("--bad-fraction", type=float, default=0.05, help="requests with invalid input")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="client timeout of one stream (s)")
    ap.add_argument("--out", type=Path, default=Path("results/soak.json"))
    args = ap.parse_args()
    if not (args.artifacts / MANIFEST).is_file():
        print(f"soak: no exported artifacts in {args.artifacts} (no {MANIFEST}): run "
              "`make export-small` (or pass --artifacts)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="chattts-soak-"))
    render_repository(load_profile("cpu"), args.artifacts, work / "repo")
    ports = _port(), _port(), _port()
    client_outcomes: dict[str, str] = {}
    cancels: set[str] = set()
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + args.minutes * 60
    url = f"127.0.0.1:{ports[1]}"
    metrics_url = f"http://127.0.0.1:{ports[2]}/metrics"
    log_path = work / "tritonserver.log"

    def client(k: int) -> None:
        rng = random.Random(k)
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            kind = rng.choices(["ok", "bad", "cancel"],
                               [1 - args.bad_fraction - args.cancel_fraction, args.bad_fraction,
                                args.cancel_fraction])[0]
            rid = f"soak-{k}-{i}"
            text = "" if kind == "bad" else TEXTS[(k + i) % len(TEXTS)]
            req = SynthesisRequest(text=text, seed=i, max_new_tokens=args.tokens, min_new_tokens=args.tokens // 2,
                                   request_id=rid)
            try:
                if kind == "cancel":
                    chunks = iter_chunks(url, req, timeout_s=args.timeout_s)
                    next(chunks, None)
                    chunks.close()
                    outcome = "cancel_requested"
                else:
                    synthesize_stream(url, req, timeout_s=args.timeout_s)
                    outcome = str(Outcome.COMPLETED)
            except Exception as exc:  # every failure is classified and counted; the client keeps going
                outcome = str(classify_error(exc))
                with lock:
                    errors[f"{outcome}: {type(exc).__name__}: {str(exc)[:60]}"] += 1
            with lock:
                client_outcomes[rid] = outcome
                if outcome == "cancel_requested":
                    cancels.add(rid)

    rss: list[tuple[float, float]] = []
    with TritonServer(work / "repo", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                      log_path=log_path, build_dir=work / "build") as srv:
        assert srv.proc is not None
        root = psutil.Process(srv.proc.pid)
        before = scrape(metrics_url)
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
        idle_after_s = wait_idle(metrics_url, timeout_s=60.0)
        gauges = busy_gauges(metrics_url)
        # refusals are counted once their burst has settled (at most ~0.1 s later: the entry
        # models' RefusalRecorder): scrape until two scrapes 0.3 s apart agree
        after = scrape(metrics_url)
        for _ in range(20):
            time.sleep(0.3)
            again = scrape(metrics_url)
            if not any(counter_deltas(after, again).values()):
                break
            after = again
        counters = counter_deltas(before, after)
    final, mismatches = reconcile(client_outcomes, cancels, server_records(log_path))
    outcomes = count_outcomes(collections.Counter(final.values()))
    sent = len(client_outcomes)
    lost = sent - sum(outcomes.values())
    failures = {str(o): outcomes[str(o)] for o in FAILURES}
    counter_problems = counters_agree(outcomes, counters)
    n = len(rss)
    head = [r for _, r in rss[n // 10: n // 10 + max(1, n // 10)]] or [rss[0][1]]
    tail = [r for _, r in rss[-max(1, n // 10):]]
    checks = {"lost_is_0": lost == 0, "no_failures": not any(failures.values()), "server_agrees": not mismatches,
              "counters_agree": not counter_problems, "idle_at_end": bool(gauges) and not any(gauges.values())}
    report = {
        "minutes": args.minutes, "concurrency": args.concurrency, "tokens": args.tokens,
        "artifacts": str(args.artifacts), "sent": sent, "outcomes": outcomes, "lost": lost,
        "client_cancels": len(cancels),
        "cancels_after_completion": sum(1 for rid in cancels if final.get(rid) == str(Outcome.COMPLETED)),
        "errors_by_kind": dict(errors), "server_mismatches": mismatches[:20], "server_counters": counters,
        "counter_problems": counter_problems, "gauges_at_end": gauges, "idle_after_s": idle_after_s,
        "checks": checks, "passed": all(checks.values()),
        "rss_mb_start": sum(head) / len(head), "rss_mb_end": sum(tail) / len(tail),
        "rss_mb_over_time": rss,
    }
    report["rss_drift_pct"] = round(100 * (report["rss_mb_end"] / report["rss_mb_start"] - 1), 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print(json.dumps({k: v for k, v in report.items() if k != "rss_mb_over_time"}, indent=2, ensure_ascii=False))
    if not report["passed"]:
        print(f"soak: FAILED: {', '.join(k for k, ok in checks.items() if not ok)}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
