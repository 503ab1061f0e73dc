"""The vocoder graphs in ONNX Runtime (:class:`VocoderRunner`), free of Triton."""

from __future__ import annotations

import numpy as np

from .. import contract
from ..runtime import Artifacts, OrtOptions, graph_path, make_session


class VocoderRunner:
    """Runs one vocoder graph: windows (B, T, H) float32 or (B, T, 4) int32 -> audio
    (B, 512T-256) float32 (fp32 IO also for the fp16 variant, ``opts.precision``).
    Raises FileNotFoundError when that variant was not exported (:func:`graph_path`)."""

    def __init__(self, artifacts: Artifacts, path: str, opts: OrtOptions = OrtOptions()) -> None:
        if path not in contract.VOCODER_PATHS:
            raise ValueError(f"unknown vocoder path {path!r}; expected one of {sorted(contract.VOCODER_PATHS)}")
        graph = contract.VOCODER_HIDDEN_GRAPH if path == "hidden" else contract.VOCODER_CODES_GRAPH
        self.path = path
        self.input_name = "hidden" if path == "hidden" else "codes"
        self.session = make_session(graph_path(artifacts, graph, opts.precision), opts)

    def warm_up(self, hidden_size: int, lengths: tuple[int, ...] = (17, 48, 96)) -> None:
        """Decode one window of each length before serving (first-run allocations)."""
        for n in lengths:
            shape = (1, n, hidden_size) if self.path == "hidden" else (1, n, contract.NUM_VQ)
            self.run(np.zeros(shape, np.float32 if self.path == "hidden" else np.int32))

    def run(self, windows: np.ndarray) -> np.ndarray:
        dtype = np.float32 if self.path == "hidden" else np.int32
        return self.session.run(["audio"], {self.input_name: np.ascontiguousarray(windows, dtype=dtype)})[0]
