"""``chattts-export``: build the artifact directory from real, downloaded or generated weights."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..contract import Precision
from .weights import SIZES, WeightsError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chattts-export",
        description="Export ChatTTS' GPT step, vocoders, embeddings, tokenizer and speaker statistics "
                    "to an ONNX artifact directory for the Triton models. Up-to-date artifacts "
                    "(same input hashes) are reused.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--assets", type=Path, metavar="DIR",
                     help="local 2Noise/ChatTTS snapshot (the folder that holds asset/)")
    src.add_argument("--download", action="store_true",
                     help="fetch 2Noise/ChatTTS from Hugging Face with ChatTTS' own downloader")
    src.add_argument("--synthetic", action="store_true",
                     help="seeded random weights of ChatTTS' architecture, with a generated tokenizer")
    p.add_argument("--size", choices=sorted(SIZES), default="small",
                   help="with --synthetic: 'full' = ChatTTS' default config, 'small' = fast test config")
    p.add_argument("--seed", type=int, default=0, help="with --synthetic: weight seed (default 0)")
    p.add_argument("--out", type=Path, default=None,
                   help="artifact directory (default artifacts/<size> or artifacts/chattts)")
    p.add_argument("--weights-dir", type=Path, default=None,
                   help="where --synthetic writes its checkpoint / --download its snapshot "
                        "(default build/weights/<name>)")
    p.add_argument("--force", action="store_true", help="export even if the artifacts are up to date")
    p.add_argument("--precision", choices=[str(x) for x in Precision if x is not Precision.AUTO],
                   default=str(Precision.FP32),
                   help="fp16: also write fp16 variants of the graphs (KV cache fp16, fp32 embeddings/logits/"
                        "audio), checked against ChatTTS' fp32 modules; int8: also write 8-bit weight (MatMulNBits) "
                        "variants of the GPT step and the vocoders (fp32 IO and KV cache), checked against the fp32 "
                        "graphs; either listed in manifest.json, for profiles whose [engine] / [vocoder] precision "
                        "is \"fp16\" or \"int8\" (default fp32: only the fp32 graphs)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .build import export_artifacts
    from .variants import ensure_precision
    from .weights import download, generate_checkpoint

    started = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[export {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        if args.synthetic:
            name = f"synthetic-{args.size}-seed{args.seed}"
            root = args.weights_dir or Path("build/weights") / name
            out = args.out or Path("artifacts") / args.size
            marker = root / "asset" / "chattts_serving.json"
            if not marker.is_file() or f'"seed": {args.seed}' not in marker.read_text() or args.force:
                progress(f"generating {args.size} checkpoint (seed {args.seed}) in {root}")
                generate_checkpoint(root, args.size, args.seed)
            source = {"kind": "synthetic", "size": args.size, "seed": args.seed}
        elif args.download:
            root = download(args.weights_dir or Path("build/weights/chattts-hf"))
            out = args.out or Path("artifacts") / "chattts"
            source = {"kind": "huggingface", "repo": "2Noise/ChatTTS", "path": str(root)}
        else:
            root = args.assets
            out = args.out or Path("artifacts") / "chattts"
            source = {"kind": "assets", "path": str(Path(root).resolve())}
        out, exported = export_artifacts(root, out, source=source, force=args.force, progress=progress)
        exported = ensure_precision(out, root, args.precision, force=args.force, progress=progress) or exported
    except WeightsError as exc:
        print(f"chattts-export: error: {exc}", file=sys.stderr)
        return 2
    state = "exported" if exported else "up to date, reused"
    print(f"{out}: {state} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
