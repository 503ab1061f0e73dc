"""Which CPU kernel runs the int8 GPT step on this host, chosen at start-up by a short probe.

The int8 step graph (``chattts-export --precision int8``, :mod:`chattts_serving.export.int8`)
holds ONNX Runtime ``MatMulNBits`` nodes whose ``accuracy_level`` attribute picks the kernel
that multiplies: 4 quantizes each activation block to int8 and multiplies in int8 (VNNI where
the CPU has it, AMX where ONNX Runtime's MLAS uses it), 1 dequantizes the 8-bit weights and
multiplies in fp32. The weights and their scales are the same in both, so the tokens' accuracy
is that of the exported graph at level 4 or better (level 1 rounds only the weights). Which is
faster depends on the instruction set and the ONNX Runtime build, not on the model: rather
than a choice that holds on one CPU, :func:`choose_int8_kernel` times a few decode steps of
each candidate (:data:`KERNELS`) on the host at start-up and keeps the fastest; the choice and
the timings are logged and kept on the runner (``GptStepRunner.kernel``).

:func:`cpu_features` reads the CPU model and the instruction-set flags that decide it (the
benchmark records them next to its figures).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import contract
from ..contract import Precision
from ..runtime import make_session

if TYPE_CHECKING:
    from .gpt import GptStepRunner

log = logging.getLogger(__name__)

KERNELS: dict[str, int] = {"int8-activations": 4, "fp32-activations": 1}
"""Candidate kernels of the int8 step: name -> ``MatMulNBits`` ``accuracy_level``. The first is
what the export writes (and the choice when the probe cannot tell them apart)."""

PROBE_BATCHES = (1, 16)
"""Batch sizes the probe times (one stream, a full batch); the score is their sum of step ms."""
PROBE_PAST_TOKENS = 128
PROBE_STEPS = 3
"""Timed decode steps per batch size (after one untimed); the figure is their median."""
PROBE_GIVE_UP = 3.0
"""A candidate whose untimed first B=1 step takes this many times the best candidate's whole
score is dropped without more steps (a kernel that is an order of magnitude slower on this
CPU would otherwise cost seconds of start-up)."""

CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")
"""The instruction-set flags that decide which int8/bf16 kernels a CPU can run."""


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """{"cpu_model": str | None, "cpu_flags": [those of :data:`CPU_FLAGS` the CPU has]} from
    ``/proc/cpuinfo`` (None and [] where it cannot be read, e.g. not Linux)."""
    model: str | None = None
    flags: set[str] = set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def with_accuracy_level(model: Path | bytes, level: int) -> bytes:
    """The serialized ONNX ``model`` (a file or bytes) with every ``MatMulNBits`` node's
    ``accuracy_level`` set to ``level``. Raises ValueError when it has no such node."""
    import onnx

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    nodes = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    if not nodes:
        raise ValueError("the graph has no MatMulNBits node")
    for n in nodes:
        attrs = [a for a in n.attribute if a.name == "accuracy_level"]
        if attrs:
            attrs[0].i = level
        else:
            n.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    return bytes(proto.SerializeToString())


@dataclass
class KernelChoice:
    """The probe's outcome: ``chosen`` (a :data:`KERNELS` name), ``step_ms`` per candidate
    {name: {batch: median ms}} ({} for a candidate dropped early: ``dropped``), the
    ``cpu`` features and the probe's wall time (s)."""

    chosen: str
    step_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    cpu: dict[str, Any] = field(default_factory=dict)
    probe_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "accuracy_level": KERNELS[self.chosen],
                "step_ms": {k: {str(b): round(v, 3) for b, v in d.items()} for k, d in self.step_ms.items()},
                "dropped": self.dropped, **self.cpu, "probe_s": round(self.probe_s, 2)}


