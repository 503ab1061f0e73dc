"""``python -m bench.opprofile``: the decode step's kernel time by op type, from ONNX Runtime's
own profile, on the small generated checkpoint; and the trace arithmetic on a made-up trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.opprofile import main, op_times
from chattts_serving.engine.kernels import OWN_KERNEL
from chattts_serving.runtime import Artifacts


def test_op_times_sum_the_kernels_of_the_runs_after_the_warm_up() -> None:
    run = {"cat": "Session", "name": "model_run"}
    node = {"cat": "Node"}
    trace = [{**run, "ts": 0, "dur": 100}, {**node, "name": "a_kernel_time", "ts": 10, "dur": 50_000,
                                            "args": {"op_name": "MatMulNBits"}},
             {**run, "ts": 200, "dur": 100},
             {**node, "name": "a_kernel_time", "ts": 210, "dur": 3000, "args": {"op_name": "MatMulNBits"}},
             {**node, "name": "b_kernel_time", "ts": 250, "dur": 1000, "args": {"op_name": "GroupQueryAttention"}},
             {**node, "name": "b_fence_before", "ts": 260, "dur": 9000, "args": {"op_name": "GroupQueryAttention"}}]
    assert op_times(trace, slice(1, None)) == {"MatMulNBits": 3.0, "GroupQueryAttention": 1.0}
    assert op_times(trace, slice(0, 1)) == {"MatMulNBits": 50.0}
    assert op_times(trace, slice(2, None)) == {}


@pytest.mark.parametrize("profile", ["cpu-fp32", "cpu-int8"])
def test_the_profile_names_the_ops_of_the_graph_the_profile_runs(small_int8_artifacts: Artifacts, tmp_path: Path,
                                                                 profile: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "opprofile.json"
    assert main(["--artifacts", str(small_int8_artifacts.root), "--profiles", profile, "--batches", "1,2",
                 "--past", "8", "--steps", "3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["profiles"][profile]
    assert set(res) == {"1", "2"}
    for r in res.values():
        assert r["ops"]["GroupQueryAttention"] > 0 and r["node_ms_per_step"] >= sum(r["ops"].values()) * 0.999
        int8_op = "Int8BlockMatMul" if profile == "cpu-int8" and r["kernel"]["chosen"] == OWN_KERNEL else "MatMulNBits"
        projections = int8_op if profile == "cpu-int8" else "MatMul"
        assert r["ops"][projections] > 0
        assert (int8_op in r["ops"]) == (profile == "cpu-int8")
    assert f"| {profile} | 2 | fp32 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--batches", "1,x"], ["--batches", "0"], ["--steps", "-1"],
                                  ["--profiles", "no-such-profile"]])
def test_bad_arguments_end_in_a_usage_error(small_artifacts: Artifacts, argv: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--artifacts", str(small_artifacts.root), *argv])
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err
