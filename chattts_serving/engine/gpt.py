"""The GPT side of the exported artifacts in ONNX Runtime: ChatTTS' embedding lookups
(:class:`Embeddings`) and the GPT step graph (:class:`GptStepRunner`), free of Triton.

Used by the engine, the parity checks of the exporter and the raw-step benchmark.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..contract import KvPrecision
from ..runtime import Artifacts, OrtOptions, graph_path, kv_precision, make_session, resolve_kv_precision

log = logging.getLogger(__name__)


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

    def prompt(self, input_ids: np.ndarray, spk_emb: np.ndarray | None,
               prompt_codes: np.ndarray | None = None) -> np.ndarray:
        """Prefill embeddings (T+P, H) float32 of prompt ids (T,): text embeddings, with the
        ``[spk_emb]`` positions replaced by ``spk_emb`` (H,), the speaker vector already
        normalised by :func:`chattts_serving.text.speaker.normalize_speaker` (ChatTTS'
        ``Speaker.apply``), followed by the P positions of ``prompt_codes`` (P, 4) int (an
        audio prompt, ChatTTS' ``spk_smp``), each the sum of its 4 code embeddings: what
        ChatTTS' ``Embed.forward`` computes where ``text_mask`` is false, the positions its
        ``Tokenizer.encode(..., prompt=codes)`` appends after ``[Ptts]``. P = 0 when None."""
        emb = self.emb_text[input_ids]
        if spk_emb is not None and spk_emb.size:
            emb[input_ids == self.spk_emb_id] = spk_emb.astype(np.float32)
        if prompt_codes is not None and len(prompt_codes):
            emb = np.concatenate([emb, self.codes(np.asarray(prompt_codes, np.int64))])
        return emb

    def codes(self, codes: np.ndarray) -> np.ndarray:
        """Decode-step embeddings (B, H) of codes (B, 4): the sum of the 4 code embeddings."""
        out = self.emb_code[0][codes[:, 0]]
        for q in range(1, contract.NUM_VQ):
            out = out + self.emb_code[q][codes[:, q]]
        return out


class KvCache:
    """The GPT's KV cache: per layer one K and one V buffer (rows, heads, capacity, head_dim)
    of ``dtype`` on ``backend`` (numpy on the host, cupy on a CUDA device), allocated once.

    Row r holds its sequence's positions in columns [0, length) (GroupQueryAttention's layout,
    see chattts_serving/export/fused.py); the step graph reads them and writes the new
    positions after them in place (its ``past_*`` and ``present_*`` are bound to the same
    memory), so a decode step copies nothing. Columns past a row's length hold stale data that
    is never read. On the host the buffers are ``zeros`` (calloc: pages are committed as
    positions are first written, not at allocation).
    """

    def __init__(self, backend: Any, layers: int, rows: int, heads: int, capacity: int, head_dim: int,
                 dtype: Any) -> None:
        self.backend = backend
        self.dtype = dtype
        self.buffers = [backend.zeros((rows, heads, capacity, head_dim), dtype) for _ in range(2 * layers)]
        """2*layers arrays: layer i's K at 2i, its V at 2i+1."""

    @property
    def rows(self) -> int:
        return int(self.buffers[0].shape[0])

    @property
    def capacity(self) -> int:
        """Positions each row can hold."""
        return int(self.buffers[0].shape[2])

    def copy_row(self, row: int, src: KvCache, src_row: int, n: int) -> None:
        """Copy the first ``n`` positions of ``src``'s row ``src_row`` into row ``row`` (a
        sequence joining the batch with its prefill KV: O(n), the only copy it ever gets)."""
        for dst, s in zip(self.buffers, src.buffers):
            dst[row, :, :n] = s[src_row, :, :n]


def load_step_graph(artifacts: Artifacts, graph: Path, kv: KvPrecision | str) -> Path | bytes:
    """What :func:`~chattts_serving.runtime.make_session` loads for step graph file ``graph``
    of ``artifacts`` with a KV cache of precision ``kv``: the file itself when its cache already
    is ``kv`` (or ``kv`` is fp32: the graph as exported), else the serialized graph rewritten
    by :func:`~chattts_serving.engine.kvprecision.kv_cache_graph` (int8: with the scales of
    :data:`~chattts_serving.contract.KV_SCALES_FILE`).

    Raises:
        ValueError: the graph's cache is in another reduced precision (the fp16 graph with an
            int8 cache), or int8 scales that do not fit the graph.
        FileNotFoundError: an int8 cache without calibrated scales in ``artifacts``.
    """
    import onnx

    from .kvprecision import graph_kv_precision, kv_cache_graph

    kv = KvPrecision(kv)
    if kv is KvPrecision.FP32:
        return graph
    model = onnx.load(str(graph))
    have = graph_kv_precision(model)
    if have is kv:
        return graph
    if have is not KvPrecision.FP32:
        raise ValueError(f"{graph.name} keeps its KV cache in {have}; a {kv} cache needs a graph with an fp32 one")
    scales = None
    if kv is KvPrecision.INT8:
        path = artifacts.root / contract.KV_SCALES_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{artifacts.root} has no {contract.KV_SCALES_FILE} (the int8 KV cache's scales): "
                                    "python -m chattts_serving.export.accuracy kv --artifacts DIR")
        with np.load(path) as data:
            scales = {k: data[k] for k in data.files}
    return bytes(kv_cache_graph(model, kv, scales).SerializeToString())


