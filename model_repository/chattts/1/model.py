"""chattts (decoupled BLS entry point): text (BYTES [1]) and optional voice, vocoder, sampling
and lookahead_tokens, request parameters priority/timeout_s -> a stream of audio chunks
(FP32 [n], 24 kHz mono), small first chunk, larger ones after; the stream ends with an empty
final response or an explicit error. Logic: chattts_serving.entry and .pipeline."""

from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.entry import EntryService
from chattts_serving.pipeline import INTERNAL, RequestError, stream_audio


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=True)
        self.service = EntryService(pb_utils, setup.name, setup.profile)
        self.emit_tokens = setup.profile.stream.emit_tokens
        self.pool = ThreadPoolExecutor(setup.profile.entry.max_concurrent_streams, thread_name_prefix="stream")
        self.watcher = glue.CancelWatcher()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                adm = self.service.admit(request)
            except RequestError as exc:
                glue.send_final_error(pb_utils, sender, exc)
                continue
            self.pool.submit(self._run, adm, sender)
        return None

    def _run(self, adm, sender):
        first = []

        def send(chunk):
            if not first:
                first.append(True)
                self.service.first_audio(adm)
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.OUT_AUDIO.name, chunk)]))

        result, error = None, None
        try:
            result = stream_audio(adm.req, self.service.stages, adm.schedule, self.emit_tokens, send,
                                  sender.is_cancelled, adm.arrival_s, self.watcher.watcher(sender.is_cancelled))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except RequestError as exc:
            error = exc
        except Exception as exc:  # never leave a client waiting: end every stream explicitly
            glue.log.exception("stream failed")
            error = RequestError(f"internal error: {type(exc).__name__}", INTERNAL)
        if error is not None:
            glue.send_final_error(pb_utils, sender, error)
        self.service.finish(adm, result, error)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=False)
