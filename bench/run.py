"""``python -m bench``: the side-by-side benchmark in one command.

In one process tree, with one artifact directory and the checkpoint it was exported from, one
list of sentences and one token budget per request, in this order (never overlapping, so each
part has the machine to itself):

0. the text front end alone (``FrontEnd.prepare`` per request, in process);
1. the baselines: upstream ChatTTS on torch, served as a user would serve it: ``Chat.infer``
   one request at a time, over a list of 16 texts at once, and in its own stream mode at its
   default and smaller ``stream_batch`` settings (:mod:`~bench.baseline`);
2. for each profile (``--profiles``; the first is the default, whose figures are also the
   top-level ones), the ceilings in process: the raw ONNX Runtime GPT decode step and the
   minimal pipeline (engine + chunking + batched vocoder, :mod:`~bench.minimal`),
   each repeated and reduced to its median; then this system: the model repository rendered
   from a benchmark copy of the profile whose degraded mode is out of reach (the default path:
   ``degradation = "off for default-path levels"``), the bundled tritonserver on free ports, and
   the server phases of :data:`SERVER_PHASES` in order (closed-loop levels, open-loop
   arrivals, the overload burst);
3. for the default profile, one row "under load, as deployed": the profile as shipped (its
   degraded mode live) at the top concurrency level.
4. for the default profile, the OpenAI gateway in front of the same server against direct
   gRPC (:mod:`~bench.gatewayload`), then text replayed at LLM speed over its
   WebSocket at concurrency 1 and 8 (:mod:`~bench.wsload`).
5. for the default profile, on the same server, the time to first audio of each segmentation
   mode and of a reference recording (:mod:`~bench.modes`), and the two
   streaming doors, ``chattts`` (BLS) and ``chattts_ensemble``, taking turns at c=1 and c=16
   (:mod:`~bench.doors`).

Every request records the server's ``info`` (generated tokens, degraded mode, vocoder); a
figure whose measurement ran a degraded request, or ran while other processes loaded the
machine, is null and ``null_reasons`` says why. Writes ``<out>/bench.json``, ``<out>/bench.md``,
three PNG plots and the server logs. Speeds are measured, never asserted: the exit status is 0
unless a part could not run at all.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from chattts_serving import contract

from . import load_sentences
from .cpuload import CpuWindow
from .doors import DOOR_FIGURES, door_figures
from .gatewayload import FIRST_BYTE_FIGURES, GATEWAY_FIGURES, first_byte_figures, gateway_figures, gateway_process
from .modes import MODE_KEYS, mode_figures
from .report import DEGRADATION_NOTE, definitions, frontend_figures, markdown, plot, profile_figures
from .wsload import WS_FIGURES, ws_figures

SMOKE_ARTIFACTS = Path("artifacts/small")
SMOKE: dict[str, Any] = {"levels": (1, 2, 16), "tokens": 16, "baseline_requests": 2, "stream_requests": 1,
                         "batched_repeats": 1, "baseline_batch": 4, "raw_repeats": 5, "pipeline_repeats": 3,
                         "frontend_repeats": 2, "open_loop_requests": 6, "burst_clients": 16, "burst_rounds": 2,
                         "hold_tokens": 2048}
"""``--smoke``: small artifacts, tiny load; exercises every part in a minute or two."""

SMOKE_HOLD_WAIT_S = 10.0
"""How long a smoke run's saturated burst waits for its holds to take every slot (a full run
waits up to ``run_burst``'s default)."""

FULL: dict[str, Any] = {"levels": (1, 2, 3, 4, 6, 8, 16), "tokens": 100, "baseline_requests": 4,
                        "stream_requests": 2, "batched_repeats": 2, "baseline_batch": 16, "raw_repeats": 20,
                        "pipeline_repeats": 3, "frontend_repeats": 20, "open_loop_requests": 60, "burst_clients": 200,
                        "burst_rounds": 5, "hold_tokens": 2048}
