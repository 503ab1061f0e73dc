"""Against a real tritonserver: streaming, no mixing between concurrent streams, batched
engine steps, and clear errors for bad input with the server staying healthy."""

from __future__ import annotations

import queue
import threading
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from chattts_serving import contract
from tests.support.requests import BAD_INPUTS, GREEDY, entry_input, stream

TEXTS = ["你好，欢迎使用流式语音合成服务。", "今天天气很好，我们去公园散步吧。", "ChatTTS 在 Triton 上流式输出。",
         "请稍等，正在为您查询订单。", "这是第五个并发请求。", "语音合成需要低延迟。", "第七句话比较短。",
         "最后一句，谢谢大家的耐心。"]






def _request(text: str, seed: int, tokens: int = 40) -> list[grpcclient.InferInput]:
    return [entry_input("text", text), entry_input("seed", seed), entry_input("max_new_tokens", tokens),
            entry_input("min_new_tokens", tokens), entry_input("voice", str(seed))]


def _metric(metrics_port: int, name: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
    return out


def test_sentence_streams_in_several_chunks(triton_server) -> None:
    chunks, err = stream(triton_server.grpc_url, _request(TEXTS[0], 1, 60))
    assert err is None
    assert len(chunks) >= 2
    assert chunks[0].size < chunks[-1].size or len(chunks) > 2
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in chunks)
    assert sum(c.size for c in chunks) == contract.samples_for_tokens(60)


