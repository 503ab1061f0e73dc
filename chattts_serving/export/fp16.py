"""fp16 variants of the exported graphs (``chattts-export --precision fp16``), for the ``gpu`` profile.

Each fp32 graph is converted by ONNX Runtime's own converter
(``onnxruntime.transformers.float16.convert_float_to_float16``, shipped with ``onnxruntime`` and
``onnxruntime-gpu``; ``onnxconverter-common`` 1.16's ``keep_io_types`` crashes on these graphs):
weights and compute in fp16, with

- the GPT step's KV cache in fp16 too (``past_*``/``new_*``: half the cache memory and the
  bandwidth of every decode step, which at large batch and context reads mostly cache), while
  ``inputs_embeds``, ``logits`` and ``hidden`` stay float32 (the engine's and vocoder's IO
  does not change);
- the vocoders' IO unchanged (hidden float32 or codes int32 in, audio float32 out);
- constants clamped to +-1e4 (:data:`MAX_FINITE`, onnxconverter-common's default), so that
  the attention mask's "minus infinity" (float32 min) becomes -1e4 rather than -65504: a
  precaution, since -65504 plus a negative score overflows fp16 to -inf where the addition
  runs in fp16, and a row masked entirely (a left-padding position) would then give NaN, which
  could reach real positions through the padding's keys and values. (On the CPU EP the -65504
  clamp also stayed finite on the parity inputs; the CUDA kernels are unverified here.)

The parity check (:func:`fp16_parity`) runs the same stages as the fp32 one against ChatTTS'
fp32 torch modules and bounds the error relative to the reference's largest magnitude; see
:data:`FP16_RELATIVE_TOLERANCE` for why that bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import contract
from ..contract import Precision
from ..runtime import FP16_GRAPH_FILES, Artifacts, OrtOptions
from .weights import WeightsError

MAX_FINITE = 1e4
"""Constants beyond +-1e4 are clamped when converting (see the module docstring)."""

FP16_RELATIVE_TOLERANCE = 2e-2
"""Largest error allowed between an fp16 graph and ChatTTS' fp32 module, relative to the
reference's largest absolute value (error / max|ref|) per stage.

