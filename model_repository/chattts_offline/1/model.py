"""chattts_offline (HTTP/gRPC infer): same inputs as chattts -> the whole utterance as one
audio tensor (FP32 [512*N-256], 24 kHz mono), vocoded in one window like offline ChatTTS.
Logic: chattts_serving.pipeline.offline_audio over BLS calls."""

from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.pipeline import INTERNAL, RequestError, offline_audio, parse_entry


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=False)
        self.profile = setup.profile
        self.stages = glue.BlsStages(pb_utils)
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="offline")

    def execute(self, requests):
        return list(self.pool.map(self._one, requests))

    def _one(self, request):
        try:
            inputs = glue.request_inputs(pb_utils, request, contract.ENTRY_INPUTS)
            req = parse_entry(inputs, self.profile.engine.max_new_tokens_cap, self.profile.stream.default_vocoder)
            audio, _ = offline_audio(req, self.stages)
        except RequestError as exc:
            return pb_utils.InferenceResponse(error=glue.triton_error(pb_utils, exc))
        except Exception as exc:
            glue.log.exception("offline request failed")
            return pb_utils.InferenceResponse(
                error=glue.triton_error(pb_utils, RequestError(f"internal error: {type(exc).__name__}", INTERNAL)))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.OUT_AUDIO.name, audio)])
