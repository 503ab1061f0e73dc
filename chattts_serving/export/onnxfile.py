"""Writing and hashing the artifact files: the TorchScript ONNX export every graph goes through
and the sha256 the manifest records (a leaf module: the exporters of each graph import it)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

OPSET = 17
"""ONNX opset of every exported graph."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def onnx_export(module: Any, args: tuple[Any, ...], path: Path, in_names: list[str], out_names: list[str],
                dynamic_axes: dict[str, dict[int, str]]) -> None:
    """TorchScript-based ``torch.onnx.export`` (the dynamo exporter also works but is slower)."""
    import warnings

    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=in_names, output_names=out_names,
                          dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False,
                          do_constant_folding=True)