Why 2e-2: fp16 has a unit roundoff of 2^-11 = 4.9e-4. Every matmul, norm and softmax rounds
its output to fp16 (accumulation inside a matmul is fp32 on CUDA), so a residual network of
L layers accumulates on the order of sqrt(number of rounded ops) roundoffs relative to the
activations' scale: for ChatTTS' 20 layers (about 10 rounded ops each) that is about
sqrt(200) * 4.9e-4 = 7e-3. The bound allows about 3x that. Measured (CPU EP, synthetic
weights): about 1e-3 relative on the full config's logits and hidden (2.0e-3 / 2.3 and
3.3e-3 / 3.0), top-1 code agreement 100 %. An error of 2e-2 of the logits' range moves a
logit by far less than the gap that sampling at temperature 0.3 resolves, and the
vocoders' 2e-2 of peak amplitude is about -34 dB, below the streaming seam errors accepted
in docs/streaming-quality.md. The fp32 graphs' bound stays :data:`chattts_serving.export.build.PARITY_TOLERANCE`
(absolute, 1e-4).
"""

FP16_KEEP_FLOAT32_IO = (contract.G_EMBEDS, contract.G_LOGITS, contract.G_HIDDEN, "hidden", "audio")
"""Graph inputs/outputs that stay float32 (everything else float in the IO becomes fp16: the KV)."""

FP16_STAGES = ("gpt_prefill_logits", "gpt_prefill_hidden", "gpt_decode_logits", "gpt_decode_hidden",
               "gpt_decode_spare_columns_logits", "gpt_text_prefill_logits", "gpt_text_decode_logits",
               "vocoder_hidden", "vocoder_codes")
"""The parity stages that run an fp16 graph (the others are numpy lookups, unchanged)."""


def convert_graph(src: Path, dst: Path) -> None:
    """Write the fp16 variant of ONNX graph ``src`` to ``dst`` (see the module docstring).

    Raises:
        ImportError: this onnxruntime build lacks ``onnxruntime.transformers``.
    """
    import onnx
    from onnxruntime.transformers import float16

    model = onnx.load(str(src))
    keep = [v.name for v in (*model.graph.input, *model.graph.output) if v.name in FP16_KEEP_FLOAT32_IO]
    converted = float16.convert_float_to_float16(model, keep_io_types=keep, max_finite_val=MAX_FINITE)
    onnx.save(converted, str(dst))


def convert_artifacts(root: Path) -> dict[str, str]:
    """Convert the three graphs in artifact directory ``root``; returns {fp32 file: fp16 file}
    (:data:`chattts_serving.runtime.FP16_GRAPH_FILES`)."""
    for src, dst in FP16_GRAPH_FILES.items():
        convert_graph(Path(root) / src, Path(root) / dst)
    return dict(FP16_GRAPH_FILES)


def fp16_parity(chat: Any, root: Path, opts: OrtOptions | None = None) -> dict[str, dict[str, float]]:
    """Parity of the fp16 graphs in ``root`` against ChatTTS' fp32 modules, run with ``opts``
    (its precision is forced to fp16; pass CUDA providers to check the CUDA kernels).

    Returns {stage: {"abs": max abs error, "scale": max |reference|, "rel": abs / scale}} for
    each of :data:`FP16_STAGES`.
    """
    from dataclasses import replace

    from .parity import parity_report

    scales: dict[str, float] = {}
    report = parity_report(chat, Path(root), replace(opts or OrtOptions(), precision=Precision.FP16), scales)
    return {k: {"abs": report[k], "scale": scales[k], "rel": report[k] / max(scales[k], 1e-12)}
            for k in FP16_STAGES}


def check_fp16_parity(parity: dict[str, dict[str, float]]) -> None:
    """Raise :class:`WeightsError` when a stage's relative error exceeds
    :data:`FP16_RELATIVE_TOLERANCE` (or is NaN)."""
    bad = {k: v["rel"] for k, v in parity.items() if not v["rel"] <= FP16_RELATIVE_TOLERANCE}
    if bad:
        raise WeightsError(f"fp16 graphs differ from ChatTTS' fp32 modules by more than "
                           f"{FP16_RELATIVE_TOLERANCE} relative: {bad}")


def add_fp16(chat: Any, root: Path, *, force: bool = False, progress: Any = None) -> bool:
    """Add the fp16 graphs to the (fp32, complete) artifact directory ``root``: convert, check
    parity on the CPU EP (:func:`check_fp16_parity`), then list them in manifest.json
    (``precisions.fp16``: files and the fp32 graphs' sha256 they came from; ``parity_fp16``;
    their sha256 under ``files``). Skipped (returns False) when the manifest already lists fp16
    graphs converted from the current fp32 graphs, unless ``force``.

    Raises:
        WeightsError: parity failed (the fp16 files are removed, the manifest is unchanged).
    """
    from .build import sha256_file

    say = progress or (lambda _msg: None)
    root = Path(root)
    if not force and fp16_up_to_date(root):
        return False
    manifest = json.loads((root / contract.MANIFEST).read_text())
    sources = {src: manifest["files"][src] for src in FP16_GRAPH_FILES}
    say("converting the graphs to fp16")
    files = convert_artifacts(root)
    say("checking fp16 parity against ChatTTS' fp32 modules")
    try:
        parity = fp16_parity(chat, root)
        check_fp16_parity(parity)
    except BaseException:
        for f in files.values():
            (root / f).unlink(missing_ok=True)
        raise
    manifest.setdefault("precisions", {})["fp16"] = {**files, "sources": sources}
    manifest["parity_fp16"] = parity
    manifest["parity_fp16_relative_tolerance"] = FP16_RELATIVE_TOLERANCE
    manifest["graphs_fp16"] = {src: _io(root / f) for src, f in files.items()}
    for f in files.values():
        manifest["files"][f] = sha256_file(root / f)
    (root / contract.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return True


def fp16_up_to_date(root: Path) -> bool:
    """True when ``root``'s manifest lists fp16 graphs converted from its current fp32 graphs
    and every listed file matches its sha256. Raises :class:`WeightsError` as
    :func:`~chattts_serving.export.build.verify_artifacts` (no manifest, a file changed)."""
    from .build import verify_artifacts

    manifest = verify_artifacts(Path(root))
    sources = {src: manifest["files"][src] for src in FP16_GRAPH_FILES}
    have = manifest.get("precisions", {}).get("fp16", {})
    return bool(have.get("sources") == sources and all(f in manifest["files"] for f in FP16_GRAPH_FILES.values()))


def _io(path: Path) -> dict[str, Any]:
    from .build import _graph_io

    return _graph_io(path)


def has_fp16(art: Artifacts) -> bool:
    """True when ``art`` lists fp16 graphs (exported with ``--precision fp16``)."""
    return bool(art.manifest.get("precisions", {}).get("fp16"))