"""The full run's sizes: about 15 minutes on 2 cores for two profiles (docs/performance.md)."""
DEFAULT_PROFILES = ("cpu", "cpu-fp32", "cpu-int8")
"""Profiles benchmarked by default, those of them that exist (the first is the default profile).
``cpu`` runs int8 or fp32 (precision ``auto``): one of the other two that runs the same is
skipped (:func:`same_as`): ``cpu-int8`` where int8 was measured accurate enough, as ``make
bench`` makes sure, so both precisions are measured once each (``cpu-fp32`` also doubles its
chunks, so it never runs the same as ``cpu``)."""
PIPELINE_BATCH = 16
"""Sequences of the minimal pipeline: the concurrency its tokens/s is compared with."""
BURST_TOKENS = 16
"""Token budget of each burst request."""
UNREACHABLE_STREAMS = 10**9
UNREACHABLE_TTFA_S = 1e9
"""Degradation thresholds of the default-path servers: never reached."""
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


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated profile names, got {text!r}")
    return names


def _positive(text: str) -> int:
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
    p.add_argument("--profiles", type=_names, default=None,
                   help="deployment profiles to benchmark, the default one first (default: those of "
                        f"{','.join(DEFAULT_PROFILES)} that exist)")
    p.add_argument("--levels", type=_ints, default=None,
                   help=f"closed-loop concurrency levels (default {','.join(map(str, FULL['levels']))})")
    p.add_argument("--requests-per-level", type=_positive, default=None,
                   help="requests per level (default max(6, 3 x level))")
    p.add_argument("--tokens", type=_positive, default=None,
                   help="GPT tokens per request, min = max (default 100 = 2.1 s of audio)")
    p.add_argument("--baseline-requests", type=int, default=None,
                   help="sequential ChatTTS requests (default 4; 0 skips the offline baseline)")
    p.add_argument("--stream-requests", type=int, default=None,
                   help="ChatTTS stream-mode requests per stream setting (default 2)")
    p.add_argument("--batched-repeats", type=int, default=None,
                   help="timed Chat.infer calls over a list of 16 texts (default 2; 0 skips)")
    p.add_argument("--voice-seed", type=int, default=2, help="speaker seed used by both systems")
    p.add_argument("--raw-batches", type=_ints, default=(1, 4, 16), help="batch sizes of the raw step (1,4,16)")
    p.add_argument("--raw-past", type=_positive, default=300, help="past positions of the raw step (300)")
    p.add_argument("--raw-repeats", type=_positive, default=None, help="timed raw steps per batch and round (20)")
    p.add_argument("--pipeline-repeats", type=_positive, default=None,
                   help="timed runs of the minimal pipeline (3; the median counts)")
    p.add_argument("--frontend-repeats", type=_positive, default=None,
                   help="timed passes over the sentences of the front-end measurement (20)")
    p.add_argument("--open-loop-requests", type=int, default=None, help="open-loop arrivals (60; 0 skips)")
    p.add_argument("--burst-clients", type=int, default=None, help="clients of the overload burst (200; 0 skips)")
    p.add_argument("--burst-rounds", type=_positive, default=None, help="bursts per server state, pooled (5)")
    p.add_argument("--hold-tokens", type=_positive, default=None,
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU model and the instruction-set flags that decide the int8 kernels
    (:func:`~chattts_serving.engine.kernels.cpu_features`), cores, memory (GB), OS, Python and
    library versions, git commit."""
    import psutil

    from chattts_serving.engine.kernels import cpu_features

    cpu = cpu_features()
    cpu_model = cpu["cpu_model"] or platform.processor() or "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                                    timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"cpu_model": cpu_model, "cpu_flags": cpu["cpu_flags"], "logical_cpus": os.cpu_count(),
            "physical_cpus": psutil.cpu_count(logical=False), "affinity_cpus": len(os.sched_getaffinity(0)),
            "memory_gb": psutil.virtual_memory().total / 1e9, "platform": platform.platform(),
            "python": platform.python_version(), "onnxruntime": _version("onnxruntime"),
            "torch": _version("torch"), "chattts": _version("chattts"),
            "tritonclient": _version("tritonclient"), "nvidia_pytriton": _version("nvidia-pytriton"),
            "git_commit": commit, "git_dirty": dirty, "load_avg_1m_at_start": os.getloadavg()[0]}


def _clean(v: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None, tuples lists, paths strings."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v


def _empty_baseline(tokens: int) -> dict[str, Any]:
    from .stats import summarize

    return {"skipped": True, "tokens": tokens, "offline": {**summarize([], 0.0), "records": []},
            "batched": None, "stream": None, "stream_settings": [], "stream_smallest": None}


def default_path_profile(profile: Any) -> Any:
    """``profile`` with its degraded mode out of reach (thresholds never met): the server then
    runs every request on the default path (the profile's vocoder, chunks and refine-text)."""
    degrade = profile.degrade.model_copy(update={
        "live_high": UNREACHABLE_STREAMS, "live_low": UNREACHABLE_STREAMS - 1,
        "queued_high": UNREACHABLE_STREAMS, "queued_low": UNREACHABLE_STREAMS - 1,
        "ttfa_p95_high_s": UNREACHABLE_TTFA_S, "ttfa_p95_low_s": UNREACHABLE_TTFA_S})
    return profile.model_copy(update={"degrade": degrade})


def resolved_key(artifacts_dir: Path, profile: Any) -> str:
    """What ``profile`` runs on ``artifacts_dir``: its settings without its name, the engine's
    and the vocoders' precisions and the KV cache's resolved (``auto`` decided), as a
    comparable string."""
    from chattts_serving import contract
    from chattts_serving.runtime import Artifacts, resolve_kv_precision, resolve_precision

    art = Artifacts.load(artifacts_dir)
    data = profile.model_dump(mode="json")
    data.pop("name")
    data["engine"]["precision"] = str(resolve_precision(art, profile.engine.precision))
    data["engine"]["kv_cache"] = str(resolve_kv_precision(art, profile.engine.kv_cache, profile.engine.precision))
    data["vocoder"]["precision"] = {g: str(resolve_precision(art, profile.vocoder.precision, g))
                                    for g in (contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH)}
    return json.dumps(data, sort_keys=True)


def same_as(artifacts_dir: Path, name: str, earlier: dict[str, str]) -> str | None:
    """The earlier profile (``earlier``: name -> :func:`resolved_key`) that runs exactly what
    profile ``name`` runs on ``artifacts_dir``, or None."""
    from chattts_serving.serving.profile import load_profile

    key = resolved_key(artifacts_dir, load_profile(name))
    return next((other for other, k in earlier.items() if k == key), None)


def missing_graphs(artifacts_dir: Path, profile: Any) -> str | None:
    """Why ``profile`` cannot run on ``artifacts_dir`` (a graph of its precision was not
    exported), or None."""
    from chattts_serving.runtime import Artifacts, graph_path

    art = Artifacts.load(artifacts_dir)
    wanted = [(contract.GPT_GRAPH, profile.engine.precision),
              (contract.VOCODER_HIDDEN_GRAPH, profile.vocoder.precision),
              (contract.VOCODER_CODES_GRAPH, profile.vocoder.precision)]
    for graph, precision in wanted:
        try:
            graph_path(art, graph, str(precision))
        except (FileNotFoundError, ValueError) as exc:
            return str(exc)
    return None


@dataclass
class PhaseContext:
    """What a server phase gets: the run's :class:`Config`, the running server
    (:class:`~bench.serverload.ServerSession`), the profile's result so far
    (``prof``: earlier phases' keys, e.g. ``levels``) and whether this is the default profile."""

    cfg: Config
    session: Any
    prof: dict[str, Any]
    is_default: bool


@dataclass(frozen=True)
class ServerPhase:
    """One part of the benchmark run against a running default-path server: ``run(ctx)``
    returns what is stored under ``key`` in the profile's result (and, for the default profile,
    at the top level of bench.json); ``default_only``: run for the default profile only.
    Figures derived from it belong in :func:`~bench.report.profile_figures`,
    its Markdown in :data:`~bench.report.SECTIONS`."""

    key: str
    run: Callable[[PhaseContext], Any]
    default_only: bool = False


def _levels_phase(ctx: PhaseContext) -> Any:
    from .serverload import run_levels

    return run_levels(ctx.session, levels=ctx.cfg.levels, requests_for=ctx.cfg.requests_for, tokens=ctx.cfg.tokens)


def _open_loop_phase(ctx: PhaseContext) -> Any:
    from .openloop import measure_open_loop

    levels = [lv for lv in ctx.prof.get("levels", []) if lv.get("tokens_per_s")]
    capacity = max(levels, key=lambda lv: lv["concurrency"])["tokens_per_s"] if levels else None
    return measure_open_loop(ctx.session, requests=ctx.cfg.open_loop_requests, tokens=ctx.cfg.tokens,
                             capacity_tokens_per_s=capacity)


def _burst_phase(ctx: PhaseContext) -> Any:
    import asyncio

    from .burst import CLIENT_NICE, run_burst
    from .serverload import wait_idle

    s, cfg = ctx.session, ctx.cfg
    if cfg.burst_clients <= 0:
        return {"skipped": "--burst-clients 0"}
    out: dict[str, Any] = {}
    entry = s.profile.entry
    hold, offline_hold = entry.max_concurrent_streams, entry.offline_threads
    # Saturated: every stream slot and every chattts_offline slot held; bursts to chattts, then to
    # chattts_offline, then through the gateway (unless --skip-gateway); the client receives only
    # refusals and runs at CLIENT_NICE where allowed (see run_burst).
    doors = ("stream", "offline") + (("gateway",) if cfg.gateway_levels else ())
    saturated = {"hold": hold, "hold_tokens": cfg.hold_tokens, "client_nice": CLIENT_NICE,
                 "offline_hold": offline_hold, "doors": doors}
    if cfg.smoke:  # the small model's holds end too soon to be all held at once: do not wait long
        saturated["hold_wait_s"] = SMOKE_HOLD_WAIT_S
    for name, kwargs in (("burst", {}), ("saturated", saturated)):
        s.progress(f"server burst ({name}): {cfg.burst_rounds} x {cfg.burst_clients} clients, "
                   f"{BURST_TOKENS} tokens each"
                   + (f", after {hold} streams of {cfg.hold_tokens} tokens and {offline_hold} offline requests hold "
                      f"every slot; to {', '.join(doors)}" if kwargs else ""))
        with contextlib.ExitStack() as stack:
            if "gateway" in kwargs.get("doors", ()):
                gw_url, _ = stack.enter_context(gateway_process(s.grpc_url, free_port(),
                                                                cfg.out / "bench_burst_gateway.log"))
                kwargs = {**kwargs, "gateway_url": gw_url}
            window = s.monitor.begin()
            summary = asyncio.run(run_burst(s.grpc_url, cfg.burst_clients, BURST_TOKENS, timeout_s=s.timeout_s,
                                            metrics_url=s.metrics_url, rounds=cfg.burst_rounds, **kwargs))
            usage = s.monitor.end(window)
        out[name] = {**summary, "other_cpu_percent": usage["other_cpu_percent"], "cpu_percent": usage["cpu_percent"]}
        s.progress(f"server burst ({name}): {summary['outcomes']}, busy p99 {summary['busy_p99_s']} s"
                   + "".join(f"; {d}: {summary[d]['outcomes']}, busy p99 {summary[d]['busy_p99_s']} s"
                             for d in kwargs.get("doors", ())[1:]))
        out[name]["idle_after_s"] = wait_idle(s.metrics_url)
    return out


def _gateway_phase(ctx: PhaseContext) -> Any:
    from .gatewayload import run_gateway_overhead

    s, cfg = ctx.session, ctx.cfg
    if not cfg.gateway_levels:
        return {"skipped": "--skip-gateway", "levels": []}
    s.progress(f"gateway: /v1/audio/speech against direct gRPC, levels {list(cfg.gateway_levels)}")
    return run_gateway_overhead(s.grpc_url, s.sentences, levels=cfg.gateway_levels,
                                requests_for=(lambda c: c) if cfg.smoke else cfg.requests_for, tokens=cfg.tokens,
                                voice=str(cfg.voice_seed), port=free_port(), log_path=cfg.out / "bench_gateway.log",
                                progress=s.progress)


def _ws_phase(ctx: PhaseContext) -> Any:
    from .wsload import WS_LEVELS, run_ws_phase

    s, cfg = ctx.session, ctx.cfg
    if not cfg.gateway_levels:
        return {"skipped": "--skip-gateway", "levels": []}
    s.progress(f"websocket: text at LLM speed through /v1/audio/speech/stream, levels {list(WS_LEVELS)}")
    return run_ws_phase(s.grpc_url, s.sentences, tokens=cfg.tokens, voice=str(cfg.voice_seed), port=free_port(),
                        log_path=cfg.out / "bench_ws.log", sentences_per_text=2 if cfg.smoke else 3,
                        progress=s.progress)


def _doors_phase(ctx: PhaseContext) -> Any:
    from .doors import LEVELS, run_doors

    s, cfg = ctx.session, ctx.cfg
    s.progress(f"doors: chattts (BLS) and chattts_ensemble taking turns, levels {list(LEVELS)}")
    from .report import OUTSIDE_LOAD_WARN_PERCENT

    return run_doors(s, tokens=cfg.tokens, requests_for=cfg.requests_for, pipeline=ctx.prof.get("pipeline"),
                     outside_load_percent=OUTSIDE_LOAD_WARN_PERCENT)


def _modes_phase(ctx: PhaseContext) -> Any:
    from .modes import measure_modes

    s = ctx.session
    return measure_modes(s.grpc_url, s.sentences, tokens=ctx.cfg.tokens, requests=1 if ctx.cfg.smoke else 4,
                         voice=s.voice, timeout_s=s.timeout_s, progress=s.progress)


SERVER_PHASES: list[ServerPhase] = [
    ServerPhase("levels", _levels_phase),
    ServerPhase("open_loop", _open_loop_phase),
    ServerPhase("doors", _doors_phase, default_only=True),
    ServerPhase("gateway", _gateway_phase, default_only=True),
    ServerPhase("ws", _ws_phase, default_only=True),
    ServerPhase("modes", _modes_phase, default_only=True),
    ServerPhase("burst", _burst_phase, default_only=True),
]
"""The server phases, in order, on one default-path server per profile. ``levels`` comes first
(the open loop aims at its capacity); the burst last (it saturates the server, then waits until
it is idle again). A new phase appends itself here and writes only its own key."""


@contextlib.contextmanager
def serving(profile: Any, cfg: Config, log_name: str, sentences: list[str],
            progress: Callable[[str], None]) -> Iterator[Any]:
    """Render ``profile`` over the artifacts, start the bundled tritonserver on free ports
    (its log at ``<out>/<log_name>``), yield a warmed-up
    :class:`~bench.serverload.ServerSession` (its ``started_s`` and
    ``triton_version`` set), and stop the server at the end."""
    from chattts_serving.deploy.render import render_repository
    from chattts_serving.deploy.server import TritonServer

    from .serverload import ServerSession, TreeMonitor, warm_up

    with tempfile.TemporaryDirectory(prefix="chattts-bench-") as tmp:
        repo = Path(tmp) / "model_repository"
        render_repository(profile, cfg.artifacts, repo)
        ports = free_port(), free_port(), free_port()
        progress(f"server: starting tritonserver for {profile.name} (HTTP {ports[0]}, gRPC {ports[1]}, "
                 f"metrics {ports[2]})")
        t = time.perf_counter()
        srv = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                           log_path=cfg.out / log_name, build_dir=Path(tmp) / "build")
        try:  # not `with`: an interrupt inside start() must stop the half-started server too
            srv.start()
            started_s = time.perf_counter() - t
            assert srv.proc is not None
            monitor = TreeMonitor(srv.proc.pid).start()
            try:
                session = ServerSession(f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}/metrics", monitor,
                                        sentences, str(cfg.voice_seed), profile, progress=progress)
                session.started_s = started_s
                session.triton_version = _triton_version(ports[0])
                warm_up(session, max(cfg.levels), cfg.tokens)
                yield session
            finally:
                monitor.stop()
        finally:
            srv.stop()
            _scan_server_log(cfg.out / log_name, progress)


