"""The int8 GPT step and vocoders (``chattts-export --precision int8``), small config, on a real
tritonserver: the ``cpu-int8`` profile serves a stream from the int8 graphs. The graph, the engine on it and
the accuracy measurement in process: tests/unit/test_int8.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chattts_serving import contract
from chattts_serving.export.int8 import add_int8
from chattts_serving.runtime import Artifacts
from tests.support.servers import stream_24_tokens


@pytest.fixture(scope="module")
def int8_artifacts(small_int8_artifacts: Artifacts) -> Artifacts:
    """The small artifacts with their int8 graphs; exporting again reuses it (up to date)."""
    assert not add_int8(small_int8_artifacts.root)
    return small_int8_artifacts


def test_cpu_int8_profile_serves_a_stream_from_the_int8_graphs(int8_artifacts: Artifacts, tmp_path: Path) -> None:
    _, text = stream_24_tokens(int8_artifacts, tmp_path, "cpu-int8")
    assert f"GPT step graph {contract.INT8_GRAPH_FILES[contract.GPT_GRAPH]} (precision int8)" in text
    for graph in (contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH):
        assert f"vocoder graph {contract.INT8_GRAPH_FILES[graph]} (precision int8)" in text
    # the engine chose the int8 step's kernel on this CPU at start-up and said which and why
    kernel = (r"int8 GPT kernel: [\w-]+ \(the numerics of MatMulNBits accuracy_level \d\) on "
              r".*probe ms at 1 / 16 rows \{")
    assert re.search(kernel, text), text[-3000:]
