"""What a Triton model learns in ``initialize(args)``: its config, artifacts and profile."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..runtime import Artifacts, OrtOptions
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
        logging.basicConfig(level=os.environ.get("CHATTTS_LOG_LEVEL", "INFO"),
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        config = json.loads(args["model_config"])
        name = config["name"]
        if pb.using_decoupled_model_transaction_policy(config) != decoupled:
            raise RuntimeError(f"{name}: model_transaction_policy decoupled must be {decoupled}")
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        artifacts = Artifacts.load(params["artifacts_dir"])
        profile = profile_from_json(Path(params["profile_path"]).read_text())
        gpu = int(args.get("model_instance_device_id", 0)) if args.get("model_instance_kind") == "GPU" else None
        return cls(name, config, artifacts, profile, params, gpu)
