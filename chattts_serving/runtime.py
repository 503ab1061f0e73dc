"""ONNX Runtime wrappers for the exported graphs, free of Triton.

Used by the engine and vocoder models, the parity tests and the raw-step benchmark.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import contract


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session knobs (from the deployment profile).

    ``intra_op_threads``: threads per session (0 = ORT's default, one per core).
    ``allow_spinning``: busy-wait between ops; off when several sessions share few cores
    (measured in ../shared/NOTES.md: two sessions back to back on 2 cores, 58 ms spinning vs
    25 ms not). ``providers``: execution providers in preference order.
    """

    intra_op_threads: int = 0
    allow_spinning: bool = False
    providers: tuple[str, ...] = ("CPUExecutionProvider",)


def make_session(path: Path | str, opts: OrtOptions = OrtOptions()) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` with ``opts``; providers that this
    onnxruntime build lacks are dropped (CPU is always kept as the fallback)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
    available = set(ort.get_available_providers())
    providers = [p for p in opts.providers if p in available] or ["CPUExecutionProvider"]
    if "CPUExecutionProvider" not in providers:
        providers.append("CPUExecutionProvider")
    return ort.InferenceSession(str(path), sess_options=so, providers=providers)


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

    def receptive_field_tokens(self, path: str) -> int:
        """Context in tokens on each side that fully determines a token's audio (``path``:
        'hidden' or 'codes')."""
        return int(self.manifest["receptive_field_tokens"][path])


class Embeddings:
    """ChatTTS' ``Embed`` lookups in numpy.

    ``emb_text``: (21178, H) float32; ``emb_code``: (4, 626, H) float32. The text head
    (``head_text`` in embed.npz, (21178, H) float32, 65 MB at H=768) is read on first use by
    :meth:`text_logits` or :meth:`load_text_head`, so that deployments that never refine text
    do not hold it.
    """

    def __init__(self, artifacts: Artifacts) -> None:
        self._path = artifacts.root / contract.EMBED_FILE
        data = np.load(self._path)
        self.emb_text = np.ascontiguousarray(data["emb_text"], dtype=np.float32)
        self.emb_code = np.ascontiguousarray(data["emb_code"], dtype=np.float32)
        self.has_text_head = "head_text" in data.files
        self.spk_emb_id = contract.SPECIAL_TOKEN_IDS["[spk_emb]"]
        self._head_text: np.ndarray | None = None
        self._head_lock = threading.Lock()

    def load_text_head(self) -> np.ndarray:
        """The text head W (21178, H) float32, ChatTTS' weight-normed ``Embed.head_text``
        materialised by the exporter; loaded once, then cached.

        Raises:
            RuntimeError: the artifacts predate the text head (exporter version < 3); re-run
                the export (``make export``) to add it.
        """
        with self._head_lock:
            if self._head_text is None:
                if not self.has_text_head:
                    raise RuntimeError(f"{self._path} has no text head (head_text): these artifacts predate "
                                       "refine-text support; re-run `make export`")
                with np.load(self._path) as data:
                    self._head_text = np.ascontiguousarray(data["head_text"], dtype=np.float32)
            return self._head_text

    def text_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Text-mode logits (B, 21178) float32 of last hidden states (B, H) float32:
        ``hidden @ W.T``, what ChatTTS' ``GPT.generate(infer_text=True)`` gets from
        ``self.head_text(hidden_states)`` (``ChatTTS/model/gpt.py``). Raises RuntimeError as
        :meth:`load_text_head`."""
        w = self.load_text_head()
        return np.asarray(hidden, np.float32) @ w.T

    def text(self, ids: np.ndarray) -> np.ndarray:
        """Decode-step embeddings (B, H) float32 of text ids (B,): ``emb_text`` rows, as
        ChatTTS' text mode embeds each new token (``self.emb_text(inputs_ids[:, :, 0])``)."""
        return self.emb_text[ids]

    def prompt(self, input_ids: np.ndarray, spk_emb: np.ndarray | None) -> np.ndarray:
        """Prefill embeddings (T, H) float32 of prompt ids (T,): text embeddings, with the
        ``[spk_emb]`` positions replaced by ``spk_emb`` (H,), the speaker vector already
        normalised by :func:`chattts_serving.speaker.normalize_speaker` (ChatTTS'
        ``Speaker.apply``)."""
        emb = self.emb_text[input_ids]
        if spk_emb is not None and spk_emb.size:
            emb[input_ids == self.spk_emb_id] = spk_emb.astype(np.float32)
        return emb

    def codes(self, codes: np.ndarray) -> np.ndarray:
        """Decode-step embeddings (B, H) of codes (B, 4): the sum of the 4 code embeddings."""
        out = self.emb_code[0][codes[:, 0]]
        for q in range(1, contract.NUM_VQ):
            out = out + self.emb_code[q][codes[:, q]]
        return out


class GptStepRunner:
    """Runs ``gpt_step.onnx``.

    :meth:`run` takes embeddings (B, T, H) float32, an int64 mask (B, P+T) and the per-layer
    past KV list (2*layers arrays of (B, heads, P, head_dim)); returns logits (B, 4, 626),
    hidden (B, H) and the new positions' KV list (B, heads, T, head_dim).
    """

    def __init__(self, artifacts: Artifacts, opts: OrtOptions = OrtOptions()) -> None:
        self.art = artifacts
        self.session = make_session(artifacts.root / contract.GPT_GRAPH, opts)
        self.layers = artifacts.num_layers
        self._past = [n for i in range(self.layers) for n in contract.past_names(i)]
        self._out = [contract.G_LOGITS, contract.G_HIDDEN,
                     *(n for i in range(self.layers) for n in contract.present_names(i))]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.art.num_heads, 0, self.art.head_dim)
        return [np.zeros(shape, np.float32) for _ in range(2 * self.layers)]

    def run(self, embeds: np.ndarray, mask: np.ndarray,
            past: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        feed = {contract.G_EMBEDS: embeds, contract.G_MASK: mask}
        feed.update(zip(self._past, past))
        outs = self.session.run(self._out, feed)
        return outs[0], outs[1], outs[2:]


class VocoderRunner:
    """Runs one vocoder graph: windows (B, T, H) float32 or (B, T, 4) int32 -> audio
    (B, 512T-256) float32."""

    def __init__(self, artifacts: Artifacts, path: str, opts: OrtOptions = OrtOptions()) -> None:
        if path not in contract.VOCODER_PATHS:
            raise ValueError(f"unknown vocoder path {path!r}; expected one of {sorted(contract.VOCODER_PATHS)}")
        graph = contract.VOCODER_HIDDEN_GRAPH if path == "hidden" else contract.VOCODER_CODES_GRAPH
        self.path = path
        self.input_name = "hidden" if path == "hidden" else "codes"
        self.session = make_session(artifacts.root / graph, opts)

    def warm_up(self, hidden_size: int, lengths: tuple[int, ...] = (17, 48, 96)) -> None:
        """Decode one window of each length before serving (first-run allocations)."""
        for n in lengths:
            shape = (1, n, hidden_size) if self.path == "hidden" else (1, n, contract.NUM_VQ)
            self.run(np.zeros(shape, np.float32 if self.path == "hidden" else np.int32))

    def run(self, windows: np.ndarray) -> np.ndarray:
        dtype = np.float32 if self.path == "hidden" else np.int32
        return self.session.run(["audio"], {self.input_name: np.ascontiguousarray(windows, dtype=dtype)})[0]
