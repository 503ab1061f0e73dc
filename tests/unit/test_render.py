"""The model repository renderer: profiles, strict templates, Triton config validation."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from chattts_serving import contract
from chattts_serving.deploy import render
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.profile import ProfileError, load_profile


@pytest.mark.parametrize("name", ["cpu", "cpu-int8", "gpu"])
def test_profiles_render_every_model_into_valid_configs(name: str, tmp_path: Path,
                                                         small_artifacts: Artifacts) -> None:
    written = render.render_repository(load_profile(name), small_artifacts.root, tmp_path / "repo")
    assert sorted(p.parent.name for p in written) == sorted(contract.ALL_MODELS)
    for p in written:
        cfg = model_config_pb2.ModelConfig()
        text_format.Parse(p.read_text(), cfg)
        if cfg.backend == contract.GATE_BACKEND:  # the admission gate: C++, no model.py, no artifacts
            assert cfg.name in (*contract.GATED_MODELS, contract.MODEL_ADMISSION) and (p.parent / "1").is_dir()
            continue
        if cfg.platform == "ensemble":  # the ensemble door: steps, no model.py, no instances
            assert cfg.name == contract.MODEL_ENSEMBLE and not (p.parent / "1" / "model.py").exists()
            assert not cfg.instance_group and not cfg.backend
            continue
        assert cfg.backend == "python" and (p.parent / "1" / "model.py").is_file()
        assert cfg.parameters["artifacts_dir"].string_value == str(small_artifacts.root.resolve())
        kind = cfg.instance_group[0].kind
        if cfg.name in (contract.MODEL_ENGINE, contract.MODEL_VOCODER, contract.MODEL_VOCODER_CODES,
                        contract.MODEL_ENSEMBLE_VOCODER):
            want = "KIND_GPU" if name == "gpu" else "KIND_CPU"
            assert model_config_pb2.ModelInstanceGroup.Kind.Name(kind) == want
            if name == "gpu":
                assert list(cfg.instance_group[0].gpus) == [0]
        else:
            assert model_config_pb2.ModelInstanceGroup.Kind.Name(kind) == "KIND_CPU"
    stream = text_format.Parse((tmp_path / "repo" / contract.MODEL_STREAM / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert stream.model_transaction_policy.decoupled
    assert [i.name for i in stream.input] == [t.name for t in contract.ENTRY_INPUTS]
    assert not stream.HasField("dynamic_batching")  # see render.model_specs: it stalls decoupled models
    offline = text_format.Parse((tmp_path / "repo" / contract.MODEL_OFFLINE_ENTRY / "config.pbtxt").read_text(),
                                model_config_pb2.ModelConfig())  # behind its gate: Triton's queue, priorities
    assert offline.dynamic_batching.default_queue_policy.max_queue_size > 0
    assert offline.dynamic_batching.priority_levels == 2
    voc = text_format.Parse((tmp_path / "repo" / contract.MODEL_VOCODER / "config.pbtxt").read_text(),
                            model_config_pb2.ModelConfig())
    assert voc.max_batch_size > 0 and voc.input[0].allow_ragged_batch
    ens = text_format.Parse((tmp_path / "repo" / contract.MODEL_ENSEMBLE / "config.pbtxt").read_text(),
                            model_config_pb2.ModelConfig())
    # chattts' inputs but validate_only (the ensemble always synthesises)
    assert [i.name for i in ens.input] == [t.name for t in contract.ENSEMBLE_INPUTS]
    # text is refused by the front end when missing (Triton would end the ensemble silently)
    assert [i.optional for i in ens.input] == [t.optional or t.name == contract.IN_TEXT.name
                                               for t in contract.ENSEMBLE_INPUTS]
    assert [o.name for o in ens.output] == [t.name for t in contract.ENSEMBLE_OUTPUTS]
    assert [s.model_name for s in ens.ensemble_scheduling.step] == [
        contract.MODEL_FRONTEND, contract.MODEL_ENGINE, contract.MODEL_ENSEMBLE_VOCODER]
    last = text_format.Parse((tmp_path / "repo" / contract.MODEL_ENSEMBLE_VOCODER / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())
    # every step after the engine must see the requests Triton marked cancelled: a dynamic
    # batcher answers those itself, ending the ensemble before the engine hears of the cancel
    assert last.model_transaction_policy.decoupled and not last.HasField("dynamic_batching")
    assert [o.name for o in last.output] == [t.name for t in contract.ENSEMBLE_OUTPUTS]


def _ensemble_with(change) -> list[render.ModelSpec]:  # type: ignore[no-untyped-def]
    specs = render.model_specs(load_profile("cpu"), Path("/artifacts"), Path("/repo"))
    ens = next(s for s in specs if s.name == contract.MODEL_ENSEMBLE)
    ens.steps = tuple(change(list(ens.steps)))
    return specs


@pytest.mark.parametrize(("change", "cause"), [
    (lambda steps: steps[:1] + steps[2:], "no earlier step makes"),  # the engine step left out
    (lambda steps: [steps[0], render.EnsembleStep(contract.MODEL_ENGINE, {**steps[1].input_map, "seed": "top_p"},
                                                  steps[1].output_map), *steps[2:]], "TYPE_FP32"),
    (lambda steps: [*steps[:2], render.EnsembleStep(contract.MODEL_VOCODER, {},
                                                    {"audio": "audio"})], "required inputs"),
    (lambda steps: [*steps[:2], render.EnsembleStep("chattts_nowhere", {}, {})], "not in the repository"),
])
def test_an_ensemble_that_triton_would_refuse_fails_at_render_time(change, cause: str,  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    with pytest.raises(render.RenderError, match=cause):
        render._check_ensembles(_ensemble_with(change))


def test_unknown_profile_key_is_an_error(tmp_path: Path) -> None:
    text = (render.REPO_SRC.parent / "profiles" / "cpu.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[engine]\n", "[engine]\nmax_batchsize = 4\n"))
    with pytest.raises(ProfileError, match="max_batchsize"):
        load_profile(bad)


@pytest.mark.parametrize(("old", "new", "cause"), [
    ("max_waiting = 80 ", "max_waiting = 79 ", "max_waiting"),  # 64 streams + 2 x 8 offline admitted
    ("stall_timeout_s = 60.0 ", "stall_timeout_s = 14.0 ", "waiting_heartbeat_s"),  # < 3 x 5 s
    ("batch_rows = 12 ", "batch_rows = 17 ", "batch_rows"),  # more than max_batch_size (16)
])
def test_a_profile_whose_engine_could_refuse_or_kill_what_the_entry_admitted_is_an_error(
        tmp_path: Path, old: str, new: str, cause: str) -> None:
    """The engine's queue holds every request the entry can admit (else an admitted request
    is refused "busy" late, in Python), a stream queued in the engine hears from it often
    enough that the stall watchdog does not take it for a dead engine, and the batch-priority
    rows are some of the batch's."""
    text = (render.REPO_SRC.parent / "profiles" / "cpu.toml").read_text()
    assert old in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(old, new))
    with pytest.raises(ProfileError, match=cause):
        load_profile(bad)


