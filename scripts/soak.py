"""Soak test (a benchmark, not a test): N minutes of mixed traffic, then an account that fails on
any sign of a crash, a lost request or a leak.

Starts the bundled tritonserver on the given artifacts (full size by default, as it serves; the
admission gate on) and runs, for ``--minutes``:

* ``--users`` closed-loop gRPC streams (texts and seeds cycling; ``--cancel-fraction`` abandoned
  mid-way by the client, ``--bad-fraction`` with invalid input);
* ``--wave-users`` streams in waves: each wave starts together and generates the same number
  of tokens, so its streams end within milliseconds of each other and the next wave is
  accepted while the last responses of the previous one are being finalised (the traffic of
  issue 28's corruption);
* open-loop arrivals (``--arrivals-per-s``, Poisson, short streams): requests arrive whatever
  the server is doing;
* bursts (every ``--burst-every-s``, ``--burst-size`` short streams at once) against a stream
  limit lowered to ``--max-streams``, so that some are refused "busy" at once;
* ``chattts_offline`` requests over HTTP, one at a time.

Every request has its own id and ends in exactly one outcome
(:class:`bench.outcomes.Outcome`). The soak passes when

* ``lost = sent - sum(outcomes)`` is 0, and server errors, client timeouts and transport
  errors are 0;
* every outcome agrees with the server's own record of that request id (its
  ``request_finished`` / ``request_rejected`` log events), and the server's counters agree;
* at the end the server is idle (no live sequence, no active request);
* the server log shows no crash, heap corruption or sanitizer report
  (:mod:`chattts_serving.deploy.logscan`: any ``Signal (N)`` but the stop's 2 or 15,
  ``malloc(``, ``double free``, ``corrupted``, ``Fatal Python error``, ``Segmentation fault``);
* the RSS of the server and its model processes grew by at most ``--max-rss-growth-pct``
  (5 %) from its level after the warm-up (:func:`rss_drift_pct`) to the last tenth of the run;
  not under ``--sanitize``, where it is reported only: AddressSanitizer keeps freed memory in
  its quarantine (``quarantine_size_mb``, 256 MB per process by default, and the preloaded
  runtime is in every stub too), so RSS there grows by design, not by a leak.

``--sanitize`` runs the admission gate built with AddressSanitizer and UndefinedBehaviorSanitizer,
their runtime loaded into tritonserver (``make soak SANITIZE=1``). The report goes to
``results/soak.json``; the exit status is 0 on a pass, 1 otherwise.

    .venv/bin/python scripts/soak.py --artifacts artifacts/full --minutes 30
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import tomllib

from chattts_serving.client import SynthesisRequest, iter_chunks, synthesize_stream
from chattts_serving.client.http_infer import synthesize_offline
from chattts_serving.contract import MANIFEST, MODEL_OFFLINE, MODEL_STREAM
from chattts_serving.deploy.logscan import fatal_lines
from chattts_serving.deploy.render import render_repository
from chattts_serving.deploy.server import TritonServer
from chattts_serving.serving.profile import PROFILES_DIR, Profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench.outcomes import FAILURES, Outcome, classify_error, count_outcomes
from bench.serverload import busy_gauges, scrape, wait_idle
from bench.stats import diff_samples

TEXTS = ["你好，欢迎使用流式语音合成服务。", "今天天气很好，我们去公园散步吧。", "请稍等，正在为您查询订单。",
         "ChatTTS 在 Triton 上流式输出。", "语音合成需要低延迟和高吞吐。"]

SERVER_STATUS: dict[str, set[str]] = {
    str(Outcome.COMPLETED): {"ok"}, str(Outcome.CANCELLED): {"cancelled"},
    str(Outcome.REFUSED_INVALID): {"rejected:invalid", "invalid"}, str(Outcome.REFUSED_BUSY): {"rejected:busy"},
}
"""For each client outcome, the server records that agree with it (the ``status`` of
``request_finished``, or ``rejected:<reason>`` of ``request_rejected``)."""

MODELS = (MODEL_STREAM, MODEL_OFFLINE)


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
        if ev.get("model") not in MODELS or not ev.get("request_id"):
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
    """``tts_request_total`` by status and ``tts_rejected_total`` by reason of the entry models
    over the soak: {"status:ok": n, ..., "rejected:busy": n, ...}."""
    out: dict[str, float] = collections.defaultdict(float)
    for (name, labels), v in diff_samples(before, after).items():
        lab = dict(labels)
        if lab.get("model") not in MODELS:
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


WARM_UP_S = 120.0
"""RSS grows for the first minutes of traffic (allocator arenas, caches, the Python heaps of
the model processes filling) and then levels off: the baseline starts after this much."""


def rss_drift_pct(samples: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(RSS at the start, at the end, growth in %) from (seconds, MB) samples: the mean over a
    tenth of the run starting after a tenth of it and at least :data:`WARM_UP_S`, against the
    mean of the last tenth."""
    n = len(samples)
    span = max(1, n // 10)
    first = next((i for i, (s, _) in enumerate(samples) if s >= WARM_UP_S), n - span)
    first = min(max(n // 10, first), n - span)
    head = [r for _, r in samples[first:first + span]] or [samples[0][1]]
    tail = [r for _, r in samples[-span:]]
    start, end = sum(head) / len(head), sum(tail) / len(tail)
    return start, end, round(100 * (end / start - 1), 2)


class Traffic:
    """The clients of one soak: every request gets an id and exactly one recorded outcome."""

    def __init__(self, grpc_url: str, http_url: str, tokens: int, timeout_s: float, stop_at: float) -> None:
        self.grpc_url, self.http_url = grpc_url, http_url
        self.tokens, self.timeout_s, self.stop_at = tokens, timeout_s, stop_at
        self.outcomes: dict[str, str] = {}
        self.cancels: set[str] = set()
        self.errors: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.inflight = 0
        """Requests sent and not yet ended."""
        self._lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.stop_at

    def one(self, rid: str, kind: str, text: str, seed: int, tokens: int, exact: bool = False) -> None:
        """Send one request of ``kind`` (stream, cancel, bad, offline) and record its outcome."""
        req = SynthesisRequest(text="" if kind == "bad" else text, seed=seed, max_new_tokens=tokens,
                               min_new_tokens=tokens if exact else tokens // 2, request_id=rid)
        with self._lock:
            self.inflight += 1
        try:
            if kind == "cancel":
                chunks = iter_chunks(self.grpc_url, req, timeout_s=self.timeout_s)
                next(chunks, None)
                chunks.close()
                outcome = "cancel_requested"
            elif kind == "offline":
                synthesize_offline(self.http_url, req, timeout_s=self.timeout_s)
                outcome = str(Outcome.COMPLETED)
            else:
                synthesize_stream(self.grpc_url, req, timeout_s=self.timeout_s)
                outcome = str(Outcome.COMPLETED)
        except Exception as exc:  # every failure is classified and counted; the client keeps going
            outcome = str(classify_error(exc))
            with self._lock:
                self.errors[f"{kind} {outcome}: {type(exc).__name__}: {str(exc)[:60]}"] += 1
        with self._lock:
            self.inflight -= 1
            self.outcomes[rid] = outcome
            self.kinds[kind] += 1
            if outcome == "cancel_requested":
                self.cancels.add(rid)

    def closed_user(self, k: int, cancel_fraction: float, bad_fraction: float) -> None:
        rng = random.Random(k)
        i = 0
        while self.running():
            i += 1
            kind = rng.choices(["stream", "bad", "cancel"],
                               [1 - bad_fraction - cancel_fraction, bad_fraction, cancel_fraction])[0]
            self.one(f"soak-u{k}-{i}", kind, TEXTS[(k + i) % len(TEXTS)], i, self.tokens)

    def waves(self, users: int) -> None:
        """Waves of ``users`` streams of exactly ``tokens`` tokens each, started together."""
        wave = 0
        while self.running():
            wave += 1
            threads = [threading.Thread(target=self.one, args=(f"soak-w{wave}-{u}", "stream", TEXTS[u % len(TEXTS)],
                                                               wave, self.tokens, True), daemon=True)
                       for u in range(users)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def open_loop(self, per_s: float, seed: int = 7) -> None:
        """Poisson arrivals of short streams, each on its own thread."""
        rng = random.Random(seed)
        i = 0
        while self.running():
            time.sleep(rng.expovariate(per_s))
            i += 1
            threading.Thread(target=self.one, args=(f"soak-o{i}", "stream", TEXTS[i % len(TEXTS)], i, 16),
                             daemon=True).start()

    def bursts(self, every_s: float, size: int) -> None:
        """Every ``every_s`` seconds ``size`` short streams at once."""
        burst = 0
        while self.running():
            time.sleep(every_s)
            burst += 1
            for j in range(size):
                threading.Thread(target=self.one, args=(f"soak-b{burst}-{j}", "stream", TEXTS[j % len(TEXTS)], j, 8),
                                 daemon=True).start()

    def offline(self) -> None:
        i = 0
        while self.running():
            i += 1
            self.one(f"soak-f{i}", "offline", TEXTS[i % len(TEXTS)], i, self.tokens // 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/full"))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--users", type=int, default=4, help="closed-loop streaming users")
    ap.add_argument("--wave-users", type=int, default=8, help="streams per wave (0: no waves)")
    ap.add_argument("--arrivals-per-s", type=float, default=0.5, help="open-loop arrivals a second (0: none)")
    ap.add_argument("--burst-every-s", type=float, default=60.0, help="seconds between bursts (0: none)")
    ap.add_argument("--burst-size", type=int, default=24, help="short streams per burst")
    ap.add_argument("--offline", action=argparse.BooleanOptionalAction, default=True,
                    help="one chattts_offline request at a time")
    ap.add_argument("--max-streams", type=int, default=24,
                    help="the server's entry.max_concurrent_streams (low enough for bursts to be refused)")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--cancel-fraction", type=float, default=0.05, help="streams the client abandons mid-way")
    ap.add_argument("--bad-fraction", type=float, default=0.05, help="requests with invalid input")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="client timeout of one request (s)")
    ap.add_argument("--max-rss-growth-pct", type=float, default=5.0)
    ap.add_argument("--sanitize", action="store_true", help="AddressSanitizer/UBSan build of the admission gate")
    ap.add_argument("--out", type=Path, default=Path("results/soak.json"))
    args = ap.parse_args()
    if not (args.artifacts / MANIFEST).is_file():
        print(f"soak: no exported artifacts in {args.artifacts} (no {MANIFEST}): run "
              "`make export-full` (or pass --artifacts)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="chattts-soak-"))
    data = tomllib.loads((PROFILES_DIR / "cpu.toml").read_text())
    data["entry"]["max_concurrent_streams"] = args.max_streams
    render_repository(Profile.model_validate(data), args.artifacts, work / "repo")
    ports = _port(), _port(), _port()
    metrics_url = f"http://127.0.0.1:{ports[2]}/metrics"
    log_path = work / "tritonserver.log"
    traffic = Traffic(f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[0]}", args.tokens, args.timeout_s,
                      time.monotonic() + args.minutes * 60)
    rss: list[tuple[float, float]] = []
    with TritonServer(work / "repo", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                      log_path=log_path, build_dir=work / "build", sanitize=args.sanitize) as srv:
        assert srv.proc is not None
        root = psutil.Process(srv.proc.pid)
        before = scrape(metrics_url)
        loops: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (traffic.closed_user, (k, args.cancel_fraction, args.bad_fraction)) for k in range(args.users)]
        if args.wave_users:
            loops.append((traffic.waves, (args.wave_users,)))
        if args.arrivals_per_s:
            loops.append((traffic.open_loop, (args.arrivals_per_s,)))
        if args.burst_every_s:
            loops.append((traffic.bursts, (args.burst_every_s, args.burst_size)))
        if args.offline:
            loops.append((traffic.offline, ()))
        threads = [threading.Thread(target=fn, args=a, daemon=True) for fn, a in loops]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) or traffic.inflight:
            total = 0
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            rss.append((round(time.monotonic() - t0, 1), round(total / 2**20, 1)))
            if not any(t.is_alive() for t in threads) and time.monotonic() - t0 > args.minutes * 60 + args.timeout_s:
                break  # requests still open past every client timeout: counted as lost below
            time.sleep(5)
        idle_after_s = wait_idle(metrics_url, timeout_s=60.0)
        gauges = busy_gauges(metrics_url)
        # refusals are counted once their burst has settled (at most ~0.1 s later): scrape
        # until two scrapes 0.3 s apart agree
        after = scrape(metrics_url)
        for _ in range(20):
            time.sleep(0.3)
            again = scrape(metrics_url)
            if not any(counter_deltas(after, again).values()):
                break
            after = again
        counters = counter_deltas(before, after)
    final, mismatches = reconcile(traffic.outcomes, traffic.cancels, server_records(log_path))
    outcomes = count_outcomes(collections.Counter(final.values()))
    sent = len(traffic.outcomes)
    lost = sent - sum(outcomes.values())
    failures = {str(o): outcomes[str(o)] for o in FAILURES}
    counter_problems = counters_agree(outcomes, counters)
    signs = fatal_lines(log_path.read_text(errors="replace"))
    rss_start, rss_end, drift = rss_drift_pct(rss)
    checks = {"lost_is_0": lost == 0, "no_failures": not any(failures.values()), "server_agrees": not mismatches,
              "counters_agree": not counter_problems, "idle_at_end": bool(gauges) and not any(gauges.values()),
              "no_crash_in_log": not signs,
              "rss_growth_ok": args.sanitize or drift <= args.max_rss_growth_pct}  # see the docstring
    report = {
        "minutes": args.minutes, "artifacts": str(args.artifacts), "sanitize": args.sanitize,
        "traffic": {"users": args.users, "wave_users": args.wave_users, "arrivals_per_s": args.arrivals_per_s,
                    "burst_every_s": args.burst_every_s, "burst_size": args.burst_size, "offline": args.offline,
                    "max_streams": args.max_streams, "tokens": args.tokens},
        "sent": sent, "sent_by_kind": dict(traffic.kinds), "outcomes": outcomes, "lost": lost,
        "client_cancels": len(traffic.cancels),
        "cancels_after_completion": sum(1 for rid in traffic.cancels if final.get(rid) == str(Outcome.COMPLETED)),
        "errors_by_kind": dict(traffic.errors), "server_mismatches": mismatches[:20], "server_counters": counters,
        "counter_problems": counter_problems, "gauges_at_end": gauges, "idle_after_s": idle_after_s,
        "log": str(log_path), "crash_signs_in_log": signs[:20],
        "rss_mb_start": rss_start, "rss_mb_end": rss_end, "rss_drift_pct": drift,
        "checks": checks, "passed": all(checks.values()), "rss_mb_over_time": rss,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print(json.dumps({k: v for k, v in report.items() if k != "rss_mb_over_time"}, indent=2, ensure_ascii=False))
    if not report["passed"]:
        print(f"soak: FAILED: {', '.join(k for k, ok in checks.items() if not ok)}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