class GptStepRunner:
    """Runs the fused GPT step graph ``gpt_step.onnx`` (or its ``opts.precision`` variant) with
    ONNX Runtime's IO binding over a :class:`KvCache`.

    :meth:`prefill` runs right-padded prompts from an empty cache into a new cache of their
    own; :meth:`decode` runs one token for each of the first B rows of a cache, reading and
    writing its buffers in place. The KV dtype is the graph's (float32; float16 for the fp16
    graph) and the cache lives on :attr:`backend` (numpy on the host; cupy device memory with
    ``opts.io_binding`` on the CUDA execution provider). Embeddings go in and logits and
    hidden come out through host memory: the only per-step transfers. ``opts.kv_cache``
    fp16 or int8 rewrites an fp32-KV graph's cache into that precision when it loads
    (:func:`load_step_graph`); the cache buffers are then float16 or int8.
    """

    def __init__(self, artifacts: Artifacts, opts: OrtOptions = OrtOptions()) -> None:
        from .arrays import backend_for_session

        self.art = artifacts
        self.opts = opts
        self.graph = graph_path(artifacts, contract.GPT_GRAPH, opts.precision)
        """The graph file this runner loaded (the fp32 file or its ``opts.precision`` variant)."""
        self.kv_precision = resolve_kv_precision(artifacts, opts.kv_cache, opts.precision)
        """The KV cache precision this runner runs (``opts.kv_cache``, ``auto`` resolved)."""
        model = load_step_graph(artifacts, self.graph, self.kv_precision)
        try:
            self.session = make_session(model, opts)
        except Exception as exc:
            if isinstance(model, Path):
                raise
            import onnxruntime

            why = (f"onnxruntime {onnxruntime.__version__} cannot load {self.graph.name} with a "
                   f"{self.kv_precision} KV cache (its GroupQueryAttention kernels for this provider take "
                   f"no such cache): {exc}")
            if kv_precision(opts.kv_cache) is not KvPrecision.AUTO:
                raise RuntimeError(why) from exc
            # auto chose the cache the artifacts measured; this onnxruntime cannot run it
            log.warning("%s; running the fp32 KV cache instead", why)
            self.kv_precision = KvPrecision.FP32
            self.session = make_session(load_step_graph(artifacts, self.graph, self.kv_precision), opts)
        self.layers = artifacts.num_layers
        self._past = [n for i in range(self.layers) for n in contract.past_names(i)]
        self._present = [n for i in range(self.layers) for n in contract.present_names(i)]
        types = {i.name: i.type for i in self.session.get_inputs()}
        if contract.G_SEQLENS_K not in types or self._past[0] not in types:
            raise RuntimeError(f"{self.graph} is not the fused GPT step graph (exported before the fused "
                               "graph existed): re-run `make export`")
        dtypes: dict[str, type[np.generic]] = {"tensor(float16)": np.float16, "tensor(int8)": np.int8}
        self.kv_dtype: type[np.generic] = dtypes.get(types[self._past[0]], np.float32)
        """dtype of the KV cache: float16 for the fp16 graph or ``opts.kv_cache`` fp16, int8 for
        ``opts.kv_cache`` int8, else float32."""
        self.io_binding = opts.io_binding
        self.backend = backend_for_session(list(self.session.get_providers()), opts.io_binding, opts.device_id)
        """Where :class:`KvCache` buffers live (device memory with cupy on the CUDA EP when
        ``opts.io_binding``; else host memory)."""
        self._placeholder = self.backend.zeros((1,), self.kv_dtype)  # a valid address for an empty past
        self._bound: tuple[KvCache, int, Any] | None = None  # (cache, rows, IOBinding) of the last decode

    def use_session(self, session: Any) -> None:
        """Run the step on ``session`` (the same graph, rebuilt with other kernels or options)
        from the next call; the IO binding of the last decode belonged to the old session."""
        self.session = session
        self._bound = None

    def new_cache(self, rows: int, capacity: int) -> KvCache:
        """An empty :class:`KvCache` of ``rows`` rows of ``capacity`` positions for this graph."""
        return KvCache(self.backend, self.layers, rows, self.art.num_heads, capacity, self.art.head_dim,
                       self.kv_dtype)

    def _bind_kv(self, io: Any, cache: KvCache, rows: int) -> None:
        """Bind the first ``rows`` rows of ``cache`` as both past and present (one memory)."""
        be = self.backend
        for past, present, buf in zip(self._past, self._present, cache.buffers):
            shape = (rows, *buf.shape[1:])
            io.bind_input(past, be.device_type, be.device_id, self.kv_dtype, shape, be.ptr(buf))
            io.bind_output(present, be.device_type, be.device_id, self.kv_dtype, shape, be.ptr(buf))

    def _run(self, io: Any, embeds: np.ndarray, seqlens_k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = embeds.shape[0]
        io.bind_cpu_input(contract.G_EMBEDS, embeds)
        io.bind_cpu_input(contract.G_SEQLENS_K, seqlens_k)
        io.bind_cpu_input(contract.G_TOTAL_SEQ, np.array([int(seqlens_k.max()) + 1], np.int32))
        logits = np.empty((b, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS), np.float32)
        hidden = np.empty((b, self.art.hidden_size), np.float32)
        io.bind_output(contract.G_LOGITS, "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        io.bind_output(contract.G_HIDDEN, "cpu", 0, np.float32, hidden.shape, hidden.ctypes.data)
        self.backend.synchronize()  # the engine's writes to the cache before ORT's stream reads it
        io.synchronize_inputs()
        self.session.run_with_iobinding(io)
        io.synchronize_outputs()
        return logits, hidden

    def prefill(self, embeds: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, KvCache]:
        """Prompts through the graph from an empty cache.

        Args:
            embeds: (B, T, H) float32, row b's prompt in its first ``lengths[b]`` positions
                (right-padded; the padding is computed and ignored).
            lengths: (B,) int, 1 <= lengths[b] <= T.

        Returns:
            logits (B, 4, 626) and hidden (B, H) float32 at each row's last prompt position,
            and a new :class:`KvCache` (B rows, capacity T) whose row b holds the prompt's
            ``lengths[b]`` positions.
        """
        b, t, _ = embeds.shape
        lengths = np.asarray(lengths)
        if lengths.shape != (b,) or lengths.min() < 1 or lengths.max() > t:
            raise ValueError(f"prefill lengths must be (B,) in [1, T]; got {lengths} for T={t}")
        cache = self.new_cache(b, t)
        be = self.backend
        io = self.session.io_binding()
        for name, buf in zip(self._past, cache.buffers):
            io.bind_input(name, be.device_type, be.device_id, self.kv_dtype, (b, *buf.shape[1:2], 0, buf.shape[3]),
                          be.ptr(self._placeholder))
        for name, buf in zip(self._present, cache.buffers):
            io.bind_output(name, be.device_type, be.device_id, self.kv_dtype, tuple(buf.shape), be.ptr(buf))
        logits, hidden = self._run(io, np.ascontiguousarray(embeds, np.float32), (lengths - 1).astype(np.int32))
        return logits, hidden, cache

    def decode(self, embeds: np.ndarray, cache: KvCache, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One new token for each of the first B rows of ``cache``, written in place at column
        ``lengths[b]`` of row b.

        Args:
            embeds: (B, 1, H) float32, B <= cache.rows.
            cache: the batch's :class:`KvCache` (its first B rows are bound, not copied).
            lengths: (B,) int, positions each row holds before this step (< capacity); a row
                that holds no sequence may pass 0 (its output is garbage and its column 0 is
                overwritten).

        Returns:
            logits (B, 4, 626) and hidden (B, H) float32 of the new tokens.
        """
        b = embeds.shape[0]
        lengths = np.asarray(lengths)
        if embeds.shape[1] != 1 or b > cache.rows or lengths.shape != (b,):
            raise ValueError(f"decode takes (B, 1, H) embeddings for B <= {cache.rows} rows and (B,) lengths")
        if b and int(lengths.max()) >= cache.capacity:
            raise ValueError(f"a row is full: {int(lengths.max())} positions in a cache of {cache.capacity}")
        if self._bound is not None and self._bound[0] is cache and self._bound[1] == b:
            io = self._bound[2]  # the KV bindings of the last step still hold: rebind only the rest
        else:
            io = self.session.io_binding()
            self._bind_kv(io, cache, b)
            self._bound = (cache, b, io)
        return self._run(io, np.ascontiguousarray(embeds, np.float32), lengths.astype(np.int32))
