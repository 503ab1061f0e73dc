"""Which CPU kernel runs the int8 GPT step on this host, chosen at start-up by a short probe.

The int8 step graph (``chattts-export --precision int8``, :mod:`chattts_serving.export.int8`)
holds ONNX Runtime ``MatMulNBits`` nodes whose ``accuracy_level`` attribute picks the kernel
that multiplies: 4 quantizes each activation block to int8 and multiplies in int8 (VNNI where
the CPU has it, AMX where ONNX Runtime's MLAS uses it), 1 dequantizes the 8-bit weights and
multiplies in fp32. The weights and their scales are the same in both, so the tokens' accuracy
is that of the exported graph at level 4 or better (level 1 rounds only the weights). Which is
faster depends on the instruction set and the ONNX Runtime build, not on the model: rather
than a choice that holds on one CPU, :func:`choose_int8_kernel` times each candidate
(:data:`KERNELS`) on the host at start-up, on a few ``MatMulNBits`` of the step's own shape,
and runs the step on the fastest; the choice and the timings are logged (and returned, for the
benchmark's record). A third candidate is our own kernel (:data:`OWN_KERNEL`,
:mod:`chattts_serving.int8_kernel`), with level 4's numerics.

Over an int8 KV cache the attention is chosen the same way (:func:`choose_attention`): ONNX
Runtime's ``GroupQueryAttention`` or ours (``chattts.Int8KvAttention``), timed on a few nodes of
the step's shape; :func:`choose_kernels` makes both choices, as the engine does at start-up.

:func:`cpu_features` reads the CPU model and the instruction-set flags that decide it (the
benchmark records them next to its figures).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import contract
from ..contract import Precision
from ..int8_kernel import ATTENTION_NAME, NAME, KernelUnavailable
from ..runtime import make_session

if TYPE_CHECKING:
    from .gpt import GptStepRunner

log = logging.getLogger(__name__)

KERNELS: dict[str, int] = {"int8-activations": 4, "fp32-activations": 1}
"""ONNX Runtime's candidate kernels of the int8 step: name -> ``MatMulNBits`` ``accuracy_level``.
The first is what the export writes (and the choice when no candidate could be timed)."""
OWN_KERNEL = NAME
"""The candidate that swaps ``MatMulNBits`` for our op (:mod:`chattts_serving.int8_kernel`: the numerics of
level 4, AVX-512 VNNI), where it builds and this CPU runs it."""

PROBE_BATCHES = (1, 16)
"""Rows the probe multiplies (one stream, a full batch); a candidate's score is the sum of its
fastest ms at each."""
PROBE_STEPS = 9
"""Timed runs per candidate and batch size (after one untimed), the candidates taking turns run
by run (:func:`race`); the figure is the fastest run. A server's engine probes while its other
models start on the other core: timed one after the other, a candidate could lose by the load
it happened to meet (docs/decode-speed.md, "The probe under load")."""
PROBE_GIVE_UP = 5.0
"""A candidate whose untimed first runs take this many times the fastest candidate's are
dropped without being timed (a kernel 100 times slower would otherwise cost seconds)."""
PROBE_LAYERS = 4
"""Distinct weight matrices in the probe graph, each a layer's largest (gate and up packed:
hidden x 2 intermediate): 4 x 768 x 6144 bytes = 19 MB at full size, weights that do not stay
in a core's caches between runs, as a decode step's 221 MB do not."""

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


def accuracy_level(kernel: str) -> int:
    """The ``MatMulNBits`` level whose numerics ``kernel`` (a :data:`KERNELS` name or
    :data:`OWN_KERNEL`) has: our kernel rounds as level 4 does."""
    return KERNELS.get(kernel, KERNELS["int8-activations"])


def kernel_graph(model: Path | bytes, kernel: str) -> tuple[bytes, Path | None]:
    """The serialized graph ``model`` (MatMulNBits as exported) for ``kernel``, and the custom
    op library its session must load (None for ONNX Runtime's own kernels).

    Raises:
        KernelUnavailable: ``kernel`` is :data:`OWN_KERNEL` and cannot run on this host.
    """
    if kernel == OWN_KERNEL:
        from ..int8_kernel import library, with_own_kernel

        return with_own_kernel(model), library()
    return with_accuracy_level(model, KERNELS[kernel]), None


@dataclass
class KernelChoice:
    """The probe's outcome: ``chosen`` (a :data:`KERNELS` name or :data:`OWN_KERNEL`),
    ``probe_ms`` per candidate {name: {rows: fastest ms}} (none for one whose session failed or
    that was far slower than the best at its first runs: ``dropped``), the ``cpu`` features, the
    probe's shape {"layers", "k", "n", "block_size"} and its wall time (s), and ``swap_s``: the
    time to rebuild the runner's session on the chosen kernel (0 when the exported kernel won)."""

    chosen: str
    probe_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    cpu: dict[str, Any] = field(default_factory=dict)
    shape: dict[str, int] = field(default_factory=dict)
    probe_s: float = 0.0
    swap_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "accuracy_level": accuracy_level(self.chosen),
                "probe_ms": {k: {str(b): round(v, 3) for b, v in d.items()} for k, d in self.probe_ms.items()},
                "dropped": self.dropped, **self.cpu, "shape": self.shape, "probe_s": round(self.probe_s, 2),
                "swap_s": round(self.swap_s, 2)}


