"""What a Triton model learns in ``initialize(args)``: its config, artifacts and profile."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..runtime import Artifacts, OrtOptions
from ..serving.logs import configure_root_logging
from ..serving.profile import Profile, profile_from_json


@dataclass(frozen=True)
class ModelSetup:
    """A model instance's configuration: its name and config (Triton's JSON form), the
    artifacts and profile named by the config's ``artifacts_dir`` and ``profile_path``
    parameters, every config parameter, and its GPU for KIND_GPU instances."""

    name: str
    config: dict[str, Any]
    artifacts: Artifacts
    profile: Profile
    parameters: dict[str, str]
    gpu_index: int | None = None
    """The instance's GPU (Triton's ``model_instance_device_id``) for KIND_GPU, else None."""

    def ort(self, stage: Literal["engine", "vocoder"]) -> OrtOptions:
        """The profile's ONNX Runtime options for ``stage``, on this instance's GPU (an
        instance group over several GPUs gives each instance its own device)."""
        opts = self.profile.ort(stage)
        return opts if self.gpu_index is None else dataclasses.replace(opts, device_id=self.gpu_index)

    @classmethod
    def from_args(cls, pb: Any, args: dict[str, Any], decoupled: bool) -> ModelSetup:
        """Parse Triton's ``initialize`` args. Raises RuntimeError when the config's transaction
        policy does not match what the model implements; FileNotFoundError when its
        artifacts or profile are missing."""
        configure_root_logging(os.environ.get("CHATTTS_LOG_LEVEL", "INFO"))
        config = json.loads(args["model_config"])
        name = config["name"]
        if pb.using_decoupled_model_transaction_policy(config) != decoupled:
            raise RuntimeError(f"{name}: model_transaction_policy decoupled must be {decoupled}")
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        artifacts = Artifacts.load(params["artifacts_dir"])
        profile = profile_from_json(Path(params["profile_path"]).read_text())
        gpu = int(args.get("model_instance_device_id", 0)) if args.get("model_instance_kind") == "GPU" else None
        return cls(name, config, artifacts, profile, params, gpu)


def lower_priority(nice: int) -> int:
    """Give every thread of this process the niceness ``nice`` (0-19; a higher value runs
    later when the CPU is contended). Linux keeps a niceness per thread and a new thread
    inherits its creator's, so threads started afterwards from these keep it too. Only raises
    the value (an unprivileged process cannot lower it): returns the number of threads
    changed. Raises ValueError outside 0-19."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be 0-19, not {nice}")
    changed = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < nice:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                changed += 1
    return changed
