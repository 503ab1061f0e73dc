"""The error codec (chattts_serving.errors): the ``[kind]`` / ``[kind:param]`` tag, the GPT
engine's ``error:<kind>:`` stop reasons and the transport statuses, and the ``param`` that
request parsing sets and the gateway reports, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.client import ClientError
from chattts_serving.errors import (
    STATUS,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    RequestError,
    decode,
    decode_stop,
    decode_tagged,
    encode,
    encode_stop,
    from_message,
    kind_from_status,
    quoted,
)
from chattts_serving.gateway.errors import from_client_error
from chattts_serving.serving.request import EntryLimits, parse_engine, parse_entry
from chattts_serving.text.voices import VoiceBook, VoiceError

LIMITS = EntryLimits(max_new_tokens_cap=1024)


def _text(value: str) -> np.ndarray:
    return np.array([value.encode()], np.object_)


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_kind_survives_the_tag_with_and_without_a_param(kind: ErrorKind) -> None:
    message = "something: went [wrong] here"
    assert encode(kind, message) == f"[{kind.value}] {message}"
    assert decode(encode(kind, message)) == (kind, message)
    tagged = decode_tagged(encode(kind, message, "voice"))
    assert (tagged.kind, tagged.param, tagged.message) == (kind, "voice", message)
    assert decode(encode(kind, message, "voice")) == (kind, message)  # the old two-part view
    back = from_message(RequestError(message, kind, param="top_p").wire())
    assert (back.kind, back.param, str(back)) == (kind, "top_p", message)
    assert STATUS[kind] == back.status


@pytest.mark.parametrize("text", [
    "Exceeds maximum queue size",
    "[nonsense] a tag of no kind",
    "[invalid]no space after the tag",
    "[invalid:] an empty param",
    "[invalid:two words] a param that is not a name",
    "see [invalid] later in the text",
    "",
])
def test_a_message_without_a_valid_tag_is_left_as_it_is(text: str) -> None:
    assert decode(text) == (None, text)
    assert decode_tagged(text).param is None
    untagged = from_message(text)
    assert (untagged.kind, untagged.param, str(untagged)) == (ErrorKind.INTERNAL, None, text)
    assert from_message(text, ErrorKind.BUSY).kind == ErrorKind.BUSY


class _TritonError:
    """What a BLS response's ``error()`` returns (only ``message()`` is read)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def message(self) -> str:
        return self.text


@pytest.mark.parametrize(("text", "kind", "why"), [
    ("Model chattts_vocoder - Error when running inference: Server not ready", ErrorKind.UNAVAILABLE,
     "the server is shutting down"),
    ("Server not ready", ErrorKind.UNAVAILABLE, "the server is shutting down"),
    ("Stub process 'chattts_gpt_0_0' is not healthy.", ErrorKind.UNAVAILABLE, "a model process is unavailable"),
    ("Request for unknown model: 'chattts_vocoder' has no available versions", ErrorKind.UNAVAILABLE,
     "a model process is unavailable"),
    ("Model chattts_vocoder - Error when running inference: Failed for execute the inference request. Model "
     "'chattts_vocoder' is not ready.", ErrorKind.UNAVAILABLE, "a model process is unavailable"),
    ("Request for unknown model: 'chattts_nope' is not found", ErrorKind.INTERNAL, ""),
    ("onnxruntime: bad shape", ErrorKind.INTERNAL, ""),
    (RequestError("text is empty: Server not ready", ErrorKind.INVALID).wire(), ErrorKind.INVALID, ""),
])
def test_tritons_own_unavailability_in_bls_errors_reads_as_unavailable(text: str, kind: ErrorKind, why: str) -> None:
    """Triton's own words for a stopping server, a model being (re)loaded and a dead model
    process are UNAVAILABLE (retry after the restart, or elsewhere); other untagged errors stay
    INTERNAL, and a tagged message keeps its own kind."""
    from chattts_serving.triton.compat.error_codes import error_from_triton

    exc = error_from_triton(_TritonError(text))
    assert exc.kind == kind
    if kind == ErrorKind.UNAVAILABLE:
        assert str(exc).startswith(f"server unavailable: {why}") and text in str(exc)


def test_a_param_must_be_an_input_name() -> None:
    with pytest.raises(ValueError, match="param"):
        RequestError("x", param="not a name")
    assert RequestError("x").param is None and RequestError("x").wire() == "[invalid] x"


def test_the_special_errors_keep_their_kinds() -> None:
    assert decode(DeadlineExceeded(1.5).wire()) == (ErrorKind.DEADLINE, str(DeadlineExceeded(1.5)))
    assert str(DeadlineExceeded(1.5)).startswith("deadline exceeded") and "timeout_s=1.5" in str(DeadlineExceeded(1.5))
    assert decode(Cancelled().wire()) == (ErrorKind.CANCELLED, "cancelled by the client")


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_stop_reasons_carry_every_kind(kind: ErrorKind) -> None:
    stop = encode_stop(RequestError("failed: at step 3", kind))
    assert stop == f"error:{kind.value}:failed: at step 3"
    back = decode_stop(stop)
    assert back is not None and (back.kind, str(back)) == (kind, "failed: at step 3")


def test_normal_and_unknown_stop_reasons() -> None:
    for normal in ("eos", "max_tokens", "cancelled", ""):
        assert decode_stop(normal) is None
    unknown = decode_stop("error:exploded:the GPU caught fire")
    assert unknown is not None and unknown.kind == ErrorKind.INTERNAL
    assert str(unknown) == "exploded:the GPU caught fire"  # nothing of it is lost


