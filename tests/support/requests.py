"""Requests to a real server's ``chattts``: one input tensor, one whole stream, and the bad
inputs every door must refuse (name, inputs, what the error says)."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from chattts_serving import contract


def entry_input(name: str, value: Any, datatype: str | None = None) -> grpcclient.InferInput:
    spec = {t.name: t for t in contract.ENTRY_INPUTS}.get(name)
    if isinstance(value, np.ndarray):
        arr = value
    elif spec is not None and spec.triton_dtype == "TYPE_STRING":
        arr = np.array([value.encode() if isinstance(value, str) else value], dtype=np.object_)
    else:
        assert spec is not None
        arr = np.array([value], dtype=spec.np_dtype)
    dt = datatype or (spec.client_dtype if spec else "BYTES")
    i = grpcclient.InferInput(name, list(arr.shape), dt)
    i.set_data_from_numpy(arr)
    return i


def stream(url: str, inputs: list[grpcclient.InferInput], timeout_s: float = 120.0
           ) -> tuple[list[np.ndarray], str | None]:
    """Run one stream on ``chattts``; returns (chunks, error message or None)."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    chunks: list[np.ndarray] = []
    err = None
    try:
        client.async_stream_infer(contract.MODEL_STREAM, inputs, enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=timeout_s)
            if error is not None:
                err = str(error)
                break
            audio = result.as_numpy(contract.OUT_AUDIO.name)
            if audio is not None and audio.size:
                chunks.append(audio)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return chunks, err


BAD_INPUTS = [
    ("empty text", [entry_input("text", "")], "empty"),
    ("whitespace only", [entry_input("text", "   \n\t ")], "empty"),
    ("punctuation only", [entry_input("text", "，。！")], "nothing speakable"),
    ("missing text", [entry_input("seed", 3)], "missing required input 'text'"),
    ("invalid utf-8", [entry_input("text", b"\xff\xfe\xfa")], "UTF-8"),
    ("wrong dtype", [entry_input("text", "你好"), entry_input("temperature", np.array([0.3], np.float64), "FP64")],
     "expects 'FP32'"),
    ("wrong shape", [entry_input("text", np.array([b"a", b"b"], dtype=np.object_))], "shape"),
    ("unknown voice", [entry_input("text", "你好"), entry_input("voice", "not-a-voice!")], "unknown voice"),
    ("voice seed out of range", [entry_input("text", "你好"), entry_input("voice", "99999999999999")], "out of range"),
    ("max_new_tokens zero", [entry_input("text", "你好"), entry_input("max_new_tokens", 0)], "max_new_tokens"),
    ("max_new_tokens negative", [entry_input("text", "你好"), entry_input("max_new_tokens", -3)], "max_new_tokens"),
    ("max_new_tokens huge", [entry_input("text", "你好"), entry_input("max_new_tokens", 10**9)], "max_new_tokens"),
    ("temperature negative", [entry_input("text", "你好"), entry_input("temperature", -0.5)], "temperature"),
    ("top_p above one", [entry_input("text", "你好"), entry_input("top_p", 1.5)], "top_p"),
    ("unknown vocoder", [entry_input("text", "你好"), entry_input("vocoder", "wavenet")], "vocoder"),
    ("lookahead zero", [entry_input("text", "你好"), entry_input("lookahead_tokens", 0)], "lookahead"),
    ("text too long", [entry_input("text", "好" * 5000)], "limit"),
    ("24000 characters", [entry_input("text", "语音合成。" * 4800)], "limit"),
    ("emoji only", [entry_input("text", "😀🎉")], "nothing speakable"),
    ("negative top_k", [entry_input("text", "你好"), entry_input("top_k", -4)], "top_k"),
    ("huge seed voice", [entry_input("text", "你好"), entry_input("voice", "-1")], "out of range"),
    ("refine parameter without refine_text", [entry_input("text", "你好"), entry_input("refine_top_k", 5)],
     "refine_text"),
    ("refine prompt not control tokens", [entry_input("text", "你好"), entry_input("refine_text", True),
                                          entry_input("refine_prompt", "说慢一点")], "refine_prompt"),
    ("refine temperature zero", [entry_input("text", "你好"), entry_input("refine_text", True),
                                 entry_input("refine_temperature", 0.0)], "refine_temperature"),
]


GREEDY = 1e-6  # token-for-token comparisons with ChatTTS need 1e-6 (at 1e-4 near-ties are coin tosses)
