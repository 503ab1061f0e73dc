"""ONNX Runtime wrappers for the exported graphs, free of Triton.

Used by the engine and vocoder models, the parity tests and the raw-step benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import contract
from .contract import Precision, VocoderPath


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session knobs (from the deployment profile).

    ``intra_op_threads``: threads per session (0 = ORT's default, one per core).
    ``allow_spinning``: busy-wait between ops; off when several sessions share few cores
    (two sessions back to back on 2 cores took 58 ms spinning against 25 ms not).
    ``providers``: execution providers in preference order.
    ``io_binding``: the GPT step runs through ONNX Runtime's IO binding, its KV cache in
    buffers of the runner's :class:`~chattts_serving.engine.arrays.ArrayBackend` (device memory with
    cupy on the CUDA EP, numpy on the CPU EP) that are bound in place, never copied per step.
    ``precision``: fp32, fp16 or int8 graphs, a :class:`~chattts_serving.contract.Precision`
    (its string value is taken too and becomes the member; another raises ValueError; see
    :func:`graph_path`).
    ``device_id``: the GPU ordinal for the CUDA/TensorRT execution providers and cupy.
    ``kv_cache``: the GPT step's KV cache precision, a :class:`~chattts_serving.contract.KvPrecision`
    (its string value is taken too; another raises ValueError): ``fp32`` runs the graph as
    exported, ``fp16``/``int8`` rewrite its cache when the session loads
    (:mod:`chattts_serving.engine.kvprecision`), ``auto`` is :func:`resolve_kv_precision`'s
    choice. The vocoders ignore it.
    """

    intra_op_threads: int = 0
    allow_spinning: bool = False
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    io_binding: bool = False
    precision: Precision = Precision.FP32
    device_id: int = 0
    kv_cache: contract.KvPrecision = contract.KvPrecision.FP32

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", _precision(self.precision))
        object.__setattr__(self, "kv_cache", kv_precision(self.kv_cache))


PRECISIONS = tuple(p.value for p in contract.Precision)
"""Graph precisions an artifact directory may hold (:class:`~chattts_serving.contract.Precision`):
``fp32`` (always), ``fp16`` (exported with ``chattts-export --precision fp16``) and ``int8``
(``--precision int8``: the GPT step and the vocoders); the variants are listed under ``precisions`` in
manifest.json."""


FP16_GRAPH_FILES = contract.FP16_GRAPH_FILES


def _precision(value: Precision | str) -> Precision:
    """``value`` as a :class:`~chattts_serving.contract.Precision`. Raises ValueError."""
    try:
        return Precision(value)
    except ValueError:
        raise ValueError(f"unknown precision {value!r}; expected one of {PRECISIONS}") from None


KV_PRECISIONS = tuple(p.value for p in contract.KvPrecision)
"""KV cache precisions the GPT step runs with (:class:`~chattts_serving.contract.KvPrecision`)."""


def kv_precision(value: contract.KvPrecision | str) -> contract.KvPrecision:
    """``value`` as a :class:`~chattts_serving.contract.KvPrecision`. Raises ValueError naming
    the values there are."""
    try:
        return contract.KvPrecision(value)
    except ValueError:
        raise ValueError(f"unknown KV cache precision {value!r}; expected one of {KV_PRECISIONS}") from None


def resolve_kv_precision(artifacts: Artifacts, kv: contract.KvPrecision | str,
                         weights: Precision | str = Precision.FP32) -> contract.KvPrecision:
    """``kv``, with ``auto`` decided for the GPT graph of ``weights`` precision (resolved
    first, as :func:`resolve_precision`): int8 when ``artifacts`` hold the int8 cache's scales
    (manifest.json ``kv_cache.int8.file``) and its accuracy measured with those weights meets
    the threshold (``kv_cache.int8.accuracy.<weights>.meets_threshold``), else fp32. Raises
    ValueError for an unknown precision."""
    kv = kv_precision(kv)
    if kv is not contract.KvPrecision.AUTO:
        return kv
    weights = resolve_precision(artifacts, weights)
    entry = artifacts.manifest.get("kv_cache", {}).get(contract.KvPrecision.INT8, {})
    accurate = bool(entry.get("accuracy", {}).get(weights, {}).get("meets_threshold"))
    has_scales = bool(entry.get("file")) and (artifacts.root / entry["file"]).is_file()
    return contract.KvPrecision.INT8 if accurate and has_scales else contract.KvPrecision.FP32


