"""int8 on CPU: which quantized GPT step graph to keep, and whether the vocoders gain from int8.

Usage: python scripts/bench_int8.py ARTIFACTS [--batches 1,4,16] [--past 300] [--rounds 7]
          [--steps 10] [--threads 2] [--parts gpt,parity,vocoders] [--out results/int8_bench.json]

ARTIFACTS: an exported (fp32) artifact directory, full size for figures that mean anything
(``python -m chattts_serving.export --synthetic --size full``). Candidates, all from its
``gpt_step.onnx`` and quantized into a temporary directory:

- ``fp32``: the graph itself;
- ``int8-b<N>``: 8-bit weight-only ``MatMulNBits`` (``chattts_serving.export.int8.quantize_graph``,
  symmetric, blocks of N input rows from ``--blocks``, accuracy level 4: int8 activations inside
  the kernel; block 32 with fp32 code heads is what ``chattts-export --precision int8`` writes);
- ``int4-b128``: the same in 4 bits (for reference: measured too inaccurate to ship);
- ``int8-b32-heads-fp32-level<L>`` for each ``--levels`` L other than 4: the exported graph with
  another ``MatMulNBits`` kernel (1: fp32 activations; the candidates of the start-up probe,
  ``chattts_serving.engine.kernels``).

Measurements, as the ``cpu`` profile runs ONNX Runtime (``--threads`` intra-op threads,
spinning off):

1. GPT decode step (T = 1) at each batch over a random past of ``--past`` positions: per
   round, the median of ``--steps`` timed steps (after 2 untimed), candidates interleaved
   within each round so that load from other processes hits all of them; the figure is the
   median over ``--rounds`` rounds (the minimum round is reported too);
2. accuracy of each quantized candidate against fp32 on the export parity prompts
   (``chattts_serving.export.int8.int8_parity``: top-1 agreement, logit and hidden errors);
   with ``--parts accuracy`` also as ``make int8-accuracy`` measures it (the 20 benchmark
   sentences, >= 1000 teacher-forced decode steps, vocoded SNR);
3. vocoders (hidden and codes paths), fp32 against the exported int8 vocoders, on 1 s and
   5 s windows (47 and 235 tokens) of a real token stream (the fp32 GPT decoding a benchmark
   sentence), batch 1: median ms over the rounds, and the SNR of the int8 audio against fp32;
   then the whole stream vocoded as the server streams it (the ``cpu`` profile's chunk
   schedule) by each, SNR against the offline fp32 decode.

Prints Markdown tables and writes JSON. On a shared 2-core host expect +-20 % noise or more:
compare candidates within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.audio.vocoder import VocoderRunner
from chattts_serving.engine.gpt import GptStepRunner
from chattts_serving.export import int8
from chattts_serving.runtime import Artifacts, OrtOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench import load_sentences
from bench.rawstep import time_steps

LINKED = (contract.GPT_GRAPH, contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH, contract.EMBED_FILE,
          contract.SPEAKER_FILE, contract.TOKENIZER_DIR)


def candidate_dir(src: Artifacts, work: Path, name: str, graphs: dict[str, str]) -> Artifacts:
    """An artifact view in ``work/name``: ``src``'s files linked, ``graphs`` ({fp32 graph: file
    in that folder}) listed as its int8 variants, so that the runtime loads them as int8."""
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    for f in LINKED:
        if not (d / f).exists():
            os.symlink((src.root / f).resolve(), d / f)
    manifest = {**src.manifest, "precisions": {"int8": dict(graphs)}}
    (d / contract.MANIFEST).write_text(json.dumps(manifest))
    return Artifacts.load(d)


def cpu_flags() -> list[str]:
    """The CPU's AVX/VNNI/AMX flags from /proc/cpuinfo ([] where unreadable)."""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags.split() if "avx" in f or "vnni" in f or "amx" in f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--past", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="gpt,parity,vocoders", help="what to measure (comma-separated)")
    ap.add_argument("--blocks", default="32,128", help="block sizes of the 8-bit candidates (comma-separated)")
    ap.add_argument("--heads-fp32", action="store_true", help="also each 8-bit candidate with fp32 code heads")
    ap.add_argument("--no-int4", dest="int4", action="store_false", help="skip the 4-bit reference candidate")
    ap.add_argument("--levels", default="", help="MatMulNBits accuracy levels besides 4 of the exported graph "
                                                 "(comma-separated, e.g. 1)")
    ap.add_argument("--out", type=Path, default=Path("results/int8_bench.json"))
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    parts = set(args.parts.split(","))
    blocks = [int(b) for b in args.blocks.split(",")]
    opts = OrtOptions(args.threads, False)
    src = Artifacts.load(args.artifacts)
    t_start = time.perf_counter()
    result: dict[str, Any] = {"artifacts": str(args.artifacts), "config": src.manifest["config"],
                              "past_tokens": args.past, "rounds": args.rounds, "steps_per_round": args.steps,
                              "intra_op_threads": args.threads, "allow_spinning": False,
                              "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
                              "cpus": os.cpu_count(), "load_avg_start": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="bench_int8_") as tmp:
        work = Path(tmp)
        gpt = src.root / contract.GPT_GRAPH
        makers = {f"int8-b{blk}": (lambda dst, blk=blk: int8.quantize_graph(gpt, dst, 8, blk)) for blk in blocks}
        if args.heads_fp32:
            makers.update({f"int8-b{blk}-heads-fp32": (lambda dst, blk=blk: int8.quantize_graph(
                gpt, dst, 8, blk, keep_fp32=("heads.weight",))) for blk in blocks})
        if args.int4:
            makers["int4-b128"] = lambda dst: int8.quantize_graph(gpt, dst, 4, 128)
        for level in (int(v) for v in args.levels.split(",") if v):
            makers[f"int8-b32-heads-fp32-level{level}"] = (lambda dst, level=level: int8.quantize_graph(
                gpt, dst, 8, 32, accuracy_level=level, keep_fp32=("heads.weight",)))
        arts: dict[str, Artifacts] = {}
        sizes = {"fp32": gpt.stat().st_size}
        quantize_s = {}
        for name, make in makers.items() if parts & {"gpt", "parity", "accuracy"} else ():
            d = work / name
            d.mkdir()
            t = time.perf_counter()
            make(d / f"gpt_step.{name}.onnx")
            quantize_s[name] = round(time.perf_counter() - t, 1)
            sizes[name] = (d / f"gpt_step.{name}.onnx").stat().st_size
            arts[name] = candidate_dir(src, work, name, {contract.GPT_GRAPH: f"gpt_step.{name}.onnx"})
            print(f"{name}: quantized in {quantize_s[name]} s, {sizes[name] / 1e6:.0f} MB", flush=True)
        result["graph_bytes"] = sizes
        result["quantize_s"] = quantize_s

        # 1. GPT step timings, candidates interleaved per round.
        runners: dict[str, GptStepRunner] = {}
        if "gpt" in parts:
            int8_opts = OrtOptions(args.threads, False, precision="int8")
            runners = {"fp32": GptStepRunner(src, opts), **{k: GptStepRunner(a, int8_opts) for k, a in arts.items()}}
        per_round: dict[str, dict[int, list[float]]] = {k: {b: [] for b in batches} for k in runners}
        rng = np.random.default_rng(0)
        for r in range(args.rounds if runners else 0):
            for b in batches:
                for k, runner in runners.items():
                    times = time_steps(runner, b, args.past, args.steps, 2, rng)
                    per_round[k][b].append(statistics.median(times) * 1e3)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k} " + "/".join(f"{per_round[k][b][-1]:.1f}" for b in batches) for k in runners), flush=True)
        result["gpt_step_ms"] = {k: {str(b): summary(v[b]) for b in batches} for k, v in per_round.items()}
        # Prefill through the same graph: one 60-token prompt, and 4 prompts right-padded to 60.
        prefill: dict[str, dict[str, list[float]]] = {k: {"b1_t60": [], "b4_padded_t60": []} for k in runners}
        for _ in range(args.rounds if runners else 0):
            for k, runner in runners.items():
                for key, lengths in (("b1_t60", [60]), ("b4_padded_t60", [60, 45, 30, 52])):
                    x = rng.standard_normal((len(lengths), 60, src.hidden_size), dtype=np.float32)
                    t = time.perf_counter()
                    runner.prefill(x, np.array(lengths))
                    prefill[k][key].append((time.perf_counter() - t) * 1e3)
        result["prefill_ms"] = {k: {key: summary(v) for key, v in d.items()} for k, d in prefill.items()}
        del runners

        # 2. accuracy of each candidate on the export parity prompts.
        result["parity_vs_fp32"] = {}
        for k, a in arts.items() if "parity" in parts else ():
            result["parity_vs_fp32"][k] = int8.int8_parity(a, opts)
            print(f"{k}: parity {result['parity_vs_fp32'][k]}", flush=True)

        # 2b. accuracy of every candidate as make int8-accuracy measures it (>= 1000 decode steps),
        # the fp32 reference run once per step for all of them.
        if "accuracy" in parts:
            result["accuracy"] = accuracy_all(src, arts, opts)
            for k, v in result["accuracy"].items():
                print(f"{k}: accuracy {v}", flush=True)

        # 3. vocoders.
        if "vocoders" in parts:
            result["vocoders"] = bench_vocoders(src, work, opts, args.rounds)
    result["load_avg_end"] = list(os.getloadavg())
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(tables(result, batches))
    print(f"wrote {args.out}")
    return 0


