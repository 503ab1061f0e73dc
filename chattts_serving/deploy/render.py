"""``chattts-render``: the Triton model repository from one template and a deployment profile.

Every ``config.pbtxt`` comes from ``model_repository/config.pbtxt.j2`` and a :class:`ModelSpec`
built here from the contract (tensor names, dtypes) and the profile (instances, batching,
queues). Rendering is strict: an undefined template variable or an unknown profile key is an
error, and each rendered config is parsed into Triton's ``ModelConfig`` protobuf (unknown
fields and bad enum values fail) and checked for consistency before anything is written.
The adapters ``model_repository/<model>/1/model.py`` are copied next to their configs, and the
resolved profile is written as ``profile.json`` for the models to read.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2

from .. import contract
from ..contract import VocoderPath
from ..errors import RequestError
from ..serving.profile import Profile, ProfileError, load_profile

REPO_SRC = Path(__file__).resolve().parents[2] / "model_repository"
TEMPLATE = "config.pbtxt.j2"
PROFILE_JSON = "profile.json"


class RenderError(ValueError):
    """A config that cannot be rendered or does not validate (message names model and cause)."""


@dataclass
class Batching:
    max_queue_size: int
    max_queue_delay_microseconds: int = 0
    priority_levels: int = 1
    default_priority_level: int = 1


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: its model, model input <- ensemble tensor, model output ->
    ensemble tensor."""

    model: str
    input_map: dict[str, str]
    output_map: dict[str, str]


@dataclass
class ModelSpec:
    """What one config.pbtxt says; ``dims`` exclude the batch dimension when batching."""

    name: str
    inputs: tuple[contract.TensorSpec, ...]
    outputs: tuple[contract.TensorSpec, ...]
    max_batch_size: int = 0
    decoupled: bool = False
    ragged: bool = False
    instance_count: int = 1
    kind: str = "KIND_CPU"
    gpus: list[int] = field(default_factory=list)
    batching: Batching | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    adapter: str = ""  # model_repository/<adapter>/1/model.py; default: the model's own name
    backend: str = "python"  # another backend (the gate) has no model.py
    platform: str = ""  # "ensemble": no backend, no instances, no model.py; ``steps`` instead
    steps: tuple[EnsembleStep, ...] = ()

    @property
    def adapter_dir(self) -> str:
        return self.adapter or self.name


def gate_spec(profile: Profile, model: str) -> ModelSpec:
    """``model`` (``chattts`` or ``chattts_offline``) as the admission gate
    (chattts_serving/gate/gate.cc) in front of the Python model behind it
    (:data:`contract.GATED_MODELS`): the same tensors and transaction policy, the limit and the
    busy message the Python entry model would apply (:func:`gate_limit`,
    :func:`~chattts_serving.serving.admission.busy_error`), the Python models' help text of
    ``tts_rejected_total``, the cancel poll interval of the profile, the refusal log's
    settling times of :class:`~chattts_serving.serving.entry.RefusalRecorder`, and its pings of
    the target while streams are live (:func:`ping_interval_s`; a ping unanswered for
    ``entry.stall_timeout_s`` ends them, and with ``health.stop_on_stall`` stops the server).
    Raises KeyError for a model without a gate."""
    from ..serving.entry import RefusalRecorder

    entry = profile.entry
    limit, busy = gate_limit(profile, model)
    return ModelSpec(model, contract.ENTRY_INPUTS, contract.ENTRY_OUTPUTS, decoupled=model == contract.MODEL_STREAM,
                     backend=contract.GATE_BACKEND,
                     parameters={"target_model": contract.GATED_MODELS[model],
                                 "max_live": str(limit),
                                 "busy_message": busy.wire(),
                                 "label_model": model, "rejected_metric": contract.REJECTED_METRIC,
                                 "rejected_help": contract.REJECTED_HELP,
                                 "cancel_poll_ms": f"{entry.cancel_poll_interval_s * 1000:g}",
                                 "log_settle_ms": f"{RefusalRecorder.SETTLE_S * 1000:g}",
                                 "log_max_wait_ms": f"{RefusalRecorder.MAX_DELAY_S * 1000:g}",
                                 "ping_input": contract.IN_TEXT.name,
                                 "ping_interval_ms": f"{ping_interval_s(profile) * 1000:g}",
                                 "stall_timeout_ms": f"{entry.stall_timeout_s * 1000:g}",
                                 "stop_server_on_stall": "true" if profile.health.stop_on_stall else "false"})


GATE_PING_INTERVAL_S = 5.0
"""Longest time between two pings of a gate's target while streams are live (s)."""


