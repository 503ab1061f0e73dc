"""The settings of one benchmark run: the full and smoke sizes, the command line, and
:class:`Config`, what both resolve to (the artifacts, the checkpoint the baseline loads, the
profiles, levels and token budget)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chattts_serving import contract

SMOKE_ARTIFACTS = Path("artifacts/small")
SMOKE: dict[str, Any] = {"levels": (1, 2, 16), "tokens": 16, "baseline_requests": 2, "stream_requests": 1,
                         "batched_repeats": 1, "baseline_batch": 4, "raw_repeats": 5, "pipeline_repeats": 3,
                         "frontend_repeats": 2, "open_loop_requests": 6, "burst_clients": 16, "burst_rounds": 2,
                         "hold_tokens": 2048}
"""``--smoke``: small artifacts, tiny load; exercises every part in a minute or two."""
FULL: dict[str, Any] = {"levels": (1, 2, 3, 4, 6, 8, 16), "tokens": 100, "baseline_requests": 4,
                        "stream_requests": 2, "batched_repeats": 2, "baseline_batch": 16, "raw_repeats": 20,
                        "pipeline_repeats": 3, "frontend_repeats": 20, "open_loop_requests": 60, "burst_clients": 200,
                        "burst_rounds": 5, "hold_tokens": 2048}
"""The full run's sizes: about 15 minutes on 2 cores for two profiles (docs/performance.md)."""
DEFAULT_PROFILES = ("cpu", "cpu-fp32", "cpu-int8")
"""Profiles benchmarked by default, those of them that exist (the first is the default profile).
``cpu`` runs int8 or fp32 (precision ``auto``): one of the other two that runs the same is
skipped (:func:`~bench.profiles.same_as`): ``cpu-int8`` where int8 was measured accurate enough, as ``make
bench`` makes sure, so both precisions are measured once each (``cpu-fp32`` also doubles its
chunks, so it never runs the same as ``cpu``)."""
PIPELINE_BATCH = 16
"""Sequences of the minimal pipeline: the concurrency its tokens/s is compared with."""
GATEWAY_LEVELS = (1, 16)
"""Concurrency levels of the gateway phase (its figures are at 1 and 16; in smoke runs too,
with one request per stream at each level)."""


@dataclass(frozen=True)
class Config:
    """Resolved settings of one benchmark run (paths, token budget in tokens, levels...)."""

    artifacts: Path
    weights: Path
    profiles: tuple[str, ...]
    levels: tuple[int, ...]
    requests_per_level: int | None
    tokens: int
    baseline_requests: int
    stream_requests: int
    batched_repeats: int
    baseline_batch: int
    voice_seed: int
    raw_batches: tuple[int, ...]
    raw_past_tokens: int
    raw_repeats: int
    pipeline_repeats: int
    frontend_repeats: int
    open_loop_requests: int
    burst_clients: int
    burst_rounds: int
    hold_tokens: int
    out: Path
    smoke: bool
    skip_baseline: bool
    as_deployed: bool = True
    label: str = ""
    gateway_levels: tuple[int, ...] = GATEWAY_LEVELS
    """Levels of the gateway-overhead phase; () skips it."""

    def requests_for(self, c: int) -> int:
        """Requests at concurrency ``c``: the fixed ``--requests-per-level``, else three waves
        of ``c`` (at least 6) in a full run and one (at least 2) in a smoke run."""
        if self.requests_per_level:
            return self.requests_per_level
        return max(2, c) if self.smoke else max(6, 3 * c)