SERVER_CRASH_SIGNS: list[str] = []
"""Crash signs (:mod:`chattts_serving.deploy.logscan`) found in the logs of this run's servers:
any fails the benchmark, whatever its figures."""


def _scan_server_log(log: Path, progress: Callable[[str], None]) -> None:
    from chattts_serving.deploy.logscan import fatal_lines

    signs = fatal_lines(log.read_text(errors="replace")) if log.is_file() else []
    for line in signs:
        progress(f"server log {log.name} shows a crash: {line}")
    SERVER_CRASH_SIGNS.extend(f"{log.name}: {line}" for line in signs)


def run_profile(cfg: Config, name: str, is_default: bool, sentences: list[str], prompts: list[Any],
                progress: Callable[[str], None], bandwidth_gbps: float | None = None) -> dict[str, Any]:
    """Every per-profile part for profile ``name`` (module docstring, steps 2 and 3); returns
    its result (``skipped`` with the reason when its graphs are missing). ``bandwidth_gbps``:
    the host's streaming bandwidth measured in this run, for the step's floor (none: no floor)."""
    from chattts_serving.engine.gpt import GptStepRunner
    from chattts_serving.runtime import Artifacts, resolve_precision
    from chattts_serving.serving.profile import load_profile

    from .floor import step_floor
    from .minimal import measure_pipeline
    from .rawstep import measure_raw_step
    from .serverload import run_level

    profile = load_profile(name)
    precision = str(profile.engine.precision)
    if missing_graphs(cfg.artifacts, profile) is None:
        precision = str(resolve_precision(Artifacts.load(cfg.artifacts), profile.engine.precision))
    prof: dict[str, Any] = {"profile": name, "default": is_default, "precision": precision,
                            "precision_setting": str(profile.engine.precision),
                            "vocoder": str(profile.stream.default_vocoder), "degradation": DEGRADATION_NOTE}
    missing = missing_graphs(cfg.artifacts, profile)
    if missing:
        progress(f"{name}: skipped: {missing}")
        return {**prof, "skipped": missing}

    progress(f"{name}: raw ORT step, batches {list(cfg.raw_batches)}, past {cfg.raw_past_tokens}, 3 rounds")
    window = CpuWindow()
    prof["raw_step"] = measure_raw_step(cfg.artifacts, profile.ort("engine"), cfg.raw_batches,
                                        past_tokens=cfg.raw_past_tokens, repeats=cfg.raw_repeats)
    prof["raw_step"]["cpu"] = window.stop()
    if bandwidth_gbps:
        art = Artifacts.load(cfg.artifacts)
        runner = GptStepRunner(art, profile.ort("engine"))
        prof["floor"] = step_floor(art, runner.graph, runner.kv_dtype(0).itemsize, list(cfg.raw_batches),
                                   cfg.raw_past_tokens, bandwidth_gbps)
        del runner

    progress(f"{name}: minimal pipeline, batch {len(prompts)}, {cfg.tokens} tokens, {cfg.pipeline_repeats} runs")
    prof["pipeline"] = measure_pipeline(cfg.artifacts, profile, prompts, tokens=cfg.tokens,
                                        repeats=cfg.pipeline_repeats)

    with serving(default_path_profile(profile), cfg, f"bench_tritonserver_{name}.log", sentences,
                 progress) as session:
        prof["server_start_s"] = session.started_s
        prof["tritonserver_version"] = session.triton_version
        for phase in SERVER_PHASES:
            if phase.default_only and not is_default:
                continue
            prof[phase.key] = phase.run(PhaseContext(cfg, session, prof, is_default))

    if is_default and cfg.as_deployed:
        top = max(cfg.levels)
        with serving(profile, cfg, f"bench_tritonserver_{name}_as_deployed.log", sentences, progress) as session:
            progress(f"{name}: under load, as deployed (degraded mode live), c={top}")
            prof["as_deployed"] = run_level(session, top, cfg.requests_for(top), cfg.tokens)
    return prof


