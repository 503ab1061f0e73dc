"""Building the project's C++ parts on the host: the compiler to use, and library files
written so that no process ever loads a half-written one. Used by the admission gate
(:mod:`chattts_serving.deploy.gate`) and our int8 kernel (:mod:`chattts_serving.int8_kernel`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else ``g++``, else ``c++`` on PATH; None when none is."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and (path := shutil.which(name)):
            return path
    return None


def write_atomically(dest: Path, write: Callable[[str], object]) -> None:
    """``write(tmp)`` a temporary file next to ``dest``, then rename it to ``dest`` (removed on failure)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cache_dir(env: str, name: str) -> Path:
    """Where compiled libraries of one kind are kept: ``$<env>`` when set, else
    ``~/.cache/chattts-serving/<name>``."""
    value = os.environ.get(env)
    return Path(value) if value else Path.home() / ".cache" / "chattts-serving" / name


def median_ms(call: Callable[[], object], runs: int) -> float:
    """Median wall time in ms of ``runs`` calls of ``call`` (no untimed call first: the
    caller warms up as it needs)."""
    import time

    import numpy as np

    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3
