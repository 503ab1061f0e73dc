"""One front-end call per request: a request's segments travel to ``chattts_frontend`` in one
call and come back as one output each, and a later call prompts the texts the front end made
again without normalising them (tests/unit/test_multisentence.py counts the calls of whole
requests)."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.contract import Language
from chattts_serving.errors import RequestError
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.boundary import FrontendOutput, frontend_outputs, frontend_tensors
from chattts_serving.serving.request import FrontendCall, frontend_inputs, parse_frontend
from chattts_serving.text.frontend import FrontEnd


def test_a_call_of_several_segments_reads_back_as_it_was_sent() -> None:
    call = FrontendCall(texts=("今天天气很好。", "", "Hi."), speeds=(5, 3, 9), voice="7", request_id="r",
                        refine_prompt="[oral_2]", refined_ids=(np.array([1, 2], np.int32), np.zeros(0, np.int32),
                                                               np.array([3], np.int32)),
                        reference_text="参考。", reference_audio=np.ones(4, np.float32), reference_rate_hz=16000,
                        transient_reference=True, keep_unspeakable=True, language=Language.ZH)
    back = parse_frontend(frontend_inputs(call), "r")
    assert back.texts == call.texts and back.speeds == call.speeds and back.refine_prompt == "[oral_2]"
    assert back.refined_ids is not None and [r.tolist() for r in back.refined_ids] == [[1, 2], [], [3]]
    assert (back.reference_text, back.reference_rate_hz, back.transient_reference, back.no_speaker,
            back.keep_unspeakable, back.language) == ("参考。", 16000, True, False, True, Language.ZH)
    np.testing.assert_array_equal(back.reference_audio, call.reference_audio)


def test_a_single_text_call_is_one_segment() -> None:
    text = np.array(["好。".encode()], np.object_)
    call = parse_frontend({contract.IN_TEXT.name: text, contract.FE_REFINED_IDS.name: np.array([4, 5], np.int32)})
    assert call.texts == ("好。",) and call.speeds is None
    assert call.refined_ids is not None and call.refined_ids[0].tolist() == [4, 5]


@pytest.mark.parametrize("extra,param", [
    ({contract.FE_SEGMENT_SPEEDS.name: np.array([5], np.int32)}, contract.FE_SEGMENT_SPEEDS.name),
    ({contract.FE_SEGMENT_SPEEDS.name: np.array([5, 10], np.int32)}, contract.FE_SEGMENT_SPEEDS.name),
    ({contract.FE_REFINED_IDS.name: np.array([1], np.int32)}, contract.FE_REFINED_LENGTHS.name),
    ({contract.FE_REFINED_IDS.name: np.array([1], np.int32),
      contract.FE_REFINED_LENGTHS.name: np.array([1, 1], np.int32)}, contract.FE_REFINED_LENGTHS.name),
])
def test_per_segment_inputs_must_fit_the_segments(extra: dict[str, np.ndarray], param: str) -> None:
    inputs = {contract.FE_SEGMENTS.name: np.array([b"a.", b"b."], np.object_), **extra}
    with pytest.raises(RequestError) as err:
        parse_frontend(inputs)
    assert err.value.param == param


def test_the_outputs_of_one_call_read_back_per_segment() -> None:
    spk, codes = np.ones(8, np.float32), np.arange(8, dtype=np.int32).reshape(2, 4)
    outs = [FrontendOutput(input_ids=np.array([1, 2, 3], np.int32), spk_emb=spk, normalized_text="Here it is.",
                           dropped=("😀",), refine_ids=np.array([7, 8], np.int32), prompt_codes=codes, speed=3),
            FrontendOutput(input_ids=np.array([4], np.int32), spk_emb=spk, normalized_text="Next",
                           dropped=("😀", "¤"), prompt_codes=codes, speed=5)]
    tensors = frontend_tensors(outs)
    assert tensors[contract.FE_NORMALIZED.name].tolist() == [b"Here it is. Next"]
    assert tensors[contract.FE_DROPPED.name].tolist() == ['["😀", "¤"]'.encode()]
    assert {t.name for t in contract.FRONTEND_OUTPUTS} - set(tensors) == \
        {t.name for t in contract.FRONTEND_REQUEST_OUTPUTS}
    back = frontend_outputs(tensors)
    assert [(o.input_ids.tolist(), o.normalized_text, o.dropped, o.speed) for o in back] == \
        [([1, 2, 3], "Here it is.", ("😀",), 3), ([4], "Next", ("😀", "¤"), 5)]
    assert back[0].refine_ids is not None and back[0].refine_ids.tolist() == [7, 8] and back[1].refine_ids is None
    assert all(o.spk_emb is not None and o.prompt_codes is not None and o.prompt_codes.shape == (2, 4) for o in back)


def test_prompting_a_normalised_text_again_gives_the_prompt_of_the_first_pass(small_artifacts: Artifacts) -> None:
    """:meth:`FrontEnd.code_prompt` on what :meth:`FrontEnd.prepare` made is prepare's own
    prompt, with a transcript too: the front end need not normalise a text twice."""
    fe = FrontEnd(small_artifacts, 4096, 2)
    for text in ("[speed_3]今天是2024年3月5日，气温25°C。", "Dr. Smith paid $3.50 at 10:30.", "。"):
        p = fe.prepare(text, "7", keep_unspeakable=True)
        ids, spoken = fe.code_prompt(p.normalized, p.speed)
        assert spoken == p.normalized and ids.tolist() == p.input_ids.tolist()
        with_smp = fe.prepare(text, "7", txt_smp="参考。", keep_unspeakable=True)
        assert fe.code_prompt(p.normalized, p.speed, txt_smp="参考。")[0].tolist() == with_smp.input_ids.tolist()