def probe_graph(k: int, n: int, block_size: int, level: int, layers: int = PROBE_LAYERS, seed: int = 0) -> bytes:
    """A serialized ONNX graph of ``layers`` 8-bit ``MatMulNBits`` nodes (K = ``k`` inputs,
    N = ``n`` outputs, symmetric blocks of ``block_size`` as the export writes them, random
    weights and scales) at ``accuracy_level`` ``level``, each applied to the input ``x`` (M, k)
    float32, outputs ``y0``.. (M, n): the int8 step's MatMuls in small."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    blocks = -(-k // block_size)
    inits, nodes, outs = [], [], []
    for i in range(layers):
        q = rng.integers(0, 256, (n, blocks, block_size), dtype=np.uint8)
        scales = (rng.random((n, blocks), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(q, f"w{i}"), onnx.numpy_helper.from_array(scales, f"s{i}")]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=k, N=n, bits=8, block_size=block_size, accuracy_level=level))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])
    graph = helper.make_graph(nodes, "int8_kernel_probe", [x], outs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = contract.ONNX_IR_VERSION  # as the exported graphs: onnx's default is too new for some
    return bytes(model.SerializeToString())


def race(calls: dict[str, dict[int, Callable[[], object]]], steps: int) -> dict[str, dict[int, float]]:
    """Each candidate's fastest of ``steps`` timed calls per batch size, in ms: ``calls``
    {candidate: {rows: call}}, the candidates taking turns call by call, so that outside load
    (another model of the server warming up on the other core) slows each alike, and the fastest
    run leaves out what it added."""
    best = {name: dict.fromkeys(per, float("inf")) for name, per in calls.items()}
    for _ in range(steps):
        for name, per in calls.items():
            for rows, call in per.items():
                t = time.perf_counter()
                call()
                best[name][rows] = min(best[name][rows], (time.perf_counter() - t) * 1e3)
    return best


def _candidate_session(what: str, name: str, build: Callable[[], Any], dropped: list[str]) -> Any | None:
    """``build()``'s probe session for candidate ``name``, or None with ``name`` appended to
    ``dropped``: logged at INFO where our library cannot run here (KernelUnavailable), as a
    warning where this onnxruntime build refuses the graph."""
    try:
        return build()
    except KernelUnavailable as exc:
        log.info("%s %s: unavailable (%s)", what, name, exc)
    except Exception as exc:  # a node this onnxruntime build refuses: not a candidate
        log.warning("%s %s: no session (%s)", what, name, exc)
    dropped.append(name)
    return None


def _first_run_ms(calls: dict[int, Callable[[], object]]) -> float:
    """The untimed first runs' ms summed over the batch sizes (first-run allocations included)."""
    t = time.perf_counter()
    for call in calls.values():
        call()
    return (time.perf_counter() - t) * 1e3


