"""What bench.json records of the host: CPU model and instruction-set flags, cores, memory, OS,
library versions and the git commit measured."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU model and the instruction-set flags that decide the int8 kernels
    (:func:`~chattts_serving.engine.kernels.cpu_features`), cores, memory (GB), OS, Python and
    library versions, git commit."""
    import psutil

    from chattts_serving.engine.kernels import cpu_features

    cpu = cpu_features()
    cpu_model = cpu["cpu_model"] or platform.processor() or "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                                    timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"cpu_model": cpu_model, "cpu_flags": cpu["cpu_flags"], "logical_cpus": os.cpu_count(),
            "physical_cpus": psutil.cpu_count(logical=False), "affinity_cpus": len(os.sched_getaffinity(0)),
            "memory_gb": psutil.virtual_memory().total / 1e9, "platform": platform.platform(),
            "python": platform.python_version(), "onnxruntime": _version("onnxruntime"),
            "torch": _version("torch"), "chattts": _version("chattts"),
            "tritonclient": _version("tritonclient"), "nvidia_pytriton": _version("nvidia-pytriton"),
            "git_commit": commit, "git_dirty": dirty, "load_avg_1m_at_start": os.getloadavg()[0]}