def _step_ms(runner: GptStepRunner, batch: int, past: int, steps: int, rng: np.random.Generator,
             give_up_ms: float | None = None) -> float | None:
    """Median ms of ``steps`` decode steps of ``batch`` rows over a random past of ``past``
    positions (after one untimed step); None when that first step took longer than ``give_up_ms``."""
    cache = runner.new_cache(batch, past + 1)
    for buf in cache.buffers:
        buf[...] = cache.backend.to_device(rng.standard_normal(buf.shape, dtype=np.float32).astype(runner.kv_dtype))
    embeds = rng.standard_normal((batch, 1, runner.art.hidden_size), dtype=np.float32)
    lengths = np.full(batch, past, np.int64)
    t = time.perf_counter()
    runner.decode(embeds, cache, lengths)
    if give_up_ms is not None and (time.perf_counter() - t) * 1e3 > give_up_ms:
        return None
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        runner.decode(embeds, cache, lengths)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def _use(runner: GptStepRunner, session: Any) -> None:
    runner.session = session
    runner._bound = None  # an IOBinding belongs to the session that made it


def runs_int8(runner: GptStepRunner) -> bool:
    """True when ``runner`` loaded the int8 step graph its artifacts list (``precisions.int8``)."""
    int8 = runner.art.manifest.get("precisions", {}).get(str(Precision.INT8), {})
    return bool(int8.get(contract.GPT_GRAPH)) and runner.graph.name == int8[contract.GPT_GRAPH]


def choose_int8_kernel(runner: GptStepRunner, kernels: dict[str, int] | None = None, *,
                       steps: int = PROBE_STEPS, past: int = PROBE_PAST_TOKENS) -> KernelChoice | None:
    """Time each of ``kernels`` (default :data:`KERNELS`) on ``runner``'s int8 step graph and
    leave the runner on the fastest; returns the :class:`KernelChoice` (also logged at INFO),
    or None when the runner does not run the int8 graph (:func:`runs_int8`: nothing to choose).
    The runner's current session counts as the first candidate (the exported kernel) and is
    kept when it wins; the others are the same graph (as the runner loaded it, KV cache
    precision included) with another ``accuracy_level``. A candidate whose session cannot be
    made is dropped with a warning."""
    from .gpt import load_step_graph

    if not runs_int8(runner):
        return None
    kernels = dict(KERNELS if kernels is None else kernels)
    model = load_step_graph(runner.art, runner.graph, getattr(runner, "kv_precision", runner.opts.kv_cache))
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    names = list(kernels)
    sessions: dict[str, Any] = {names[0]: runner.session}
    step_ms: dict[str, dict[int, float]] = {}
    dropped: list[str] = []
    best: float | None = None
    for name in names:
        if name not in sessions:
            try:
                sessions[name] = make_session(with_accuracy_level(model, kernels[name]), runner.opts)
            except Exception as exc:  # a kernel this onnxruntime build refuses: not a candidate
                log.warning("int8 kernel %s: no session (%s)", name, exc)
                dropped.append(name)
                continue
        _use(runner, sessions[name])
        times: dict[int, float] = {}
        for b in PROBE_BATCHES:
            ms = _step_ms(runner, b, past, steps, rng, None if best is None else PROBE_GIVE_UP * best)
            if ms is None:
                break
            times[b] = ms
        if len(times) < len(PROBE_BATCHES):
            dropped.append(name)
            sessions.pop(name)
            continue
        step_ms[name] = times
        score = sum(times.values())
        best = score if best is None else min(best, score)
    chosen = min(step_ms, key=lambda k: sum(step_ms[k].values())) if step_ms else names[0]
    _use(runner, sessions[chosen])
    choice = KernelChoice(chosen, step_ms, dropped, cpu_features(), time.perf_counter() - started)
    log.info("int8 GPT kernel: %s (MatMulNBits accuracy_level %d) on %s [%s]; probe step ms %s%s, %.1f s",
             chosen, kernels[chosen], choice.cpu["cpu_model"], " ".join(choice.cpu["cpu_flags"]),
             {k: {b: round(v, 1) for b, v in d.items()} for k, d in step_ms.items()},
             f", dropped {dropped}" if dropped else "", choice.probe_s)
    return choice