def ping_interval_s(profile: Profile) -> float:
    """How often a gate pings its target while streams are live: every
    :data:`GATE_PING_INTERVAL_S`, or four times per ``entry.stall_timeout_s`` when that is
    shorter, so that a stuck target is told from a slow one well inside the stall timeout."""
    return min(GATE_PING_INTERVAL_S, profile.entry.stall_timeout_s / 4)


ADMISSION_CANCEL_POLL_MS = 100
"""How often the admission watch asks whether a subscriber has gone (ms): a subscription is one
per gateway process, so a gone one costs nothing but its memory until then."""


def admission_spec() -> ModelSpec:
    """The admission watch (:data:`contract.MODEL_ADMISSION`, the gate's backend in watch mode):
    no inputs, output :data:`contract.ADM_FULL` per door of :data:`contract.ADMISSION_DOORS`."""
    return ModelSpec(contract.MODEL_ADMISSION, (), (contract.ADM_FULL,), decoupled=True,
                     backend=contract.GATE_BACKEND,
                     parameters={"watch_models": ",".join(contract.ADMISSION_DOORS),
                                 "cancel_poll_ms": str(ADMISSION_CANCEL_POLL_MS),
                                 "heartbeat_ms": f"{contract.ADMISSION_HEARTBEAT_S * 1000:g}"})


def ensemble_spec() -> ModelSpec:
    """``chattts_ensemble`` (:data:`contract.MODEL_ENSEMBLE`, ``platform: "ensemble"``): the
    entry inputs of ``chattts`` -> ``chattts_frontend`` (the whole request, its text as
    ``request_text``) -> ``chattts_gpt`` in ensemble mode (the sampling inputs straight from the
    request) -> ``chattts_ensemble_vocoder`` -> audio, chunk_index, info.
    Ensemble tensors between steps are named ``_<name>``."""
    fe_in = {contract.FE_REQUEST_TEXT.name: contract.IN_TEXT.name,
             **{t.name: t.name for t in contract.ENSEMBLE_INPUTS if t.name != contract.IN_TEXT.name}}
    fe_out = [contract.FE_INPUT_IDS, contract.FE_SPK_EMB, contract.FE_PROMPT_CODES, *contract.FRONTEND_REQUEST_OUTPUTS]
    engine_from_frontend = {contract.FE_INPUT_IDS.name: contract.FE_INPUT_IDS.name,
                            contract.EN_SPK_EMB.name: contract.FE_SPK_EMB.name,
                            contract.EN_PROMPT_CODES.name: contract.FE_PROMPT_CODES.name,
                            contract.EN_STREAM_ID.name: contract.FE_STREAM_ID.name,
                            contract.EN_PRIORITY.name: contract.FE_ENGINE_PRIORITY.name,
                            contract.EN_TIMEOUT_MS.name: contract.FE_TIMEOUT_MS.name,
                            contract.EN_WINDOW_LOOKAHEAD.name: contract.FE_LOOKAHEAD.name,
                            contract.EN_INFO_HEADER.name: contract.FE_INFO.name}
    steps = (
        EnsembleStep(contract.MODEL_FRONTEND, fe_in, {t.name: f"_{t.name}" for t in fe_out}),
        EnsembleStep(contract.MODEL_ENGINE,
                     {**{k: f"_{v}" for k, v in engine_from_frontend.items()},
                      **{p.name: p.name for p in contract.SAMPLING_PARAMS}},
                     {t.name: f"_{t.name}" for t in contract.WINDOW_OUTPUTS}),
        EnsembleStep(contract.MODEL_ENSEMBLE_VOCODER, {t.name: f"_{t.name}" for t in contract.ENSEMBLE_VOCODER_INPUTS},
                     {t.name: t.name for t in contract.ENSEMBLE_VOCODER_OUTPUTS}),
    )
    return ModelSpec(contract.MODEL_ENSEMBLE, contract.ENSEMBLE_INPUTS, contract.ENSEMBLE_OUTPUTS,
                     platform="ensemble", steps=steps)


def gate_limit(profile: Profile, model: str) -> tuple[int, RequestError]:
    """The requests the gate of ``model`` lets through at once, and its busy error: for
    ``chattts`` ``entry.max_concurrent_streams`` live streams; for ``chattts_offline``
    ``entry.offline_threads`` running requests. Raises KeyError for a model without a gate."""
    from ..serving.admission import OFFLINE_BUSY_DETAIL, busy_error

    entry = profile.entry
    if model == contract.MODEL_STREAM:
        return entry.max_concurrent_streams, busy_error(entry.max_concurrent_streams)
    if model == contract.MODEL_OFFLINE:
        limit = entry.offline_threads
        return limit, busy_error(limit, OFFLINE_BUSY_DETAIL)
    raise KeyError(f"{model} has no admission gate")


