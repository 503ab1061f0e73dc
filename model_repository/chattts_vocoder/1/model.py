"""chattts_vocoder / chattts_dvae_vocoder (dynamic batching): token windows -> 24 kHz audio.
Inputs, outputs and logic: chattts_serving.triton.models."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import VocoderModel


class TritonPythonModel(VocoderModel):
    pb = pb_utils