def test_missing_profile_names_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="cpu"):
        load_profile("nosuchprofile")


def test_unfilled_template_variable_fails_at_render_time(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = jinja2.DictLoader({render.TEMPLATE: 'name: "{{ m.name }}"\nmax_batch_size: {{ m.no_such_key }}\n'})
    monkeypatch.setattr(render, "_environment", lambda: jinja2.Environment(
        loader=loader, undefined=jinja2.StrictUndefined))
    spec = render.ModelSpec("x", (), ())
    with pytest.raises(render.RenderError, match="unfilled"):
        render.render_config(spec, "cpu")


@pytest.mark.parametrize("text, cause", [
    ('name: "m"\nbogus_field: 3\n', "not a valid"),
    ('name: "m"\ninput { name: "a" data_type: TYPE_NOPE dims: [1] }\n', "not a valid"),
    ('name: "other"\n', "names the model"),
    ('name: "m"\nmax_batch_size: 4\nmodel_transaction_policy { decoupled: true }\n', "decoupled"),
    ('name: "m"\ninstance_group { kind: KIND_GPU }\n', "without gpus"),
])
def test_validator_rejects_bad_configs(text: str, cause: str) -> None:
    with pytest.raises(render.RenderError, match=cause):
        render.validate_config(text, "m")


def test_each_gpu_instance_runs_on_its_own_device() -> None:
    """KIND_GPU instances get Triton's model_instance_device_id as their ONNX Runtime device."""
    from chattts_serving.serving.profile import load_profile
    from chattts_serving.triton.setup import ModelSetup

    prof = load_profile("gpu")
    on_gpu1 = ModelSetup("chattts_gpt", {}, None, prof, {}, gpu_index=1)  # type: ignore[arg-type]
    on_cpu = ModelSetup("chattts_gpt", {}, None, load_profile("cpu"), {})  # type: ignore[arg-type]
    assert on_gpu1.ort("engine").device_id == 1 and on_gpu1.ort("vocoder").device_id == 1
    assert on_gpu1.ort("engine").providers == prof.ort("engine").providers
    assert on_cpu.ort("engine") == load_profile("cpu").ort("engine")


@pytest.mark.parametrize("gate", [True, False])
def test_each_model_py_docstring_names_every_model_it_serves(gate: bool, tmp_path: Path) -> None:
    """A reader of model_repository/<dir>/1/model.py learns which models it serves: with the
    gate (every shipped profile) chattts/1/model.py serves chattts_entry, without it chattts."""
    base = load_profile("cpu")
    profile = base.model_copy(update={"entry": base.entry.model_copy(update={"gate": gate})})
    specs = render.model_specs(profile, tmp_path, tmp_path)
    missing = []
    for s in specs:
        if s.backend != "python" or s.platform:
            continue
        doc = (render.REPO_SRC / s.adapter_dir / "1" / "model.py").read_text().split('"""')[1]
        if f"``{s.name}``" not in doc:
            missing.append(f"{s.adapter_dir}/1/model.py does not name {s.name}")
    assert missing == []
