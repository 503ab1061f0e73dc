"""The deep probe's command line (``python -m chattts_serving.deploy.probe``) in a subprocess,
with the admin token given or none at all from this environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from chattts_serving.deploy.admin import TOKEN_ENV, TOKEN_FILE_ENV


def probe_cli(*args: str, timeout: float = 120, admin_token: str | None = None) -> tuple[int, dict[str, Any]]:
    """The probe's exit code and its JSON verdict (its last line of output; ``{"stderr": ...}``
    when it wrote none)."""
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    if admin_token:
        env[TOKEN_ENV] = admin_token
    proc = subprocess.run([sys.executable, "-m", "chattts_serving.deploy.probe", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {"stderr": proc.stderr})
