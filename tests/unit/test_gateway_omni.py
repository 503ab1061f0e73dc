"""vLLM-Omni's streaming-text dialect: where the clause splitter cuts (the dialect against a
real gateway and tritonserver: tests/server/test_gateway_omni.py)."""

from __future__ import annotations

from chattts_serving.gateway.omni_ws import ClauseSplitter


def test_clause_splitting_cuts_after_pauses_but_not_inside_numbers() -> None:
    s = ClauseSplitter(400)
    out = s.feed("价格是1,234元，好吗？Yes, it is: 10:30 sharp") + s.end()
    assert out == ["价格是1,234元，", "好吗？", "Yes,", "it is:", "10:30 sharp"]
