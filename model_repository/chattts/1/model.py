"""chattts (decoupled BLS entry point): text (BYTES [1]) and optional voice, vocoder, sampling
and lookahead_tokens -> a stream of audio chunks (FP32 [n], 24 kHz mono), small first chunk,
larger ones after; the stream ends with an empty final response or an explicit error.
Logic: chattts_serving.pipeline.stream_audio over BLS calls (chattts_serving.triton_glue)."""

from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.pipeline import INTERNAL, UNAVAILABLE, RequestError, parse_entry, stream_audio


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=True)
        self.profile = setup.profile
        self.schedule = setup.profile.stream.schedule()
        self.slots = glue.StreamSlots(setup.profile.entry.max_concurrent_streams)
        self.pool = ThreadPoolExecutor(setup.profile.entry.max_concurrent_streams, thread_name_prefix="stream")
        self.stages = glue.BlsStages(pb_utils)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = glue.request_inputs(pb_utils, request, contract.ENTRY_INPUTS)
                req = parse_entry(inputs, self.profile.engine.max_new_tokens_cap, self.profile.stream.default_vocoder)
                if not self.slots.acquire():
                    raise RequestError(f"server busy: {self.slots.limit} streams already live", UNAVAILABLE)
            except RequestError as exc:
                glue.send_final_error(pb_utils, sender, exc)
                continue
            self.pool.submit(self._run, req, sender)
        return None

    def _run(self, req, sender):
        def send(chunk):
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.OUT_AUDIO.name, chunk)]))

        try:
            stream_audio(req, self.stages, self.schedule, self.profile.stream.emit_tokens, send, sender.is_cancelled)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except RequestError as exc:
            glue.send_final_error(pb_utils, sender, exc)
        except Exception as exc:  # never leave a client waiting: end every stream explicitly
            glue.log.exception("stream failed")
            glue.send_final_error(pb_utils, sender, RequestError(f"internal error: {type(exc).__name__}", INTERNAL))
        finally:
            self.slots.release()

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=False)