def model_specs(profile: Profile, artifacts_dir: Path, repo_dir: Path) -> list[ModelSpec]:
    """The models of the repository for ``profile`` (:func:`contract.models`)."""
    params = {"artifacts_dir": str(artifacts_dir), "profile_path": str(repo_dir / PROFILE_JSON)}
    accel = {"kind": profile.instance_kind, "gpus": list(profile.gpu_ids)}
    entry = Batching(max_queue_size=profile.entry.max_queue_size,
                     priority_levels=profile.entry.priority_levels,
                     default_priority_level=profile.entry.default_priority_level)
    vocoder_batching = Batching(max_queue_size=profile.vocoder.max_queue_size,
                                max_queue_delay_microseconds=profile.vocoder.max_queue_delay_microseconds)
    specs = [
        ModelSpec(contract.MODEL_FRONTEND, contract.FRONTEND_INPUTS, contract.FRONTEND_OUTPUTS,
                  instance_count=profile.frontend.instance_count, parameters=dict(params)),
        ModelSpec(contract.MODEL_ENGINE, contract.ENGINE_INPUTS, contract.ENGINE_OUTPUTS, decoupled=True,
                  parameters=dict(params), **accel),  # type: ignore[arg-type]
    ]
    # No dynamic_batching on the decoupled entry model (docs/triton-workarounds.md, "no dynamic
    # batching on the streaming entry"). Its admission limit and
    # priorities are the model's own (entry.max_concurrent_streams, request parameter
    # `priority`), since a decoupled model empties Triton's queue at once anyway.
    entries = [ModelSpec(contract.MODEL_STREAM, contract.ENTRY_INPUTS, contract.ENTRY_OUTPUTS, decoupled=True,
                         parameters=dict(params)),
               ModelSpec(contract.MODEL_OFFLINE, contract.ENTRY_INPUTS, contract.ENTRY_OUTPUTS,
                         batching=entry,
                         parameters=dict(params))]
    if profile.entry.gate:
        # Each public entry model is a gate; the Python model sits behind it under another
        # name and labels its metrics and logs with the public one.
        specs += [gate_spec(profile, e.name) for e in entries]
        specs += [replace(e, name=contract.GATED_MODELS[e.name], adapter=e.name,
                          parameters={**e.parameters, "label_model": e.name, "gated": "true"}) for e in entries]
        specs.append(admission_spec())
    else:
        specs += entries
    for path, name in contract.VOCODER_PATHS.items():
        tensor = contract.VO_HIDDEN if path is VocoderPath.HIDDEN else contract.VO_CODES
        specs.append(ModelSpec(name, (tensor, *contract.VOCODER_STREAM_INPUTS), (contract.VO_AUDIO,),
                               max_batch_size=profile.vocoder.max_batch_size, ragged=True,
                               instance_count=profile.vocoder.instance_count, batching=vocoder_batching,
                               parameters={**params, "vocoder_path": path}, adapter=contract.MODEL_VOCODER,
                               **accel))  # type: ignore[arg-type]
    # The ensemble door: its vocoder step (no batching, so that it sees the requests Triton has
    # marked cancelled: docs/triton-workarounds.md, "ensemble: cancels and errors"), and the
    # ensemble itself.
    specs.append(ModelSpec(contract.MODEL_ENSEMBLE_VOCODER, contract.ENSEMBLE_VOCODER_INPUTS,
                           contract.ENSEMBLE_VOCODER_OUTPUTS, decoupled=True,
                           instance_count=profile.vocoder.instance_count,
                           parameters=dict(params), **accel))  # type: ignore[arg-type]
    specs.append(ensemble_spec())
    return specs


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO_SRC)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render_config(spec: ModelSpec, profile_name: str) -> str:
    """Render and validate one config. Raises :class:`RenderError`."""
    try:
        text = _environment().get_template(TEMPLATE).render(m=spec, profile_name=profile_name)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"{spec.name}: unfilled template variable: {exc}") from None
    validate_config(text, spec.name)
    return text


