#!/usr/bin/env python3
"""Draw the Grafana dashboard's main panels as one PNG, from a running Prometheus.

    .venv/bin/python scripts/dashboard_png.py --prometheus http://127.0.0.1:9090 --minutes 10 --out docs/dashboard.png

The queries are not repeated here: each panel's PromQL, legend and unit are read from the
dashboard JSON that Grafana provisions (docker/grafana/dashboards/chattts.json) and answered by
Prometheus' ``/api/v1/query_range``. Grafana's ``$__rate_interval`` is replaced the way Grafana
computes it: max(step + scrape interval, 4 x scrape interval). Panels are matched by title;
those missing from the dashboard are reported and skipped. Exit status 1 when Prometheus
cannot be reached or answers with an error.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "chattts.json"

# The panels drawn, in reading order (titles as in the dashboard JSON).
PANELS = (
    "Time to first audio (p50, p95)",
    "Request duration (p50, p95, p99)",
    "Requests per second",
    "Audio produced (audio seconds per second)",
    "Real-time factor (wall s per audio s)",
    "Request queue size",
    "Engine batch size",
    "Active sequences",
    "KV cache usage",
    "Errors and rejections per second",
    "Error ratio",
    "Process memory (RSS)",
)
COLUMNS = 3
# Panels with more lines than this hide the ones that stay at zero (Triton's failure counters
# come as one series per model and reason): the picture is for reading, not hovering.
MAX_LINES = 6

# Grafana's dark theme and its classic palette, so the picture reads like the real thing.
BACKGROUND = "#111217"
PANEL_BACKGROUND = "#181b1f"
GRID = "#2c3235"
TEXT = "#d8d9da"
MUTED = "#8e8e8e"
PALETTE = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#b877d9", "#f2495c", "#8ab8ff", "#fade2a", "#96d98d")
THRESHOLD = "#f2495c"


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or answered with an error."""


@dataclass
class Series:
    """One line of a panel: legend, timestamps (s since the epoch) and values."""

    legend: str
    times: list[float]
    values: list[float]


@dataclass
class Panel:
    """A panel of the dashboard, with what Prometheus answered for each of its queries."""

    title: str
    unit: str
    threshold: float | None
    queries: list[tuple[str, str]]  # (PromQL, legend format)
    series: list[Series] = field(default_factory=list)


