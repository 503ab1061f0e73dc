"""chattts_gpt (decoupled): the in-flight batching GPT engine. input_ids (INT32 [T]), spk_emb
(FP32 [H], code mode), mode ('code' or 'text' for refine-text), sampling parameters,
emit_tokens -> a stream of codes (INT32 [N, 4]), hidden (FP32 [N, H]), stop_reason (BYTES
[1]), starting with an empty acknowledgement; or a control request ('cancel' + stream_id).
KV caches stay inside. Logic: chattts_serving.engine and triton_glue."""

import time

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.engine import Engine, EngineBusy, Sequence
from chattts_serving.metrics import EngineMetrics, MemoryGauges
from chattts_serving.pipeline import UNAVAILABLE, RequestError
from chattts_serving.runtime import Embeddings, GptStepRunner


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=True)
        self.profile, self.name = setup.profile, setup.name
        self.hidden_size = setup.artifacts.hidden_size
        runner = GptStepRunner(setup.artifacts, setup.ort("engine"))
        ep = setup.profile.engine
        self.metrics = EngineMetrics(pb_utils, setup.name, ep.max_batch_size * ep.max_context_tokens,
                                     MemoryGauges(pb_utils, setup.name, setup.gpu_index))
        self.engine = Engine(runner, Embeddings(setup.artifacts), ep.engine_config(), self.metrics)
        self.engine.warm_up(text_head=self.engine.emb.has_text_head)  # refine-text needs the text head
        if not self.engine.emb.has_text_head:
            glue.log.warning("%s: the artifacts have no text head (exported before exporter version 3): "
                             "refine_text requests will fail until `make export` runs again", setup.artifacts.root)
        self.engine.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = glue.request_inputs(pb_utils, request, contract.ENGINE_INPUTS)
                control, stream_id = glue.engine_control(inputs)
                if control == "cancel":
                    self.engine.cancel(stream_id)
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                a = glue.engine_sequence_args(inputs, self.hidden_size, self.profile.engine.max_new_tokens_cap)
                deadline = time.monotonic() + a.timeout_s if a.timeout_s else None
                try:
                    sink = glue.SenderSink(pb_utils, sender, self.name, request.request_id(), a.input_ids.size)
                    self.engine.submit(Sequence(a.input_ids, a.spk_emb, a.params, sink, mode=a.mode, acknowledge=True,
                                                emit_tokens=a.emit_tokens, first_emit_tokens=a.first_emit_tokens,
                                                priority=a.priority, deadline_s=deadline,
                                                request_id=stream_id or request.request_id()))
                except EngineBusy as exc:
                    raise RequestError(str(exc), UNAVAILABLE) from None
                except ValueError as exc:
                    raise RequestError(str(exc)) from None
            except RequestError as exc:
                glue.send_engine_error(pb_utils, sender, exc)
        return None

    def finalize(self):
        self.engine.stop()
