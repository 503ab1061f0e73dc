"""Serves the streaming entry model: ``chattts_entry`` in every shipped profile (``[entry] gate =
true``: ``chattts`` itself is then the C++ admission gate, chattts_serving/gate/gate.cc, which
forwards what it admits here), or ``chattts`` itself with ``[entry] gate = false``. Decoupled BLS:
text in, a stream of 24 kHz audio chunks out, the first and the final response with info (JSON).
Inputs, outputs and logic: chattts_serving.triton.models.StreamingEntryModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import StreamingEntryModel


class TritonPythonModel(StreamingEntryModel):
    pb = pb_utils