def _probe_calls(session: Any, k: int) -> dict[int, Callable[[], object]]:
    """One run of a :func:`probe_graph` session per :data:`PROBE_BATCHES` row count."""
    feeds = {b: {"x": np.random.default_rng(b).standard_normal((b, k), dtype=np.float32)} for b in PROBE_BATCHES}
    return {b: functools.partial(session.run, None, feeds[b]) for b in PROBE_BATCHES}


def runs_int8(runner: GptStepRunner) -> bool:
    """True when ``runner`` loaded the int8 step graph its artifacts list (``precisions.int8``)."""
    int8 = runner.art.manifest.get("precisions", {}).get(str(Precision.INT8), {})
    return bool(int8.get(contract.GPT_GRAPH)) and runner.graph.name == int8[contract.GPT_GRAPH]


def use_kernel(runner: GptStepRunner, kernel: str | None = None, attention: str | None = None,
               profile_prefix: str | None = None) -> float:
    """Rebuild ``runner``'s session (its step graph as it loaded it, KV cache precision
    included) on int8 ``kernel`` (:func:`kernel_graph`; None: the one it runs, if any) and
    ``attention`` (:data:`ATTENTION_KERNELS`; None: the one it runs), with ONNX Runtime's
    profiler on where ``profile_prefix`` is given; returns the seconds it took. Raises what
    :func:`kernel_graph`, the attention's rewrite or the session raises (the runner keeps its
    session then)."""
    from ..int8_kernel import library as own_library
    from ..int8_kernel import with_own_attention
    from .gpt import load_step_graph

    t = time.perf_counter()
    kernel = kernel if kernel is not None else getattr(runner, "_int8_kernel", None)
    attention = attention if attention is not None else getattr(runner, "_attention", GQA_ATTENTION)
    graph: Path | bytes = load_step_graph(runner.art, runner.graph, getattr(runner, "kv_precision",
                                                                            runner.opts.kv_cache))
    library = None
    if kernel is not None:
        graph, library = kernel_graph(graph, kernel)
    if attention == OWN_ATTENTION:
        graph, library = with_own_attention(graph), own_library()
    runner.use_session(make_session(graph, runner.opts, profile_prefix=profile_prefix, custom_ops=library))
    if kernel is not None:  # None: the exported kernel, which the probe reads from the manifest
        runner._int8_kernel = kernel  # type: ignore[attr-defined]
    runner._attention = attention  # type: ignore[attr-defined]
    return time.perf_counter() - t


