"""Serves ``chattts_ensemble_vocoder`` in every profile (decoupled): the ensemble door's last
step; vocodes the GPT engine's windows and passes a client's cancel to the engine.
Inputs, outputs and logic: chattts_serving.triton.models.EnsembleVocoderModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import EnsembleVocoderModel


class TritonPythonModel(EnsembleVocoderModel):
    pb = pb_utils
