"""chattts_vocoder / chattts_dvae_vocoder (dynamic batching): a token window, hidden (FP32
[T, H]) or codes (INT32 [T, 4]), -> audio (FP32 [512*T-256]) at 24 kHz. Windows of equal
length in one batch run as one ONNX Runtime call. Logic: chattts_serving.runtime and
triton_glue.vocode_requests."""

import triton_python_backend_utils as pb_utils

from chattts_serving import triton_glue as glue
from chattts_serving.metrics import MemoryGauges
from chattts_serving.runtime import VocoderRunner


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=False)
        self.name = setup.name
        self.memory = MemoryGauges(pb_utils, setup.name, setup.gpu_index)
        self.runner = VocoderRunner(setup.artifacts, setup.parameters["vocoder_path"], setup.ort("vocoder"))
        self.runner.warm_up(setup.artifacts.hidden_size)

    def execute(self, requests):
        return glue.vocode_requests(pb_utils, self.runner, requests, self.name, self.memory)
