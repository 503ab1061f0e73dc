"""The request's ``language`` (issue #32) in process: the language of numbers, units and symbols
that the text gives no context for (a bare ``25kg`` or ``03:04pm``), parsed from the entry and
front-end models' inputs and carried through the pipeline to the front end. Through a real
tritonserver: tests/server/test_language.py."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.contract import Language
from chattts_serving.errors import ErrorKind, RequestError
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.job import SynthesisJob
from chattts_serving.serving.prepare import prepare_segments
from chattts_serving.serving.profile import load_profile
from chattts_serving.serving.request import EntryLimits, EntryRequest, parse_entry, parse_frontend
from tests.support.inprocess import InProcessStages

READINGS = [("25kg", {"zh": "二十五千克", "en": "twenty five kilograms"}),
            ("03:04pm", {"zh": "下午三点零四分", "en": "three oh four PM"})]


def _text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def test_entry_and_front_end_inputs_parse_the_language() -> None:
    limits = EntryLimits(max_new_tokens_cap=4096)
    assert parse_entry({"text": _text("25kg")}, limits).language is Language.AUTO
    assert parse_entry({"text": _text("25kg"), "language": _text(" zh ")}, limits).language is Language.ZH
    assert parse_frontend({"text": _text("25kg"), "language": _text("en")}).language is Language.EN
    for parse in (lambda i: parse_entry(i, limits), parse_frontend):
        with pytest.raises(RequestError) as err:
            parse({"text": _text("25kg"), "language": _text("fr")})
        assert err.value.kind == ErrorKind.INVALID and err.value.param == contract.IN_LANGUAGE.name
        assert "auto" in str(err.value) and "fr" in str(err.value)


@pytest.fixture(scope="module")
def stages(small_artifacts: Artifacts) -> InProcessStages:
    return InProcessStages(small_artifacts)


@pytest.mark.parametrize("text, readings", READINGS)
def test_the_pipeline_reads_text_without_context_in_the_requests_language(stages: InProcessStages, text: str,
                                                                          readings: dict[str, str]) -> None:
    for language in (Language.ZH, Language.EN):
        req = EntryRequest(text=text, language=language)
        job = SynthesisJob(req=req, schedule=load_profile("cpu").stream.schedule(), emit_tokens=8, arrival_s=0.0)
        (seg,) = prepare_segments(job, stages).segments
        assert seg.normalized_text == readings[language.value]


