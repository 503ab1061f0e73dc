"""The fused GPT step graph (``gpt_step.onnx``), built from ChatTTS' own LlamaModel modules.

ONNX Runtime runs a transformer layer fastest as a handful of its fused contrib ops; the
TorchScript export of the same layer is about 60 small nodes (RMSNorm spelled out, three
projections, RoPE and a split softmax over past and new keys) that no ORT optimizer fuses.
This module writes the graph directly from the modules' weights, one layer as:

- ``SimplifiedLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` (RMSNorm, the
  latter adding the residual in the same kernel: ``input_layernorm`` and
  ``post_attention_layernorm`` of each ``LlamaDecoderLayer``, then ``norm``);
- one packed QKV ``MatMul`` (H x 3H: ``q_proj | k_proj | v_proj``);
- ``com.microsoft.GroupQueryAttention`` with rotary inside (``do_rotary``, the cos/sin caches
  of the model's ``rotary_emb`` for every position up to ``max_position_embeddings``), its KV
  cache one buffer shared by ``past_*`` and ``present_*`` (IO binding the same memory to
  both: the kernel writes the new positions in place);
- ``o_proj``; one packed gate/up ``MatMul`` (H x 2F), ``Split``, ``QuickGelu(alpha=1)`` (=
  SiLU) and ``Mul``; ``down_proj``;
- the 4 weight-normed code heads folded into one (H x 4*626) ``MatMul``.

The cache layout is GroupQueryAttention's own: each row's positions start at column 0
(``left-aligned``), ``seqlens_k[b]`` = row b's positions after this call - 1, so rows of
different lengths share a batch without padding columns; the rotary position of a new token
is its column (what ChatTTS computes as ``cumsum(attention_mask) - 1``). A prefill of several
prompts is right-padded: row b's ``seqlens_k[b] + 1`` first positions are real, the padding
after them is computed and never read (causal attention keeps it out of the real positions).

Inputs:
    inputs_embeds: (B, S, H) float32.
    seqlens_k: (B,) int32, positions of each row after this call, minus 1.
    total_sequence_length: (1,) int32, ``max(seqlens_k) + 1``.
    past_key_i, past_value_i: (B, heads, C, head_dim) KV dtype, the cache (C >= total; C = 0
        for a prefill into fresh outputs).
Outputs:
    logits: (B, 4, 626) float32 at each row's last real position: ``min(seqlens_k[b], S - 1)``
        (S = 1: the new token; a prefill from an empty cache: the prompt's last token).
    hidden: (B, H) float32, the final-norm hidden state there.
    present_key_i, present_value_i: (B, heads, max(C, total), head_dim), bound to the past
        buffers by the engine (then nothing is copied).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import contract

MS_DOMAIN = "com.microsoft"
FUSED_OPSET = 17
"""ONNX opset of the fused graph (plus the ``com.microsoft`` contrib domain, version 1)."""
FUSED_LAYOUT = 1
"""Recorded in manifest.json (``graphs.gpt_step.layout``): the fused graph's IO as described in
this module's docstring. The runner refuses a gpt_step.onnx without it (an old export)."""


def _np(t: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy())


