"""The perf_analyzer input file (``loadtest/perf_analyzer_input.json``) speaks the streaming
model's contract: every step gives the required text and only known inputs, each a one-element
list of the input's type, and the token budget of the perf_analyzer measurement in docs/performance.md."""

from __future__ import annotations

import json
from pathlib import Path

from chattts_serving import contract

ROOT = Path(__file__).resolve().parents[2]
INPUT = ROOT / "loadtest" / "perf_analyzer_input.json"
PYTHON_TYPE = {"TYPE_STRING": str, "TYPE_INT32": int, "TYPE_INT64": int, "TYPE_FP32": float, "TYPE_BOOL": bool}


def test_every_step_is_a_valid_request_of_the_streaming_model() -> None:
    steps = json.loads(INPUT.read_text(encoding="utf-8"))["data"]
    specs = {t.name: t for t in contract.ENTRY_INPUTS}
    required = {name for name, t in specs.items() if not t.optional}
    assert steps and required == {contract.IN_TEXT.name}
    for step in steps:
        assert required <= set(step) <= set(specs), step
        for name, value in step.items():
            assert isinstance(value, list) and len(value) == 1, (name, value)
            assert isinstance(value[0], PYTHON_TYPE[specs[name].triton_dtype]), (name, value)
        assert step["text"][0].strip()
        assert step["max_new_tokens"] == step["min_new_tokens"] == [48]  # docs/performance.md's table: 1.0 s of audio


def test_the_script_sends_the_admin_header_of_the_package() -> None:
    script = (ROOT / "scripts" / "perf_analyzer.sh").read_text()
    assert "GRPC_ADMIN_HEADER" in script and "token_from_env" in script
    assert "--streaming" in script and "tritonclient==2.41.0" in script


def test_every_step_is_also_a_request_the_ensemble_door_serves() -> None:
    """``MODEL=chattts_ensemble scripts/perf_analyzer.sh`` sends the same file: each text is one
    sentence segment of the cpu profile (what the ensemble serves; more is refused)."""
    from chattts_serving.serving.profile import load_profile
    from chattts_serving.text.segments import SegmentRules, split_segments

    fp = load_profile("cpu").frontend
    rules = SegmentRules(max_chars=fp.max_segment_chars, merge_chars=fp.merge_segment_chars)
    ensemble = {t.name for t in contract.ENSEMBLE_INPUTS}
    for step in json.loads(INPUT.read_text(encoding="utf-8"))["data"]:
        assert set(step) <= ensemble
        assert len(split_segments(step["text"][0], rules)) == 1, step["text"]
    script = (ROOT / "scripts" / "perf_analyzer.sh").read_text()
    assert 'MODEL=${MODEL:-chattts}' in script and '-m "$MODEL"' in script
