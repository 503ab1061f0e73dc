"""Serves ``chattts_ensemble_relay`` in every profile (decoupled): the ensemble door's step between
the GPT engine and the vocoder; passes vocoder windows on and a client's cancel to the engine.
Inputs, outputs and logic: chattts_serving.triton.models.RelayModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import RelayModel


class TritonPythonModel(RelayModel):
    pb = pb_utils
