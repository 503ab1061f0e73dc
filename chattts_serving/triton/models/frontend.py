"""``chattts_frontend``: text (and voice, refine and reference inputs) -> the prepared prompt;
with ``request_text``, also the ensemble door's first step."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ... import contract
from ...audio.encoder import DvaeEncoderRunner
from ...errors import RequestError
from ...runtime import OrtOptions
from ...serving.admission import rejection_reason
from ...serving.boundary import FrontendOutput, frontend_tensors
from ...serving.ensemble import prepare_request
from ...serving.frontend_service import FrontendService
from ...serving.logs import log_event
from ...serving.request import EntryLimits, FrontendCall, parse_frontend
from ...text.frontend import FrontEnd
from ...text.segments import SegmentRules
from ..setup import ModelSetup
from ..tensors import entry_request, request_inputs, string_tensor
from .base import UnaryModel

WARM_UP_TEXT = "你好，世界。Hello 123, 2024-03-05."
"""The front end's first text: number readers, the normaliser, the tokenizer, the voice cache and
(with ``frontend.wetext``) WeTextProcessing warmed before serving."""

ENSEMBLE_FRONTEND_INPUTS = (contract.FE_REQUEST_TEXT, *(t for t in contract.ENTRY_INPUTS if t != contract.IN_TEXT))
"""What the front end reads of an ensemble request: the entry inputs, the text as ``request_text``."""

class FrontendModel(UnaryModel):
    """chattts_frontend: text (BYTES [1]) + voice, refine_prompt, reference_text (BYTES [1]),
    refined_ids (INT32 [N]), reference_audio (FP32 [N]) at reference_sample_rate_hz (INT32 [1]),
    no_speaker, keep_unspeakable, transient_reference (BOOL [1]), all optional -> input_ids
    (INT32 [T]), spk_emb (FP32 [H], L2-normalised; [0] without a speaker), normalized_text
    (BYTES [1]), dropped (BYTES [1], JSON list of what is not spoken), refine_ids (INT32 [T'],
    the refine-text prompt), prompt_codes (INT32 [P, 4], the audio prompt; [0, 4] for none).
    A request's segments come in one call (``segments`` BYTES [N] instead of ``text``, each
    output then per segment: ``contract.FE_SEGMENTS`` and the names after it;
    :func:`~chattts_serving.serving.boundary.frontend_tensors`).
    The DVAE encoder runs here (:class:`~chattts_serving.serving.frontend_service.FrontendService`).

    With ``request_text`` the call is the ensemble door's first step: the whole request (the
    entry inputs, ``request_text`` its text) is validated and prepared by
    :func:`~chattts_serving.serving.ensemble.prepare_request`, and the outputs also hold the
    engine's ensemble-mode inputs (``contract.FRONTEND_REQUEST_OUTPUTS``)."""

    def start(self, setup: ModelSetup) -> None:
        profile = setup.profile
        fp, ref = profile.frontend, profile.reference
        encoder = DvaeEncoderRunner(setup.artifacts, OrtOptions(intra_op_threads=ref.encoder_intra_op_threads))
        encoder.run(np.zeros(contract.SAMPLE_RATE_HZ, np.float32))  # first-run allocations before serving
        self.service = FrontendService(
            FrontEnd(setup.artifacts, fp.max_text_chars, fp.default_voice_seed, wetext=fp.wetext), encoder.run,
            ref.limits(), ref.prompt_cache_entries)
        self.service.prepare(FrontendCall(texts=(WARM_UP_TEXT,)))
        self.limits = EntryLimits(max_new_tokens_cap=profile.engine.max_new_tokens_cap,
                                  max_text_chars=fp.max_text_chars, default_vocoder=profile.stream.default_vocoder,
                                  default_segmentation=fp.segmentation, reference=ref.limits())
        self.rules = SegmentRules(max_chars=fp.max_segment_chars, merge_chars=fp.merge_segment_chars)
        self.schedule = profile.stream.schedule()

    def respond(self, request: Any) -> list[Any]:
        pb = self.pb
        if pb.get_input_tensor_by_name(request, contract.FE_REQUEST_TEXT.name) is not None:
            return self._ensemble_request(request)
        outs = self.service.prepare(parse_frontend(request_inputs(pb, request, contract.FRONTEND_INPUTS),
                                                   request.request_id()))
        return self._prepared(outs)

    def _ensemble_request(self, request: Any) -> list[Any]:
        """The ensemble door's request -> the prepared segment and the engine's ensemble-mode inputs."""
        pb = self.pb
        arrival = time.monotonic()
        inputs, params, request_id = entry_request(pb, request, ENSEMBLE_FRONTEND_INPUTS)
        inputs[contract.IN_TEXT.name] = inputs.pop(contract.FE_REQUEST_TEXT.name)
        try:
            r = prepare_request(inputs, params, request_id, self.service, self.limits, self.rules, self.schedule,
                                arrival)
        except RequestError as exc:
            log_event("request_rejected", level="warning", model=contract.MODEL_ENSEMBLE, request_id=request_id,
                      reason=rejection_reason(exc), status=exc.kind, message=str(exc))
            raise
        log_event("request_accepted", model=contract.MODEL_ENSEMBLE, request_id=request_id, stream_id=r.stream_id,
                  priority=r.request.priority, text_chars=len(r.request.text))
        return [*self._prepared([r.segment]),
                string_tensor(pb, contract.FE_STREAM_ID.name, r.stream_id),
                pb.Tensor(contract.FE_ENGINE_PRIORITY.name, np.array([r.engine_priority], np.int32)),
                pb.Tensor(contract.FE_TIMEOUT_MS.name, np.array([r.timeout_ms], np.int64)),
                pb.Tensor(contract.FE_LOOKAHEAD.name, np.array([r.lookahead_tokens], np.int32)),
                string_tensor(pb, contract.FE_INFO.name, r.info_header)]

    def _prepared(self, outs: list[FrontendOutput]) -> list[Any]:
        return [self.pb.Tensor(name, arr) for name, arr in frontend_tensors(outs).items()]