def llama_weights(llama: Any, head_weights: Any) -> dict[str, Any]:
    """What the fused graph needs from ChatTTS' LlamaModel ``llama`` (transformers'
    ``LlamaModel``) and its folded code heads ``head_weights`` (4, 626, H), as numpy float32.

    Raises:
        ValueError: a Llama variant the graph does not express (biases on the projections,
            an activation other than SiLU, grouped KV heads, a rotary type other than the
            default one).
    """
    import torch

    cfg = llama.config
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hidden = int(cfg.hidden_size)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    if str(cfg.hidden_act) != "silu":
        raise ValueError(f"the fused graph expresses SiLU MLPs only, not {cfg.hidden_act!r}")
    if kv_heads != heads:
        raise ValueError("the fused graph assumes as many KV heads as query heads (ChatTTS' GPT)")
    layers = []
    for layer in llama.layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            if lin.bias is not None:
                raise ValueError("the fused graph assumes bias-free projections (ChatTTS' GPT)")
        layers.append({
            "ln_in": _np(layer.input_layernorm.weight), "ln_in_eps": float(layer.input_layernorm.variance_epsilon),
            "ln_post": _np(layer.post_attention_layernorm.weight),
            "ln_post_eps": float(layer.post_attention_layernorm.variance_epsilon),
            "qkv": np.concatenate([_np(a.q_proj.weight).T, _np(a.k_proj.weight).T, _np(a.v_proj.weight).T], 1),
            "o": _np(a.o_proj.weight).T,
            "gate_up": np.concatenate([_np(m.gate_proj.weight).T, _np(m.up_proj.weight).T], 1),
            "down": _np(m.down_proj.weight).T,
        })
    max_pos = int(cfg.max_position_embeddings)
    with torch.no_grad():
        probe = torch.zeros(1, 1, hidden)
        cos, sin = llama.rotary_emb(probe, torch.arange(max_pos)[None])
    cos_np, sin_np = _np(cos[0]), _np(sin[0])
    half = head_dim // 2
    if not (np.allclose(cos_np[:, :half], cos_np[:, half:]) and np.allclose(sin_np[:, :half], sin_np[:, half:])):
        raise ValueError("the fused graph expects the default (rotate-half) rotary embedding")
    heads_w = _np(head_weights).reshape(-1, hidden).T  # (H, 4 * 626)
    return {"layers": layers, "norm": _np(llama.norm.weight), "norm_eps": float(llama.norm.variance_epsilon),
            "cos": np.ascontiguousarray(cos_np[:, :half]), "sin": np.ascontiguousarray(sin_np[:, :half]),
            "heads": np.ascontiguousarray(heads_w), "num_heads": heads, "head_dim": head_dim, "hidden": hidden,
            "n_codes": int(head_weights.shape[0]), "vocab": int(head_weights.shape[1])}