@pytest.mark.parametrize("status, kind", [
    (400, ErrorKind.INVALID), (404, ErrorKind.INVALID), (429, ErrorKind.BUSY), (499, ErrorKind.CANCELLED),
    (500, ErrorKind.INTERNAL), (503, ErrorKind.BUSY), (504, ErrorKind.DEADLINE), (502, ErrorKind.INTERNAL),
    (200, None), (None, None),
    ("UNAVAILABLE", ErrorKind.BUSY), ("StatusCode.UNAVAILABLE", ErrorKind.BUSY),
    ("StatusCode.INVALID_ARGUMENT", ErrorKind.INVALID), ("RESOURCE_EXHAUSTED", ErrorKind.BUSY),
    ("DEADLINE_EXCEEDED", ErrorKind.DEADLINE), ("StatusCode.CANCELLED", ErrorKind.CANCELLED),
    ("INTERNAL", ErrorKind.INTERNAL), ("StatusCode.UNKNOWN", ErrorKind.INTERNAL),
])
def test_kind_from_status(status: int | str | None, kind: ErrorKind | None) -> None:
    assert kind_from_status(status) == kind


@pytest.mark.parametrize("inputs, param", [
    ({}, "text"),
    ({"text": _text("好" * 11)}, "text"),
    ({"voice": np.array([1], np.int32)}, "voice"),
    ({"vocoder": _text("magic")}, "vocoder"),
    ({"priority": _text("urgent")}, "priority"),
    ({"segmentation": _text("words")}, "segmentation"),
    ({"language": _text("fr")}, "language"),
    ({"timeout_s": np.array([-1.0], np.float32)}, "timeout_s"),
    ({"top_p": np.array([3.0], np.float32)}, "top_p"),
    ({"top_k": np.array([1.0], np.float32)}, "top_k"),
    ({"max_new_tokens": np.array([5000], np.int32)}, "max_new_tokens"),
    ({"min_new_tokens": np.array([300], np.int32), "max_new_tokens": np.array([200], np.int32)}, "min_new_tokens"),
    ({"lookahead_tokens": np.array([0], np.int32)}, "lookahead_tokens"),
    ({"refine_temperature": np.array([0.5], np.float32)}, "refine_text"),
    ({"refine_text": np.array([True]), "refine_top_p": np.array([3.0], np.float32)}, "refine_top_p"),
    ({"refine_text": np.array([True]), "refine_prompt": _text("[laugh_0]" * 999)}, "refine_prompt"),
    ({"reference_text": _text("参考。")}, "reference_text"),
    ({"spk_smp": _text("not a prompt"), "reference_text": _text("参考。")}, "spk_smp"),
    ({"reference_audio": np.zeros(10, np.float64), "reference_text": _text("参考。")}, "reference_audio"),
    ({"reference_audio": np.zeros(10, np.float32), "reference_text": _text("参考。")}, "reference_audio"),
])
def test_entry_parsing_names_the_input_at_fault(inputs: dict[str, np.ndarray], param: str) -> None:
    tensors = {"text": _text("你好"), **inputs}
    if not inputs:
        del tensors["text"]
    with pytest.raises(RequestError) as err:
        parse_entry(tensors, EntryLimits(max_new_tokens_cap=1024, max_text_chars=10))
    assert err.value.kind == ErrorKind.INVALID and err.value.param == param, str(err.value)
    assert err.value.wire().startswith(f"[invalid:{param}] ")


def test_errors_about_no_one_input_name_none() -> None:
    with pytest.raises(RequestError) as err:
        parse_entry({"text": _text("你好")}, LIMITS, {"priorty": "batch"})  # a Triton request parameter
    assert err.value.param is None and err.value.wire().startswith("[invalid] unknown request parameter")


def test_engine_parsing_names_its_inputs() -> None:
    with pytest.raises(RequestError) as err:
        parse_engine({"control": _text("pause")}, 8, 1024)
    assert err.value.param == contract.EN_CONTROL.name
    with pytest.raises(RequestError) as err:
        parse_engine({"input_ids": np.array([1.0], np.float32)}, 8, 1024)
    assert err.value.param == contract.FE_INPUT_IDS.name


@pytest.mark.parametrize("wire, field", [
    ("[invalid:voice] unknown voice 'x': not a seed", "voice"),
    ("[invalid:text] text is empty", "input"),  # the entry's text is OpenAI's input
    ("[invalid:reference_sample_rate_hz] reference sample rate must be ...", "reference_audio"),
    ("[invalid:top_p] top_p=3 is out of range", "top_p"),
    ("[invalid] the voice and the text were fine, something else was not", None),  # no guessing from words
])
def test_the_gateway_reports_the_param_the_server_named(wire: str, field: str | None) -> None:
    error = ClientError(wire)
    assert error.kind == ErrorKind.INVALID and not error.message.startswith("[")
    api = from_client_error(error, "127.0.0.1:1")
    assert (api.status, api.param, api.code) == (400, field, "invalid_value")
    assert api.body()["error"]["param"] == field


def test_a_long_message_is_cut_to_fit_a_grpc_trailer_and_values_are_quoted_short() -> None:
    """A 50 KB unknown voice quoted whole passed gRPC's 16 KB trailer limit: the client got
    RESOURCE_EXHAUSTED instead of the error (and retried a bad request as unavailable)."""
    wire = encode(ErrorKind.INVALID, "unknown voice " + "x" * 50_000, "voice")
    assert len(wire) < 2100 and wire.endswith("... (cut)")
    assert decode_tagged(wire).kind == ErrorKind.INVALID and decode_tagged(wire).param == "voice"
    assert quoted("alloy") == "'alloy'"
    assert quoted("x" * 50_000) == repr("x" * 64) + "... (50000 characters)"
    with pytest.raises(VoiceError) as caught:
        VoiceBook().resolve("y" * 300_000, 2)
    assert len(str(caught.value)) < 1000 and "300000 characters" in str(caught.value)