def validate_config(text: str, expected_name: str) -> Any:
    """Parse ``text`` into Triton's ``ModelConfig`` and check it. Returns the message.

    Raises :class:`RenderError` on unknown fields, bad enums, or inconsistencies (name,
    decoupled models that batch, batching models without dims, duplicate tensor names).
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise RenderError(f"{expected_name}: not a valid Triton model config: {exc}") from None
    if cfg.name != expected_name:
        raise RenderError(f"{expected_name}: config names the model {cfg.name!r}")
    names = [t.name for t in cfg.input] + [t.name for t in cfg.output]
    if len(set(names)) != len(names):
        raise RenderError(f"{expected_name}: duplicate tensor names {names}")
    for t in list(cfg.input) + list(cfg.output):
        if not t.dims:
            raise RenderError(f"{expected_name}: tensor {t.name} has no dims")
        if t.data_type == model_config_pb2.TYPE_INVALID:
            raise RenderError(f"{expected_name}: tensor {t.name} has no data_type")
    if cfg.platform == "ensemble" and (not cfg.ensemble_scheduling.step or cfg.instance_group):
        raise RenderError(f"{expected_name}: an ensemble needs steps and has no instance groups")
    if cfg.model_transaction_policy.decoupled and cfg.max_batch_size > 0:
        raise RenderError(f"{expected_name}: a decoupled model here must not batch (max_batch_size 0)")
    for g in cfg.instance_group:
        if g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU and not g.gpus:
            raise RenderError(f"{expected_name}: KIND_GPU instance group without gpus")
    return cfg


def _check_ensembles(specs: list[ModelSpec]) -> None:
    """Each ensemble step names a model of ``specs`` and only its tensors, maps every required
    input, and each ensemble tensor has one dtype wherever it is used (what Triton checks at
    load, here at render time). Raises :class:`RenderError`."""
    by_name = {s.name: s for s in specs}
    for e in (s for s in specs if s.platform == "ensemble"):
        dtypes = {t.name: t.triton_dtype for t in e.inputs}
        produced = set(dtypes)
        for step in e.steps:
            m = by_name.get(step.model)
            if m is None:
                raise RenderError(f"{e.name}: step model {step.model} is not in the repository")
            ins, outs = {t.name: t for t in m.inputs}, {t.name: t for t in m.outputs}
            for model_in, tensor in step.input_map.items():
                if model_in not in ins:
                    raise RenderError(f"{e.name}: {step.model} has no input {model_in}")
                if tensor not in produced:
                    raise RenderError(f"{e.name}: {step.model}.{model_in} reads {tensor}, which no earlier step makes")
                if dtypes[tensor] != ins[model_in].triton_dtype:
                    raise RenderError(f"{e.name}: {tensor} is {dtypes[tensor]}, {step.model}.{model_in} "
                                      f"{ins[model_in].triton_dtype}")
            missing = [n for n, t in ins.items() if not t.optional and n not in step.input_map]
            if missing:
                raise RenderError(f"{e.name}: {step.model}'s required inputs {missing} are not mapped")
            for model_out, tensor in step.output_map.items():
                if model_out not in outs:
                    raise RenderError(f"{e.name}: {step.model} has no output {model_out}")
                dtypes[tensor] = outs[model_out].triton_dtype
                produced.add(tensor)
        for t in e.outputs:
            if dtypes.get(t.name) != t.triton_dtype:
                raise RenderError(f"{e.name}: output {t.name} ({t.triton_dtype}) is not made by a step")


def render_repository(profile: Profile, artifacts_dir: Path, out: Path) -> list[Path]:
    """Write the model repository for ``profile`` into ``out`` (replacing it).

    Every config is rendered and validated before anything is written. Returns the written
    config paths. Raises :class:`RenderError`.
    """
    out = Path(out).resolve()
    artifacts_dir = Path(artifacts_dir).resolve()
    specs = model_specs(profile, artifacts_dir, out)
    rendered = {s.name: render_config(s, profile.name) for s in specs}
    _check_ensembles(specs)
    for s in specs:
        if s.backend == "python" and not s.platform and not (REPO_SRC / s.adapter_dir / "1" / "model.py").is_file():
            raise RenderError(f"{s.name}: no adapter model_repository/{s.adapter_dir}/1/model.py")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / PROFILE_JSON).write_text(profile.model_dump_json(indent=2))
    written = []
    for s in specs:
        (out / s.name / "1").mkdir(parents=True)
        if s.backend == "python" and not s.platform:
            shutil.copy2(REPO_SRC / s.adapter_dir / "1" / "model.py", out / s.name / "1" / "model.py")
        (out / s.name / "config.pbtxt").write_text(rendered[s.name])
        written.append(out / s.name / "config.pbtxt")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chattts-render", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu", help="profile name (profiles/<name>.toml) or TOML path")
    ap.add_argument("--artifacts", type=Path, required=True, help="exported artifact directory")
    ap.add_argument("--out", type=Path, default=Path("build/model_repository"))
    args = ap.parse_args(argv)
    try:
        written = render_repository(load_profile(args.profile), args.artifacts, args.out)
    except (ProfileError, RenderError) as exc:
        print(f"chattts-render: error: {exc}", file=sys.stderr)
        return 2
    print(f"rendered {len(written)} models into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
