"""chattts_offline (HTTP/gRPC infer): same inputs and request parameters as chattts -> the
whole utterance as one audio tensor (FP32 [n], 24 kHz mono), each sentence vocoded in one
window like offline ChatTTS, and info (BYTES [1], JSON: contract.INFO_FINAL_KEYS). Logic:
chattts_serving.entry and .pipeline.offline_audio."""

from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.entry import EntryService
from chattts_serving.pipeline import INTERNAL, RequestError, info_json, offline_audio


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=False)
        self.service = EntryService(pb_utils, setup.name, setup.profile)
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="offline")

    def execute(self, requests):
        return list(self.pool.map(self._one, requests))

    def _one(self, request):
        try:
            adm = self.service.admit(request)
        except RequestError as exc:
            return pb_utils.InferenceResponse(error=glue.triton_error(pb_utils, exc))
        result, error, audio = None, None, None
        try:
            audio, result = offline_audio(adm.req, self.service.stages, t0=adm.arrival_s)
        except RequestError as exc:
            error = exc
        except Exception as exc:
            glue.log.exception("offline request failed")
            error = RequestError(f"internal error: {type(exc).__name__}", INTERNAL)
        self.service.finish(adm, result, error)
        if error is not None:
            return pb_utils.InferenceResponse(error=glue.triton_error(pb_utils, error))
        info = info_json(adm.req, result, final=True, degraded=adm.degraded)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.OUT_AUDIO.name, audio),
                                                          glue.string_tensor(pb_utils, contract.OUT_INFO.name, info)])
