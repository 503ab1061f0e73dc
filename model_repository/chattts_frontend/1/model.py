"""Serves ``chattts_frontend`` in every profile: one text segment and voice -> prompt ids, speaker
vector, normalised text and what was not spoken (and the ensemble door's whole request). Inputs,
outputs and logic: chattts_serving.triton.models.FrontendModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import FrontendModel


class TritonPythonModel(FrontendModel):
    pb = pb_utils
