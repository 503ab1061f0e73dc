"""``python -m chattts_serving.export.accuracy {int8,kv} --artifacts DIR``: the accuracy
measurements that decide what ``auto`` precisions resolve to, written into manifest.json.

- ``int8``: the int8 GPT step of :mod:`.int8` added to an exported artifact directory (if
  missing or stale) and, with ``--measure``, its accuracy against fp32 (``precisions.int8.accuracy``).
- ``kv``: the int8 KV cache's scales calibrated when missing (``--calibrate`` re-calibrates,
  :func:`~.kvcache.calibrate_scales`), then each reduced cache against the fp32 cache with the
  same weights (``kv_cache.<kv>.accuracy.<weights>``, :func:`~.kvcache.kv_accuracy_report`);
  with ``--measure-if-missing`` only what ``kv_cache = "auto"`` decides by, once.

Both are teacher-forced over the shipped sentences (:mod:`.sentences`), at least
:data:`~.int8.MIN_ACCURACY_DECODE_STEPS` decode steps in all, and judged by
:data:`~.int8.ACCURACY_THRESHOLD`. The KV cache's step time is a benchmark: ``python -m bench.kv``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import contract
from ..contract import KvPrecision, Precision
from ..runtime import Artifacts, OrtOptions, kv_precision, resolve_precision
from .build import read_manifest
from .int8 import (
    ACCURACY_VOICE,
    MIN_ACCURACY_DECODE_STEPS,
    accuracy_report,
    accuracy_table,
    add_int8,
    write_accuracy,
)
from .kvcache import (
    CALIBRATION_STEPS,
    KV_INT8_MARGIN,
    calibrate_scales,
    kv_accuracy_report,
    write_kv_accuracy,
    write_scales,
)
from .sentences import load_sentences
from .weights import WeightsError

Say = Callable[[str], None]


def has_accuracy(root: Path) -> bool:
    """True when ``root``'s manifest holds an accuracy measurement of its int8 graph (a new
    int8 graph drops the old measurement: :func:`~.int8.add_int8`)."""
    manifest = json.loads((Path(root) / contract.MANIFEST).read_text())
    return "accuracy" in manifest.get("precisions", {}).get("int8", {})


def has_kv_accuracy(art: Artifacts, weights: Precision | str) -> bool:
    """True when ``art``'s manifest holds the int8 KV cache's scales and their accuracy measured
    with the ``weights`` graph (a new int8 GPT graph drops its measurement: :func:`~.int8.add_int8`)."""
    entry = art.manifest.get("kv_cache", {}).get(str(KvPrecision.INT8), {})
    has_scales = bool(entry.get("file")) and (art.root / entry["file"]).is_file()
    return has_scales and str(weights) in entry.get("accuracy", {})


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _steps(given: int | None, texts: list[str], say: Say) -> int:
    """Tokens per sentence: ``given``, else enough for the minimum decode steps in all."""
    steps = given or -(-MIN_ACCURACY_DECODE_STEPS // len(texts)) + 1
    if len(texts) * (steps - 1) < MIN_ACCURACY_DECODE_STEPS:
        say(f"note: {len(texts)} x {steps - 1} decode steps is below {MIN_ACCURACY_DECODE_STEPS}")
    return steps


def run_int8(args: argparse.Namespace, say: Say) -> int:
    """The ``int8`` subcommand: add the int8 GPT graph, then measure it when asked."""
    added = add_int8(args.artifacts, force=args.force, progress=say)
    say(f"{args.artifacts}: int8 graph {'added' if added else 'up to date'}")
    if args.measure_if_missing and not args.measure:
        args.measure = not has_accuracy(args.artifacts)
        say(f"{args.artifacts}: int8 accuracy {'to measure' if args.measure else 'already measured'}")
    if args.measure:
        texts = load_sentences()
        acc = accuracy_report(args.artifacts, texts, _steps(args.steps, texts, say), voice=args.voice,
                              opts=OrtOptions(args.threads, False), progress=say)
        write_accuracy(args.artifacts, acc)
        print(accuracy_table(acc))
    return 0


def exported_weights(art: Artifacts) -> list[str]:
    """The weight precisions ``art`` holds: fp32, and int8 where manifest.json lists it."""
    has_int8 = bool(art.manifest.get("precisions", {}).get("int8"))
    return [str(Precision.FP32)] + ([str(Precision.INT8)] if has_int8 else [])


def kv_precisions(text: str) -> list[KvPrecision]:
    """The reduced KV precisions of ``--kv`` (fp32, the reference, dropped). Raises ValueError
    for an unknown name or ``auto``."""
    kvs = [kv_precision(k) for k in _csv(text)]
    if KvPrecision.AUTO in kvs:
        raise ValueError("--kv takes the precisions to measure (fp16, int8), not auto")
    return [k for k in kvs if k is not KvPrecision.FP32]


def run_kv(args: argparse.Namespace, say: Say) -> int:
    """The ``kv`` subcommand: calibrate the int8 scales when missing or asked, then measure each
    reduced cache with each weight precision (fp32, and int8 where exported, unless ``--weights``)
    into manifest.json (unless ``--no-manifest``) and ``--out``."""
    kvs = args.kv
    art = Artifacts(args.artifacts, read_manifest(args.artifacts))
    weights = _csv(args.weights) if args.weights else exported_weights(art)
    if args.measure_if_missing:  # what `kv_cache = "auto"` reads: the int8 cache with the weights `auto` serves
        kvs, weights = [KvPrecision.INT8], [str(resolve_precision(art, Precision.AUTO))]
        if has_kv_accuracy(art, weights[0]):
            say(f"{args.artifacts}: int8 KV accuracy with {weights[0]} weights already measured")
            return 0
        say(f"{args.artifacts}: int8 KV accuracy with {weights[0]} weights to measure")
    opts = OrtOptions(args.threads, False)
    if KvPrecision.INT8 in kvs and (args.calibrate or not (args.artifacts / contract.KV_SCALES_FILE).is_file()):
        say("calibrating the int8 KV scales on the fp32 graph")
        scales = calibrate_scales(args.artifacts, steps=CALIBRATION_STEPS, opts=opts)
        write_scales(args.artifacts, scales, {"texts": "export.parity.PARITY_TEXTS", "steps": CALIBRATION_STEPS,
                                              "margin": KV_INT8_MARGIN, "graph": "fp32 weights, fp32 KV"})
    texts = load_sentences()
    steps = _steps(args.steps, texts, say)
    result: dict[str, Any] = {"artifacts": str(args.artifacts), "kv_precisions": [str(k) for k in kvs],
                              "accuracy": {}}
    for w in weights:
        for kv in kvs:
            acc = kv_accuracy_report(args.artifacts, texts, steps, kv, weights=w, opts=opts, progress=say)
            result["accuracy"][f"{w}/{kv}"] = acc
            say(f"{w} weights, {kv} KV: top-1 per head {[round(a, 3) for a in acc['top1_agreement']]}, "
                f"audio {acc['audio_snr_db']:.1f} dB (worst {acc['audio_snr_db_min']:.1f}), "
                f"meets threshold: {acc['meets_threshold']}")
            if not args.no_manifest:
                write_kv_accuracy(args.artifacts, acc)
    if args.against_fp32 and str(Precision.INT8) in weights:
        result["accuracy_vs_fp32"] = {}
        for kv in kvs:
            acc = kv_accuracy_report(args.artifacts, texts, steps, kv, weights=Precision.INT8,
                                     reference_weights=Precision.FP32, opts=opts, progress=say)
            result["accuracy_vs_fp32"][f"int8/{kv}"] = acc
            say(f"int8 weights, {kv} KV against fp32 throughout: top-1 per head "
                f"{[round(a, 3) for a in acc['top1_agreement']]}, audio {acc['audio_snr_db']:.1f} dB")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True))
        say(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per measurement, each with ``--artifacts``."""
    ap = argparse.ArgumentParser(prog="python -m chattts_serving.export.accuracy", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    i8 = sub.add_parser("int8", help="add the int8 GPT graph and measure its accuracy against fp32")
    kv = sub.add_parser("kv", help="calibrate the int8 KV cache and measure each reduced cache's accuracy")
    for p in (i8, kv):
        p.add_argument("--artifacts", type=Path, required=True, help="an exported artifact directory")
        p.add_argument("--steps", type=int, default=None,
                       help=f"tokens per sentence (default: enough for {MIN_ACCURACY_DECODE_STEPS} decode steps "
                            "in all)")
        p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2, as the cpu profile)")
    i8.add_argument("--measure", action="store_true",
                    help="teacher-forced accuracy vs fp32 over the shipped sentences -> manifest.json")
    i8.add_argument("--measure-if-missing", action="store_true",
                    help="--measure unless the manifest already holds an accuracy of the current int8 graph")
    i8.add_argument("--voice", default=ACCURACY_VOICE, help="voice of the prompts (default %(default)s)")
    i8.add_argument("--force", action="store_true", help="re-quantize even when up to date")
    kv.add_argument("--kv", default="fp16,int8", help="reduced KV precisions to measure (default %(default)s)")
    kv.add_argument("--weights", default=None,
                    help="weight precisions the accuracy is measured with (default: fp32, and int8 where exported)")
    kv.add_argument("--measure-if-missing", action="store_true",
                    help="only the int8 cache with the weights `precision = auto` serves, and only when the "
                         "manifest holds no such measurement yet (what `kv_cache = auto` decides by; --kv and "
                         "--weights ignored)")
    kv.add_argument("--calibrate", action="store_true", help="re-calibrate the int8 scales (else only when missing)")
    kv.add_argument("--no-manifest", action="store_true", help="do not write the accuracy into manifest.json")
    kv.add_argument("--against-fp32", action="store_true",
                    help="also measure each reduced cache with int8 weights against fp32 weights and cache "
                         "(results only: accuracy_vs_fp32)")
    kv.add_argument("--out", type=Path, default=None, help="also write the measurements to this JSON file")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; exit status 2 with the reason on bad options or artifacts."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.what == "kv":
        try:
            args.kv = kv_precisions(args.kv)
        except ValueError as exc:
            ap.error(str(exc))
    started = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{args.what} {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        return run_int8(args, say) if args.what == "int8" else run_kv(args, say)
    except WeightsError as exc:
        print(f"chattts-export accuracy {args.what}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
