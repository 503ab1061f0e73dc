"""scripts/compose_v1.py: copies of docker/compose.yaml and docker/compose.cpu.yaml that Docker
Compose 1.29 (Debian bookworm's ``docker-compose``) accepts, with the override's ``!reset`` /
``!override`` applied as Compose v2 applies them. Checked by 1.29's own ``config`` where it is
installed (it needs no engine)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
FILES = [DOCKER / "compose.yaml", DOCKER / "compose.cpu.yaml"]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_v1", REPO / "scripts" / "compose_v1.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["compose_v1"] = module
    spec.loader.exec_module(module)
    return module


def test_the_copies_lack_what_1_29_rejects_and_keep_the_rest() -> None:
    cv1 = _module()
    originals = [cv1.load(f) for f in FILES]
    base, cpu = cv1.to_v1(originals)
    assert "name" not in base and originals[0]["name"] == "chattts", "the input must stay unchanged"
    assert base["services"]["triton"]["depends_on"]["export"] == {"condition": "service_completed_successfully"}
    assert originals[0]["services"]["triton"]["depends_on"]["export"]["required"] is False
    # `reservations: !reset` removes the GPU reservation from compose.yaml's copy ...
    assert "reservations" not in base["services"]["triton"]["deploy"]["resources"]
    assert "reservations" not in cpu["services"]["triton"]["deploy"]["resources"]
    assert isinstance(originals[1]["services"]["triton"]["deploy"]["resources"]["reservations"], cv1.Reset)
    # ... and leaves everything else of both files as it was.
    assert base["services"]["triton"]["image"] == originals[0]["services"]["triton"]["image"]
    assert cpu["services"]["triton"]["image"] == "chattts-serving:0.1.0-cpu"
    assert base["volumes"] == originals[0]["volumes"]


def test_override_replaces_a_list_that_compose_would_merge(tmp_path: Path) -> None:
    cv1 = _module()
    over = tmp_path / "over.yaml"
    over.write_text('services:\n  gateway:\n    ports: !override ["127.0.0.1:18080:8080"]\n', encoding="utf-8")
    base, out = cv1.to_v1([cv1.load(FILES[0]), cv1.load(over)])
    assert "ports" not in base["services"]["gateway"]
    assert out["services"]["gateway"]["ports"] == ["127.0.0.1:18080:8080"]


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n", encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "compose_v1.py"), "--out", str(out), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not a compose file" in proc.stderr
    assert not out.exists()


def test_docker_compose_1_29_accepts_the_copies(tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("Debian's docker-compose is not installed (scripts/containers.sh install)")
    out = tmp_path / "v1"
    subprocess.run([sys.executable, str(REPO / "scripts" / "compose_v1.py"), "--out", str(out), *map(str, FILES)],
                   check=True, timeout=60)
    env = {**os.environ, "CHATTTS_INFERENCE_KEY": "k" * 32}
    cmd = [compose, "--project-directory", str(DOCKER), "-p", "chattts",
           "-f", str(out / "compose.yaml"), "-f", str(out / "compose.cpu.yaml"), "--profile", "export", "config"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    triton = config["services"]["triton"]
    assert triton["image"] == "chattts-serving:0.1.0-cpu"
    assert "nvidia" not in proc.stdout, "the GPU reservation must be gone"
    assert config["services"]["voices-db"]["image"] == "chattts-postgres:15-bookworm"
    # Relative paths stay relative to docker/: the Prometheus folder is bind-mounted from there.
    assert any(str(DOCKER / "prometheus") in str(v) for v in config["services"]["prometheus"]["volumes"])
    # The originals still fail there, which is why the copies exist.
    orig = subprocess.run([compose, "-f", str(FILES[0]), "config", "-q"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert orig.returncode != 0
