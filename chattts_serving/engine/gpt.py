"""The GPT side of the exported artifacts in ONNX Runtime: ChatTTS' embedding lookups
(:class:`Embeddings`) and the GPT step graph (:class:`GptStepRunner`), free of Triton.

Used by the engine, the parity checks of the exporter and the raw-step benchmark.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .. import contract
from ..runtime import Artifacts, OrtOptions, graph_path, make_session


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


class GptStepRunner:
    """Runs ``gpt_step.onnx`` (or its fp16 or int8 variant, ``opts.precision``; the int8
    graph's IO and KV cache are float32 like the fp32 graph's).

    :meth:`run` takes embeddings (B, T, H) float32, an int64 mask (B, P+T) and the per-layer
    past KV list (2*layers arrays of (B, heads, P, head_dim) :attr:`kv_dtype`: float32, float16
    for the fp16 graph); returns logits (B, 4, 626) float32, hidden (B, H) float32 and the new
    positions' KV list (B, heads, T, head_dim) :attr:`kv_dtype`, all numpy (``session.run``).

    :meth:`step` is what the engine calls: :meth:`run` without IO binding; with
    ``opts.io_binding`` it is :meth:`run_bound`, where mask, past and new KV are arrays of
    :attr:`backend` (device memory on the CUDA EP with cupy) bound in place.
    """

    def __init__(self, artifacts: Artifacts, opts: OrtOptions = OrtOptions()) -> None:
        from .arrays import NUMPY, backend_for_session

        self.art = artifacts
        self.opts = opts
        self.graph = graph_path(artifacts, contract.GPT_GRAPH, opts.precision)
        """The graph file this runner loaded (the fp32 file or its ``opts.precision`` variant)."""
        self.session = make_session(self.graph, opts)
        self.layers = artifacts.num_layers
        self._past = [n for i in range(self.layers) for n in contract.past_names(i)]
        self._out = [contract.G_LOGITS, contract.G_HIDDEN,
                     *(n for i in range(self.layers) for n in contract.present_names(i))]
        past_type = {i.name: i.type for i in self.session.get_inputs()}[self._past[0]]
        self.kv_dtype: type[np.floating[Any]] = np.float16 if past_type == "tensor(float16)" else np.float32
        """dtype of the KV cache the graph takes and returns: float16 for the fp16 graph, else float32."""
        self.io_binding = opts.io_binding
        self.backend = (backend_for_session(list(self.session.get_providers()), True, opts.device_id)
                        if opts.io_binding else NUMPY)
        """Where :meth:`step` expects mask and KV arrays and returns new KV arrays."""
        self._new_kv: dict[tuple[int, int], list[Any]] = {}
        self._placeholder = self.backend.zeros((1,), np.float32)  # a valid address for empty buffers

    def empty_past(self, batch: int) -> list[Any]:
        """Past KV of 0 positions for ``batch`` rows: 2*layers arrays (B, heads, 0, head_dim)
        of :attr:`kv_dtype` on :attr:`backend` (numpy without IO binding)."""
        shape = (batch, self.art.num_heads, 0, self.art.head_dim)
        return [self.backend.zeros(shape, self.kv_dtype) for _ in range(2 * self.layers)]

    def run(self, embeds: np.ndarray, mask: np.ndarray,
            past: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        feed = {contract.G_EMBEDS: embeds, contract.G_MASK: mask}
        feed.update(zip(self._past, past))
        outs = self.session.run(self._out, feed)
        return outs[0], outs[1], outs[2:]

    def step(self, embeds: np.ndarray, mask: Any, past: list[Any], *,
             reuse_outputs: bool = False) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """One GPT call as the engine makes it: :meth:`run_bound` with IO binding, else
        :meth:`run` (``mask`` and ``past`` then numpy, ``reuse_outputs`` ignored)."""
        if self.io_binding:
            return self.run_bound(embeds, mask, past, reuse_outputs=reuse_outputs)
        return self.run(embeds, mask, past)

    def run_bound(self, embeds: np.ndarray, mask: Any, past: list[Any], *,
                  reuse_outputs: bool = False) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """One GPT call through IO binding.

        Args:
            embeds: (B, T, H) float32 host array (the only per-step upload: B*T*H*4 bytes).
            mask: (B, P+T) int64, C-contiguous, on :attr:`backend`'s device.
            past: 2*layers C-contiguous (B, heads, P, head_dim) :attr:`kv_dtype` arrays on the device,
                bound in place (not copied); they may be the engine's whole KV buffers.
            reuse_outputs: write the new KV into buffers preallocated for this (B, T) and
                reused by the next call of the same shape (the decode step, whose caller copies
                them into its cache at once); otherwise fresh buffers.

        Returns:
            logits (B, 4, 626) float32 and hidden (B, H) float32 on the host (the per-step
            download), and the new KV: 2*layers (B, heads, T, head_dim) :attr:`kv_dtype` arrays on the
            device.

        Raises:
            ValueError: a bound array is not C-contiguous.
        """
        be = self.backend
        b, t, h = embeds.shape
        io = self.session.io_binding()
        embeds = np.ascontiguousarray(embeds, np.float32)
        io.bind_cpu_input(contract.G_EMBEDS, embeds)
        io.bind_input(contract.G_MASK, be.device_type, be.device_id, np.int64, tuple(mask.shape), be.ptr(mask))
        for name, p in zip(self._past, past):
            ptr = be.ptr(p) if p.size else be.ptr(self._placeholder)
            io.bind_input(name, be.device_type, be.device_id, self.kv_dtype, tuple(p.shape), ptr)
        logits = np.empty((b, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS), np.float32)
        hidden = np.empty((b, h), np.float32)
        io.bind_output(contract.G_LOGITS, "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        io.bind_output(contract.G_HIDDEN, "cpu", 0, np.float32, hidden.shape, hidden.ctypes.data)
        shape = (b, self.art.num_heads, t, self.art.head_dim)
        new_kv = self._new_kv.get((b, t)) if reuse_outputs else None
        if new_kv is None:
            new_kv = [be.zeros(shape, self.kv_dtype) for _ in range(2 * self.layers)]
            if reuse_outputs:
                self._new_kv = {(b, t): new_kv}  # one decode shape at a time: free the others
        for name, buf in zip(self._out[2:], new_kv):
            io.bind_output(name, be.device_type, be.device_id, self.kv_dtype, shape, be.ptr(buf))
        be.synchronize()  # the engine's writes to mask/KV (cupy's stream) before ORT's stream reads them
        io.synchronize_inputs()
        self.session.run_with_iobinding(io)
        io.synchronize_outputs()
        return logits, hidden, new_kv