def accuracy_all(src: Artifacts, arts: dict[str, Artifacts], opts: OrtOptions) -> dict[str, Any]:
    """Teacher-forced top-1 agreement per head and hidden-path SNR of each candidate against
    fp32 over the 20 benchmark sentences (>= 1000 decode steps), as
    ``chattts_serving.export.int8.accuracy_report`` measures one, sharing the reference."""
    from chattts_serving.engine.gpt import Embeddings
    from chattts_serving.engine.sampling import RequestSampler, sample_batch
    from chattts_serving.params import SamplingParams

    texts = load_sentences()
    steps = -(-int8.MIN_ACCURACY_DECODE_STEPS // len(texts)) + 1
    ref = GptStepRunner(src, opts)
    cands = {k: GptStepRunner(a, OrtOptions(opts.intra_op_threads, False, precision="int8")) for k, a in arts.items()}
    emb = Embeddings(src)
    vocoder = VocoderRunner(src, "hidden", opts)
    runs: dict[str, list[Any]] = {k: [] for k in cands}
    snr: dict[str, list[float]] = {k: [] for k in cands}
    for i, prompt in enumerate(int8._prompts(src, texts, int8.ACCURACY_VOICE)):
        sampler = RequestSampler(SamplingParams(seed=i, max_new_tokens=steps, min_new_tokens=steps))
        n = len(prompt)
        runners = {"ref": ref, **cands}
        caches = {k: r.new_cache(1, n + steps) for k, r in runners.items()}
        logs: dict[str, tuple[list[Any], list[Any]]] = {k: ([], []) for k in runners}
        x = prompt[None].astype(np.float32)
        codes = []
        for step in range(steps):
            for k, r in runners.items():
                if step == 0:
                    lg, hd, kv = r.prefill(x, np.array([n]))
                    caches[k].copy_row(0, kv, 0, n)
                else:
                    lg, hd = r.decode(x, caches[k], np.array([n + step - 1]))
                logs[k][0].append(lg[0])
                logs[k][1].append(hd[0])
            c = sample_batch(logs["ref"][0][-1][None], [sampler])[0]
            sampler.record(c)
            codes.append(c)
            x = emb.codes(c[None])[:, None, :].astype(np.float32)
        rl, rh = np.stack(logs["ref"][0]), np.stack(logs["ref"][1])
        a_ref = vocoder.run(rh[None])[0]
        for k in cands:
            ch = np.stack(logs[k][1])
            runs[k].append(int8.TeacherForced(np.stack(codes), rl, np.stack(logs[k][0]), rh, ch))
            snr[k].append(int8.snr_db(a_ref, vocoder.run(ch[None])[0]))
        print(f"accuracy: prompt {i + 1}/{len(texts)}", flush=True)
    out = {}
    for k in cands:
        c = int8.compare_runs(runs[k])
        out[k] = {"top1_agreement": [round(a, 4) for a in c["top1_agreement"]],
                  "top1_agreement_min": round(c["top1_agreement_min"], 4), "decode_steps": c["decode_steps"],
                  "hidden_rel_err_mean": round(c["hidden_rel_err_mean"], 4),
                  "audio_snr_db_min": round(min(snr[k]), 2), "audio_snr_db_mean": round(statistics.mean(snr[k]), 2)}
    return out


def summary(ms: list[float]) -> dict[str, float]:
    """Median and minimum of per-round figures in ms."""
    return {"median": round(statistics.median(ms), 2), "min": round(min(ms), 2)}


def bench_vocoders(src: Artifacts, work: Path, opts: OrtOptions, rounds: int) -> dict[str, Any]:
    """fp32 vs the int8 vocoders (as ``chattts-export --precision int8`` makes them) on 1 s and
    5 s windows of a real token stream."""
    files = {g: contract.INT8_GRAPH_FILES[g] for g in (contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH)}
    d = work / "voc-int8"
    d.mkdir()
    for s, dst in files.items():
        int8.quantize_graph(src.root / s, d / dst, block_size=int8.INT8_VOCODER_BLOCK_SIZE, keep_fp32=())
    art8 = candidate_dir(src, work, "voc-int8", files)
    ref = GptStepRunner(src, opts)
    embeds = int8._prompts(src, load_sentences()[:1], int8.ACCURACY_VOICE)[0]
    run = int8.teacher_forced(ref, ref, embeds, 235)  # one stream, 5 s of audio
    del ref
    inputs = {"hidden": run.ref_hidden, "codes": run.codes.astype(np.int32)}
    out: dict[str, Any] = {"graph_bytes": {f: (d / f).stat().st_size for f in files.values()}}
    for path in ("hidden", "codes"):
        v32 = VocoderRunner(src, path, opts)
        v8 = VocoderRunner(art8, path, OrtOptions(opts.intra_op_threads, False, precision="int8"))
        for seconds, tokens in ((1, 47), (5, 235)):
            x = inputs[path][None, :tokens]
            a32, a8 = v32.run(x), v8.run(x)
            times: dict[str, list[float]] = {"fp32": [], "int8": []}
            for _ in range(rounds):
                for k, v in (("fp32", v32), ("int8", v8)):
                    t = time.perf_counter()
                    v.run(x)
                    times[k].append((time.perf_counter() - t) * 1e3)
            key = f"{path}_{seconds}s"
            out[key] = {"fp32_ms": summary(times["fp32"]), "int8_ms": summary(times["int8"]),
                        "snr_db": round(int8.snr_db(a32[0], a8[0]), 2), "tokens": tokens}
            print(f"vocoder {key}: {out[key]}", flush=True)
        # streamed through the cpu profile's chunk schedule, against the offline fp32 decode
        x = inputs[path][None]
        offline = v32.run(x)[0]
        out[f"{path}_streamed_snr_db"] = {k: round(int8.snr_db(offline, streamed(v, x[0])), 2)
                                          for k, v in (("fp32", v32), ("int8", v8))}
        print(f"vocoder {path} streamed: {out[f'{path}_streamed_snr_db']}", flush=True)
    return out


def streamed(voc: VocoderRunner, x: np.ndarray) -> np.ndarray:
    """``x`` (T, ...) vocoded as the server streams it: the ``cpu`` profile's chunk schedule,
    tokens arriving 3 at a time (as scripts/lookahead_snr.py)."""
    from chattts_serving.audio.chunking import StreamChunker
    from chattts_serving.serving.profile import load_profile

    ch, out, avail, n = StreamChunker(load_profile("cpu").stream.schedule()), [], 0, len(x)
    while not ch.done:
        avail = min(n, avail + 3)
        while (w := ch.next_window(avail, avail == n)) is not None:
            out.append(ch.emit(w, voc.run(x[None, w.start:w.end])[0]))
    return np.concatenate(out)


def tables(result: dict[str, Any], batches: list[int]) -> str:
    """The results as Markdown tables."""
    lines = [f"GPT decode step, past {result['past_tokens']}, {result['intra_op_threads']} threads, spinning off: "
             f"median (min) over {result['rounds']} rounds of the median of {result['steps_per_round']} steps, ms",
             "",
             "| graph | MB | " + " | ".join(f"B={b}" for b in batches) + " | top-1 min | hidden err |",
             "|---|---|" + "---|" * len(batches) + "---|---|"]
    for k, v in result["gpt_step_ms"].items():
        p = result["parity_vs_fp32"].get(k)
        acc = f"{p['top1_agreement_min']:.3f} | {p['hidden_rel_err_mean']:.4f}" if p else "- | -"
        lines.append(f"| {k} | {result['graph_bytes'][k] / 1e6:.0f} | "
                     + " | ".join(f"{v[str(b)]['median']:.1f} ({v[str(b)]['min']:.1f})" for b in batches)
                     + f" | {acc} |")
    if result.get("prefill_ms"):
        lines += ["", "| graph | prefill B=1, 60 tokens, ms | prefill B=4 right-padded to 60, ms |", "|---|---|---|"]
        for k, v in result["prefill_ms"].items():
            lines.append(f"| {k} | {v['b1_t60']['median']:.1f} ({v['b1_t60']['min']:.1f}) | "
                         f"{v['b4_padded_t60']['median']:.1f} ({v['b4_padded_t60']['min']:.1f}) |")
    if "vocoders" in result:
        lines += ["", "| vocoder window, batch 1 | fp32 ms median (min) | int8 ms median (min) | int8 SNR dB |",
                  "|---|---|---|---|"]
        for k, v in result["vocoders"].items():
            if "_streamed_" in k:
                lines.append(f"| {k}: fp32 {v['fp32']} dB, int8 {v['int8']} dB vs the offline fp32 decode | | | |")
            elif k != "graph_bytes":
                f, i = v["fp32_ms"], v["int8_ms"]
                lines.append(f"| {k} | {f['median']} ({f['min']}) | {i['median']} ({i['min']}) | {v['snr_db']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
