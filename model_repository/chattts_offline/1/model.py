"""Serves the offline entry model: ``chattts_offline_entry`` in every shipped profile (behind the
C++ gate ``chattts_offline``), or ``chattts_offline`` itself with ``[entry] gate = false``. HTTP/gRPC
infer: the inputs of chattts -> the whole utterance as one 24 kHz audio tensor and info (JSON).
Inputs, outputs and logic: chattts_serving.triton.models.OfflineEntryModel."""

import triton_python_backend_utils as pb_utils

from chattts_serving.triton.models import OfflineEntryModel


class TritonPythonModel(OfflineEntryModel):
    pb = pb_utils
