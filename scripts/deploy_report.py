"""Merge the deploy tests' result files into ``results/deploy.json`` and check what issue 40 asks.

``make deploy-test`` runs it after ``tests/deploy``: each module (or backend) writes
``results/deploy/<name>.json`` (``image``, ``compose``, ``k8s``, ``replicas-<backend>``); this
script puts them under ``modules`` by name, adds one row per replica case (requests sent,
completed, failed with an explicit error, lost, time to re-route) under ``cases``, prints that
table in Markdown, and exits 1 when a case lost a request, a drain or rolling case failed one,
a fleet had fewer than 2 replicas, or no replica results exist at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ZERO_FAILED = ("drain_one_replica", "rolling_restart")
"""Cases in which no request may fail at all (no replica dies)."""
COLUMNS = ("sent", "completed", "failed_explicit", "lost", "time_to_reroute_s")


def rows(modules: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per replica case of every ``replicas-*`` module: backend, case and :data:`COLUMNS`."""
    out = []
    for name, data in sorted(modules.items()):
        if not name.startswith("replicas-"):
            continue
        for case, figures in data.get("cases", {}).items():
            if "sent" in figures:
                out.append({"backend": data.get("backend", name), "case": case,
                            **{c: figures.get(c) for c in COLUMNS}})
    return out


def problems(modules: dict[str, Any], table: list[dict[str, Any]]) -> list[str]:
    """What keeps the merged results from passing (empty: they pass)."""
    found = []
    fleets = {n: d for n, d in modules.items() if n.startswith("replicas-")}
    if not fleets:
        found.append("no replica results (results/deploy/replicas-*.json)")
    found += [f"{n}: {d.get('replicas')} replicas, not 2 or more" for n, d in fleets.items()
              if int(d.get("replicas") or 0) < 2]
    found += [f"{r['backend']} {r['case']}: {r['lost']} lost" for r in table if r["lost"]]
    found += [f"{r['backend']} {r['case']}: {r['failed_explicit']} failed" for r in table
              if r["case"] in ZERO_FAILED and r["failed_explicit"]]
    return found


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("backend", "case", *COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in head) + " |" for r in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("results/deploy"), help="the per-module files")
    ap.add_argument("--out", type=Path, default=Path("results/deploy.json"))
    ap.add_argument("--duration-s", type=float, default=None, help="how long make deploy-test ran")
    args = ap.parse_args(argv)
    modules: dict[str, Any] = {}
    for path in sorted(args.dir.glob("*.json")):
        try:
            modules[path.stem] = json.loads(path.read_text())
        except ValueError as exc:
            modules[path.stem] = {"error": f"unreadable: {exc}"}
    table = rows(modules)
    found = problems(modules, table)
    merged = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "duration_s": args.duration_s,
              "passed": not found, "problems": found, "cases": table, "modules": modules}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(markdown(table))
    for p in found:
        print(f"deploy report: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
