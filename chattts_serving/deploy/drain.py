"""Wait until a server has no request in flight: the drain before a stop.

``python -m chattts_serving.deploy.drain --metrics-url http://127.0.0.1:8002/metrics
--timeout-s 120`` reads the entry models' ``tts_active_requests`` gauges (accepted requests
not yet finished, :data:`chattts_serving.contract.ACTIVE_METRIC`) every ``--interval-s`` and
returns once their sum has been 0 on :data:`QUIET_POLLS` reads in a row, or when
``--timeout-s`` has passed. It prints one JSON line: ``drained`` (bool), ``active`` (the last
sum), ``waited_s``, ``reason``.

Why: on SIGTERM tritonserver unloads every model at once and the live streams end with
UNAVAILABLE (docs/operations.md, "Stopping it"). Kubernetes runs this as the server container's
``preStop`` hook: the pod is already being taken out of its Service's endpoints, so no new
requests arrive, and the streams in flight finish before the kubelet sends SIGTERM.

Exit codes: 0 drained (also when the metrics endpoint cannot be reached: nothing is left to
drain), 1 timed out with requests in flight, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

from .. import contract

QUIET_POLLS = 2
"""Reads of 0 in a row that count as drained: the gauge is set when a request is admitted, a
few milliseconds after Triton handed it over, so one read of 0 may fall in that gap."""


@dataclass(frozen=True)
class DrainResult:
    """What a drain found: ``drained``, ``active`` (requests in flight at the last read, -1
    when none could be read), ``waited_s`` and ``reason``."""

    drained: bool
    active: int
    waited_s: float
    reason: str


def active_requests(metrics_url: str, timeout_s: float = 5.0) -> int:
    """The sum of ``tts_active_requests`` over the entry models at ``metrics_url`` (Triton's
    Prometheus text, parsed by ``prometheus_client.parser`` as the bench's ``parse_prometheus``
    does; deploy may not import the bench). Raises OSError (urllib's URLError) when it cannot be
    read, ValueError when it is not a Prometheus text exposition."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as r:
        text = r.read().decode("utf-8", "replace")
    return int(sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == contract.ACTIVE_METRIC))


def drain(metrics_url: str, timeout_s: float, interval_s: float = 0.5) -> DrainResult:
    """Poll until no request is in flight on :data:`QUIET_POLLS` reads in a row, or until
    ``timeout_s`` seconds have passed."""
    start = time.monotonic()
    quiet, active = 0, -1
    while True:
        waited = round(time.monotonic() - start, 3)
        try:
            active = active_requests(metrics_url)
        except (OSError, ValueError) as exc:
            return DrainResult(True, -1, waited, f"metrics unreachable ({exc}): nothing to drain")
        quiet = quiet + 1 if active == 0 else 0
        if quiet >= QUIET_POLLS:
            return DrainResult(True, 0, waited, "no request in flight")
        if time.monotonic() - start >= timeout_s:
            return DrainResult(False, active, waited, f"{active} requests still in flight after {timeout_s:g} s")
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    ap = argparse.ArgumentParser(prog="python -m chattts_serving.deploy.drain",
                                 description="Wait until the server has no request in flight.")
    ap.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--interval-s", type=float, default=0.5)
    args = ap.parse_args(argv)
    if args.timeout_s < 0 or args.interval_s <= 0:
        ap.error("--timeout-s must be >= 0 and --interval-s > 0")
    result = drain(args.metrics_url, args.timeout_s, args.interval_s)
    print(json.dumps(asdict(result)), flush=True)
    return 0 if result.drained else 1


if __name__ == "__main__":
    sys.exit(main())
