"""chattts (decoupled BLS entry point): text in, a stream of 24 kHz audio chunks out, the first
and the final response with info (JSON). Inputs, outputs and logic: chattts_serving.triton.models."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import StreamingEntryModel


class TritonPythonModel(StreamingEntryModel):
    pb = pb_utils
