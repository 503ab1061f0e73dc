"""The vocoder graphs in ONNX Runtime (:class:`VocoderRunner`), free of Triton."""

from __future__ import annotations

import numpy as np

from .. import contract
from ..contract import VocoderPath
from ..runtime import Artifacts, OrtOptions, graph_path, make_session


class VocoderRunner:
    """Runs one vocoder graph: windows (B, T, H) float32 or (B, T, 4) int32 -> audio
    (B, 512T-256) float32 (fp32 IO also for the fp16 and int8 variants, ``opts.precision``).
    ``path``: a :class:`~chattts_serving.contract.VocoderPath` or its value (a profile's or a
    model parameter's string). Raises ValueError for another path, FileNotFoundError when that
    variant was not exported (:func:`graph_path`)."""

    def __init__(self, artifacts: Artifacts, path: VocoderPath | str, opts: OrtOptions = OrtOptions()) -> None:
        try:
            self.path = VocoderPath(path)
        except ValueError:
            raise ValueError(f"unknown vocoder path {path!r}; expected one of "
                             f"{sorted(p.value for p in contract.VOCODER_PATHS)}") from None
        hidden = self.path is VocoderPath.HIDDEN
        self.source = contract.VOCODER_HIDDEN_GRAPH if hidden else contract.VOCODER_CODES_GRAPH
        """The graph's ``contract.*_GRAPH`` name (its fp32 file)."""
        self.input_name = contract.VO_HIDDEN.name if hidden else contract.VO_CODES.name
        self.graph = graph_path(artifacts, self.source, opts.precision)
        """The graph file this runner runs (its precision's variant; ``auto`` resolved)."""
        self.session = make_session(self.graph, opts)

    def warm_up(self, hidden_size: int, lengths: tuple[int, ...] = (17, 48, 96)) -> None:
        """Decode one window of each length before serving (first-run allocations)."""
        for n in lengths:
            shape = (1, n, hidden_size) if self.path is VocoderPath.HIDDEN else (1, n, contract.NUM_VQ)
            self.run(np.zeros(shape, np.float32 if self.path is VocoderPath.HIDDEN else np.int32))

    def run(self, windows: np.ndarray) -> np.ndarray:
        """Audio (B, 512T-256) float32 of windows (B, T, H) float32 (hidden path) or
        (B, T, 4) int32 codes (codes path), cast to that dtype."""
        dtype = np.float32 if self.path is VocoderPath.HIDDEN else np.int32
        return self.session.run(["audio"], {self.input_name: np.ascontiguousarray(windows, dtype=dtype)})[0]
