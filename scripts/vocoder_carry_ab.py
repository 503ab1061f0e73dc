"""The carried vocoder against the windowed mode, A/B in one process: vocoder CPU per generated
token, tokens vocoded per generated token, and the distance from the offline decode.

Tokens come from the exported GPT itself (as scripts/lookahead_snr.py makes them). Each round
streams utterances of several lengths (prefixes of the generated sequence) through the ``cpu``
profile's chunk schedule, tokens arriving ``emit_tokens`` at a time, once windowed (each window
decoded alone with its left context: ``VocoderRunner``) and once carried (``VocoderStream``),
the two modes' order alternating round by round; the CPU time of the vocoder calls alone is
taken (``time.process_time``, the vocoder on the profile's ``[vocoder] intra_op_threads``).
Writes results/vocoder_carry_ab.json and prints Markdown tables.

    .venv/bin/python scripts/vocoder_carry_ab.py --artifacts artifacts/full
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving.audio.chunking import ChunkSchedule, StreamChunker, vocoded_tokens
from chattts_serving.audio.vocoder import StreamingVocoderRunner, VocoderRunner
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.request import SequenceRequest
from chattts_serving.engine.scheduler import Engine
from chattts_serving.engine.sequence import Sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import load_profile


def generate(art: Artifacts, tokens: int) -> dict[str, np.ndarray]:
    """Hidden states and codes of one ``tokens``-token utterance from the exported GPT."""
    profile = load_profile("cpu")
    eng = Engine(GptStepRunner(art), Embeddings(art), profile.engine.engine_config())
    keep = CollectingSink()
    ids = np.array([21131, 21143, 21168 + 5, *range(1000, 1030), 21132])
    spk = np.random.default_rng(0).normal(size=art.hidden_size).astype(np.float32)
    eng.submit(Sequence(SequenceRequest(ids, spk / np.linalg.norm(spk),
                                        SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens), emit_tokens=64),
                        keep))
    while eng.live_count():
        eng.run_once()
    return {"hidden": np.concatenate(keep.hidden), "codes": np.concatenate(keep.codes)}


def stream(schedule: ChunkSchedule, x: np.ndarray, emit: int, windowed: VocoderRunner,
           carried: StreamingVocoderRunner) -> tuple[np.ndarray, float, int]:
    """``x`` streamed on ``schedule`` (carried or not), ``emit`` tokens per arrival: (audio,
    CPU seconds of the vocoder calls, tokens vocoded)."""
    n = len(x)
    ch, out, avail, cpu, vocoded = StreamChunker(schedule), [], 0, 0.0, 0
    state = carried.open() if schedule.carried else None
    while not ch.done:
        avail = min(n, avail + emit)
        while (w := ch.next_window(avail, avail == n)) is not None:
            t0 = time.process_time()
            if state is None:
                audio = windowed.run(x[None, w.start:w.end])[0]
            else:
                audio = state.vocode(x[w.start:w.end], w.start, w.final, ch.carry_point(w))
            cpu += time.process_time() - t0
            vocoded += w.end - w.start
            out.append(ch.emit(w, audio))
    return np.concatenate(out), cpu, vocoded


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - ref) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(noise, 1e-30)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/full"))
    ap.add_argument("--lengths", default="40,100,300", help="utterance lengths in tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("results/vocoder_carry_ab.json"))
    args = ap.parse_args()
    art = Artifacts.load(args.artifacts)
    profile = load_profile("cpu")
    lengths = [int(v) for v in args.lengths.split(",")]
    data = generate(art, max(lengths))
    opts = profile.ort("vocoder")
    base = profile.stream.schedule().windowed()
    modes = {"windowed": base, "carried": base.with_carried_state()}
    emit = profile.stream.emit_tokens
    quality: list[dict[str, Any]] = []
    cost: dict[str, dict[str, Any]] = {}
    for path in ("hidden", "codes"):
        windowed, carried = VocoderRunner(art, path, opts), StreamingVocoderRunner(art, path, opts)
        x = data[path]
        offline = windowed.run(x[None])[0]
        rf = art.receptive_field_tokens(path)
        for label, look in (("profile", None), ("receptive field", rf)):
            row: dict[str, Any] = {"path": path, "lookahead": label if look is None else f"{label} ({look})"}
            for mode, sched in modes.items():
                audio, _, _ = stream(sched if look is None else sched.with_lookahead(look), x, emit, windowed, carried)
                row[f"{mode}_snr_db"] = round(snr_db(offline, audio), 1)
                row[f"{mode}_max_abs_error"] = float(np.abs(audio - offline).max())
            quality.append(row)
        for n in lengths:
            per: dict[str, Any] = {m: {"cpu_s": [], "vocoded_tokens": vocoded_tokens(s, n)} for m, s in modes.items()}
            for r in range(args.rounds):
                order = list(modes) if r % 2 == 0 else list(reversed(modes))
                for mode in order:
                    _, cpu, vocoded = stream(modes[mode], x[:n], emit, windowed, carried)
                    assert vocoded == per[mode]["vocoded_tokens"]
                    per[mode]["cpu_s"].append(cpu)
            for mode in modes:
                p = per[mode]
                p["cpu_ms_per_token_median"] = round(1000 * float(np.median(p["cpu_s"])) / n, 3)
                p["vocoded_tokens_per_token"] = round(p["vocoded_tokens"] / n, 3)
            per["cpu_ratio_carried_over_windowed"] = round(
                per["carried"]["cpu_ms_per_token_median"] / per["windowed"]["cpu_ms_per_token_median"], 3)
            cost[f"{path}/{n}"] = per
    machine = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}
    with contextlib.suppress(OSError, StopIteration):
        machine["cpu_model"] = next(line.split(":", 1)[1].strip() for line in
                                    Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"artifacts": str(args.artifacts), "sizes": art.manifest["sizes"],
                                    "vocoder_threads": opts.intra_op_threads, "precision": str(opts.precision),
                                    "rounds": args.rounds, "machine": machine, "quality": quality, "cost": cost},
                                   indent=2))
    print("| path | lookahead | windowed SNR (dB) | carried SNR (dB) | windowed max err | carried max err |")
    print("|---|---|---|---|---|---|")
    for q in quality:
        print(f"| {q['path']} | {q['lookahead']} | {q['windowed_snr_db']} | {q['carried_snr_db']} "
              f"| {q['windowed_max_abs_error']:.1e} | {q['carried_max_abs_error']:.1e} |")
    print()
    print("| path / tokens | vocoded per token, windowed / carried | CPU ms per token, windowed / carried | ratio |")
    print("|---|---|---|---|")
    for key, per in cost.items():
        w, c = per["windowed"], per["carried"]
        print(f"| {key} | {w['vocoded_tokens_per_token']} / {c['vocoded_tokens_per_token']} "
              f"| {w['cpu_ms_per_token_median']} / {c['cpu_ms_per_token_median']} "
              f"| {per['cpu_ratio_carried_over_windowed']} |")


if __name__ == "__main__":
    main()
