"""``python -m chattts_serving.bench``: the side-by-side benchmark in one command.

In one process tree, with one artifact directory and the checkpoint it was exported from, one
list of sentences and one token budget per request, in this order (never overlapping, so each
part has the machine to itself):

0. the text front end alone (``FrontEnd.prepare`` per request, in process);
1. the raw ONNX Runtime GPT decode step at batch 1 and 16 (the hardware ceiling);
2. the baseline: upstream ChatTTS ``Chat.infer`` on torch, one request at a time (the
   synchronous "V1"), and its own stream mode's first-chunk time;
3. this system: the model repository rendered from a profile, the bundled tritonserver on free
   ports, and closed-loop gRPC streaming clients at each concurrency level.

Writes ``<out>/bench.json``, ``<out>/bench.md``, three PNG plots and the server log. Speeds are
measured, never asserted: the exit status is 0 unless a part could not run at all.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import contract
from . import load_sentences
from .cpuload import CpuWindow
from .report import frontend_figures, headline_ratios, markdown, plot

SMOKE_ARTIFACTS = Path("artifacts/small")
SMOKE: dict[str, Any] = {"levels": (1, 2), "requests": 2, "tokens": 16, "baseline_requests": 2,
                         "stream_requests": 1, "raw_repeats": 5, "frontend_repeats": 2}
"""``--smoke``: small artifacts, tiny load; exercises every part in well under a minute."""


@dataclass(frozen=True)
class Config:
    """Resolved settings of one benchmark run (paths, token budget in tokens, levels...)."""

    artifacts: Path
    weights: Path
    profile: str
    levels: tuple[int, ...]
    requests_per_level: int | None
    tokens: int
    baseline_requests: int
    stream_requests: int
    voice_seed: int
    raw_batches: tuple[int, ...]
    raw_past_tokens: int
    raw_repeats: int
    frontend_repeats: int
    out: Path
    smoke: bool
    skip_baseline: bool
    label: str = ""

    def requests_for(self, c: int) -> int:
        """Requests at concurrency ``c``: the fixed ``--requests-per-level``, else max(4, 2c)."""
        return self.requests_per_level if self.requests_per_level else max(4, 2 * c)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


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
        prog="python -m chattts_serving.bench",
        description="Benchmark this Triton server against upstream ChatTTS served one request at a time, "
                    "with the same weights, sentences and token budget; writes bench.json, bench.md and "
                    "plots.")
    p.add_argument("--artifacts", type=Path, default=None,
                   help="exported artifact directory (default artifacts/full; artifacts/small with --smoke)")
    p.add_argument("--weights", type=Path, default=None,
                   help="checkpoint the artifacts were exported from, for the baseline (default: from the "
                        "artifacts' manifest, e.g. build/weights/synthetic-full-seed0)")
    p.add_argument("--profile", default="cpu", help="deployment profile to render the repository with")
    p.add_argument("--levels", type=_ints, default=None, help="concurrency levels, e.g. 1,4,8,16 (default)")
    p.add_argument("--requests-per-level", type=_positive, default=None,
                   help="requests per level (default max(4, 2 x level))")
    p.add_argument("--tokens", type=_positive, default=None,
                   help="GPT tokens per request, min = max (default 100 = 2.1 s of audio)")
    p.add_argument("--baseline-requests", type=int, default=None,
                   help="sequential ChatTTS requests (default 4; 0 skips the offline baseline)")
    p.add_argument("--stream-requests", type=int, default=None,
                   help="ChatTTS stream-mode requests for the first-chunk time (default 2)")
    p.add_argument("--voice-seed", type=int, default=2, help="speaker seed used by both systems")
    p.add_argument("--raw-batches", type=_ints, default=(1, 16), help="batch sizes of the raw step (1,16)")
    p.add_argument("--raw-past", type=_positive, default=150, help="past positions of the raw step (150)")
    p.add_argument("--raw-repeats", type=_positive, default=None, help="timed raw steps per batch (20)")
    p.add_argument("--frontend-repeats", type=_positive, default=None,
                   help="timed passes over the sentences of the front-end measurement (20)")
    p.add_argument("--skip-baseline", action="store_true", help="do not run ChatTTS (no torch needed)")
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results)")
    p.add_argument("--label", default="", help="free text stored in the report, e.g. the server version measured")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run: small artifacts, levels 1,2, 2 requests, 16 tokens")
    return p


def resolve(args: argparse.Namespace) -> Config:
    """Fill defaults (smoke or full) and derive the weights directory from the manifest."""
    smoke = bool(args.smoke)
    artifacts = args.artifacts or (SMOKE_ARTIFACTS if smoke else Path("artifacts/full"))
    weights = args.weights or weights_from_manifest(artifacts)

    def pick(value: Any, smoke_value: Any, default: Any) -> Any:
        return value if value is not None else (smoke_value if smoke else default)

    return Config(
        artifacts=Path(artifacts), weights=Path(weights), profile=args.profile,
        levels=pick(args.levels, SMOKE["levels"], (1, 4, 8, 16)),
        requests_per_level=pick(args.requests_per_level, SMOKE["requests"], None),
        tokens=pick(args.tokens, SMOKE["tokens"], 100),
        baseline_requests=pick(args.baseline_requests, SMOKE["baseline_requests"], 4),
        stream_requests=pick(args.stream_requests, SMOKE["stream_requests"], 2),
        voice_seed=args.voice_seed, raw_batches=args.raw_batches, raw_past_tokens=args.raw_past,
        raw_repeats=pick(args.raw_repeats, SMOKE["raw_repeats"], 20),
        frontend_repeats=pick(args.frontend_repeats, SMOKE["frontend_repeats"], 20), out=args.out, smoke=smoke,
        skip_baseline=bool(args.skip_baseline), label=args.label)


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
    from ..export.build import export_artifacts
    from ..export.weights import generate_checkpoint

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
    """CPU model, cores, memory (GB), OS, Python and library versions, git commit."""
    import psutil

    cpu_model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                                    timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"cpu_model": cpu_model, "logical_cpus": os.cpu_count(),
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
            "stream": {"first_chunk_p50_s": None, "first_chunk_mean_s": None, "total_p50_s": None,
                       "stream_batch_tokens": None, "pass_first_n_batches": None, "records": []}}


def run(cfg: Config) -> dict[str, Any]:
    """Run every part and write the outputs; returns the result written to bench.json."""
    from ..deploy.render import render_repository
    from ..deploy.server import TritonServer
    from ..runtime import Artifacts
    from ..serving.profile import load_profile
    from .baseline import run_baseline
    from .frontend import measure_frontend
    from .rawstep import measure_raw_step
    from .serverload import run_levels

    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[bench {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    ensure_smoke_artifacts(cfg, progress)
    art = Artifacts.load(cfg.artifacts)
    profile = load_profile(cfg.profile)
    sentences = load_sentences()
    cfg.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "started_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": {
            "artifacts": str(cfg.artifacts), "weights": str(cfg.weights), "profile": cfg.profile,
            "sizes": art.manifest.get("sizes"), "gpt_layers": art.num_layers, "hidden_size": art.hidden_size,
            "tokens": cfg.tokens,
            "audio_s_per_request": contract.samples_for_tokens(cfg.tokens) / contract.SAMPLE_RATE_HZ,
            "levels": list(cfg.levels),
            "requests_per_level": {str(c): cfg.requests_for(c) for c in cfg.levels},
            "baseline_requests": cfg.baseline_requests, "stream_requests": cfg.stream_requests,
            "voice_seed": cfg.voice_seed, "sentences": len(sentences), "smoke": cfg.smoke, "label": cfg.label,
            "engine_max_batch_size": profile.engine.max_batch_size,
        },
        "machine": machine_info(),
    }

    progress(f"front end: FrontEnd.prepare in process, {cfg.frontend_repeats} passes")
    result["frontend"] = measure_frontend(cfg.artifacts, profile, sentences, cfg.frontend_repeats)

    progress(f"raw ORT step, batches {list(cfg.raw_batches)}, past {cfg.raw_past_tokens}")
    window = CpuWindow()
    result["raw_step"] = measure_raw_step(cfg.artifacts, profile.ort("engine"), cfg.raw_batches,
                                          past_tokens=cfg.raw_past_tokens, repeats=cfg.raw_repeats)
    result["raw_step"]["cpu"] = window.stop()

    if cfg.skip_baseline or (cfg.baseline_requests <= 0 and cfg.stream_requests <= 0):
        result["baseline"] = _empty_baseline(cfg.tokens)
    else:
        progress(f"baseline: ChatTTS from {cfg.weights}, {cfg.baseline_requests} requests + "
                 f"{cfg.stream_requests} stream-mode requests")
        window = CpuWindow()
        result["baseline"] = run_baseline(cfg.weights, cfg.artifacts, sentences, tokens=cfg.tokens,
                                          requests=max(0, cfg.baseline_requests),
                                          stream_requests=max(0, cfg.stream_requests),
                                          voice_seed=cfg.voice_seed, progress=progress)
        result["baseline"]["cpu"] = window.stop()

    with tempfile.TemporaryDirectory(prefix="chattts-bench-") as tmp:
        repo = Path(tmp) / "model_repository"
        render_repository(profile, cfg.artifacts, repo)
        ports = free_port(), free_port(), free_port()
        log_path = cfg.out / "bench_tritonserver.log"
        progress(f"server: starting tritonserver (HTTP {ports[0]}, gRPC {ports[1]}, metrics {ports[2]})")
        t = time.perf_counter()
        srv = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                           log_path=log_path, build_dir=Path(tmp) / "build")
        try:  # not `with`: an interrupt inside start() must stop the half-started server too
            srv.start()
            result["server_start_s"] = time.perf_counter() - t
            result["machine"]["tritonserver_version"] = _triton_version(ports[0])
            assert srv.proc is not None
            result["levels"] = run_levels(
                f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}/metrics", srv.proc.pid, sentences,
                levels=cfg.levels, requests_for=cfg.requests_for, tokens=cfg.tokens,
                voice=str(cfg.voice_seed), progress=progress)
        finally:
            srv.stop()
    result.update(headline_ratios(result["baseline"], result["levels"], result["raw_step"]))
    result.update(frontend_figures(result["frontend"], result["levels"]))
    result["elapsed_s"] = time.perf_counter() - started
    result = _clean(result)
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    (cfg.out / "bench.json").write_text(text, encoding="utf-8")
    (cfg.out / "bench.md").write_text(markdown(result), encoding="utf-8")
    plot(result, cfg.out)
    progress(f"wrote {cfg.out / 'bench.json'}, {cfg.out / 'bench.md'} and plots")
    return result


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
    if not cfg.smoke and not (cfg.artifacts / contract.MANIFEST).is_file():
        print(f"bench: error: no artifacts in {cfg.artifacts} (run `python -m chattts_serving.export "
              "--synthetic --size full` first)", file=sys.stderr)
        return 2
    if not cfg.skip_baseline and cfg.baseline_requests + cfg.stream_requests > 0 and not cfg.smoke \
            and not cfg.weights.is_dir():
        print(f"bench: error: no checkpoint in {cfg.weights} for the baseline (pass --weights or "
              "--skip-baseline)", file=sys.stderr)
        return 2
    from ..deploy.server import ServerError
    from .serverload import WarmupError

    try:
        result = run(cfg)
    except (ServerError, WarmupError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    from .report import FRONTEND_FIGURES, TARGETS

    for name in (*TARGETS, *FRONTEND_FIGURES):
        print(f"{name}: {result.get(name)}")
    if any(lv["ok"] == 0 for lv in result["levels"]):
        print("bench: error: a concurrency level had no successful request", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