def query_range(base_url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """``/api/v1/query_range`` of ``expr``: the matrix' series (``metric``, ``values``)."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # Prometheus answers bad queries with 400 and a JSON error
        try:
            body = json.loads(exc.read())
        except ValueError:
            raise PrometheusError(f"{url}: HTTP {exc.code}") from None
    except OSError as exc:
        raise PrometheusError(f"cannot reach Prometheus at {base_url}: {exc}") from None
    if body.get("status") != "success":
        raise PrometheusError(f"query {expr!r} failed: {body.get('errorType')}: {body.get('error')}")
    return list(body["data"]["result"])


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: ``{{label}}`` replaced by the series' label value."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()
    return text or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"


def rate_interval(step_s: float, scrape_s: float) -> str:
    """Grafana's ``$__rate_interval`` for a query step and scrape interval, as a PromQL duration."""
    return f"{math.ceil(max(step_s + scrape_s, 4 * scrape_s))}s"


def load_panels(dashboard: Path, titles: tuple[str, ...] = PANELS) -> list[Panel]:
    """The panels named ``titles`` from the dashboard JSON, in that order, with their queries."""
    data = json.loads(dashboard.read_text(encoding="utf-8"))
    by_title = {p["title"]: p for p in data["panels"]}
    missing = [t for t in titles if t not in by_title]
    if missing:
        print(f"dashboard_png: not in {dashboard}, skipped: {missing}", file=sys.stderr)
    panels = []
    for title in titles:
        if title not in by_title:
            continue
        raw = by_title[title]
        defaults = raw.get("fieldConfig", {}).get("defaults", {})
        steps = defaults.get("thresholds", {}).get("steps", [])
        red = [s["value"] for s in steps if s.get("value") is not None]
        panels.append(Panel(title=title, unit=defaults.get("unit", ""), threshold=red[0] if red else None,
                            queries=[(t["expr"], t.get("legendFormat", "")) for t in raw["targets"]]))
    return panels


def fetch(panels: list[Panel], base_url: str, start: float, end: float, step: float, scrape_s: float) -> None:
    """Fill each panel's series from Prometheus (``$__rate_interval`` substituted)."""
    window = rate_interval(step, scrape_s)
    for panel in panels:
        for expr, template in panel.queries:
            for result in query_range(base_url, expr.replace("$__rate_interval", window), start, end, step):
                times = [float(t) for t, _ in result["values"]]
                values = [float(v) for _, v in result["values"]]  # "NaN" and "+Inf" parse as floats
                panel.series.append(Series(legend(template, result["metric"]), times, values))


def _scale(unit: str, values: list[float]) -> tuple[float, str]:
    """Divisor and axis label for a Grafana unit."""
    finite = [abs(v) for v in values if math.isfinite(v)]
    top = max(finite) if finite else 0.0
    if unit == "bytes":
        return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")
    if unit == "percentunit":
        return 0.01, "%"
    if unit == "s":
        return (1.0, "s") if top >= 1 or top == 0 else (1e-3, "ms")
    if unit == "µs":
        return (1e3, "ms") if top >= 1e3 else (1.0, "µs")
    return 1.0, {"reqps": "req/s", "short": "", "none": ""}.get(unit, unit)


def draw(panels: list[Panel], out: Path, title: str, subtitle: str, start: float, end: float) -> None:
    """Lay the panels out in a grid, Grafana-like, and write ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / COLUMNS)
    height = 3.3 * rows + 1.1
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6.4 * COLUMNS, height), squeeze=False, facecolor=BACKGROUND)
    fig.text(0.01, 1 - 0.15 / height, title, color=TEXT, fontsize=17, ha="left", va="top", weight="bold")
    fig.text(0.01, 1 - 0.5 / height, subtitle, color=MUTED, fontsize=10.5, ha="left", va="top")
    t0, t1 = datetime.fromtimestamp(start), datetime.fromtimestamp(end)
    for ax, panel in zip(axes.flat, panels):
        ax.set_facecolor(PANEL_BACKGROUND)
        for spine in ax.spines.values():
            spine.set_color(GRID)
        ax.tick_params(colors=MUTED, labelsize=8.5)
        ax.grid(True, color=GRID, linewidth=0.6)
        ax.set_xlim(t0, t1)
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=4, maxticks=8))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M" if end - start > 600 else "%H:%M:%S"))
        all_values = [v for s in panel.series for v in s.values]
        div, label = _scale(panel.unit, all_values)
        shown = sorted(panel.series, key=lambda s: s.legend)
        hidden = 0
        if len(shown) > MAX_LINES:
            nonzero = [s for s in shown if any(math.isfinite(v) and v != 0 for v in s.values)]
            hidden, shown = len(shown) - len(nonzero), nonzero
        top = 0.0
        for i, s in enumerate(shown):
            xs = [datetime.fromtimestamp(t) for t in s.times]
            ys = [v / div if math.isfinite(v) else math.nan for v in s.values]
            color = PALETTE[i % len(PALETTE)]
            ax.plot(xs, ys, color=color, linewidth=1.5, label=s.legend)
            ax.fill_between(xs, ys, color=color, alpha=0.08, linewidth=0)
            top = max([top, *(y for y in ys if math.isfinite(y))])
        heading = panel.title
        ymax = top * 1.35 if top > 0 else 1.0  # head room for the legend
        if panel.threshold is not None:
            limit = panel.threshold / div
            # Grafana draws the alert threshold as a dashed line; one far above the data would
            # flatten it, so such a limit is named in the heading instead.
            if limit <= 2.5 * max(top, 1e-12):
                ax.axhline(limit, color=THRESHOLD, linestyle="--", linewidth=1.0, alpha=0.8)
                ymax = max(ymax, limit * 1.15)
            else:
                heading += f"  [limit {limit:g}{' ' + label if label else ''}]"
        ax.set_title(heading, color=TEXT, fontsize=11, loc="left", pad=6)
        if label:
            ax.set_ylabel(label, color=MUTED, fontsize=9)
        ax.set_ylim(0, ymax)
        if hidden:
            ax.text(0.99, 0.97, f"{hidden} series at 0 not shown", transform=ax.transAxes, ha="right", va="top",
                    color=MUTED, fontsize=7.5)
        if shown:
            legend_box = ax.legend(loc="upper left", fontsize=8, frameon=True, ncol=min(3, len(shown)),
                                   facecolor=PANEL_BACKGROUND, edgecolor=GRID, labelcolor=TEXT)
            legend_box.get_frame().set_alpha(0.85)
        if not panel.series:
            ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center", va="center", color=MUTED, fontsize=12)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.subplots_adjust(left=0.045, right=0.99, bottom=0.035, top=1 - 1.25 / height, hspace=0.42, wspace=0.2)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, facecolor=BACKGROUND)
    plt.close(fig)


def render(prometheus: str, minutes: float, out: Path, *, dashboard: Path = DASHBOARD, scrape_s: float = 5.0,
           end: float | None = None, subtitle: str = "") -> list[Panel]:
    """Query the last ``minutes`` (up to ``end``, default now) and write the PNG; returns the panels."""
    end = time.time() if end is None else end
    start = end - minutes * 60
    step = max(1.0, round(minutes * 60 / 300))  # about 300 points per line
    panels = load_panels(dashboard)
    fetch(panels, prometheus, start, end, step, scrape_s)
    title = "ChatTTS serving"
    sub = (f"{datetime.fromtimestamp(start):%Y-%m-%d %H:%M} – {datetime.fromtimestamp(end):%H:%M}   ·   "
           f"queries from {dashboard.relative_to(ROOT) if dashboard.is_relative_to(ROOT) else dashboard}, "
           f"answered by Prometheus   ·   step {step:g} s, $__rate_interval {rate_interval(step, scrape_s)}")
    draw(panels, out, title, f"{sub}\n{subtitle}" if subtitle else sub, start, end)
    return panels


def _timestamp(text: str) -> float:
    """Unix seconds from ``1700000000`` or ``2026-11-29T15:35:00``."""
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    ap.add_argument("--minutes", type=float, default=10.0, help="time range ending now (default 10)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png", help="PNG to write")
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD, help="Grafana dashboard JSON with the queries")
    ap.add_argument("--scrape-interval", type=float, default=5.0,
                    help="scrape interval of the triton job in seconds, for $__rate_interval (default 5)")
    ap.add_argument("--end", type=_timestamp, default=None,
                    help="end of the range: Unix seconds or ISO 8601 local time (default now)")
    ap.add_argument("--subtitle", default="", help="second line under the title (e.g. what load ran)")
    args = ap.parse_args(argv)
    try:
        panels = render(args.prometheus, args.minutes, args.out, dashboard=args.dashboard,
                        scrape_s=args.scrape_interval, end=args.end, subtitle=args.subtitle)
    except PrometheusError as exc:
        print(f"dashboard_png: error: {exc}", file=sys.stderr)
        return 1
    empty = [p.title for p in panels if not p.series]
    print(f"wrote {args.out} ({len(panels)} panels" + (f"; no data: {empty}" if empty else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
