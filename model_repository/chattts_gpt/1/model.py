"""chattts_gpt (decoupled): the in-flight batching GPT engine, KV caches resident; prompt ids in,
token batches out. Inputs, outputs and logic: chattts_serving.triton.models."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import EngineModel


class TritonPythonModel(EngineModel):
    pb = pb_utils
