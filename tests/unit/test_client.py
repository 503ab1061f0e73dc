"""The client library without a server: the server-sent-event parser, the request's tensors
and its mode fields, the vocoder paths and precisions as enums. The clients against a real
tritonserver: tests/server/test_client.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.client import ClientError, SynthesisRequest, sse


def test_sse_parser_handles_events_split_anywhere_and_megabyte_lines() -> None:
    """Events split anywhere across reads (separators included) come out whole and in order,
    and a 1 MB event arriving in 4 KiB reads is one event (httpx-sse's parser; its cost on
    long lines is the library's, not measured here)."""
    long_audio = [0.25] * 200_000  # about 1 MB on one line
    head = b": comment\n\n" + b"data: " + json.dumps({"audio": [1.0, 2.0]}).encode() + b"\n\n"
    body = (b"data: " + json.dumps({"audio": long_audio}).encode() + b"\r\n\r\n"
            + b'data: {"error": "boom"}\n\n')
    for size in (1, 3, 7):  # separators split across reads, then the long event in 4 KiB reads
        pieces = [head[i:i + size] for i in range(len(head))[::size]]
        pieces += [body[i:i + 4096] for i in range(len(body))[::4096]]
        events = list(sse.iter_events(iter(pieces)))
        assert [sorted(e) for e in events] == [["audio"], ["audio"], ["error"]]
        assert events[0]["audio"] == [1.0, 2.0] and len(events[1]["audio"]) == len(long_audio)
        assert events[2]["error"] == "boom"


def test_sse_parser_joins_data_lines_and_refuses_what_is_not_a_json_object() -> None:
    joined = list(sse.iter_events([b'data: {"a":\ndata: 1}\r\n', b"\r\nid: 7\nevent: x\n\n"]))
    assert joined == [{"a": 1}]  # two data lines joined with a newline; events without data skipped
    for bad in (b"data: not json\n\n", b"data: [1, 2]\n\n"):
        with pytest.raises(ClientError, match="server-sent event"):
            list(sse.iter_events([bad]))


def test_request_tensors_follow_the_contract() -> None:
    req = SynthesisRequest("hi", voice="3", seed=5, temperature=0.5, top_k=10, lookahead_tokens=4)
    got = {name: (arr, dtype) for name, arr, dtype in req.tensors()}
    specs = {s.name: s for s in contract.ENTRY_INPUTS}
    assert set(got) == {"text", "voice", "seed", "temperature", "top_k", "lookahead_tokens"}
    for name, (arr, dtype) in got.items():
        assert arr.shape == (1,) and arr.dtype == specs[name].np_dtype and dtype == specs[name].client_dtype
    assert got["text"][0][0] == b"hi"
    assert req.json_inputs() == {"text": "hi", "voice": "3", "seed": 5, "temperature": 0.5, "top_k": 10,
                                 "lookahead_tokens": 4}


def test_mode_fields_become_their_enums_and_other_strings_go_to_the_server() -> None:
    from chattts_serving.contract import Language, Priority, Segmentation, VocoderPath

    req = SynthesisRequest("hi", vocoder="codes", priority="batch", segmentation="chattts", language="zh")
    assert req.vocoder is VocoderPath.CODES and req.priority is Priority.BATCH
    assert req.segmentation is Segmentation.CHATTTS and req.language is Language.ZH
    assert req == SynthesisRequest("hi", vocoder=VocoderPath.CODES, priority=Priority.BATCH,
                                   segmentation=Segmentation.CHATTTS, language=Language.ZH)
    got = {name: arr[0] for name, arr, _ in req.tensors()}
    assert (got["vocoder"], got["priority"], got["segmentation"], got["language"]) == (
        b"codes", b"batch", b"chattts", b"zh")  # the wire
    assert req.json_inputs()["vocoder"] == "codes"
    odd = SynthesisRequest("hi", vocoder="magic")  # the server refuses it, naming the input
    assert odd.vocoder == "magic" and not isinstance(odd.vocoder, VocoderPath)
    assert {n: a[0] for n, a, _ in odd.tensors()}["vocoder"] == b"magic"


def test_vocoder_paths_and_precisions_are_enums_that_take_their_strings(small_artifacts: Any) -> None:
    from chattts_serving.audio.vocoder import VocoderRunner
    from chattts_serving.contract import Precision, VocoderPath
    from chattts_serving.runtime import OrtOptions, graph_path

    runner = VocoderRunner(small_artifacts, "codes")
    assert runner.path is VocoderPath.CODES and runner.input_name == contract.VO_CODES.name
    assert VocoderRunner(small_artifacts, VocoderPath.HIDDEN).input_name == contract.VO_HIDDEN.name
    with pytest.raises(ValueError, match="unknown vocoder path 'mel'"):
        VocoderRunner(small_artifacts, "mel")
    assert OrtOptions(precision="fp16").precision is Precision.FP16  # type: ignore[arg-type]
    assert OrtOptions().precision is Precision.FP32
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        OrtOptions(precision="fp8")  # type: ignore[arg-type]
    assert graph_path(small_artifacts, contract.GPT_GRAPH, "fp32") == graph_path(small_artifacts, contract.GPT_GRAPH)
    assert small_artifacts.receptive_field_tokens("codes") == small_artifacts.receptive_field_tokens(
        VocoderPath.CODES)


@pytest.mark.parametrize("protocol", ["grpc", "http", "sse"])
def test_the_cli_names_an_unusable_inference_key_as_a_usage_error(
        protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A key too short for a header is the user's setting to fix (exit 2, the variable named),
    not an "unexpected" client error; no server is needed to say so."""
    from chattts_serving.client import cli
    monkeypatch.setenv("CHATTTS_INFERENCE_KEY", "short")
    url = "127.0.0.1:9" if protocol == "grpc" else "http://127.0.0.1:9"
    code = cli.main(["--protocol", protocol, "--url", url, "--text", "你好", "--out", str(tmp_path / "a.wav")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "CHATTTS_INFERENCE_KEY" in err and "at least" in err and "unexpected" not in err, err


def test_a_stream_ended_without_a_grpc_status_is_a_lost_connection() -> None:
    """haproxy ends a client's stream without a gRPC status when its replica's connection breaks
    (gRPC: INTERNAL or UNKNOWN "Stream removed"): the client reads the server gone (unavailable,
    retryable), as UNAVAILABLE; so does a CANCELLED this client did not ask for (tritonserver
    cancels its open streams as it stops: tests/server/test_part_dies.py met it once in CI);
    any other INTERNAL stays internal."""
    from tritonclient.utils import InferenceServerException

    from chattts_serving.client.grpc_stream import _client_error
    from chattts_serving.errors import ErrorKind

    for status in ("StatusCode.INTERNAL", "StatusCode.UNKNOWN"):
        cut = _client_error(InferenceServerException("Stream removed (Data frame with END_STREAM flag received)",
                                                     status), "lb:8001", streaming=True)
        assert cut.connection and cut.kind == ErrorKind.UNAVAILABLE
        assert cut.message.startswith("lost the connection to lb:8001")
    stopped = _client_error(InferenceServerException("CANCELLED", "StatusCode.CANCELLED"), "lb:8001")
    assert stopped.connection and stopped.kind == ErrorKind.UNAVAILABLE and "the server cancelled" in stopped.message
    other = _client_error(InferenceServerException("internal error: X", "StatusCode.INTERNAL"), "lb:8001")
    assert not other.connection and other.kind == ErrorKind.INTERNAL


def test_the_asyncio_client_maps_transport_failures_as_the_sync_client_does() -> None:
    """The gateway's client (asyncio) reads a call the server cancelled, a stream cut without a
    status and UNAVAILABLE as the server gone (the gateway's 503 ``backend_unavailable``, not
    499 ``cancelled``), and an error the server sent as its kind, with the sync client's
    messages."""
    import asyncio

    import grpc
    from tritonclient.utils import InferenceServerException

    from chattts_serving.client.aio import AioStreamClient
    from chattts_serving.client.grpc_stream import _client_error
    from chattts_serving.errors import ErrorKind
    from chattts_serving.gateway.errors import from_client_error

    def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

    async def make() -> AioStreamClient:  # the asyncio client is made on a running loop
        return AioStreamClient("lb:8001")

    client = asyncio.run(make())
    cases = [(grpc.StatusCode.CANCELLED, "CANCELLED", True), (grpc.StatusCode.UNAVAILABLE, "Socket closed", True),
             (grpc.StatusCode.INTERNAL, "Stream removed", True),
             (grpc.StatusCode.INTERNAL, "[internal] engine failed", False),
             (grpc.StatusCode.INVALID_ARGUMENT, "[invalid:voice] unknown voice", False)]
    for code, details, lost in cases:
        for streaming in (False, True):
            aio = client._error(rpc_error(code, details), streaming=streaming)
            sync = _client_error(InferenceServerException(details, str(code)), "lb:8001", streaming=streaming)
            assert (aio.message, aio.kind, aio.status, aio.connection) == \
                (sync.message, sync.kind, sync.status, sync.connection), (code, details)
            assert aio.connection == lost and (aio.kind == ErrorKind.UNAVAILABLE) == lost, (code, details)
            if lost:
                assert from_client_error(aio, "lb:8001").status == 503
    assert from_client_error(client._error(rpc_error(grpc.StatusCode.CANCELLED, "CANCELLED"), streaming=True),
                             "lb:8001").code == "backend_unavailable"
