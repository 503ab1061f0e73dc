"""``python -m bench.int8 --artifacts DIR [--measure]``:
the int8 GPT step of :mod:`chattts_serving.export.int8` added to an exported artifact directory
and, with ``--measure``, its accuracy against fp32 over the benchmark sentences written into
manifest.json (``precisions.int8.accuracy``).

The command sits in ``bench/`` because its prompts are the benchmark's sentences
(:func:`bench.load_sentences`), and ``export/`` imports nothing above the core
(tests/unit/test_layout.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from chattts_serving.export.int8 import (
    ACCURACY_VOICE,
    MIN_ACCURACY_DECODE_STEPS,
    accuracy_report,
    accuracy_table,
    add_int8,
    write_accuracy,
)
from chattts_serving.export.weights import WeightsError
from chattts_serving.runtime import OrtOptions

from . import load_sentences


def has_accuracy(root: Path) -> bool:
    """True when ``root``'s manifest holds an accuracy measurement of its int8 graph (a new
    int8 graph drops the old measurement: :func:`~chattts_serving.export.int8.add_int8`)."""
    import json

    from chattts_serving import contract

    manifest = json.loads((Path(root) / contract.MANIFEST).read_text())
    return "accuracy" in manifest.get("precisions", {}).get("int8", {})


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.int8 --artifacts DIR [--measure]``: add the int8 GPT
    graph to an exported artifact directory (if missing or stale) and, with ``--measure``,
    measure its accuracy against fp32 and write it into manifest.json."""
    ap = argparse.ArgumentParser(prog="python -m bench.int8", description=main.__doc__)
    ap.add_argument("--artifacts", type=Path, required=True, help="an exported artifact directory")
    ap.add_argument("--measure", action="store_true",
                    help="teacher-forced accuracy vs fp32 over the benchmark sentences -> manifest.json")
    ap.add_argument("--measure-if-missing", action="store_true",
                    help="--measure unless the manifest already holds an accuracy of the current int8 graph")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"tokens per sentence (default: enough for {MIN_ACCURACY_DECODE_STEPS} decode steps in all)")
    ap.add_argument("--voice", default=ACCURACY_VOICE, help="voice of the prompts (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2, as the cpu profile)")
    ap.add_argument("--force", action="store_true", help="re-quantize even when up to date")
    args = ap.parse_args(argv)
    started = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[int8 {time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        added = add_int8(args.artifacts, force=args.force, progress=say)
        say(f"{args.artifacts}: int8 graph {'added' if added else 'up to date'}")
        if args.measure_if_missing and not args.measure:
            args.measure = not has_accuracy(args.artifacts)
            say(f"{args.artifacts}: int8 accuracy {'to measure' if args.measure else 'already measured'}")
        if args.measure:
            texts = load_sentences()
            steps = args.steps or -(-MIN_ACCURACY_DECODE_STEPS // len(texts)) + 1
            if len(texts) * (steps - 1) < MIN_ACCURACY_DECODE_STEPS:
                say(f"note: {len(texts)} x {steps - 1} decode steps is below {MIN_ACCURACY_DECODE_STEPS}")
            acc = accuracy_report(args.artifacts, texts, steps, voice=args.voice,
                                  opts=OrtOptions(args.threads, False), progress=say)
            write_accuracy(args.artifacts, acc)
            print(accuracy_table(acc))
    except WeightsError as exc:
        print(f"chattts-export int8: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