def run(cfg: Config) -> dict[str, Any]:
    """Run every part and write the outputs; returns the result written to bench.json."""
    from chattts_serving.runtime import Artifacts
    from chattts_serving.serving.profile import load_profile

    from .baseline import run_baseline
    from .frontend_cost import measure_frontend
    from .minimal import pipeline_prompts
    from .serverload import level_jobs

    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[bench {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    ensure_smoke_artifacts(cfg, progress)
    art = Artifacts.load(cfg.artifacts)
    default = load_profile(cfg.profiles[0])
    sentences = load_sentences()
    cfg.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "started_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": {
            "artifacts": str(cfg.artifacts), "weights": str(cfg.weights), "profile": cfg.profiles[0],
            "profiles": list(cfg.profiles),
            "sizes": art.manifest.get("sizes"), "gpt_layers": art.num_layers, "hidden_size": art.hidden_size,
            "tokens": cfg.tokens,
            "audio_s_per_request": contract.samples_for_tokens(cfg.tokens) / contract.SAMPLE_RATE_HZ,
            "levels": list(cfg.levels),
            "requests_per_level": {str(c): cfg.requests_for(c) for c in cfg.levels},
            "baseline_requests": cfg.baseline_requests, "stream_requests": cfg.stream_requests,
            "baseline_batch": cfg.baseline_batch, "batched_repeats": cfg.batched_repeats,
            "pipeline_batch": PIPELINE_BATCH, "pipeline_repeats": cfg.pipeline_repeats,
            "open_loop_requests": cfg.open_loop_requests, "burst_clients": cfg.burst_clients,
            "burst_rounds": cfg.burst_rounds,
            "burst_tokens": BURST_TOKENS, "hold_tokens": cfg.hold_tokens, "as_deployed": cfg.as_deployed,
            "voice_seed": cfg.voice_seed, "sentences": len(sentences), "smoke": cfg.smoke, "label": cfg.label,
            "engine_max_batch_size": default.engine.max_batch_size,
        },
        "machine": machine_info(),
        "degradation": DEGRADATION_NOTE,
    }

    progress(f"front end: FrontEnd.prepare in process, {cfg.frontend_repeats} passes")
    result["frontend"] = measure_frontend(cfg.artifacts, default, sentences, cfg.frontend_repeats)

    if cfg.skip_baseline or (cfg.baseline_requests <= 0 and cfg.stream_requests <= 0 and cfg.batched_repeats <= 0):
        result["baseline"] = _empty_baseline(cfg.tokens)
    else:
        progress(f"baseline: ChatTTS from {cfg.weights}: {cfg.baseline_requests} requests one at a time, "
                 f"{cfg.batched_repeats} x {cfg.baseline_batch} texts batched, {cfg.stream_requests} stream-mode "
                 "requests per setting")
        window = CpuWindow()
        result["baseline"] = run_baseline(cfg.weights, cfg.artifacts, sentences, tokens=cfg.tokens,
                                          requests=max(0, cfg.baseline_requests),
                                          stream_requests=max(0, cfg.stream_requests), voice_seed=cfg.voice_seed,
                                          batch=cfg.baseline_batch, batched_repeats=max(0, cfg.batched_repeats),
                                          progress=progress)
        result["baseline"]["cpu"] = window.stop()

    texts = [j.text for j in level_jobs(sentences, PIPELINE_BATCH, PIPELINE_BATCH, cfg.tokens)]
    prompts = pipeline_prompts(cfg.artifacts, default, texts, str(cfg.voice_seed))
    from .floor import GEMV_SHAPE_FULL, GEMV_SHAPE_SMOKE, stream_bandwidth

    progress("streaming bandwidth: one large GEMV through ONNX Runtime")
    window = CpuWindow()
    result["floor"] = stream_bandwidth(default.ort("engine"), GEMV_SHAPE_SMOKE if cfg.smoke else GEMV_SHAPE_FULL,
                                       repeats=5 if cfg.smoke else 15)
    result["floor"]["cpu"] = window.stop()
    result["profiles"] = {}
    ran: dict[str, str] = {}
    for i, name in enumerate(cfg.profiles):
        twin = same_as(cfg.artifacts, name, ran) if i else None
        if twin is not None:
            progress(f"{name}: skipped: it runs what {twin} ran")
            result["profiles"][name] = {"profile": name, "default": False, "skipped": f"the same as {twin}"}
            continue
        ran[name] = resolved_key(cfg.artifacts, load_profile(name))
        prof = run_profile(cfg, name, i == 0, sentences, prompts, progress, result["floor"]["bandwidth_gbps"])
        if "skipped" not in prof:
            figures, nulls = profile_figures(prof, result["baseline"])
            prof.update(figures)
            prof["null_reasons"] = nulls
        result["profiles"][name] = prof
    top = result["profiles"][cfg.profiles[0]]
    if "skipped" in top:
        raise ProfileSkipped(f"the default profile {cfg.profiles[0]} cannot run: {top['skipped']}")
    result["machine"]["tritonserver_version"] = top.get("tritonserver_version")
    for key in ("raw_step", "pipeline", "server_start_s", *(ph.key for ph in SERVER_PHASES), "as_deployed",
                "null_reasons"):
        if key in top:
            result[key] = top[key]
    result.update({k: v for k, v in top.items() if k in definitions()})
    result.update(frontend_figures(result["frontend"], result["levels"]))
    result.update(door_figures(result.get("doors")))
    result.update(gateway_figures(result.get("gateway")))
    result.update(first_byte_figures(result.get("gateway")))
    result.update(ws_figures(result.get("ws")))
    result.update(mode_figures(result.get("modes")))
    result["definitions"] = definitions()
    result["elapsed_s"] = time.perf_counter() - started
    result = _clean(result)
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    (cfg.out / "bench.json").write_text(text, encoding="utf-8")
    (cfg.out / "bench.md").write_text(markdown(result), encoding="utf-8")
    plot(result, cfg.out)
    progress(f"wrote {cfg.out / 'bench.json'}, {cfg.out / 'bench.md'} and plots")
    return result


class ProfileSkipped(RuntimeError):
    """The default profile could not run (its graphs were not exported)."""


def _triton_version(http_port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2", timeout=5) as r:
            return str(json.loads(r.read()).get("version"))
    except (OSError, ValueError):
        return None


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (and SIGINT, which a background job inherits as ignored) unwind through the
    # server's context manager, so a stopped benchmark never leaves a tritonserver behind.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    cfg = resolve(args)
    if not cfg.profiles:
        print(f"bench: error: none of the profiles {', '.join(DEFAULT_PROFILES)} exists (pass --profiles)",
              file=sys.stderr)
        return 2
    if not cfg.smoke and not (cfg.artifacts / contract.MANIFEST).is_file():
        print(f"bench: error: no artifacts in {cfg.artifacts} (run `python -m chattts_serving.export "
              "--synthetic --size full` first)", file=sys.stderr)
        return 2
    if not cfg.skip_baseline and cfg.baseline_requests + cfg.stream_requests + cfg.batched_repeats > 0 \
            and not cfg.smoke and not cfg.weights.is_dir():
        print(f"bench: error: no checkpoint in {cfg.weights} for the baseline (pass --weights or "
              "--skip-baseline)", file=sys.stderr)
        return 2
    from chattts_serving.deploy.server import ServerError
    from chattts_serving.serving.profile import ProfileError

    from .serverload import WarmupError

    try:
        result = run(cfg)
    except (ServerError, WarmupError, ProfileError, ProfileSkipped) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    from .report import FRONTEND_FIGURES

    for name in (*definitions(), *FRONTEND_FIGURES, *DOOR_FIGURES, *GATEWAY_FIGURES, *FIRST_BYTE_FIGURES,
                 *WS_FIGURES, *MODE_KEYS.values()):
        print(f"{name}: {result.get(name)}")
    for name, reason in result.get("null_reasons", {}).items():
        print(f"{name} is null: {reason}")
    if any(lv["ok"] == 0 for prof in result["profiles"].values() for lv in prof.get("levels", [])):
        print("bench: error: a concurrency level had no successful request", file=sys.stderr)
        return 1
    if SERVER_CRASH_SIGNS:
        print("bench: error: a server log shows a crash:\n  " + "\n  ".join(SERVER_CRASH_SIGNS[:20]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