def resolve_precision(artifacts: Artifacts, precision: Precision | str,
                      graph: str = contract.GPT_GRAPH) -> Precision:
    """``precision``, with ``auto`` decided for ``graph`` (a ``contract.*_GRAPH`` name) of
    ``artifacts``: int8 when they list that graph's int8 variant and the int8 accuracy was
    measured and meets the threshold (manifest.json ``precisions.int8.accuracy.meets_threshold``,
    written by ``make int8-accuracy``), else fp32. Raises ValueError for an unknown precision."""
    precision = _precision(precision)
    if precision is not Precision.AUTO:
        return precision
    int8 = artifacts.manifest.get("precisions", {}).get(Precision.INT8, {})
    accurate = bool(int8.get("accuracy", {}).get("meets_threshold"))
    return Precision.INT8 if accurate and int8.get(graph) else Precision.FP32


def graph_path(artifacts: Artifacts, graph: str, precision: Precision | str = Precision.FP32) -> Path:
    """Path of graph file ``graph`` (a ``contract.*_GRAPH`` name) in ``precision``.

    fp32 is the file itself; fp16 and int8 are the files the manifest lists under
    ``precisions.<precision>.<graph>``; ``auto`` is :func:`resolve_precision`'s choice.
    Raises ValueError for an unknown precision and
    FileNotFoundError when the artifacts have no such variant (re-export with
    ``chattts-export --precision <precision>``).
    """
    precision = resolve_precision(artifacts, precision, graph)
    if precision is Precision.FP32:
        return artifacts.root / graph
    variant = artifacts.manifest.get("precisions", {}).get(precision, {}).get(graph)
    if not variant or not (artifacts.root / variant).is_file():
        raise FileNotFoundError(f"{artifacts.root} has no {precision} variant of {graph}: "
                                f"re-export with `chattts-export ... --precision {precision}`")
    return artifacts.root / variant


def make_session(path: Path | str | bytes, opts: OrtOptions = OrtOptions(), profile_prefix: str | None = None,
                 custom_ops: Path | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` (or a serialized model) with ``opts``;
    providers that this onnxruntime build lacks are dropped (CPU is always kept as the fallback).
    ``profile_prefix``: ONNX Runtime's profiler on, its trace written there (``end_profiling``).
    ``custom_ops``: a custom op library the graph needs (our int8 kernel,
    :func:`chattts_serving.int8_kernel.library`)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if custom_ops is not None:
        so.register_custom_ops_library(str(custom_ops))
    with_opts = session_providers(opts, ort.get_available_providers())
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, sess_options=so, providers=with_opts)


GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def session_providers(opts: OrtOptions, available: list[str]) -> list[Any]:
    """The ``providers`` argument of ``InferenceSession`` for ``opts`` on an onnxruntime build
    offering ``available``: ``opts.providers`` in order, those the build lacks dropped, the CPU
    EP always last as the fallback; a GPU EP gets ``device_id`` (``opts.device_id``) and, for
    CUDA, ``do_copy_in_default_stream`` (so the engine's cupy writes to the KV cache, made on
    the default stream, are ordered before the step that reads them)."""
    providers = [p for p in opts.providers if p in set(available)] or ["CPUExecutionProvider"]
    if "CPUExecutionProvider" not in providers:
        providers.append("CPUExecutionProvider")
    out: list[Any] = []
    for p in providers:
        if p == "CUDAExecutionProvider":
            out.append((p, {"device_id": str(opts.device_id), "do_copy_in_default_stream": "1"}))
        elif p in GPU_PROVIDERS:
            out.append((p, {"device_id": str(opts.device_id)}))
        else:
            out.append(p)
    return out


@dataclass(frozen=True)
class Artifacts:
    """An exported artifact directory and its manifest (see ``export/build.py``)."""

    root: Path
    manifest: dict[str, Any]

    @classmethod
    def load(cls, root: Path | str) -> Artifacts:
        """Read ``root/manifest.json``. Raises FileNotFoundError when it is absent."""
        root = Path(root)
        return cls(root, json.loads((root / contract.MANIFEST).read_text()))

    @property
    def num_layers(self) -> int:
        return int(self.manifest["config"]["num_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["config"]["hidden_size"])

    @property
    def num_heads(self) -> int:
        return int(self.manifest["config"]["num_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.manifest["config"]["head_dim"])

    def receptive_field_tokens(self, path: VocoderPath | str) -> int:
        """Context in tokens on each side that fully determines a token's audio on vocoder
        ``path`` (a :class:`~chattts_serving.contract.VocoderPath` or its value). Raises
        ValueError for another path, KeyError when the manifest lacks it."""
        return int(self.manifest["receptive_field_tokens"][VocoderPath(path).value])
