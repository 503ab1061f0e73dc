"""`make setup` installs what the test suite needs, so that `make test` on a fresh machine runs
every test instead of skipping those whose tool is missing (promtool, the Prometheus server).

The Debian step is ``scripts/debian_packages.sh``; `make test` runs `make setup` first and
.ci/run runs `make test`, the README's command.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "debian_packages.sh"
PACKAGES = ("libpython3.11", "prometheus", "chromium", "fonts-wqy-microhei", "postgresql")
needs_apt = pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get: not a Debian-like machine")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False)


@needs_apt
def test_every_debian_package_the_tests_use_is_installed() -> None:
    """Fails (rather than letting 8 tests skip) when `make setup` has not installed them."""
    proc = _run("--check")
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}: run `make setup`, which installs them"
    assert proc.stdout.strip() == f"debian packages: all present ({' '.join(PACKAGES)})"
    # what tests/unit/test_deploy_*.py and tests/server/test_observability.py look for before they skip
    assert shutil.which("promtool") is not None and Path("/usr/bin/prometheus").is_file()
    assert Path("/usr/bin/chromium").is_file()  # what tests/server/test_gateway_page.py launches


@needs_apt
def test_apt_resolves_every_package_the_script_installs() -> None:
    proc = _run("--simulate")
    assert proc.returncode == 0, proc.stderr
    for package in PACKAGES:
        pattern = rf"^(Inst {re.escape(package)} |{re.escape(package)} is already the newest version)"
        assert re.search(pattern, proc.stdout, re.MULTILINE), f"apt-get does not plan {package}:\n{proc.stdout}"


def test_usage_error_exits_2() -> None:
    proc = _run("--bogus")
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_make_test_runs_setup_which_runs_the_debian_step_and_ci_runs_make_test() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: setup\b", makefile, re.MULTILINE)
    assert re.search(r"^setup:.*\n\tbash scripts/setup\.sh$", makefile, re.MULTILINE)
    setup = [ln.strip() for ln in (ROOT / "scripts" / "setup.sh").read_text().splitlines()]
    assert "bash scripts/debian_packages.sh" in setup
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()]
    assert ci[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^make test\s+#", readme, re.MULTILINE)
