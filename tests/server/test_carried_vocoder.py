"""The carried vocoder over a real tritonserver (the ``cpu`` profile: ``[stream]
carry_vocoder_state``): the stream at full lookahead equals the offline decode while the
vocoder model vocodes only each window's chunk, lookahead and crossfade edges; a cancelled
stream's state is freed; a window out of order is refused with INVALID_ARG, not a crash."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio.chunking import vocoded_tokens
from chattts_serving.client import SynthesisRequest, iter_chunks, synthesize_offline, synthesize_stream
from chattts_serving.serving.profile import load_profile
from tests.support.servers import metric

TEXT = "你好，欢迎使用流式语音合成服务。"
TIMEOUT_S = 60.0
TOKENS = "tts_vocoder_tokens_total"
CARRIED = "tts_vocoder_carried_streams"


def _request(**overrides: Any) -> SynthesisRequest:
    fields: dict[str, Any] = {"text": TEXT, "seed": 7, "max_new_tokens": 100}
    fields.update(overrides)
    return SynthesisRequest(**fields)


def _wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_carried_stream_equals_offline_and_vocodes_only_chunks_and_lookahead(triton_server: Any) -> None:
    port, model = triton_server.metrics_port, contract.MODEL_VOCODER
    rf = triton_server.artifacts.receptive_field_tokens("hidden")
    offline = synthesize_offline(triton_server.http_url, _request(), timeout_s=TIMEOUT_S)
    before = metric(port, TOKENS, require=True, model=model)
    streamed = synthesize_stream(triton_server.grpc_url, _request(lookahead_tokens=rf), timeout_s=TIMEOUT_S)
    vocoded = metric(port, TOKENS, model=model) - before
    assert streamed.chunks >= 2 and streamed.audio.size == offline.audio.size
    assert float(np.max(np.abs(streamed.audio - offline.audio))) < 1e-4
    n, schedule = streamed.info["tokens"], load_profile("cpu").stream.schedule().with_lookahead(rf)
    assert schedule.carried
    assert vocoded == vocoded_tokens(schedule, n) < vocoded_tokens(schedule.windowed(), n)
    assert metric(port, CARRIED, require=True, model=model) == 0


def test_a_cancelled_stream_frees_its_vocoder_state(triton_server: Any) -> None:
    port, model = triton_server.metrics_port, contract.MODEL_VOCODER
    chunks = iter_chunks(triton_server.grpc_url, _request(max_new_tokens=2000, min_new_tokens=2000),
                         timeout_s=TIMEOUT_S)
    assert next(chunks).size > 0
    assert next(chunks).size > 0  # a second window: the vocoder holds the stream's state
    assert metric(port, CARRIED, model=model) == 1
    chunks.close()  # cancels the request
    assert _wait_for(lambda: metric(port, CARRIED, model=model) == 0), "the cancelled stream's state stayed"


def test_a_window_out_of_order_is_invalid_arg_and_the_model_serves_on(triton_server: Any) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    h = triton_server.artifacts.hidden_size

    def call(stream_id: str, start: int, carry_from: int, action: int, tokens: int) -> np.ndarray:
        inputs = [grpcclient.InferInput(contract.VO_HIDDEN.name, [1, tokens, h], "FP32"),
                  grpcclient.InferInput(contract.VO_STREAM_ID.name, [1, 1], "BYTES"),
                  grpcclient.InferInput(contract.VO_STREAM_PLAN.name, [1, 3], "INT32")]
        inputs[0].set_data_from_numpy(np.random.default_rng(start).standard_normal((1, tokens, h)).astype(np.float32))
        inputs[1].set_data_from_numpy(np.array([[stream_id.encode()]], np.object_))
        inputs[2].set_data_from_numpy(np.array([[start, carry_from, action]], np.int32))
        with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            out = client.infer(contract.MODEL_VOCODER, inputs, outputs=[grpcclient.InferRequestedOutput("audio")])
        return out.as_numpy("audio")[0]

    with pytest.raises(InferenceServerException, match="is not open") as info:
        call("never-opened", 5, 9, contract.STREAM_CONTINUE, 12)
    assert "INVALID_ARG" in str(info.value.status())
    assert call("direct", 0, 4, contract.STREAM_CONTINUE, 12).size == 11 * contract.SAMPLES_PER_TOKEN
    with pytest.raises(InferenceServerException, match="starts at token 3"):
        call("direct", 3, 6, contract.STREAM_CONTINUE, 12)
    assert call("direct2", 0, 0, contract.STREAM_FINAL, 6).size == contract.samples_for_tokens(6)
    assert metric(triton_server.metrics_port, CARRIED, model=contract.MODEL_VOCODER) == 0
