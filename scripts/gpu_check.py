"""The ``gpu`` profile's checks on a CUDA host, in one prepared run (target: under 5 minutes).

NOT RUN YET: written on a CPU-only host; every step below is unverified on a GPU.

Prerequisites (the host needs no network once installed): the project venv with the ``gpu``
extra instead of the CPU onnxruntime (``pip uninstall -y onnxruntime && pip install -e .[gpu]``:
onnxruntime-gpu, cupy-cuda12x, nvidia-ml-py), an NVIDIA driver, CUDA 12 libraries.

Steps (each one timed, its outcome or error recorded; a failed step does not stop the others
unless a later one needs its output):

1. ``preflight``: onnxruntime version and providers, cupy and the device, nvidia-smi.
2. ``export_small`` / ``export_full``: synthetic checkpoints exported with ``--precision fp16``
   (the fp16 conversion and its parity on the CPU EP are part of the export).
3. ``parity_cuda``: fp32 and fp16 parity against ChatTTS' torch modules with the graphs on the
   CUDA EP (asserting the session really runs on CUDA: ORT silently falls back to CPU when the
   CUDA libraries do not load), full config; fp16 checked against the relative tolerance.
4. ``engine_cuda``: the fp16 engine on CUDA (the fused graph's KV cache in cupy device memory,
   bound as past and present) runs joins, leaves and different lengths twice with the same
   tokens, and its top-1 codes agree with the CPU EP's fp32 graph over 200 teacher-forced
   steps (ORT's CUDA GroupQueryAttention takes fp16/bf16 only: fp32 on CUDA would run the
   attention on the CPU).
5. ``step_bench``: raw decode step of the fused fp16 graph on CUDA, B = 1, 16, 32, past 300.
6. ``server``: ``python -m bench --profile gpu`` on the full artifacts (the
   bundled tritonserver with the gpu profile's model repository, closed-loop gRPC streams):
   TTFA and RTF at concurrency 1 and 16, no torch baseline.

Writes ``results/gpu_check.json`` (and ``results/gpu_check/`` for the benchmark's own files).
Usage: ``scripts/gpu_check.sh [--quick]`` (``--quick``: small config only for steps 3 to 6).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "gpu_check.json"
BENCH_DIR = ROOT / "results" / "gpu_check"
PY = sys.executable
CUDA = ("CUDAExecutionProvider", "CPUExecutionProvider")
QUICK = "--quick" in sys.argv
ART_SMALL, ART_FULL = ROOT / "artifacts" / "small", ROOT / "artifacts" / "full"
W_SMALL = ROOT / "build" / "weights" / "synthetic-small-seed0"
W_FULL = ROOT / "build" / "weights" / "synthetic-full-seed0"

report: dict[str, Any] = {"note": "produced by scripts/gpu_check.py", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                          "host": platform.node(), "quick": QUICK, "steps": {}}


def save() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2, default=str))


def step(name: str, fn: Callable[[], Any]) -> bool:
    t = time.perf_counter()
    print(f"[gpu_check] {name} ...", flush=True)
    try:
        result = fn()
        report["steps"][name] = {"ok": True, "s": round(time.perf_counter() - t, 1), "result": result}
        ok = True
    except Exception as exc:
        report["steps"][name] = {"ok": False, "s": round(time.perf_counter() - t, 1),
                                 "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        ok = False
    print(f"[gpu_check] {name}: {'ok' if ok else 'FAILED'} in {report['steps'][name]['s']} s", flush=True)
    save()
    return ok


def run(cmd: list[str], timeout_s: float) -> str:
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    return (p.stdout + p.stderr)[-2000:]


def preflight() -> dict[str, Any]:
    import onnxruntime as ort

    info: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
    if "CUDAExecutionProvider" not in info["providers"]:
        raise RuntimeError("onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu (the gpu extra)")
    import cupy

    info["cupy"] = cupy.__version__
    info["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def export(size: str) -> str:
    return run([PY, "-m", "chattts_serving.export", "--synthetic", "--size", size, "--precision", "fp16",
                "--quiet"], 240)


def parity_cuda(art: Path, weights: Path) -> dict[str, Any]:
    from chattts_serving.engine.gpt import GptStepRunner
    from chattts_serving.export.build import PARITY_TOLERANCE
    from chattts_serving.export.fp16 import FP16_RELATIVE_TOLERANCE, fp16_parity
    from chattts_serving.export.parity import parity_report
    from chattts_serving.export.weights import load_chat
    from chattts_serving.runtime import Artifacts, OrtOptions

    opts = OrtOptions(providers=CUDA)
    a = Artifacts.load(art)
    for precision in ("fp32", "fp16"):
        active = GptStepRunner(a, OrtOptions(providers=CUDA, precision=precision)).session.get_providers()
        if active[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"{precision} GPT session fell back to {active}: CUDA EP did not load")
    chat = load_chat(weights)
    fp32 = parity_report(chat, art, opts)
    fp16 = fp16_parity(chat, art, opts)
    return {"fp32_abs": fp32, "fp32_tolerance_abs": PARITY_TOLERANCE,
            "fp32_ok": all(v <= PARITY_TOLERANCE for v in fp32.values()),
            "fp16": fp16, "fp16_tolerance_rel": FP16_RELATIVE_TOLERANCE,
            "fp16_ok": all(v["rel"] <= FP16_RELATIVE_TOLERANCE for v in fp16.values())}


def engine_cuda(art: Path) -> dict[str, Any]:
    """The fp16 engine on CUDA (IO binding, the KV cache in cupy device memory): a scenario of
    joins, leaves and both modes completes twice with the same tokens, and teacher-forced over
    200 steps its top-1 codes agree with the fp32 graph on the CPU EP."""
    import numpy as np

    from chattts_serving.engine.gpt import Embeddings, GptStepRunner
    from chattts_serving.engine.scheduler import Engine, EngineConfig
    from chattts_serving.engine.sequence import make_sequence
    from chattts_serving.engine.sinks import CollectingSink
    from chattts_serving.export import int8
    from chattts_serving.params import SamplingParams
    from chattts_serving.runtime import Artifacts, OrtOptions

    a = Artifacts.load(art)
    emb = Embeddings(a)
    gpu = GptStepRunner(a, OrtOptions(providers=CUDA, precision="fp16", io_binding=True))
    if gpu.backend.device_type != "cuda" or gpu.session.get_providers()[0] != "CUDAExecutionProvider":
        raise RuntimeError(f"not on the device: backend {gpu.backend.device_type}, {gpu.session.get_providers()}")

    def scenario() -> tuple[list[CollectingSink], str]:
        eng = Engine(gpu, emb, EngineConfig(max_batch_size=3, max_context_tokens=1024))
        sinks = []
        rng = np.random.default_rng(0)
        for i in range(10):
            sink = CollectingSink()
            sinks.append(sink)
            ids = rng.integers(200, 7000, 12 + 3 * (i % 5))
            ids[0], ids[-1] = 21131, 21132
            n = 10 + 4 * i
            eng.submit(make_sequence(ids, None, SamplingParams(seed=i, max_new_tokens=n, min_new_tokens=n), sink,
                                     emit_tokens=1 + i % 3))
            for _ in range(i % 4):
                eng.run_once()
        while eng.live_count():
            eng.run_once()
        buf = eng._batch.cache.buffers[0]
        return sinks, type(buf).__module__ + "." + type(buf).__name__

    first, kv_type = scenario()
    second, _ = scenario()
    same = all(np.array_equal(x.all_codes, y.all_codes) for x, y in zip(first, second))
    errors = [str(e) for s in first for e in s.errors]
    cpu = GptStepRunner(a, OrtOptions(precision="fp32"))
    prompt = int8._prompts(a, ["今天天气很好，我们一起去公园散步吧。"], int8.ACCURACY_VOICE)[0]
    acc = int8.compare_runs([int8.teacher_forced(cpu, gpu, prompt, 200)])
    out = {"kv_array_type": kv_type, "kv_dtype": np.dtype(gpu.kv_dtype).name, "repeatable": same,
           "errors": errors, "top1_vs_cpu_fp32": acc["top1_agreement"], "logits_rel_max": acc["logits_rel_max"]}
    if not same or errors or "cupy" not in kv_type:
        raise RuntimeError(f"engine on CUDA: {out}")
    return out


def step_bench(art: Path) -> dict[str, Any]:
    """Raw decode step of the fused fp16 graph on CUDA at B = 1, 16, 32 over a past of 300."""
    from bench.rawstep import measure_raw_step
    from chattts_serving.runtime import OrtOptions

    return measure_raw_step(art, OrtOptions(4, False, CUDA, True, "fp16"), [1, 16, 32], past_tokens=300,
                            repeats=30)


def server(art: Path, weights: Path) -> dict[str, Any]:
    run([PY, "-m", "bench", "--profile", "gpu", "--artifacts", str(art), "--weights", str(weights),
         "--levels", "1,16", "--requests-per-level", "32", "--tokens", "150", "--skip-baseline",
         "--raw-batches", "1,16", "--out", str(BENCH_DIR), "--label", "gpu_check"], 240)
    bench = json.loads((BENCH_DIR / "bench.json").read_text())
    keys = ("concurrency", "ok", "failed", "ttfa_p50_s", "ttfa_p95_s", "rtf_mean", "audio_s_per_s",
            "tokens_per_s", "latency_p50_s")
    return {"levels": [{k: lv.get(k) for k in keys} for lv in bench.get("levels", [])],
            "raw_step": bench.get("raw_step"), "server_start_s": bench.get("server_start_s")}


def main() -> int:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return 0
    t0 = time.perf_counter()
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    if not step("preflight", preflight):
        return 1
    step("export_small", lambda: export("small"))
    full_ok = False if QUICK else step("export_full", lambda: export("full"))
    art, weights = (ART_FULL, W_FULL) if full_ok else (ART_SMALL, W_SMALL)
    report["artifacts_measured"] = str(art)
    step("parity_cuda", lambda: parity_cuda(art, weights))
    step("engine_cuda", lambda: engine_cuda(art))
    step("step_bench", lambda: step_bench(art))
    step("server", lambda: server(art, weights))
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    report["ok"] = all(s["ok"] for s in report["steps"].values())
    save()
    print(json.dumps({k: v["ok"] for k, v in report["steps"].items()}), f"-> {OUT}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
