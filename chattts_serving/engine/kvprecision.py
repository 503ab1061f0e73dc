"""The fused GPT step graph with its KV cache in fp16 or int8, rewritten when a session loads.

A decode step reads each row's whole KV cache once (20 layers x K and V x 768 values per
position at full size); at batch 16 and a past of 300 that is more bytes than the int8
weights. The exported ``gpt_step.onnx`` (and its int8-weight variant) keeps the cache in fp32;
:func:`kv_cache_graph` rewrites each ``com.microsoft.GroupQueryAttention`` node of it so that
``past_*``/``present_*`` hold the :class:`~chattts_serving.contract.KvPrecision` asked for:

- ``fp16``: ONNX Runtime's CPU GroupQueryAttention takes an fp16 cache only when its query
  (and its rotary cos/sin tables) are fp16 too, so the packed QKV is cast to fp16 before the
  node and its output back to fp32 after it; projections, norms and heads stay as exported.
- ``int8``: the node's own quantized cache (``kv_cache_bit_width`` 8, ``k_quant_type`` and
  ``v_quant_type`` ``PER_CHANNEL``): the new K/V are rounded to int8 with one static scale per
  head and channel (``k_scale``/``v_scale``: (heads, 1, head_dim) float32 per layer, calibrated
  on the fp32 graph, :data:`chattts_serving.contract.KV_SCALES_FILE`) and dequantized on read;
  the attention computes in fp32.

The rewrite runs in memory on the graph the runner loads (so it applies to every weight
precision without a file per combination); what it does to the tokens is measured by
``python -m chattts_serving.export.accuracy kv`` and written to manifest.json (``kv_cache``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import contract
from ..contract import KvPrecision

GQA_OP = "GroupQueryAttention"
ROTARY_INPUTS = (7, 8)
"""Positions of ``cos_cache`` and ``sin_cache`` among GroupQueryAttention's inputs."""
SCALE_INPUTS = (12, 13)
"""Positions of ``k_scale`` and ``v_scale`` among GroupQueryAttention's inputs (9-11:
position_ids, attention_bias, head_sink, left empty)."""


def graph_kv_precision(model: Any) -> KvPrecision:
    """The KV precision of fused step graph ``model`` (an ``onnx.ModelProto``), read from its
    first ``past_key`` input. Raises ValueError for a graph without one."""
    from onnx import TensorProto

    name = contract.past_names(0)[0]
    for v in model.graph.input:
        if v.name == name:
            t = v.type.tensor_type.elem_type
            return {TensorProto.FLOAT: KvPrecision.FP32, TensorProto.FLOAT16: KvPrecision.FP16,
                    TensorProto.INT8: KvPrecision.INT8}[t]
    raise ValueError(f"no {name} input: not the fused GPT step graph")


