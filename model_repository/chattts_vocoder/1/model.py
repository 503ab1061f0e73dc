"""Serves ``chattts_vocoder`` (hidden -> audio) and ``chattts_dvae_vocoder`` (codes -> audio) in
every profile (dynamic batching): token windows -> 24 kHz audio. Inputs, outputs and logic:
chattts_serving.triton.models.VocoderModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import VocoderModel


class TritonPythonModel(VocoderModel):
    pb = pb_utils
