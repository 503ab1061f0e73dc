"""What calling the front end once per request saves: TTFA and CPU of refine-text and of the
``chattts`` segmentation on a multi-sentence text, the code before (``--base``, by default
886bd3b: one front-end call per segment and stage) against this tree, measured in one run.

Each version runs in a child process of its own over the same artifacts, with the pipeline's
stages in process (``tests/support/inprocess.py``: the real front end, engine and vocoder,
function calls where the server makes BLS calls, so the saving measured here leaves out the
BLS round trips the server also saves). Per case and version, after one warm-up request,
``--runs`` streamed requests (fixed seeds, fixed token budgets: both versions generate the
same tokens, and the script checks that their audio is the same sample for sample): time to
first audio, the process's CPU seconds per request, the front-end calls and the wall and CPU
seconds spent in them, also less the DVAE encoder's (which encodes the first piece's audio once
either way): the text work this change saves. Every front-end call comes before the first
audio, so its wall time is the part of TTFA this change touches; on a busy host the engine's
share of TTFA and CPU varies far more than the front end's. The two versions alternate request
by request, so a change in the host's load touches both alike.

    PYTHONPATH=$PWD .venv/bin/python scripts/frontend_once.py --artifacts build/test/artifacts-small

writes results/frontend_once.json (docs/performance.md, "The front end once per request").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("今天是2024年3月5日，气温25°C。我们一起去公园散步吧。Mr Smith paid $3.50 at 10:30. "
        "明天见，记得带上1.5升水。")
"""Four sentences, four pieces of ChatTTS' split too (a ``。`` or a ``. `` ends each), with a
date, a temperature, money, a time and a decimal for the normaliser."""
CASES = {
    "chattts_refine": {"segmentation": "chattts", "refine": True},
    "chattts": {"segmentation": "chattts", "refine": False},
    "streaming_refine": {"segmentation": "streaming", "refine": True},
    "streaming": {"segmentation": "streaming", "refine": False},
}
"""The cases: ChatTTS' split (with its first-piece reference pass) and sentence segments, each
with and without refine-text."""


def _child(artifacts: str, cases: list[str]) -> None:
    """Serve requests read from stdin (one case name a line) and answer each with one JSON
    line: ttfa_s, cpu_s (the process's), frontend_calls, frontend_s and frontend_cpu_s (wall
    and CPU seconds inside the front end, all before the first audio), text_s and text_cpu_s
    (the same less the DVAE encoder's: the text work), audio_sha1, segments."""
    import numpy as np

    from chattts_serving.contract import Segmentation
    from chattts_serving.params import SamplingParams
    from chattts_serving.runtime import Artifacts
    from chattts_serving.serving.profile import load_profile
    from chattts_serving.serving.request import EntryRequest
    from chattts_serving.text.refine import RefineParams
    from tests.support.inprocess import InProcessStages

    try:  # this tree
        from chattts_serving.serving.job import SynthesisJob
    except ImportError:  # before pipeline.py was split
        from chattts_serving.serving.pipeline import SynthesisJob  # type: ignore[attr-defined,no-redef]
    from chattts_serving.serving.pipeline import stream_audio

    class Timed(InProcessStages):
        def __init__(self, artifacts: Artifacts) -> None:
            super().__init__(artifacts)
            self.frontend_s = self.frontend_cpu_s = self.encode_s = self.encode_cpu_s = 0.0
            encode = self.frontend_impl.encode

            def timed_encode(audio: Any) -> Any:  # the DVAE encoder: the first piece's audio prompt
                t0, cpu0 = time.perf_counter(), time.thread_time()
                try:
                    return encode(audio)
                finally:
                    self.encode_s += time.perf_counter() - t0
                    self.encode_cpu_s += time.thread_time() - cpu0

            self.frontend_impl.encode = timed_encode

        def frontend(self, call: Any) -> Any:
            t0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                return super().frontend(call)
            finally:
                self.frontend_s += time.perf_counter() - t0
                self.frontend_cpu_s += time.thread_time() - cpu0

    class Out:
        def __init__(self) -> None:
            self.chunks: list[np.ndarray] = []

        def audio(self, chunk: np.ndarray, result: Any) -> None:
            self.chunks.append(chunk)

        def cancelled(self) -> bool:
            return False

        def progress(self, working: bool) -> None:
            pass

        def watch(self, on_cancel: Any) -> Any:
            return lambda: None

    stages = Timed(Artifacts.load(Path(artifacts)))
    schedule = load_profile("cpu").stream.schedule()
    print("ready", flush=True)
    for line in sys.stdin:
        case = CASES[line.strip()]
        refine = RefineParams(max_new_tokens=24, min_new_tokens=24, seed=3) if case["refine"] else None
        req = EntryRequest(text=TEXT, voice="7", segmentation=Segmentation(case["segmentation"]), refine=refine,
                           params=SamplingParams(max_new_tokens=32, min_new_tokens=32, seed=1))
        calls, fe_s, fe_cpu_s = stages.calls["frontend"], stages.frontend_s, stages.frontend_cpu_s
        enc_s, enc_cpu_s = stages.encode_s, stages.encode_cpu_s
        out = Out()
        cpu0 = time.process_time()
        job = SynthesisJob(req=req, schedule=schedule, emit_tokens=4, arrival_s=time.monotonic())
        result = stream_audio(job, stages, out)
        cpu = time.process_time() - cpu0
        audio = np.concatenate(out.chunks).astype(np.float32)
        print(json.dumps({"ttfa_s": result.first_audio_s, "cpu_s": cpu,
                          "frontend_calls": stages.calls["frontend"] - calls,
                          "frontend_s": stages.frontend_s - fe_s, "frontend_cpu_s": stages.frontend_cpu_s - fe_cpu_s,
                          "text_s": stages.frontend_s - fe_s - (stages.encode_s - enc_s),
                          "text_cpu_s": stages.frontend_cpu_s - fe_cpu_s - (stages.encode_cpu_s - enc_cpu_s),
                          "segments": result.segments,
                          "audio_sha1": hashlib.sha1(audio.tobytes()).hexdigest()}), flush=True)


def _base_tree(commit: str, into: Path) -> Path:
    """``chattts_serving``, its profiles and voices, and ``tests/support`` as they were at
    ``commit`` (git archive)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "chattts_serving", "profiles", "voices",
                           "tests/__init__.py", "tests/support"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _start(root: Path, artifacts: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", "--artifacts", artifacts],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(root))
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() != "ready":
        pass
    return proc


def _ask(proc: subprocess.Popen[str], case: str) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(case + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the child ended without answering {case!r}")
    return dict(json.loads(line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", default=str(ROOT / "build" / "test" / "artifacts-small"))
    ap.add_argument("--base", default="886bd3b", help="the commit measured against this tree")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "results" / "frontend_once.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.artifacts, list(CASES))
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = _base_tree(args.base, Path(tmp))
        procs = {"before": _start(base, args.artifacts), "after": _start(ROOT, args.artifacts)}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {v: {c: [] for c in CASES} for v in procs}
        for case in CASES:
            for proc in procs.values():
                _ask(proc, case)  # warm-up
            for _ in range(args.runs):
                for version, proc in procs.items():
                    runs[version][case].append(_ask(proc, case))
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
    report: dict[str, Any] = {"base": args.base, "artifacts": args.artifacts, "runs": args.runs, "text": TEXT,
                              "host_cpus": os.cpu_count(), "cases": {}}
    for case in CASES:
        row: dict[str, Any] = {}
        for version in procs:
            rs = runs[version][case]
            row[version] = {"ttfa_s_median": statistics.median(r["ttfa_s"] for r in rs),
                            "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                            "frontend_calls": rs[0]["frontend_calls"],
                            "frontend_s_median": statistics.median(r["frontend_s"] for r in rs),
                            "frontend_cpu_s_median": statistics.median(r["frontend_cpu_s"] for r in rs),
                            "text_s_median": statistics.median(r["text_s"] for r in rs),
                            "text_cpu_s_median": statistics.median(r["text_cpu_s"] for r in rs),
                            "segments": rs[0]["segments"]}
        hashes = {r["audio_sha1"] for v in procs for r in runs[v][case]}
        row["same_audio"] = len(hashes) == 1
        row["ttfa_saved_s"] = row["before"]["ttfa_s_median"] - row["after"]["ttfa_s_median"]
        row["cpu_saved_s"] = row["before"]["cpu_s_median"] - row["after"]["cpu_s_median"]
        row["frontend_cpu_saved_s"] = row["before"]["frontend_cpu_s_median"] - row["after"]["frontend_cpu_s_median"]
        row["text_saved_s"] = row["before"]["text_s_median"] - row["after"]["text_s_median"]
        row["text_cpu_saved_s"] = row["before"]["text_cpu_s_median"] - row["after"]["text_cpu_s_median"]
        report["cases"][case] = row
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(report["cases"], indent=2))


if __name__ == "__main__":
    main()