def build_fused_graph(w: dict[str, Any]) -> Any:
    """The fused step as an ``onnx.ModelProto`` from :func:`llama_weights`' output."""
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    inits: list[Any] = []
    n_layers = len(w["layers"])
    heads, hd, h = w["num_heads"], w["head_dim"], w["hidden"]

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.array(arr, order="C"), name))  # keeps 0-d arrays 0-d
        return name

    def node(op: str, ins: list[str], outs: list[str], domain: str = "", **attrs: Any) -> list[str]:
        nodes.append(helper.make_node(op, ins, outs, name=f"{op}_{len(nodes)}", domain=domain or None, **attrs))
        return outs

    cos = init("cos_cache", w["cos"])
    sin = init("sin_cache", w["sin"])
    x = contract.G_EMBEDS  # residual stream
    pending: str | None = None  # sublayer output not yet added to x
    inputs = [helper.make_tensor_value_info(contract.G_EMBEDS, TensorProto.FLOAT, ["batch", "new", h]),
              helper.make_tensor_value_info(contract.G_SEQLENS_K, TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info(contract.G_TOTAL_SEQ, TensorProto.INT32, [1])]
    outputs = [helper.make_tensor_value_info(contract.G_LOGITS, TensorProto.FLOAT,
                                             ["batch", w["n_codes"], w["vocab"]]),
               helper.make_tensor_value_info(contract.G_HIDDEN, TensorProto.FLOAT, ["batch", h])]
    for i, lw in enumerate(w["layers"]):
        p = f"l{i}."
        if pending is None:
            (hn,) = node("SimplifiedLayerNormalization", [x, init(p + "ln_in", lw["ln_in"])], [p + "ln_in_out"],
                         axis=-1, epsilon=lw["ln_in_eps"])
        else:
            hn, _, _, x = node("SkipSimplifiedLayerNormalization", [pending, x, init(p + "ln_in", lw["ln_in"])],
                               [p + "ln_in_out", "", "", p + "resid_in"], domain=MS_DOMAIN, epsilon=lw["ln_in_eps"])
        (qkv,) = node("MatMul", [hn, init(p + "qkv.weight", lw["qkv"])], [p + "qkv"])
        pk, pv = contract.past_names(i)
        ok, ov = contract.present_names(i)
        for name in (pk, pv):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", heads, "past", hd]))
        for name in (ok, ov):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", heads, "present", hd]))
        att, _, _ = node("GroupQueryAttention", [qkv, "", "", pk, pv, contract.G_SEQLENS_K, contract.G_TOTAL_SEQ,
                                             cos, sin], [p + "attn", ok, ov], domain=MS_DOMAIN,
                      num_heads=heads, kv_num_heads=heads, do_rotary=1, rotary_interleaved=0,
                      scale=float(hd) ** -0.5)
        (o,) = node("MatMul", [att, init(p + "o.weight", lw["o"])], [p + "o"])
        hn2, _, _, x = node("SkipSimplifiedLayerNormalization", [o, x, init(p + "ln_post", lw["ln_post"])],
                            [p + "ln_post_out", "", "", p + "resid_attn"], domain=MS_DOMAIN,
                            epsilon=lw["ln_post_eps"])
        (gu,) = node("MatMul", [hn2, init(p + "gate_up.weight", lw["gate_up"])], [p + "gate_up"])
        g, u = node("Split", [gu, init(p + "split", np.array([lw["gate_up"].shape[1] // 2] * 2, np.int64))],
                    [p + "gate", p + "up"], axis=-1)
        (act,) = node("QuickGelu", [g], [p + "silu"], domain=MS_DOMAIN, alpha=1.0)
        (mul,) = node("Mul", [act, u], [p + "act"])
        (pending,) = node("MatMul", [mul, init(p + "down.weight", lw["down"])], [p + "down"])
    assert pending is not None and n_layers > 0
    # The last real position of each row: min(seqlens_k, S - 1), gathered before the final norm.
    (resid,) = node("Add", [pending, x], ["final_resid"])
    (shape,) = node("Shape", [contract.G_EMBEDS], ["embeds_shape"])
    (s_len,) = node("Gather", [shape, init("one_i64", np.array(1, np.int64))], ["new_len"], axis=0)
    (s_m1,) = node("Sub", [s_len, init("one_i64_b", np.array(1, np.int64))], ["new_len_m1"])
    (sk64,) = node("Cast", [contract.G_SEQLENS_K], ["seqlens_i64"], to=TensorProto.INT64)
    (last,) = node("Min", [sk64, s_m1], ["last_index"])
    (idx3,) = node("Unsqueeze", [last, init("axes_12", np.array([1, 2], np.int64))], ["last_index_3d"])
    (bsz,) = node("Gather", [shape, init("zero_i64", np.array(0, np.int64))], ["batch_size"], axis=0)
    (exp_shape,) = node("Concat", [node("Unsqueeze", [bsz, init("axes_0", np.array([0], np.int64))],
                                        ["batch_size_1d"])[0],
                                   init("one_h", np.array([1, h], np.int64))], ["gather_shape"], axis=0)
    (idx,) = node("Expand", [idx3, exp_shape], ["last_index_bh"])
    (picked,) = node("GatherElements", [resid, idx], ["last_resid"], axis=1)
    (normed,) = node("SimplifiedLayerNormalization", [picked, init("norm.weight", w["norm"])], ["last_normed"],
                     axis=-1, epsilon=w["norm_eps"])
    (hid,) = node("Squeeze", [normed, init("axis_1", np.array([1], np.int64))], [contract.G_HIDDEN])
    (flat,) = node("MatMul", [hid, init("heads.weight", w["heads"])], ["logits_flat"])
    node("Reshape", [flat, init("logits_shape", np.array([-1, w["n_codes"], w["vocab"]], np.int64))],
         [contract.G_LOGITS])
    graph = helper.make_graph(nodes, "chattts_gpt_fused", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FUSED_OPSET),
                                                     helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="chattts_serving")
    model.ir_version = contract.ONNX_IR_VERSION
    return model


def export_fused(llama: Any, head_weights: Any, path: Path) -> None:
    """Write the fused step of ``llama`` and ``head_weights`` (4, 626, H) to ``path``."""
    import onnx

    model = build_fused_graph(llama_weights(llama, head_weights))
    onnx.save_model(model, str(path))
