"""One engine-sequence request type, checked once: the pipeline's request, the engine model's
parsed tensors and the engine's Sequence are the same SequenceRequest, and each rule has one
home (SequenceRequest.__post_init__); what only the engine can judge stays in Engine.submit."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.contract import SequenceMode
from chattts_serving.engine.request import InvalidSequence, SequenceRequest
from chattts_serving.engine.sequence import Sequence, make_sequence
from chattts_serving.errors import ErrorKind
from chattts_serving.params import SamplingParams
from chattts_serving.serving.request import parse_engine

H = 8
IDS = np.arange(1, 6)
SPK = np.ones(H, np.float32)


@pytest.mark.parametrize("changes, param", [
    ({"input_ids": np.zeros(0, np.int64)}, contract.FE_INPUT_IDS.name),
    ({"input_ids": np.array([contract.TEXT_VOCAB_SIZE])}, contract.FE_INPUT_IDS.name),
    ({"mode": "texts"}, contract.EN_MODE.name),
    ({"mode": SequenceMode.TEXT}, contract.EN_SPK_EMB.name),  # a speaker in text mode
    ({"prompt_codes": np.full((3, 4), contract.EOS_CODE, np.int32)}, contract.EN_PROMPT_CODES.name),
    ({"prompt_codes": np.zeros((3, 3), np.int32)}, contract.EN_PROMPT_CODES.name),
    ({"spk_emb": np.full(H, np.nan, np.float32)}, contract.EN_SPK_EMB.name),
    ({"emit_tokens": 0}, contract.EN_EMIT_TOKENS.name),
])
def test_each_rule_refuses_with_kind_invalid_and_its_input(changes: dict, param: str) -> None:
    fields = {"input_ids": IDS, "spk_emb": SPK, "params": SamplingParams(), **changes}
    with pytest.raises(InvalidSequence) as exc:
        SequenceRequest(**fields)
    assert exc.value.kind == ErrorKind.INVALID and exc.value.param == param
    assert isinstance(exc.value, ValueError)  # the engine's own callers catch ValueError


def test_an_empty_audio_prompt_reads_as_none_and_the_prompt_length_counts_codes() -> None:
    assert SequenceRequest(IDS, SPK, SamplingParams(), prompt_codes=np.zeros((0, 4), np.int32)).prompt_codes is None
    assert SequenceRequest(IDS, SPK, SamplingParams(), prompt_codes=np.ones((7, 4), np.int32)).prompt_length == 12


def test_the_engine_model_parses_tensors_into_the_same_type_and_the_same_rule_refuses() -> None:
    inputs = {contract.FE_INPUT_IDS.name: IDS.astype(np.int32), contract.EN_SPK_EMB.name: SPK,
              contract.EN_STREAM_ID.name: np.array([b"s1"], np.object_)}
    req = parse_engine(inputs, H, 2048, request_id="r1")
    assert isinstance(req, SequenceRequest) and (req.stream_id, req.request_id) == ("s1", "r1")
    seq = Sequence(req, sink=None)  # type: ignore[arg-type]
    assert seq.request is req and (seq.request.stream_id, seq.request.request_id) == ("s1", "r1")
    bad = {**inputs, contract.EN_MODE.name: np.array([b"text"], np.object_)}  # text mode with a speaker
    with pytest.raises(InvalidSequence, match="text-mode"):
        parse_engine(bad, H, 2048)
    with pytest.raises(InvalidSequence, match="text-mode"):
        make_sequence(IDS, SPK, SamplingParams(), None, mode=SequenceMode.TEXT)  # type: ignore[arg-type]
