"""Our own int8 kernel for the GPT step and the vocoders: ONNX Runtime custom op ``chattts.Int8BlockMatMul``.

``MatMulNBits`` at ``accuracy_level`` 4 (the exported kernel) reads its 8-bit weights at about
half the rate the fp32 GEMV reaches on two AVX-512 cores and is compute-bound at 16 rows
(docs/decode-speed.md, "An int8 kernel of our own"). ``int8_matmul/int8_matmul.cc`` computes
the same thing (symmetric 8-bit weights in blocks of ``block_size`` along K, activations
rounded to int8 per block at run time: the same numerics, to float rounding) with AVX-512
VNNI over a weight layout of 64-column panels, on ONNX Runtime's intra-op threads.
Everything else in the step graph stays ONNX Runtime's.

- :func:`build` compiles the op (the host's C++ compiler, ONNX Runtime's C API header) into a
  cache keyed by the source's SHA-256; :func:`library` returns it, or the library
  ``$CHATTTS_INT8_KERNEL`` names (built in the image's build stage), for this CPU, or raises
  :class:`KernelUnavailable` saying why (no header, no compiler, a CPU without AVX-512 VNNI).
- :func:`with_own_kernel` rewrites a graph's 8-bit ``MatMulNBits`` nodes into the op with
  their weights repacked (:func:`pack`); :func:`~chattts_serving.runtime.make_session` loads
  the library for such a graph (``custom_ops``).
- :func:`fastest_session` times a graph on ``MatMulNBits`` and on the op and keeps the faster
  (the vocoders; the GPT step has its own probe, :mod:`chattts_serving.engine.kernels`).
- The same library holds ``chattts.Int8KvAttention`` (``int8_matmul/int8_attention.cc``): the
  step's attention over the int8 KV cache, read as int8 where ONNX Runtime's
  ``GroupQueryAttention`` dequantizes it first; :func:`with_own_attention` rewrites the graph's
  nodes, and the engine's start-up probe chooses between the two
  (:func:`chattts_serving.engine.kernels.choose_attention`).

The header: ``$CHATTTS_ORT_INCLUDE``, else ``build/onnxruntime-include`` (``scripts/setup.sh``
unpacks Debian's ``libonnxruntime-dev`` there: the wheel ships none), else
``/usr/include/onnxruntime``. The op is built against that header's API version and loads into
any ONNX Runtime at least as new.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .native import cache_dir as native_cache_dir
from .native import compiler, write_atomically

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "int8_matmul"
SOURCES = (SOURCE_DIR / "int8_matmul.cc", SOURCE_DIR / "int8_attention.cc")
"""The library's sources: the int8 MatMul and the attention over the int8 KV cache
(:func:`with_own_attention`), one domain, one library; they include the headers beside them
(``ort_op.h``, ``vector_math.h``)."""
NAME = "own-vnni"
"""This kernel's name where a choice among kernels is logged or recorded."""
EXPORTED = "matmulnbits"
"""The name of ONNX Runtime's ``MatMulNBits`` as exported, in :func:`fastest_session`'s record."""
DOMAIN = "chattts"
OP = "Int8BlockMatMul"
PANEL = 64
"""Output columns per weight panel (four AVX-512 registers of fp32); N is padded up to it."""
FLAGS = ("-std=c++17", "-O3", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden")
REPO_INCLUDE = Path(__file__).resolve().parents[1] / "build" / "onnxruntime-include"
HEADER = "onnxruntime_c_api.h"
PREBUILT_ENV = "CHATTTS_INT8_KERNEL"
"""The environment variable naming a library built beforehand (:func:`library`)."""
OUT_NAME = "int8_matmul.so"
"""The library's file name under ``--out`` (:func:`main`)."""


class KernelUnavailable(RuntimeError):
    """The op cannot run here; the message says why (and what would make it run)."""


def include_dir() -> Path | None:
    """The directory holding ONNX Runtime's C API header (module docstring), or None."""
    env = os.environ.get("CHATTTS_ORT_INCLUDE")
    for d in ([Path(env)] if env else []) + [REPO_INCLUDE, Path("/usr/include/onnxruntime")]:
        if (d / HEADER).is_file():
            return d
    return None


def cache_dir() -> Path:
    """Where built libraries are kept: ``$CHATTTS_KERNEL_CACHE``, else ``~/.cache/chattts-serving/int8``."""
    return native_cache_dir("CHATTTS_KERNEL_CACHE", "int8")


def build() -> Path:
    """The op compiled for x86-64 with AVX-512 by function attribute (built into
    :func:`cache_dir` on first use, a few seconds), whatever this CPU is.

    Raises:
        KernelUnavailable: no header (run ``scripts/setup.sh`` or set ``$CHATTTS_ORT_INCLUDE``),
            no C++ compiler, or the build failed (compiler output attached).
    """
    import subprocess

    inc = include_dir()
    if inc is None:
        raise KernelUnavailable(f"no ONNX Runtime C API header ({HEADER}): run scripts/setup.sh, which unpacks "
                                f"Debian's libonnxruntime-dev into {REPO_INCLUDE}, or set $CHATTTS_ORT_INCLUDE")
    cxx = compiler()
    if cxx is None:
        raise KernelUnavailable("no C++ compiler (g++ or $CXX) to build the int8 kernel")
    h = hashlib.sha256(b"".join(src.read_bytes() for src in (*SOURCES, *sorted(SOURCE_DIR.glob("*.h")))))
    h.update((inc / HEADER).read_bytes())
    h.update(" ".join((cxx, *FLAGS)).encode())
    lib = cache_dir() / f"int8_matmul-{h.hexdigest()[:24]}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)

        def compile_to(tmp: str) -> None:
            run = subprocess.run([cxx, *FLAGS, f"-I{inc}", *map(str, SOURCES), "-o", tmp],
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                raise KernelUnavailable(f"building the int8 kernel failed ({cxx}, exit {run.returncode}):\n"
                                        f"{run.stderr.strip()[-4000:]}")

        write_atomically(lib, compile_to)
    return lib


def library() -> Path:
    """The op for this host: the library ``$CHATTTS_INT8_KERNEL`` names where it is set (built
    elsewhere, e.g. in the image's build stage, which has the compiler and header the served
    image lacks: ``python -m chattts_serving.int8_kernel --out DIR``), else :func:`build`'s.

    Raises:
        KernelUnavailable: what :func:`build` raises, a ``$CHATTTS_INT8_KERNEL`` that names no
            file, or a CPU without AVX-512 F/BW/DQ/VL/VNNI.
    """
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt:
        lib = Path(prebuilt)
        if not lib.is_file():
            raise KernelUnavailable(f"${PREBUILT_ENV} names {lib}, which does not exist (the image was built "
                                    "without the kernel: no header or compiler in its build stage)")
    else:
        lib = build()
    if not ctypes.CDLL(str(lib)).chattts_int8_supported():
        raise KernelUnavailable("this CPU lacks AVX-512 F/BW/DQ/VL/VNNI, which the int8 kernel needs")
    return lib


def pack(q: np.ndarray, scales: np.ndarray, k: int, n: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The op's weight inputs (W int8 [P, K/4, 64, 4], S float32 [P, K/block, 64], Z int32
    [P, K/block, 64]; P = ceil(N/64), columns past N zero) from ``MatMulNBits``' symmetric 8-bit
    weights ``q`` (uint8, N x K/block x block, the weight plus 128) and their ``scales`` (N x
    K/block, any shape of that size)."""
    nb = k // block
    w = (q.reshape(n, k).astype(np.int16) - 128).astype(np.int8)
    s = scales.reshape(n, nb).astype(np.float32)
    z = (-128 * w.reshape(n, nb, block).astype(np.int32).sum(-1)).astype(np.int32)
    panels = -(-n // PANEL)
    pad = panels * PANEL - n
    if pad:
        w = np.concatenate([w, np.zeros((pad, k), np.int8)])
        s = np.concatenate([s, np.zeros((pad, nb), np.float32)])
        z = np.concatenate([z, np.zeros((pad, nb), np.int32)])
    wp = np.ascontiguousarray(w.reshape(panels, PANEL, k // 4, 4).transpose(0, 2, 1, 3))
    sp = np.ascontiguousarray(s.reshape(panels, PANEL, nb).transpose(0, 2, 1))
    zp = np.ascontiguousarray(z.reshape(panels, PANEL, nb).transpose(0, 2, 1))
    return wp, sp, zp


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _model_proto(model: Path | str | bytes | Any) -> Any:
    """``model`` as an ``onnx.ModelProto``: loaded from a file or bytes, or itself (then
    changed in place by the rewrite that asked)."""
    import onnx

    if isinstance(model, (str, Path)):
        return onnx.load(str(model))
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return model


def convertible(node: Any) -> bool:
    """Whether ``node`` is a ``MatMulNBits`` the op computes: 8 bits, no zero points, group
    index or bias, block size a multiple of 4 dividing K."""
    if node.op_type != "MatMulNBits":
        return False
    a = _attrs(node)
    extra = [name for name in node.input[3:] if name]
    block, k = int(a.get("block_size", 0)), int(a.get("K", 0))
    return int(a.get("bits", 4)) == 8 and not extra and block > 0 and block % 4 == 0 and k % block == 0


def with_own_kernel(model: Path | str | bytes | Any, fold_gates: bool = True) -> bytes:
    """The serialized ONNX ``model`` (a file, bytes or a ModelProto) with every convertible
    ``MatMulNBits`` node (:func:`convertible`) replaced by ``chattts.Int8BlockMatMul`` over its
    repacked weights, and (``fold_gates``) each MLP gate before a down projection folded into it
    (:func:`_fold_gates`). Raises ValueError when no node converts."""
    import onnx
    from onnx import numpy_helper

    proto = _model_proto(model)
    inits = {t.name: t for t in proto.graph.initializer}
    done = 0
    for node in proto.graph.node:
        if not convertible(node) or node.input[1] not in inits or node.input[2] not in inits:
            continue
        a = _attrs(node)
        k, n, block = int(a["K"]), int(a["N"]), int(a["block_size"])
        wp, sp, zp = pack(numpy_helper.to_array(inits[node.input[1]]), numpy_helper.to_array(inits[node.input[2]]),
                          k, n, block)
        names = [f"{node.name or node.output[0]}.{part}" for part in ("w_panels", "scales_panels", "offset_panels")]
        proto.graph.initializer.extend(numpy_helper.from_array(arr, nm) for arr, nm in zip((wp, sp, zp), names))
        inputs = [node.input[0], *names]
        del node.input[:]
        node.input.extend(inputs)
        del node.attribute[:]
        node.attribute.extend([onnx.helper.make_attribute("K", k), onnx.helper.make_attribute("N", n),
                               onnx.helper.make_attribute("block_size", block)])
        node.op_type, node.domain = OP, DOMAIN
        done += 1
    if not done:
        raise ValueError("the graph has no 8-bit MatMulNBits node the int8 kernel computes")
    if fold_gates:
        _fold_gates(proto)
    used = {name for node in proto.graph.node for name in node.input}
    keep = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    if not any(o.domain == DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return bytes(proto.SerializeToString())


ATTENTION_OP = "Int8KvAttention"
ATTENTION_NAME = "own-attention"
"""Our attention over the int8 KV cache, where a choice between it and ONNX Runtime's
``GroupQueryAttention`` is logged or recorded."""
GQA_OP = "GroupQueryAttention"
_GQA_KEPT = ("do_rotary", "rotary_interleaved", "num_heads", "kv_num_heads", "scale", "kv_cache_bit_width",
             "k_quant_type", "v_quant_type")
"""The attributes a GroupQueryAttention node may carry for :func:`attention_convertible` (any
other, a soft cap or a local window, is something our op does not compute)."""


def attention_convertible(node: Any) -> bool:
    """Whether ``node`` is a ``GroupQueryAttention`` our ``Int8KvAttention`` computes: the fused
    step's over an int8 cache (rotate-half rotary inside, as many KV heads as query heads, 8-bit
    per-channel K and V with their scales), packed QKV, no position ids, bias or head sink."""
    if node.op_type != GQA_OP or node.domain != "com.microsoft":
        return False
    a = _attrs(node)
    inputs = list(node.input) + [""] * (14 - len(node.input))
    rotary = int(a.get("do_rotary", 0)) == 1 and int(a.get("rotary_interleaved", 0)) == 0
    heads = int(a.get("kv_num_heads", 0)) == int(a.get("num_heads", -1))
    int8 = int(a.get("kv_cache_bit_width", 0)) == 8 and all(
        _str(a.get(q)) == "PER_CHANNEL" for q in ("k_quant_type", "v_quant_type"))
    wired = (len(node.input) == 14 and not any(inputs[i] for i in (1, 2, 9, 10, 11))
             and all(inputs[i] for i in (0, 3, 4, 5, 6, 7, 8, 12, 13)))
    return set(a) <= set(_GQA_KEPT) and "scale" in a and rotary and heads and int8 and wired


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def with_own_attention(model: Path | str | bytes | Any) -> bytes:
    """The serialized ONNX ``model`` (a file, bytes or a ModelProto: the fused step over an int8
    KV cache) with every ``GroupQueryAttention`` node our op computes
    (:func:`attention_convertible`) replaced by ``chattts.Int8KvAttention`` on the same inputs
    and outputs. Raises ValueError when no node converts (an fp32 or fp16 cache)."""
    import onnx

    proto = _model_proto(model)
    done = 0
    for node in proto.graph.node:
        if not attention_convertible(node):
            continue
        a = _attrs(node)
        inputs = [node.input[i] for i in (0, 3, 4, 5, 6, 7, 8, 12, 13)]
        del node.input[:]
        node.input.extend(inputs)
        del node.attribute[:]
        node.attribute.extend([onnx.helper.make_attribute("num_heads", int(a["num_heads"])),
                               onnx.helper.make_attribute("scale", float(a["scale"]))])
        node.op_type, node.domain = ATTENTION_OP, DOMAIN
        done += 1
    if not done:
        raise ValueError("the graph has no GroupQueryAttention over an int8 KV cache that our attention computes")
    if not any(o.domain == DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return bytes(proto.SerializeToString())


def _fold_gates(proto: Any) -> int:
    """Fold each LLaMA MLP gate before a converted down projection into it, in place: ``Split``
    of the packed gate | up output into halves, ``QuickGelu`` (alpha 1: SiLU) of the gate,
    ``Mul`` by the up half, consumed by that projection alone, become its ``gated`` mode (the
    op reads the packed output and multiplies silu(gate) * up as it rounds the activations).
    Returns how many it folded."""
    import onnx
    from onnx import numpy_helper

    g = proto.graph
    producer = {out: n for n in g.node for out in n.output}
    consumers: dict[str, int] = {}
    for n in g.node:
        for name in n.input:
            consumers[name] = consumers.get(name, 0) + 1
    graph_outputs = {o.name for o in g.output}
    inits = {t.name: t for t in g.initializer}
    gone: set[int] = set()
    folded = 0
    for down in g.node:
        if down.op_type != OP or down.domain != DOMAIN or int(_attrs(down).get("gated", 0)):
            continue
        mul = producer.get(down.input[0])
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        pairs = [(a, u) for a, u in (tuple(mul.input), tuple(reversed(mul.input)))
                 if a in producer and producer[a].op_type == "QuickGelu"]
        if not pairs:
            continue
        act_name, up_name = pairs[0]
        act = producer[act_name]
        split = producer.get(act.input[0])
        if (float(_attrs(act).get("alpha", 1.702)) != 1.0 or split is None or split.op_type != "Split"
                or list(split.output) != [act.input[0], up_name] or int(_attrs(split).get("axis", 0)) != -1
                or len(split.input) < 2 or split.input[1] not in inits):
            continue
        k = int(_attrs(down)["K"])
        if numpy_helper.to_array(inits[split.input[1]]).tolist() != [k, k]:
            continue
        inner = [mul.output[0], act.output[0], *split.output]
        if any(consumers.get(name, 0) != 1 or name in graph_outputs for name in inner):
            continue
        down.input[0] = split.input[0]
        down.attribute.append(onnx.helper.make_attribute("gated", 1))
        gone.update(id(n) for n in (mul, act, split))
        folded += 1
    keep = [n for n in g.node if id(n) not in gone]
    del g.node[:]
    g.node.extend(keep)
    return folded


def fastest_session(model: Path, opts: Any, probe: Callable[[Any], object], *,
                    rounds: int = 3) -> tuple[Any, str, dict[str, float]]:
    """A session of the int8 graph ``model`` with ``opts``
    (:class:`~chattts_serving.runtime.OrtOptions`) on whichever of ``MatMulNBits`` and our op
    runs ``probe(session)`` faster here (median ms of ``rounds`` calls after one untimed), its
    kernel name (:data:`EXPORTED` or :data:`NAME`) and the ms per kernel timed. Where our op
    cannot run here, or the graph has nothing it computes, the exported session without timing
    (the reason logged at INFO)."""
    from .native import median_ms
    from .runtime import make_session

    sessions = {EXPORTED: make_session(model, opts)}
    try:
        sessions[NAME] = make_session(with_own_kernel(model), opts, custom_ops=library())
    except (KernelUnavailable, ValueError) as exc:
        log.info("%s: int8 kernel %s not a candidate (%s)", Path(model).name, NAME, exc)
        return sessions[EXPORTED], EXPORTED, {}
    ms: dict[str, float] = {}
    for name, session in sessions.items():
        probe(session)
        ms[name] = median_ms(functools.partial(probe, session), rounds)
    chosen = min(ms, key=ms.__getitem__)
    log.info("%s: int8 kernel %s (probe ms %s)", Path(model).name, chosen, {k: round(v, 2) for k, v in ms.items()})
    return sessions[chosen], chosen, ms


def _copy_readable(src: Path, dest: str) -> None:
    """``src`` copied to ``dest``, readable by every user (the image serves as another user
    than the one that built it; a temporary file is made owner-only)."""
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755)


def main(argv: list[str] | None = None) -> int:
    """``python -m chattts_serving.int8_kernel``: build the op (setup runs this) and say
    where it is, or why it cannot run here (exit 0 either way: the engine then keeps
    ``MatMulNBits``; ``--require`` makes that exit 1). ``--out DIR``: build it for another
    host (this CPU is not asked) and copy it to ``DIR/int8_matmul.so``, the file
    ``$CHATTTS_INT8_KERNEL`` names there (the image's build stage); DIR is made either way."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--require", action="store_true", help="exit 1 when the kernel cannot run here")
    ap.add_argument("--out", type=Path, help="copy the built library to DIR/int8_matmul.so")
    args = ap.parse_args(argv)
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            lib = build()
            write_atomically(args.out / OUT_NAME, functools.partial(_copy_readable, lib))
            print(f"int8 kernel: {args.out / OUT_NAME}")
        else:
            print(f"int8 kernel: {library()}")
    except KernelUnavailable as exc:
        print(f"int8 kernel: unavailable: {exc}", file=sys.stderr)
        return 1 if args.require else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
