"""Serves ``chattts_gpt`` in every profile (decoupled): the in-flight batching GPT engine, KV caches
resident; prompt ids in, token batches (or the ensemble's vocoder windows) out. Inputs, outputs
and logic: chattts_serving.triton.models.EngineModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import EngineModel


class TritonPythonModel(EngineModel):
    pb = pb_utils
