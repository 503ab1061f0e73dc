"""The admission gate (chattts_serving/gate/gate.cc) without a server: built and cached, its own
C++ helpers' tests passing (also under the sanitizers), a missing or failing compiler a clear
error; rendered in front of the Python entry model and as the admission watch, and left out by
the profile's ``[entry] gate = false``. On a real tritonserver: tests/server/test_gate.py."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from chattts_serving import contract
from chattts_serving.deploy.gate import FLAGS, GATE_DIR, LIBRARY, SANITIZER_FLAGS, GateBuildError, build_gate, compiler
from chattts_serving.deploy.render import render_repository
from chattts_serving.serving.admission import OFFLINE_BUSY_DETAIL, busy_error
from chattts_serving.serving.profile import PROFILES_DIR, Profile, load_profile


# --- build ---------------------------------------------------------------------------------------
def test_the_gate_is_compiled_once_then_copied_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATTTS_GATE_CACHE", str(tmp_path / "cache"))
    lib = build_gate(tmp_path / "a")
    assert lib == tmp_path / "a" / contract.GATE_BACKEND / LIBRARY
    (cached,) = (tmp_path / "cache").glob("*.so")
    built_ns = cached.stat().st_mtime_ns
    again = build_gate(tmp_path / "b")  # another server's backend directory: no second compile
    assert again.read_bytes() == lib.read_bytes() and cached.stat().st_mtime_ns == built_ns
    assert build_gate(tmp_path / "a") == lib  # up to date where it is: kept
    # what Triton looks up in a backend library (undefined Triton symbols resolve only in tritonserver)
    so = ctypes.CDLL(str(lib), mode=os.RTLD_LAZY)
    for symbol in ("TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                   "TRITONBACKEND_ModelInstanceInitialize", "TRITONBACKEND_ModelInstanceFinalize",
                   "TRITONBACKEND_ModelInstanceExecute"):
        assert hasattr(so, symbol), symbol


@pytest.mark.parametrize("flags", [FLAGS, SANITIZER_FLAGS], ids=["release", "sanitized"])
def test_the_gates_own_helpers_pass_their_cpp_tests(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """gate/util_test.cc (JSON escaping of log lines, config parameters, the fatal-signal line)
    built with the gate's flags (warnings are errors) and with AddressSanitizer and UBSan."""
    cxx = compiler()
    assert cxx is not None, "no C++ compiler"
    exe = tmp_path / "util_test"
    cflags = [f for f in flags if f not in ("-shared", "-fPIC")]
    build = subprocess.run([cxx, *cflags, f"-I{GATE_DIR}", str(GATE_DIR / "util_test.cc"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "all checks passed" in run.stdout, run.stdout + run.stderr


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATTTS_GATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, no c++
    with pytest.raises(GateBuildError, match=r"gate = false"):
        build_gate(tmp_path / "backends")


def test_a_failing_compiler_shows_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cxx = tmp_path / "broken-cxx"
    cxx.write_text("#!/bin/sh\necho 'gate.cc:1: error: no such thing' >&2\nexit 1\n")
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CHATTTS_GATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(GateBuildError, match=r"exit 1[\s\S]*no such thing"):
        build_gate(tmp_path / "backends")
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-built is kept


# --- render --------------------------------------------------------------------------------------
def _profile(**entry: Any) -> Profile:
    data = tomllib.loads((PROFILES_DIR / "cpu.toml").read_text())
    data["entry"].update(entry)
    return Profile.model_validate(data)


def _config(repo: Path, model: str) -> Any:
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("model", sorted(contract.GATED_MODELS))
def test_the_gate_is_rendered_in_front_of_the_python_entry_model(tmp_path: Path, model: str) -> None:
    """``chattts`` and ``chattts_offline`` are gates: the tensors and transaction policy of the
    Python model behind them, its limit and busy message (for chattts_offline every instance's
    requests together), its public name on metrics and logs; Triton's queue and priorities stay
    on the Python model."""
    profile = load_profile("cpu")
    assert profile.entry.gate
    render_repository(profile, tmp_path / "art", tmp_path / "repo")
    repo = tmp_path / "repo"
    behind = contract.GATED_MODELS[model]
    gate, entry = _config(repo, model), _config(repo, behind)
    assert gate.backend == contract.GATE_BACKEND and entry.backend == "python"
    decoupled = model == contract.MODEL_STREAM
    assert gate.model_transaction_policy.decoupled == entry.model_transaction_policy.decoupled == decoupled
    assert [(t.name, t.data_type, list(t.dims), t.optional) for t in gate.input] == \
        [(t.name, t.data_type, list(t.dims), t.optional) for t in entry.input]
    assert [(t.name, t.data_type) for t in gate.output] == [(t.name, t.data_type) for t in entry.output]
    params = {k: v.string_value for k, v in gate.parameters.items()}
    e = profile.entry
    limit, detail = ((e.max_concurrent_streams, "stream already live") if decoupled else
                     (e.offline_threads, "request already running"))
    detail = detail.replace(" ", "s ", 1) if limit != 1 else detail
    assert params["target_model"] == behind
    assert params["max_live"] == str(limit)
    assert params["busy_message"] == f"[busy] server busy: {limit} {detail}"
    assert params["busy_message"] == (busy_error(limit) if decoupled else busy_error(limit, OFFLINE_BUSY_DETAIL)).wire()
    assert params["label_model"] == model and params["rejected_help"] == contract.REJECTED_HELP
    assert params["rejected_metric"] == contract.REJECTED_METRIC
    assert float(params["cancel_poll_ms"]) == profile.entry.cancel_poll_interval_s * 1000
    assert entry.parameters["label_model"].string_value == model
    assert not gate.HasField("dynamic_batching") and len(gate.instance_group) == 1
    assert entry.instance_group[0].count == 1
    assert entry.HasField("dynamic_batching") != decoupled  # offline: Triton's queue and priority levels
    assert not (tmp_path / "repo" / model / "1" / "model.py").exists()
    assert (tmp_path / "repo" / model / "1").is_dir()  # Triton needs the version directory
    assert (tmp_path / "repo" / behind / "1" / "model.py").is_file()


def test_the_admission_watch_is_rendered_on_the_gates_backend(tmp_path: Path) -> None:
    """``chattts_admission``: the gate's backend in watch mode over the gated doors in the
    contract's order, decoupled, no inputs, one BOOL output per door."""
    render_repository(load_profile("cpu"), tmp_path / "art", tmp_path / "repo")
    cfg = _config(tmp_path / "repo", contract.MODEL_ADMISSION)
    assert cfg.backend == contract.GATE_BACKEND and cfg.model_transaction_policy.decoupled
    assert not cfg.input and [(t.name, t.data_type, list(t.dims)) for t in cfg.output] == \
        [(contract.ADM_FULL.name, model_config_pb2.TYPE_BOOL, [-1])]
    assert cfg.parameters["watch_models"].string_value.split(",") == list(contract.ADMISSION_DOORS)
    assert set(contract.ADMISSION_DOORS) == set(contract.GATED_MODELS)
    assert not (tmp_path / "repo" / contract.MODEL_ADMISSION / "1" / "model.py").exists()


def test_without_the_gate_chattts_is_the_python_entry_model(tmp_path: Path) -> None:
    render_repository(_profile(gate=False), tmp_path / "art", tmp_path / "repo")
    models = {p.parent.name for p in (tmp_path / "repo").glob("*/config.pbtxt")}
    assert models == set(contract.models(gate=False)) and not models & set(contract.GATED_MODELS.values())
    for model in contract.GATED_MODELS:
        cfg = _config(tmp_path / "repo", model)
        assert cfg.backend == "python" and "label_model" not in cfg.parameters
        assert (tmp_path / "repo" / model / "1" / "model.py").is_file()