def choose_int8_kernel(runner: GptStepRunner, kernels: dict[str, int] | None = None, *,
                       steps: int = PROBE_STEPS, own: bool = True) -> KernelChoice | None:
    """Time each of ``kernels`` (default :data:`KERNELS`) on this host and leave ``runner``
    (on the int8 step graph) on the fastest; returns the :class:`KernelChoice` (also logged at
    INFO), or None when the runner does not run the int8 graph (:func:`runs_int8`: nothing to
    choose).

    The probe is :func:`probe_graph` in the step's own shape (hidden x 2 intermediate, the
    exported block size) at 1 and 16 rows, with the runner's threads: milliseconds where a
    probe of the whole step graph would build a second 221 MB session and, for a slow kernel,
    wait seconds for its first step. When the kernel the runner runs wins (the exported one,
    manifest ``precisions.int8.quantization.accuracy_level``) it keeps its session; else its
    graph (as it loaded it, KV cache precision included) is rebuilt for the winner
    (:func:`kernel_graph`), and where that session fails, for the next fastest. ``own``: our
    kernel (:data:`OWN_KERNEL`) is a candidate too, where it can run (else dropped, logged at
    INFO). A candidate whose session cannot be made is dropped with a warning, one whose first
    runs take :data:`PROBE_GIVE_UP` times the fastest candidate's without being timed; the rest
    race (:func:`race`)."""
    if not runs_int8(runner):
        return None
    kernels = dict(KERNELS if kernels is None else kernels)
    started = time.perf_counter()
    quant = runner.art.manifest["precisions"][str(Precision.INT8)].get("quantization", {})
    k = runner.art.hidden_size
    n = 2 * int(runner.art.manifest.get("config", {}).get("intermediate_size", 4 * k))
    block = int(quant.get("block_size", 32))
    dropped: list[str] = []
    names = list(kernels) + ([OWN_KERNEL] if own else [])
    calls: dict[str, dict[int, Callable[[], object]]] = {}
    first_ms: dict[str, float] = {}
    for name in names:
        def build(name: str = name) -> Any:
            graph, library = (kernel_graph(probe_graph(k, n, block, accuracy_level(name)), name) if name == OWN_KERNEL
                              else (probe_graph(k, n, block, kernels[name]), None))
            return make_session(graph, runner.opts, custom_ops=library)
        session = _candidate_session("int8 kernel", name, build, dropped)
        if session is None:
            continue
        calls[name] = _probe_calls(session, k)
        first_ms[name] = _first_run_ms(calls[name])
    fastest_first = min(first_ms.values(), default=0.0)
    for name, ms in first_ms.items():
        if ms > PROBE_GIVE_UP * fastest_first:  # far slower than the best already: no need for its figures
            log.info("int8 kernel %s: its first runs took over %.0f x the best; dropped", name, PROBE_GIVE_UP)
            dropped.append(name)
            del calls[name]
    probe_ms = race(calls, steps)
    exported = int(quant.get("accuracy_level", KERNELS[next(iter(KERNELS))]))
    running = getattr(runner, "_int8_kernel", next((c for c, lv in KERNELS.items() if lv == exported), names[0]))
    probe_s = time.perf_counter() - started
    swap_s = 0.0
    for chosen in sorted(probe_ms, key=lambda c: sum(probe_ms[c].values())):
        if chosen == running:
            break
        try:
            swap_s = use_kernel(runner, chosen)
            break
        except Exception as exc:  # the step graph would not build on it: the next fastest
            log.warning("int8 kernel %s: the step's session failed (%s); trying the next", chosen, exc)
            dropped.append(chosen)
    else:
        chosen = running  # nothing timed, or nothing faster would build: the runner keeps its session
    choice = KernelChoice(chosen, probe_ms, dropped, cpu_features(),
                          {"layers": PROBE_LAYERS, "k": k, "n": n, "block_size": block}, probe_s, swap_s)
    log.info("int8 GPT kernel: %s (the numerics of MatMulNBits accuracy_level %d) on %s [%s]; probe ms at 1 / 16 "
             "rows %s%s, %.2f s%s", chosen, accuracy_level(chosen), choice.cpu["cpu_model"],
             " ".join(choice.cpu["cpu_flags"]),
             {c: [round(v, 2) for v in d.values()] for c, d in probe_ms.items()},
             f", dropped {dropped}" if dropped else "", probe_s,
             f", session rebuilt in {swap_s:.1f} s" if swap_s else "")
    return choice


# --- attention over the int8 KV cache ------------------------------------------------------

GQA_ATTENTION = "group-query-attention"
"""ONNX Runtime's ``GroupQueryAttention`` over the int8 cache, as the graph has it."""
OWN_ATTENTION = ATTENTION_NAME
"""Our ``Int8KvAttention`` (:func:`chattts_serving.int8_kernel.with_own_attention`): the same
attention, reading the int8 cache without dequantizing it into a copy first."""
ATTENTION_KERNELS = (GQA_ATTENTION, OWN_ATTENTION)
ATTENTION_PROBE_PAST = 300
"""Positions each probe row holds (a sentence's worth of codes after its prompt)."""


