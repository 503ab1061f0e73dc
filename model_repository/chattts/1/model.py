"""chattts (decoupled BLS entry point): text (BYTES [1]) and optional voice, vocoder, sampling,
lookahead_tokens, priority and timeout_s -> a stream of audio chunks (FP32 [n], 24 kHz mono),
small first chunk, larger ones after; the first chunk also carries info (BYTES [1], JSON:
contract.INFO_HEADER_KEYS); the stream ends with a final response carrying only info
(contract.INFO_FINAL_KEYS) or an explicit error. Logic: chattts_serving.entry and .pipeline."""

from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.entry import EntryService
from chattts_serving.pipeline import INTERNAL, UNAVAILABLE, RequestError, StreamResult, info_json, stream_audio


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=True)
        self.service = EntryService(pb_utils, setup.name, setup.profile)
        self.emit_tokens = setup.profile.stream.emit_tokens
        self.pool = ThreadPoolExecutor(setup.profile.entry.max_concurrent_streams, thread_name_prefix="stream")
        self.watcher = glue.CancelWatcher(stall_s=setup.profile.entry.stall_timeout_s, on_stall=self._stalled)

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

    def _stalled(self, guard, adm):
        exc = RequestError("server unavailable: the GPT engine stopped responding", UNAVAILABLE)
        if guard.fail(exc, by_watchdog=True):
            self.service.finish(adm, None, exc)

    def _run(self, adm, sender):
        guard = glue.StreamGuard(pb_utils, sender)
        unguard = self.watcher.guard(guard, adm)
        result = StreamResult()

        def send(chunk):
            header = None
            if not result.chunks:  # the first chunk: stream_audio counts it after send returns
                self.service.first_audio(adm)
                header = info_json(adm.req, result, final=False, degraded=adm.degraded)
            guard.send_chunk(contract.OUT_AUDIO.name, chunk, header)

        error = None
        try:
            stream_audio(adm.req, self.service.stages, adm.schedule, self.emit_tokens, send,
                         guard.is_cancelled, adm.arrival_s, self.watcher.watcher(guard.is_cancelled),
                         progress=guard.touch, result=result)
        except RequestError as exc:
            error = exc
        except Exception as exc:  # never leave a client waiting: end every stream explicitly
            glue.log.exception("stream failed")
            error = RequestError(f"internal error: {type(exc).__name__}", INTERNAL)
        finally:
            unguard()
        if error is not None:
            closed = guard.fail(error)
        else:
            closed = guard.finish(info_json(adm.req, result, final=True, degraded=adm.degraded))
        if closed:
            self.service.finish(adm, result, error)

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
