"""``make demo``: from a fresh clone to streamed ChatTTS audio through a real Triton server.

1. Weights: a local 2Noise/ChatTTS snapshot when ``--assets`` (or ``$CHATTTS_ASSETS``) names
   one, else generated full-size weights of ChatTTS' architecture (seeded, offline).
2. Export to ONNX (skipped when the artifacts are up to date), plus the fp16 or int8 graph
   variant when the profile's ``precision`` asks for one (``PROFILE=cpu-int8``, ``gpu``). A
   profile at ``precision = "auto"`` (``cpu``, the default) serves int8 only where the int8
   graph's accuracy was measured and meets the threshold, and its ``kv_cache = "auto"`` runs the
   int8 KV cache only where that was measured, so the demo exports the int8 graphs and measures
   both once (``make int8-accuracy``, and the int8 KV cache alone of ``make kv-accuracy``)
   unless the manifest already holds them: the demo runs what a user would deploy.
3. Render the ``cpu`` (or ``--profile``) model repository and start the bundled tritonserver.
4. Stream a Chinese sentence over gRPC into a WAV file, printing time to first audio (TTFA),
   total time and real-time factor (RTF), and the profile and precisions that ran. The first
   request after start-up warms ONNX Runtime's allocations and is reported separately.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from . import contract
from .client import ClientError, SynthesisRequest, synthesize_stream, write_wav
from .contract import KvPrecision, Precision
from .deploy.render import RenderError, render_repository
from .deploy.server import ServerError, TritonServer
from .deploy.supervisor import supervised
from .export.build import export_artifacts
from .export.variants import ensure_precision
from .export.weights import WeightsError, generate_checkpoint, read_sizes
from .runtime import Artifacts, resolve_kv_precision, resolve_precision
from .serving.profile import Profile, ProfileError, load_profile

DEMO_TEXT = "你好，欢迎使用基于 Triton 推理服务器的流式语音合成服务，第一段音频在整句话生成完之前就已经送达。"


def prepare_artifacts(assets: Path | None, size: str, precisions: Iterable[str] = (),
                      out_dir: Path | None = None, kv_cache: str = KvPrecision.FP32) -> Path:
    """Export real weights from ``assets`` or generated ones of ``size`` into ``out_dir``
    (default ``artifacts/chattts`` or ``artifacts/<size>``), plus the graph variants
    ``precisions`` asks for (a profile's engine and vocoder precisions: ``fp16``, ``int8``;
    ``auto``: the int8 graphs and their accuracy measurement, :func:`measure_accuracy`) and, for
    ``kv_cache`` ``auto``, the int8 KV cache's measurement; returns the artifacts dir.

    Raises:
        WeightsError: an export or its parity check failed, or the accuracy measurement did.
    """
    def say(msg: str) -> None:
        print(f"  export: {msg}", flush=True)

    if assets is not None:
        weights = assets
        out, exported = export_artifacts(assets, out_dir or Path("artifacts/chattts"),
                                         source={"kind": "assets", "path": str(assets.resolve())}, progress=say)
    else:
        weights = Path(f"build/weights/synthetic-{size}-seed0")
        sizes = read_sizes(weights / "asset") if (weights / "asset").is_dir() else None
        if sizes is None or sizes.name != size:
            say(f"no real weights given: generating {size}-size ChatTTS weights (seed 0)")
            generate_checkpoint(weights, size, 0)
        out, exported = export_artifacts(weights, out_dir or Path(f"artifacts/{size}"),
                                         source={"kind": "synthetic", "size": size, "seed": 0}, progress=say)
    wanted = set(precisions)
    if Precision.AUTO in wanted:
        wanted.add(Precision.INT8)
    for precision in sorted(wanted):
        exported = ensure_precision(out, weights, precision, progress=say) or exported
    print(f"  artifacts: {out} ({'exported' if exported else 'up to date'})", flush=True)
    if Precision.AUTO in wanted:
        measure_accuracy(out, "int8")
    if kv_cache == KvPrecision.AUTO:
        measure_accuracy(out, "kv")
    return out


ACCURACY_COMMANDS = {"int8": "the int8 graphs against fp32, as `make int8-accuracy`",
                     "kv": "the int8 KV cache against fp32 with the weights in use, as `make kv-accuracy`"}
"""The measurements a profile at ``auto`` decides by: ``precision`` (int8) and ``kv_cache`` (kv)."""


def measure_accuracy(artifacts: Path, what: str) -> None:
    """``python -m chattts_serving.export.accuracy <what> --measure-if-missing`` on
    ``artifacts`` (``what``: a key of :data:`ACCURACY_COMMANDS`) unless its manifest already
    holds that measurement. It runs as its own command, so that its sessions are gone before the
    server starts. Raises WeightsError when it fails."""
    from .export.accuracy import has_accuracy, has_kv_accuracy

    art = Artifacts.load(artifacts)
    if has_accuracy(artifacts) if what == "int8" else has_kv_accuracy(art, resolve_precision(art, Precision.AUTO)):
        return
    print(f"  {what} accuracy: not measured yet on these artifacts; measuring it once (teacher-forced: "
          f"{ACCURACY_COMMANDS[what]})", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "chattts_serving.export.accuracy", what,
                           "--artifacts", str(artifacts), "--measure-if-missing"], check=False)
    if done.returncode != 0:
        raise WeightsError(f"the {what} accuracy measurement failed (exit {done.returncode})")
    print(f"  {what} accuracy: measured in {time.perf_counter() - t0:.0f} s", flush=True)


def precision_summary(profile: Profile, artifacts: Path) -> str:
    """Which precision the GPT step (and its KV cache) and the vocoders run under ``profile`` on
    ``artifacts``, and why where the profile says ``auto`` (the int8 graphs' and the int8 KV
    cache's accuracy measured against the threshold)."""
    art = Artifacts.load(artifacts)
    gpt = resolve_precision(art, profile.engine.precision, contract.GPT_GRAPH)
    voc = resolve_precision(art, profile.vocoder.precision, contract.VOCODER_HIDDEN_GRAPH)
    kv = resolve_kv_precision(art, profile.engine.kv_cache, gpt)
    text = f"GPT {gpt} (KV cache {kv}), vocoders {voc}"
    if Precision.AUTO in (profile.engine.precision, profile.vocoder.precision):
        acc = art.manifest.get("precisions", {}).get(Precision.INT8, {}).get("accuracy")
        if acc is None:
            text += " (auto: no int8 accuracy measured, so fp32)"
        else:
            worst = acc.get("top1_agreement_min")
            text += (f" (auto: int8 accuracy {'meets' if acc.get('meets_threshold') else 'misses'} the threshold"
                     + (f", worst head top-1 {worst:.3f}" if isinstance(worst, float) else "") + ")")
    if profile.engine.kv_cache == KvPrecision.AUTO:
        kv_acc = art.manifest.get("kv_cache", {}).get(KvPrecision.INT8, {}).get("accuracy", {}).get(gpt)
        if kv_acc is None:
            text += f" (KV auto: no int8 KV accuracy measured with {gpt} weights, so fp32)"
        else:
            text += (f" (KV auto: int8 KV accuracy {'meets' if kv_acc.get('meets_threshold') else 'misses'} "
                     f"the threshold with {gpt} weights)")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chattts-demo", description=__doc__.splitlines()[0])
    env_assets = os.environ.get("CHATTTS_ASSETS")
    ap.add_argument("--assets", type=Path, default=Path(env_assets) if env_assets else None,
                    help="local 2Noise/ChatTTS snapshot (folder holding asset/); default $CHATTTS_ASSETS")
    ap.add_argument("--size", choices=["full", "small"], default="full", help="generated weights' size")
    ap.add_argument("--artifacts-dir", type=Path, default=None,
                    help="where to export (default artifacts/<size>, or artifacts/chattts with --assets)")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--text", default=DEMO_TEXT)
    ap.add_argument("--out", type=Path, default=Path("out/demo.wav"))
    ap.add_argument("--max-new-tokens", type=int, default=240, help="cap on generated tokens (46.875 per second)")
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    args = ap.parse_args(argv)
    try:
        profile = load_profile(args.profile)
        print("[1/3] weights and ONNX artifacts", flush=True)
        artifacts = prepare_artifacts(args.assets, args.size, (profile.engine.precision, profile.vocoder.precision),
                                      args.artifacts_dir, profile.engine.kv_cache)
        ran = precision_summary(profile, artifacts)
        print(f"[2/3] starting tritonserver (profile {args.profile}: {ran})", flush=True)
        repo = Path("build/model_repository")
        render_repository(profile, artifacts, repo)
        Path("build").mkdir(exist_ok=True)
        log = Path("build/tritonserver-demo.log")
        with TritonServer(repo, http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                          log_path=log) as server, supervised(server, profile.health):
            url = f"127.0.0.1:{args.grpc_port}"
            print(f"  ready: gRPC {url}, HTTP 127.0.0.1:{args.http_port} (log: {log})", flush=True)
            # Generated weights end an utterance at random; a floor on its length keeps the
            # demo's stream several chunks long. Real weights decide their own length.
            floor = None if artifacts.name == "chattts" else min(150, args.max_new_tokens)
            req = SynthesisRequest(text=args.text, seed=1, voice="2", max_new_tokens=args.max_new_tokens,
                                   min_new_tokens=floor)
            print("[3/3] streaming over gRPC", flush=True)
            t0 = time.perf_counter()
            warm = synthesize_stream(url, req)
            print(f"  warm-up request: TTFA {warm.ttfa_s * 1000:.0f} ms, total {time.perf_counter() - t0:.2f} s",
                  flush=True)
            res = synthesize_stream(url, req)
    except (WeightsError, ProfileError, RenderError, ServerError, ClientError) as exc:
        print(f"chattts-demo: error: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_wav(args.out, res.audio, res.sample_rate_hz)
    print(f"  text: {args.text}")
    print(f"  wrote {args.out}: {res.audio_s:.2f} s of {contract.SAMPLE_RATE_HZ} Hz mono audio in {res.chunks} chunks")
    print(f"  TTFA {res.ttfa_s * 1000:.0f} ms | total {res.total_s:.2f} s | RTF {res.rtf:.2f} "
          f"(< 1 is faster than real time) | profile {args.profile}: {ran}")
    if artifacts.name != "chattts":
        print("  note: generated weights of ChatTTS' architecture: the timings are real, the audio is noise-like")
    return 0


if __name__ == "__main__":
    sys.exit(main())