@dataclass
class AttentionChoice:
    """The attention probe's outcome, as :class:`KernelChoice`'s: ``chosen`` (one of
    :data:`ATTENTION_KERNELS`), ``probe_ms`` {name: {rows: fastest ms}}, ``dropped``, the probe's
    ``shape`` and wall time (s), ``swap_s`` (0 when the graph's own attention won)."""

    chosen: str
    probe_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)
    probe_s: float = 0.0
    swap_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen,
                "probe_ms": {k: {str(b): round(v, 3) for b, v in d.items()} for k, d in self.probe_ms.items()},
                "dropped": self.dropped, "shape": self.shape, "probe_s": round(self.probe_s, 2),
                "swap_s": round(self.swap_s, 2)}


def attention_probe_graph(heads: int, head_dim: int, positions: int, layers: int = PROBE_LAYERS,
                          seed: int = 0) -> bytes:
    """A serialized ONNX graph of ``layers`` ``GroupQueryAttention`` nodes as the fused step has
    them over an int8 cache (rotary inside, per-channel scales: random), each on the query
    ``qkv`` (B, 1, 3 x heads x head_dim) float32 and its own cache ``pk<i>``/``pv<i>`` (B, heads,
    C, head_dim) int8, presents ``ok<i>``/``ov<i>``: the step's attention in small."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    angle = np.arange(positions)[:, None] * (1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim))[None]
    inits = [numpy_helper.from_array(np.cos(angle).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angle).astype(np.float32), "sin")]
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["b", 1, 3 * heads * head_dim]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [1])]
    outputs, nodes = [], []
    for i in range(layers):
        for kind in ("k", "v"):
            inits.append(numpy_helper.from_array((rng.random((heads, 1, head_dim)) * 0.02 + 0.01).astype(np.float32),
                                                 f"{kind}s{i}"))
            inputs.append(helper.make_tensor_value_info(f"p{kind}{i}", TensorProto.INT8, ["b", heads, "c", head_dim]))
            outputs.append(helper.make_tensor_value_info(f"o{kind}{i}", TensorProto.INT8, ["b", heads, "c", head_dim]))
        outputs.append(helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT, ["b", 1, heads * head_dim]))
        nodes.append(helper.make_node(
            "GroupQueryAttention", ["qkv", "", "", f"pk{i}", f"pv{i}", "seqlens", "total", "cos", "sin", "", "", "",
                                    f"ks{i}", f"vs{i}"], [f"o{i}", f"ok{i}", f"ov{i}"], domain="com.microsoft",
            num_heads=heads, kv_num_heads=heads, do_rotary=1, rotary_interleaved=0, scale=float(head_dim) ** -0.5,
            kv_cache_bit_width=8, k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL"))
    graph = helper.make_graph(nodes, "attention_probe", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = contract.ONNX_IR_VERSION
    return bytes(model.SerializeToString())


def attention_probe_call(session: Any, heads: int, head_dim: int, rows: int, past: int,
                         layers: int) -> Callable[[], object]:
    """One decode run of an :func:`attention_probe_graph` session on ``rows`` rows of ``past``
    positions, each cache bound to its past and present (as the engine binds its cache); the
    first call is made here, untimed."""
    import onnxruntime as ort

    rng = np.random.default_rng(rows)
    io = session.io_binding()
    io.bind_cpu_input("qkv", rng.standard_normal((rows, 1, 3 * heads * head_dim), dtype=np.float32))
    io.bind_cpu_input("seqlens", np.full(rows, past, np.int32))
    io.bind_cpu_input("total", np.array([past + 1], np.int32))
    caches = []
    for i in range(layers):
        for kind in ("k", "v"):
            cache = ort.OrtValue.ortvalue_from_numpy(rng.integers(-127, 128, (rows, heads, past + 1, head_dim),
                                                                  dtype=np.int8))
            caches.append(cache)
            io.bind_ortvalue_input(f"p{kind}{i}", cache)
            io.bind_ortvalue_output(f"o{kind}{i}", cache)
        io.bind_output(f"o{i}")
    session.run_with_iobinding(io)
    return functools.partial(session.run_with_iobinding, io)


def choose_attention(runner: GptStepRunner, *, steps: int = PROBE_STEPS,
                     candidates: tuple[str, ...] = ATTENTION_KERNELS) -> AttentionChoice | None:
    """Time each of ``candidates`` on a few attention nodes of the step's shape over an int8
    cache (:func:`attention_probe_graph`, :data:`ATTENTION_PROBE_PAST` positions, 1 and 16
    rows, the runner's threads) and leave ``runner`` on the fastest: its session is rebuilt
    (:func:`use_kernel`, its int8 kernel kept) when our attention wins, and where that fails it
    keeps ONNX Runtime's. Returns the :class:`AttentionChoice` (logged at INFO), or None when
    the runner's KV cache is not int8 (nothing to choose). Our attention is dropped where its
    library cannot run here (logged at INFO)."""
    from ..contract import KvPrecision
    from ..int8_kernel import library as own_library
    from ..int8_kernel import with_own_attention

    if getattr(runner, "kv_precision", None) is not KvPrecision.INT8:
        return None
    started = time.perf_counter()
    heads, head_dim = runner.art.num_heads, runner.art.head_dim
    probe = attention_probe_graph(heads, head_dim, ATTENTION_PROBE_PAST + 1)
    calls: dict[str, dict[int, Callable[[], object]]] = {}
    dropped: list[str] = []
    for name in candidates:
        def build(name: str = name) -> Any:
            if name == OWN_ATTENTION:
                return make_session(with_own_attention(probe), runner.opts, custom_ops=own_library())
            return make_session(probe, runner.opts)
        session = _candidate_session("attention", name, build, dropped)
        if session is None:
            continue
        calls[name] = {b: attention_probe_call(session, heads, head_dim, b, ATTENTION_PROBE_PAST, PROBE_LAYERS)
                       for b in PROBE_BATCHES}
    probe_ms = race(calls, steps)
    running = getattr(runner, "_attention", GQA_ATTENTION)
    probe_s = time.perf_counter() - started
    swap_s = 0.0
    chosen = min(probe_ms, key=lambda c: sum(probe_ms[c].values()), default=running)
    if chosen != running:
        try:
            swap_s = use_kernel(runner, attention=chosen)
        except Exception as exc:  # the step graph would not build on it: the runner keeps its session
            log.warning("attention %s: the step's session failed (%s); keeping %s", chosen, exc, running)
            dropped.append(chosen)
            chosen = running
    choice = AttentionChoice(chosen, probe_ms, dropped, {"layers": PROBE_LAYERS, "heads": heads, "head_dim": head_dim,
                                                         "past": ATTENTION_PROBE_PAST}, probe_s, swap_s)
    log.info("int8 KV attention: %s; probe ms at 1 / 16 rows %s%s, %.2f s%s", chosen,
             {c: [round(v, 2) for v in d.values()] for c, d in probe_ms.items()},
             f", dropped {dropped}" if dropped else "", probe_s,
             f", session rebuilt in {swap_s:.1f} s" if swap_s else "")
    return choice


def choose_kernels(runner: GptStepRunner) -> tuple[KernelChoice | None, AttentionChoice | None]:
    """What the engine does at start-up: the int8 MatMul kernel (:func:`choose_int8_kernel`),
    then the attention over an int8 cache (:func:`choose_attention`), each None where there is
    nothing to choose."""
    return choose_int8_kernel(runner), choose_attention(runner)
