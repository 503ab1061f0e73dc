"""The benchmark's three PNG plots: throughput and time to first audio against concurrency, and
the latency CDF per level, each beside upstream ChatTTS's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .figures import ran_profiles
from .stats import cdf

PLOTS = {"throughput": "throughput_vs_concurrency.png", "latency_cdf": "latency_cdf.png",
         "ttfa": "ttfa_vs_concurrency.png"}


def plot(result: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the three PNGs of :data:`PLOTS` into ``out_dir`` (matplotlib, Agg); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profs = ran_profiles(result)
    base = result["baseline"]
    paths = []

    def save(fig: Any, key: str) -> None:
        paths.append(out_dir / PLOTS[key])
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, prof in profs:
        levels = prof.get("levels", [])
        ax.plot([lv["concurrency"] for lv in levels], [lv["audio_s_per_s"] or 0.0 for lv in levels], "o-",
                label=f"this server, {name}")
    for part, label, style in ((base.get("offline"), "ChatTTS, one at a time", "--"),
                               (base.get("batched"), "ChatTTS, 16 texts batched", ":")):
        if part and part.get("audio_s_per_s") is not None:
            ax.axhline(part["audio_s_per_s"], color="gray", ls=style, label=label)
    ax.set_xlabel("concurrent streams (closed loop)")
    ax.set_ylabel("audio seconds per wall second")
    ax.set_title("Throughput vs concurrency (default path)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, "throughput")

    fig, ax = plt.subplots(figsize=(6, 4))
    if profs:
        for lv in profs[0][1].get("levels", []):
            x, y = cdf(r["total_s"] for r in lv["records"] if r["error"] is None)
            if x.size:
                ax.step(x, y, where="post", label=f"c={lv['concurrency']}")
    x, y = cdf(r["total_s"] for r in base["offline"]["records"] if r["error"] is None)
    if x.size:
        ax.step(x, y, where="post", color="gray", ls="--", label="ChatTTS, one at a time")
    ax.set_xlabel("request latency, s (send to end of stream)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Latency CDF per concurrency level ({profs[0][0] if profs else '-'})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    save(fig, "latency_cdf")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, prof in profs:
        levels = prof.get("levels", [])
        cs = [lv["concurrency"] for lv in levels]
        ax.plot(cs, [lv["ttfa_p50_s"] or float("nan") for lv in levels], "o-", label=f"TTFA p50, {name}")
        ax.plot(cs, [lv["ttfa_p95_s"] or float("nan") for lv in levels], "s--", label=f"TTFA p95, {name}")
    for part, label, style in ((base.get("stream"), "ChatTTS stream, default", "--"),
                               (base.get("stream_smallest"), "ChatTTS stream, smallest practical", ":")):
        if part and part.get("first_chunk_p50_s") is not None:
            ax.axhline(part["first_chunk_p50_s"], color="gray", ls=style, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams (closed loop)")
    ax.set_ylabel("time to first audio, s")
    ax.set_title("Time to first audio vs concurrency (default path)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    save(fig, "ttfa")
    return paths
