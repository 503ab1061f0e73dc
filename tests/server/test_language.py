"""The request's ``language`` (issue #32) through a real tritonserver: text without context of
its own (a bare ``25kg``) is read in the requested language on the streaming and the offline
door, and an unknown language is refused. In process: tests/unit/test_language.py."""

from __future__ import annotations

from typing import Any

import pytest

from chattts_serving.client import ClientError, SynthesisRequest, synthesize_offline, synthesize_stream
from chattts_serving.errors import ErrorKind

READINGS = [("25kg", {"zh": "二十五千克", "en": "twenty five kilograms"}),
            ("03:04pm", {"zh": "下午三点零四分", "en": "three oh four PM"})]


@pytest.mark.parametrize("text, readings", READINGS[:1])
def test_a_server_reads_in_the_requests_language_and_refuses_an_unknown_one(triton_server: Any, text: str,
                                                                           readings: dict[str, str]) -> None:
    for language in ("zh", "en"):
        req = SynthesisRequest(text=text, language=language, max_new_tokens=4, min_new_tokens=4)
        assert synthesize_stream(triton_server.grpc_url, req, timeout_s=120).info["normalized_text"] == \
            [readings[language]]
        assert synthesize_offline(triton_server.http_url, req, timeout_s=120).info["normalized_text"] == \
            [readings[language]]
    bad = SynthesisRequest(text=text, language="fr", max_new_tokens=4)
    with pytest.raises(ClientError) as err:
        synthesize_stream(triton_server.grpc_url, bad, timeout_s=60)
    assert err.value.kind == ErrorKind.INVALID and err.value.param == "language"
