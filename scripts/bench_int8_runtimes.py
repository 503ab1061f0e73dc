"""The int8 step's MatMuls on other runtimes from PyPI: is there a faster CPU kernel to choose?

Times one graph of ``--layers`` 8-bit weight matrices in the step's own shape (hidden x 2
intermediate, the exported block size; :func:`chattts_serving.engine.kernels.probe_graph`) at
1, 4 and 16 rows, each runtime with 2 threads, interleaved in one process (median of the
rounds' medians):

- ONNX Runtime's ``MatMulNBits`` at each :data:`~chattts_serving.engine.kernels.KERNELS` level
  (what the engine runs and chooses among);
- OpenVINO on the same ONNX file (its ``FullyConnectedCompressed``), with fp32 inference and
  dynamic activation quantization per block of the weights' block size (the numerics of
  ``MatMulNBits`` level 4) and with fp32 over dequantized weights; skipped when ``openvino``
  is not installed (``pip install openvino``: not a dependency of the project);
- torch's ``_weight_int8pack_mm`` (8-bit weights, a scale per output channel) on bf16
  activations.

Prints a table and writes {"shape", "rows", "ms": {runtime: {rows: ms}}, "weight_gbps_b1",
"max_rel_error_vs_level4", "fp32_gemv_gbps", "cpu"} to ``--out``; ``fp32_gemv_gbps`` is the
bandwidth the benchmark's floor assumes (:func:`bench.floor.stream_bandwidth`), measured in the
same run. With ``--layers`` 16 (75 MB of weights at full size) the weights do not fit the
caches, as the step's 221 MB do not; the default 4 (19 MB) is the engine's start-up probe.

With ``--step ARTIFACTS`` (int8 graphs exported) it also runs the whole int8 step graph on
OpenVINO at B=1 and 4 over a past of 300 next to the engine's ONNX Runtime step (``step``
in the output: ms per step, the largest logit difference, or the error OpenVINO raised), and
the int8 vocoder graphs on one thread on both runtimes (``vocoders``: ms per window of 26 and
60 tokens, the audio's SNR against ONNX Runtime's).

    python scripts/bench_int8_runtimes.py --layers 16 --step artifacts/full --out results/int8_runtimes.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving.engine.kernels import KERNELS, cpu_features, probe_graph
from chattts_serving.native import median_ms
from chattts_serving.runtime import OrtOptions, make_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits at the repository root, not installed
from bench.floor import stream_bandwidth

HIDDEN, INTERMEDIATE, BLOCK = 768, 3072, 32
"""ChatTTS' GPT (hidden 768, intermediate 3072) and the exported block size."""
ROWS = (1, 4, 16)


def _median_ms(run: Callable[[np.ndarray], Any], x: np.ndarray, steps: int) -> float:
    run(x)
    return median_ms(lambda: run(x), steps)


def _ort_run(session: Any) -> Callable[[np.ndarray], Any]:
    return lambda x: session.run(None, {"x": x})[0]


def _ov_run(request: Any) -> Callable[[np.ndarray], Any]:
    return lambda x: request.infer({"x": x})[request.model_outputs[0]]


