"""``make demo``: from a fresh clone to streamed ChatTTS audio through a real Triton server.

1. Weights: a local 2Noise/ChatTTS snapshot when ``--assets`` (or ``$CHATTTS_ASSETS``) names
   one, else generated full-size weights of ChatTTS' architecture (seeded, offline).
2. Export to ONNX (skipped when the artifacts are up to date), plus the fp16 or int8 graph
   variant when the profile's ``precision`` asks for one (``PROFILE=cpu-int8``, ``gpu``).
3. Render the ``cpu`` (or ``--profile``) model repository and start the bundled tritonserver.
4. Stream a Chinese sentence over gRPC into a WAV file, printing time to first audio (TTFA),
   total time and real-time factor (RTF). The first request after start-up warms ONNX
   Runtime's allocations and is reported separately.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from . import contract
from .client import ClientError, SynthesisRequest, synthesize_stream, write_wav
from .deploy.render import RenderError, render_repository
from .deploy.server import ServerError, TritonServer
from .deploy.supervisor import supervised
from .export.build import export_artifacts
from .export.variants import ensure_precision
from .export.weights import WeightsError, generate_checkpoint, read_sizes
from .serving.profile import ProfileError, load_profile

DEMO_TEXT = "你好，欢迎使用基于 Triton 推理服务器的流式语音合成服务，第一段音频在整句话生成完之前就已经送达。"


def prepare_artifacts(assets: Path | None, size: str, precisions: Iterable[str] = ()) -> Path:
    """Export real weights from ``assets`` or generated ones of ``size``, plus the graph variants
    ``precisions`` asks for (a profile's engine and vocoder precisions: ``fp16``, ``int8``);
    returns the artifacts dir."""
    def say(msg: str) -> None:
        print(f"  export: {msg}", flush=True)

    if assets is not None:
        weights = assets
        out, exported = export_artifacts(assets, Path("artifacts/chattts"),
                                         source={"kind": "assets", "path": str(assets.resolve())}, progress=say)
    else:
        weights = Path(f"build/weights/synthetic-{size}-seed0")
        sizes = read_sizes(weights / "asset") if (weights / "asset").is_dir() else None
        if sizes is None or sizes.name != size:
            say(f"no real weights given: generating {size}-size ChatTTS weights (seed 0)")
            generate_checkpoint(weights, size, 0)
        out, exported = export_artifacts(weights, Path(f"artifacts/{size}"),
                                         source={"kind": "synthetic", "size": size, "seed": 0}, progress=say)
    for precision in sorted(set(precisions)):
        exported = ensure_precision(out, weights, precision, progress=say) or exported
    print(f"  artifacts: {out} ({'exported' if exported else 'up to date'})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chattts-demo", description=__doc__.splitlines()[0])
    env_assets = os.environ.get("CHATTTS_ASSETS")
    ap.add_argument("--assets", type=Path, default=Path(env_assets) if env_assets else None,
                    help="local 2Noise/ChatTTS snapshot (folder holding asset/); default $CHATTTS_ASSETS")
    ap.add_argument("--size", choices=["full", "small"], default="full", help="generated weights' size")
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
        artifacts = prepare_artifacts(args.assets, args.size, (profile.engine.precision, profile.vocoder.precision))
        print(f"[2/3] starting tritonserver (profile {args.profile}, GPT {profile.engine.precision})", flush=True)
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
          f"(< 1 is faster than real time)")
    if artifacts.name != "chattts":
        print("  note: generated weights of ChatTTS' architecture: the timings are real, the audio is noise-like")
    return 0


if __name__ == "__main__":
    sys.exit(main())