def test_concurrent_streams_each_get_their_solo_audio(triton_server) -> None:
    reqs = [(t, 10 + i, 30 + 4 * i) for i, t in enumerate(TEXTS)]
    solo = []
    for text, seed, n in reqs:
        chunks, err = stream(triton_server.grpc_url, _request(text, seed, n))
        assert err is None
        solo.append(np.concatenate(chunks))
    before = _metric(triton_server.metrics_port, "tts_engine_batch_size")
    results: list[tuple[list[np.ndarray], str | None] | None] = [None] * len(reqs)

    def run(i: int) -> None:
        results[i] = stream(triton_server.grpc_url, _request(*reqs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i, res in enumerate(results):
        assert res is not None and res[1] is None, res
        got = np.concatenate(res[0])
        assert got.shape == solo[i].shape, f"stream {i}: {got.shape} vs solo {solo[i].shape}"
        np.testing.assert_allclose(got, solo[i], atol=1e-3, err_msg=f"stream {i} differs from its solo run")
    after = _metric(triton_server.metrics_port, "tts_engine_batch_size")

    def delta(suffix: str) -> float:
        keys = [k for k in after if k.startswith("tts_engine_batch_size" + suffix)]
        return sum(after[k] - before.get(k, 0.0) for k in keys)

    steps = delta("_count")
    single = sum(after[k] - before.get(k, 0.0) for k in after if k.startswith("tts_engine_batch_size_bucket")
                 and 'le="1"' in k)
    assert steps > 0
    assert single < steps, "no decode step batched more than one request"
    assert delta("_sum") / steps > 1.5, "decode steps were hardly batched"



ACCEPTED_INPUTS = [
    ("leading punctuation", "，。你好，世界。"),
    ("emoji inside text", "你好😀，世界🎉。"),
    ("mixed Chinese and English", "ChatTTS 是一个 text-to-speech 模型。"),
]


@pytest.mark.parametrize("case, text", ACCEPTED_INPUTS, ids=[c[0] for c in ACCEPTED_INPUTS])
def test_unusual_but_speakable_text_streams(triton_server, case: str, text: str) -> None:
    chunks, err = stream(triton_server.grpc_url, [entry_input("text", text), entry_input("max_new_tokens", 20),
                                                  entry_input("min_new_tokens", 20), entry_input("seed", 1)])
    assert err is None, f"{case}: {err}"
    assert sum(c.size for c in chunks) > 0


@pytest.mark.parametrize("case, inputs, fragment", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_error_and_server_stays_healthy(triton_server, case: str, inputs: list,
                                                              fragment: str) -> None:
    try:
        chunks, err = stream(triton_server.grpc_url, inputs, timeout_s=60)
    except grpcclient.InferenceServerException as exc:  # rejected before streaming
        chunks, err = [], str(exc)
    assert err, f"{case}: accepted"
    assert chunks == []
    assert "Traceback" not in err and 'File "' not in err
    assert fragment.lower() in err.lower(), err
    client = httpclient.InferenceServerClient(triton_server.http_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        for model in contract.ALL_MODELS:
            assert client.is_model_ready(model)
    finally:
        client.close()


def test_offline_http_errors_use_http_status(triton_server) -> None:
    client = httpclient.InferenceServerClient(triton_server.http_url)
    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["，。！".encode()], dtype=np.object_))
    with pytest.raises(httpclient.InferenceServerException) as info:
        try:
            client.infer(contract.MODEL_OFFLINE, [text])
        finally:
            client.close()
    assert "nothing speakable" in str(info.value)
    assert str(info.value.status()) == "400"


def test_server_still_streams_after_bad_inputs(triton_server) -> None:
    chunks, err = stream(triton_server.grpc_url, _request(TEXTS[1], 5, 30))
    assert err is None and sum(c.size for c in chunks) == contract.samples_for_tokens(30)




def test_refine_text_speaks_the_text_chattts_refines(triton_server, small_chat) -> None:  # type: ignore[no-untyped-def]
    """refine_text runs ChatTTS' refine stage: at greedy settings the server speaks exactly the
    text ChatTTS' own ``Chat.infer(refine_text_only=True)`` refines (small checkpoint), and its
    offline audio is ChatTTS' code stage and decoder on that text for the same voice seed.
    gRPC streaming and SSE give the same audio and text; without refine_text nothing is refined."""
    import torch

    from chattts_serving.client import SynthesisRequest, synthesize_offline, synthesize_sse, synthesize_stream

    chat = small_chat
    text, voice, n_refine, n_code = TEXTS[0], 3, 12, 24
    req = SynthesisRequest(text=text, voice=str(voice), temperature=GREEDY, max_new_tokens=n_code,
                           min_new_tokens=n_code, refine_text=True, refine_temperature=GREEDY,
                           refine_max_new_tokens=n_refine, refine_min_new_tokens=n_refine)
    offline = synthesize_offline(triton_server.http_url, req)
    first = synthesize_stream(triton_server.grpc_url, req)
    again = synthesize_sse(triton_server.http_url, req)
    plain = synthesize_stream(triton_server.grpc_url, SynthesisRequest(text=text, max_new_tokens=4))
    assert offline.info["refined"] is first.info["refined"] is True and plain.info["refined"] is False
    np.testing.assert_array_equal(first.audio, again.audio)
    assert first.info["normalized_text"] == again.info["normalized_text"] == offline.info["normalized_text"]

    (normalized,) = plain.info["normalized_text"]
    assert chat.normalizer(text, True, True) == normalized  # ChatTTS reads the same text before refining
    refined = chat.infer([normalized], skip_refine_text=False, refine_text_only=True, split_text=False,
                         do_text_normalization=False, do_homophone_replacement=False,
                         params_refine_text=chat.RefineTextParams(temperature=GREEDY, manual_seed=0,
                                                                  max_new_token=n_refine, min_new_token=n_refine,
                                                                  show_tqdm=False))[0]
    # what ChatTTS' code stage then speaks: its code prompt without the wrapper tokens
    (prompt,) = chat.speaker.decorate_code_prompts([refined], "", None, "any-speaker")
    assert prompt.startswith("[Stts][spk_emb]") and prompt.endswith("[Ptts]")
    spoken = prompt[len("[Stts][spk_emb]"):-len("[Ptts]")]
    assert spoken != normalized  # the refine stage changed the text
    assert offline.info["normalized_text"] == [spoken]

    torch.manual_seed(voice)
    spk = chat.sample_random_speaker()
    code_params = chat.InferCodeParams(spk_emb=spk, temperature=GREEDY, manual_seed=0, max_new_token=n_code,
                                       min_new_token=n_code, show_tqdm=False)
    generated = next(chat._infer_code([refined], False, torch.device("cpu"), True, code_params))
    reference = np.asarray(chat._decode_to_wavs(generated.hiddens, True))[0]
    assert offline.audio.size == reference.size == contract.samples_for_tokens(n_code)
    np.testing.assert_allclose(offline.audio, reference, rtol=0, atol=1e-5)


def test_cancel_during_refine_text_ends_the_refine_sequence_at_once(triton_server) -> None:
    """A client that cancels while its text is being refined (no audio yet) has the refine
    sequence dropped by the engine within a few steps, not after its 2000 tokens."""
    import time

    def engine_gauge(name: str) -> float:
        return sum(_metric(triton_server.metrics_port, name).values())

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    inputs = [entry_input("text", TEXTS[2]), entry_input("refine_text", True),
              entry_input("refine_max_new_tokens", 2000), entry_input("refine_min_new_tokens", 2000),
              entry_input("max_new_tokens", 20)]
    client.async_stream_infer(contract.MODEL_STREAM, inputs, enable_empty_final_response=True)
    deadline = time.monotonic() + 60
    while engine_gauge("tts_engine_active_sequences") < 1:
        assert time.monotonic() < deadline, "the refine sequence never reached the engine"
        time.sleep(0.01)
    steps_at_cancel = engine_gauge("tts_engine_decode_steps_total")
    client.stop_stream(cancel_requests=True)
    client.close()
    while engine_gauge("tts_engine_active_sequences") > 0:
        assert time.monotonic() < deadline, "the refine sequence kept running after the cancel"
        time.sleep(0.01)
    steps = engine_gauge("tts_engine_decode_steps_total") - steps_at_cancel
    print(f"\ndecode steps between the cancel and the refine sequence leaving: {steps:.0f}")
    assert steps < 200  # of 2000: it was dropped, not run to its end
    while not q.empty():
        result, error = q.get()
        assert error is not None or result.as_numpy(contract.OUT_AUDIO.name) is None  # no audio was sent
    chunks, err = stream(triton_server.grpc_url, _request(TEXTS[1], 5, 30))  # the server serves on
    assert err is None and sum(c.size for c in chunks) == contract.samples_for_tokens(30)
