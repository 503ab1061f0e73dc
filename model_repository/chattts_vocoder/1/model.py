"""chattts_vocoder / chattts_dvae_vocoder (dynamic batching): a token window, hidden (FP32
[T, H]) or codes (INT32 [T, 4]), -> audio (FP32 [512*T-256]) at 24 kHz. Windows of equal
length in one batch run as one ONNX Runtime call. Logic: chattts_serving.runtime."""

import numpy as np
import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.runtime import VocoderRunner


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=False)
        self.runner = VocoderRunner(setup.artifacts, setup.parameters["vocoder_path"], setup.profile.ort("vocoder"))
        self.runner.warm_up(setup.artifacts.hidden_size)

    def execute(self, requests):
        windows = [pb_utils.get_input_tensor_by_name(r, self.runner.input_name).as_numpy() for r in requests]
        audio = [None] * len(requests)
        for length in {w.shape[1] for w in windows}:
            idx = [i for i, w in enumerate(windows) if w.shape[1] == length]
            out = self.runner.run(np.concatenate([windows[i] for i in idx]))
            for row, i in enumerate(idx):
                audio[i] = out[row:row + 1]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.VO_AUDIO.name, a)])
                for a in audio]