def positive_ints(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated integers >= 1 ("1,4,16"), at least one."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def profile_names(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated names ("cpu,cpu-fp32"), at least one."""
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated profile names, got {text!r}")
    return names


def positive_int(text: str) -> int:
    """argparse type: one integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark this Triton server against upstream ChatTTS (one request at a time, batched, "
                    "streamed) with the same weights, sentences and token budget, for one or more profiles; "
                    "writes bench.json, bench.md and plots.")
    p.add_argument("--artifacts", type=Path, default=None,
                   help="exported artifact directory (default artifacts/full; artifacts/small with --smoke)")
    p.add_argument("--weights", type=Path, default=None,
                   help="checkpoint the artifacts were exported from, for the baseline (default: from the "
                        "artifacts' manifest, e.g. build/weights/synthetic-full-seed0)")
    p.add_argument("--profiles", type=profile_names, default=None,
                   help="deployment profiles to benchmark, the default one first (default: those of "
                        f"{','.join(DEFAULT_PROFILES)} that exist)")
    p.add_argument("--levels", type=positive_ints, default=None,
                   help=f"closed-loop concurrency levels (default {','.join(map(str, FULL['levels']))})")
    p.add_argument("--requests-per-level", type=positive_int, default=None,
                   help="requests per level (default max(6, 3 x level))")
    p.add_argument("--tokens", type=positive_int, default=None,
                   help="GPT tokens per request, min = max (default 100 = 2.1 s of audio)")
    p.add_argument("--baseline-requests", type=int, default=None,
                   help="sequential ChatTTS requests (default 4; 0 skips the offline baseline)")
    p.add_argument("--stream-requests", type=int, default=None,
                   help="ChatTTS stream-mode requests per stream setting (default 2)")
    p.add_argument("--batched-repeats", type=int, default=None,
                   help="timed Chat.infer calls over a list of 16 texts (default 2; 0 skips)")
    p.add_argument("--voice-seed", type=int, default=2, help="speaker seed used by both systems")
    p.add_argument("--raw-batches", type=positive_ints, default=(1, 4, 16), help="batch sizes of the raw step (1,4,16)")
    p.add_argument("--raw-past", type=positive_int, default=300, help="past positions of the raw step (300)")
    p.add_argument("--raw-repeats", type=positive_int, default=None, help="timed raw steps per batch and round (20)")
    p.add_argument("--pipeline-repeats", type=positive_int, default=None,
                   help="timed runs of the minimal pipeline (3; the median counts)")
    p.add_argument("--frontend-repeats", type=positive_int, default=None,
                   help="timed passes over the sentences of the front-end measurement (20)")
    p.add_argument("--open-loop-requests", type=int, default=None, help="open-loop arrivals (60; 0 skips)")
    p.add_argument("--burst-clients", type=int, default=None, help="clients of the overload burst (200; 0 skips)")
    p.add_argument("--burst-rounds", type=positive_int, default=None, help="bursts per server state, pooled (5)")
    p.add_argument("--hold-tokens", type=positive_int, default=None,
                   help="token budget of the streams that hold every slot in the saturated burst (2048)")
    p.add_argument("--no-as-deployed", action="store_true",
                   help="skip the row of the profile as shipped, degraded mode live")
    p.add_argument("--skip-baseline", action="store_true", help="do not run ChatTTS (no torch needed)")
    p.add_argument("--skip-gateway", action="store_true", help="do not measure the OpenAI gateway's overhead")
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results)")
    p.add_argument("--label", default="", help="free text stored in the report, e.g. the server version measured")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run: small artifacts, levels 1,2,16, one wave per level, 16 tokens")
    return p


def existing_profiles(names: tuple[str, ...] = DEFAULT_PROFILES) -> tuple[str, ...]:
    """The names among ``names`` that have a profile file."""
    from chattts_serving.serving.profile import PROFILES_DIR

    return tuple(n for n in names if (PROFILES_DIR / f"{n}.toml").is_file())


def resolve(args: argparse.Namespace) -> Config:
    """Fill defaults (smoke or full) and derive the weights directory from the manifest."""
    smoke = bool(args.smoke)
    artifacts = args.artifacts or (SMOKE_ARTIFACTS if smoke else Path("artifacts/full"))
    weights = args.weights or weights_from_manifest(artifacts)
    sizes = SMOKE if smoke else FULL

    def pick(value: Any, key: str) -> Any:
        return value if value is not None else sizes[key]

    return Config(
        artifacts=Path(artifacts), weights=Path(weights), profiles=args.profiles or existing_profiles(),
        levels=pick(args.levels, "levels"), requests_per_level=args.requests_per_level,
        tokens=pick(args.tokens, "tokens"), baseline_requests=pick(args.baseline_requests, "baseline_requests"),
        stream_requests=pick(args.stream_requests, "stream_requests"),
        batched_repeats=pick(args.batched_repeats, "batched_repeats"), baseline_batch=sizes["baseline_batch"],
        voice_seed=args.voice_seed, raw_batches=args.raw_batches, raw_past_tokens=args.raw_past,
        raw_repeats=pick(args.raw_repeats, "raw_repeats"), pipeline_repeats=pick(args.pipeline_repeats,
                                                                                 "pipeline_repeats"),
        frontend_repeats=pick(args.frontend_repeats, "frontend_repeats"),
        open_loop_requests=pick(args.open_loop_requests, "open_loop_requests"),
        burst_clients=pick(args.burst_clients, "burst_clients"), burst_rounds=pick(args.burst_rounds, "burst_rounds"),
        hold_tokens=pick(args.hold_tokens, "hold_tokens"),
        out=args.out, smoke=smoke, skip_baseline=bool(args.skip_baseline), as_deployed=not args.no_as_deployed,
        label=args.label, gateway_levels=() if args.skip_gateway else GATEWAY_LEVELS)


def weights_from_manifest(artifacts: Path) -> Path:
    """The checkpoint directory an artifact directory was exported from, per its manifest's
    ``source`` (synthetic: ``build/weights/synthetic-<size>-seed<seed>``; assets/huggingface:
    the recorded path). Falls back to ``build/weights/synthetic-<dirname>-seed0``."""
    try:
        source = json.loads((Path(artifacts) / contract.MANIFEST).read_text()).get("source", {})
    except (OSError, ValueError):
        source = {}
    if source.get("kind") == "synthetic":
        return Path("build/weights") / f"synthetic-{source.get('size')}-seed{source.get('seed', 0)}"
    if source.get("path"):
        return Path(source["path"])
    return Path("build/weights") / f"synthetic-{Path(artifacts).name}-seed0"


def ensure_smoke_artifacts(cfg: Config, progress: Any) -> None:
    """With ``--smoke`` and the default small artifacts missing, export them (seconds)."""
    if (cfg.artifacts / contract.MANIFEST).is_file() and cfg.weights.is_dir():
        return
    if not cfg.smoke or cfg.artifacts != SMOKE_ARTIFACTS:
        return
    from chattts_serving.export.build import export_artifacts
    from chattts_serving.export.weights import generate_checkpoint

    progress("smoke: exporting small synthetic artifacts")
    if not cfg.weights.is_dir():
        generate_checkpoint(cfg.weights, "small", 0)
    export_artifacts(cfg.weights, cfg.artifacts, source={"kind": "synthetic", "size": "small", "seed": 0})