def kv_cache_graph(model: Any, kv: KvPrecision | str, scales: dict[str, np.ndarray] | None = None) -> Any:
    """Rewrite the fused step graph ``model`` (``onnx.ModelProto`` with an fp32 KV cache, as
    exported; changed in place and returned) to keep its cache in ``kv``.

    Args:
        model: the fp32-KV fused graph (fp32 or int8 weights).
        kv: the cache precision; ``fp32`` returns ``model`` unchanged.
        scales: for ``int8``: ``k_<i>`` and ``v_<i>`` for every layer i, each (heads, 1,
            head_dim) float32 > 0 (see :func:`calibrate_scales`).

    Raises:
        ValueError: the graph's cache is not fp32, or ``int8`` without valid scales.
    """
    from onnx import TensorProto, helper, numpy_helper

    kv = KvPrecision(kv)
    if kv is KvPrecision.AUTO:
        raise ValueError("resolve kv_cache auto first (runtime.resolve_kv_precision)")
    if kv is KvPrecision.FP32:
        return model
    if graph_kv_precision(model) is not KvPrecision.FP32:
        raise ValueError(f"the graph's KV cache is already {graph_kv_precision(model)}; "
                         "only an fp32-KV graph is rewritten")
    g = model.graph
    elem = TensorProto.FLOAT16 if kv is KvPrecision.FP16 else TensorProto.INT8
    for v in (*g.input, *g.output):
        if v.name.startswith(("past_key_", "past_value_", "present_key_", "present_value_")):
            v.type.tensor_type.elem_type = elem
    gqa = [n for n in g.node if n.op_type == GQA_OP]
    if kv is KvPrecision.INT8:
        _check_scales(scales, len(gqa))
    inits = {i.name: i for i in g.initializer}
    if kv is KvPrecision.FP16:
        for idx in ROTARY_INPUTS:  # the tables become fp16 in place (the fp32 ones would be unused)
            t = inits[gqa[0].input[idx]]
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    nodes: list[Any] = []
    for n in g.node:
        if n.op_type != GQA_OP:
            nodes.append(n)
            continue
        if kv is KvPrecision.FP16:
            q16, out = n.input[0] + "_fp16", n.output[0]
            nodes.append(helper.make_node("Cast", [n.input[0]], [q16], name=n.name + "_query_fp16",
                                          to=TensorProto.FLOAT16))
            n.input[0] = q16
            n.output[0] = out + "_fp16"
            nodes.append(n)
            nodes.append(helper.make_node("Cast", [out + "_fp16"], [out], name=n.name + "_output_fp32",
                                          to=TensorProto.FLOAT))
        else:
            layer = len([m for m in nodes if m.op_type == GQA_OP])
            assert scales is not None
            names = []
            for kind in ("k", "v"):
                name = f"l{layer}.{kind}_scale"
                g.initializer.append(numpy_helper.from_array(
                    np.ascontiguousarray(scales[f"{kind}_{layer}"], np.float32), name))
                names.append(name)
            ins = [*n.input, *[""] * (SCALE_INPUTS[0] - len(n.input)), *names]
            del n.input[:]
            n.input.extend(ins)
            n.attribute.extend([helper.make_attribute("kv_cache_bit_width", 8),
                                helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                                helper.make_attribute("v_quant_type", "PER_CHANNEL")])
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return model


def _check_scales(scales: dict[str, np.ndarray] | None, layers: int) -> None:
    if scales is None:
        raise ValueError(f"an int8 KV cache needs its calibrated scales ({contract.KV_SCALES_FILE}: "
                         "python -m chattts_serving.export.accuracy kv --artifacts DIR)")
    for i in range(layers):
        for kind in ("k", "v"):
            a = scales.get(f"{kind}_{i}")
            if a is None or a.ndim != 3 or a.shape[1] != 1 or not np.all(np.isfinite(a)) or not np.all(a > 0):
                raise ValueError(f"{contract.KV_SCALES_FILE}: {kind}_{i} must be a (heads, 1, head_dim) array of "
                                 "finite positive scales")


INT8_LEVELS = 127
"""Largest int8 magnitude a calibrated maximum maps to (symmetric: -127..127)."""


def scales_from_absmax(k_absmax: np.ndarray, v_absmax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 scales (heads, 1, head_dim) float32 of one layer from calibrated maxima.

    ``k_absmax``: (heads, head_dim/2) largest norm of each rotary pair (channel j with
    j + head_dim/2) of the cached, rotated K: the rotation at another position moves a pair's
    magnitude between its two channels, never beyond the pair's norm, so both channels get it.
    ``v_absmax``: (heads, head_dim) largest |V| per channel. A scale is ``max / 127`` (a
    channel that was always 0 gets the smallest positive scale of its layer)."""
    k = np.concatenate([k_absmax, k_absmax], axis=-1)
    out = []
    for m in (k, v_absmax):
        s = np.asarray(m, np.float64) / INT8_LEVELS
        floor = s[s > 0].min() if np.any(s > 0) else 1.0
        out.append(np.maximum(s, floor).astype(np.float32)[:, None, :])
    return out[0], out[1]
