"""``make gateway`` runs setup only when the venv is older than what setup installs from
(pyproject.toml, scripts/setup.sh, ...): the stamp ``.venv/.setup-stamp`` that setup touches.
Checked with ``make -n`` (what make would run), the stamp a file of the test's own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.servers import ROOT


def _plan(stamp: Path, *args: str) -> str:
    proc = subprocess.run(["make", "-n", "gateway", f"VENV_STAMP={stamp}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_gateway_runs_setup_only_when_the_venv_is_older_than_its_sources(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    stamp = tmp_path / "setup-stamp"
    assert "scripts/setup.sh" in _plan(stamp)  # no stamp: a venv never set up
    stamp.touch()  # newer than every source: current
    current = _plan(stamp)
    assert "scripts/setup.sh" not in current and "-m chattts_serving.gateway" in current
    assert "scripts/setup.sh" in _plan(stamp, "-W", "pyproject.toml")  # pyproject.toml changed since
    assert "scripts/setup.sh" in _plan(stamp, "-W", "scripts/setup.sh")