def candidates(graph: Path, layers: int, threads: int) -> dict[str, Callable[[np.ndarray], Any]]:
    """Runtime name -> a function of x (M, K) float32 that runs every layer once and returns
    the first layer's output (M, N)."""
    out: dict[str, Callable[[np.ndarray], Any]] = {}
    for name, level in KERNELS.items():
        sess = make_session(probe_graph(HIDDEN, 2 * INTERMEDIATE, BLOCK, level, layers), OrtOptions(threads))
        out[f"onnxruntime MatMulNBits {name} (level {level})"] = _ort_run(sess)
    try:
        import openvino as ov
    except ImportError:
        print("openvino is not installed: skipped")
    else:
        core = ov.Core()
        model = core.read_model(str(graph))
        base = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": "f32"}
        for name, group in ((f"int8 activations per {BLOCK}", BLOCK), ("fp32 activations", 0)):
            req = core.compile_model(model, "CPU", {**base, "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}
                                     ).create_infer_request()
            out[f"openvino {ov.__version__.split('-')[0]} {name}"] = _ov_run(req)
    import torch

    torch.set_num_threads(threads)
    rng = torch.Generator().manual_seed(0)
    weights = [torch.randint(-128, 128, (2 * INTERMEDIATE, HIDDEN), dtype=torch.int8, generator=rng)
               for _ in range(layers)]
    scales = [torch.rand(2 * INTERMEDIATE, generator=rng).to(torch.bfloat16) * 0.01 for _ in range(layers)]

    def torch_bf16(x: np.ndarray) -> Any:
        xt = torch.from_numpy(x).to(torch.bfloat16)
        results = [torch.ops.aten._weight_int8pack_mm(xt, w, s) for w, s in zip(weights, scales)]
        return results[0]
    out[f"torch {torch.__version__} _weight_int8pack_mm bf16"] = torch_bf16
    return out


def whole_step(artifacts: Path, threads: int, rounds: int, steps: int, past: int = 300) -> dict[str, Any]:
    """The int8 step graph on OpenVINO against the engine's ONNX Runtime step, per batch:
    {B: {"onnxruntime_ms", "openvino_ms", "max_abs_logit_diff"} or {"openvino_error"}}."""
    import openvino as ov

    from chattts_serving import contract
    from chattts_serving.contract import Precision
    from chattts_serving.engine.gpt import GptStepRunner
    from chattts_serving.runtime import Artifacts

    art = Artifacts.load(artifacts)
    runner = GptStepRunner(art, OrtOptions(threads, precision=Precision.INT8))
    core = ov.Core()
    request = core.compile_model(core.read_model(str(runner.graph)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": BLOCK}).create_infer_request()
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for b in (1, 4):
        embeds = rng.standard_normal((b, 1, art.hidden_size), dtype=np.float32)
        cache = runner.new_cache(b, past + 1)
        for buf in cache.buffers:
            buf[...] = rng.standard_normal(buf.shape, dtype=np.float32)
        lengths = np.full(b, past)
        feeds: dict[str, np.ndarray] = {"inputs_embeds": embeds, "seqlens_k": lengths.astype(np.int32),
                                        "total_sequence_length": np.array([past + 1], np.int32)}
        feeds.update(zip((n for i in range(runner.layers) for n in contract.past_names(i)), cache.buffers))
        logits = runner.decode(embeds, cache, lengths)[0]
        try:
            ov_logits = request.infer(feeds, share_inputs=True)["logits"]
        except RuntimeError as exc:
            out[str(b)] = {"openvino_error": str(exc).strip().splitlines()[-1]}
            continue
        def ort_step(x: np.ndarray, cache: Any = cache, lengths: np.ndarray = lengths) -> Any:
            return runner.decode(x, cache, lengths)

        def ov_step(x: np.ndarray, feeds: dict[str, np.ndarray] = feeds) -> Any:
            return request.infer({**feeds, "inputs_embeds": x}, share_inputs=True)
        ort_ms, ov_ms = [], []
        for _ in range(rounds):
            ort_ms.append(_median_ms(ort_step, embeds, steps))
            ov_ms.append(_median_ms(ov_step, embeds, steps))
        out[str(b)] = {"onnxruntime_ms": round(float(np.median(ort_ms)), 2),
                       "openvino_ms": round(float(np.median(ov_ms)), 2),
                       "max_abs_logit_diff": float(np.abs(ov_logits - logits).max())}
    return out


def vocoders(artifacts: Path, rounds: int, steps: int) -> dict[str, Any]:
    """The int8 vocoder graphs (offline form, one window) on ONNX Runtime and on OpenVINO, one
    thread each as the profiles run them: {graph: {tokens: {"onnxruntime_ms", "openvino_ms",
    "snr_db"}}}."""
    import openvino as ov

    core = ov.Core()
    out: dict[str, Any] = {}
    for name in ("vocoder_hidden.int8.onnx", "vocoder_codes.int8.onnx"):
        path = artifacts / name
        sess = make_session(path, OrtOptions(1))
        request = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": BLOCK}).create_infer_request()
        feed = sess.get_inputs()[0].name
        out[name] = {}
        for tokens in (26, 60):
            rng = np.random.default_rng(tokens)
            x = (rng.integers(0, 626, (1, tokens, 4)).astype(np.int32) if "codes" in name
                 else rng.standard_normal((1, tokens, HIDDEN), dtype=np.float32))
            ref = sess.run(None, {feed: x})[0]
            got = request.infer({feed: x})[request.model_outputs[0]]

            def ort_run(x: np.ndarray, sess: Any = sess, feed: str = feed) -> Any:
                return sess.run(None, {feed: x})

            def ov_run(x: np.ndarray, request: Any = request, feed: str = feed) -> Any:
                return request.infer({feed: x})
            ort_ms = [_median_ms(ort_run, x, steps) for _ in range(rounds)]
            ov_ms = [_median_ms(ov_run, x, steps) for _ in range(rounds)]
            out[name][str(tokens)] = {
                "onnxruntime_ms": round(float(np.median(ort_ms)), 2), "openvino_ms": round(float(np.median(ov_ms)), 2),
                "snr_db": round(float(10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2))), 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="weight matrices in the graph (default 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=7, help="timed runs per round")
    ap.add_argument("--step", type=Path, metavar="ARTIFACTS", help="also the whole int8 step on OpenVINO")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.step is not None:
        try:
            import openvino  # noqa: F401
        except ImportError:
            ap.error("--step runs OpenVINO: pip install openvino")
    with tempfile.TemporaryDirectory(prefix="int8_runtimes_") as tmp:
        graph = Path(tmp) / "probe.onnx"
        graph.write_bytes(probe_graph(HIDDEN, 2 * INTERMEDIATE, BLOCK, KERNELS["int8-activations"], args.layers))
        runs = candidates(graph, args.layers, args.threads)
        xs = {r: np.random.default_rng(r).standard_normal((r, HIDDEN), dtype=np.float32) for r in ROWS}
        reference = np.asarray(next(iter(runs.values()))(xs[4]), np.float32)
        errors: dict[str, float | None] = {}
        for name, run in runs.items():
            # torch's weights are its own random matrices: no error to compare
            errors[name] = (None if name.startswith("torch") else
                            float(np.abs(np.asarray(run(xs[4])) - reference).max() / np.abs(reference).max()))
        per_round: dict[str, dict[int, list[float]]] = {n: {r: [] for r in ROWS} for n in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                for r in ROWS:
                    per_round[name][r].append(_median_ms(run, xs[r], args.steps))
    ms = {n: {r: float(np.median(v)) for r, v in d.items()} for n, d in per_round.items()}
    gemv = float(stream_bandwidth(OrtOptions(args.threads))["bandwidth_gbps"])
    weight_bytes = args.layers * HIDDEN * 2 * INTERMEDIATE
    gbps_b1 = {n: round(weight_bytes / d[1] / 1e6, 1) for n, d in ms.items()}
    cpu = cpu_features()
    result = {"shape": {"k": HIDDEN, "n": 2 * INTERMEDIATE, "block_size": BLOCK, "layers": args.layers,
                        "weight_bytes": weight_bytes, "threads": args.threads},
              "rows": list(ROWS), "ms": {n: {str(r): round(v, 3) for r, v in d.items()} for n, d in ms.items()},
              "weight_gbps_b1": gbps_b1,
              "max_rel_error_vs_level4": errors, "fp32_gemv_gbps": round(gemv, 1), "cpu": cpu}
    width = max(len(n) for n in ms)
    print(f"{args.layers} x {HIDDEN}x{2 * INTERMEDIATE} 8-bit ({weight_bytes / 1e6:.0f} MB), {args.threads} threads, "
          f"median ms; {cpu['cpu_model']}")
    print(f"{'runtime':{width}s}  " + "  ".join(f"{'B=' + str(r):>8s}" for r in ROWS) + "  GB/s B=1  rel. error")
    for n, d in ms.items():
        err = errors[n]
        print(f"{n:{width}s}  " + "  ".join(f"{d[r]:8.2f}" for r in ROWS)
              + f"  {gbps_b1[n]:8.1f}  {'-' if err is None else f'{err:.1e}'}")
    print(f"the floor's fp32 GEMV probe: {gemv:.1f} GB/s")
    if args.step is not None:
        step = whole_step(args.step, args.threads, args.rounds, args.steps)
        result["step"] = step
        for b, fig in step.items():
            print(f"whole int8 step, past 300, B={b}: {fig}")
        voc = vocoders(args.step, args.rounds, args.steps)
        result["vocoders"] = voc
        for name, per in voc.items():
            print(f"{name}, one thread: {per}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
