"""The ensemble door's first step, free of Triton: a whole request, validated as the BLS door
validates it, refused where the ensemble cannot do what ``chattts`` does, and prepared for the
GPT engine's ensemble mode.

``chattts_ensemble`` (``platform: "ensemble"``) wires ``chattts_frontend`` -> ``chattts_gpt``
-> ``chattts_ensemble_vocoder``: a fixed graph without a Python entry
model, so it can only do what needs no per-request logic between the steps: one GPT sequence,
the hidden vocoder, the front end's prompt. :func:`prepare_request` parses the request with the
entry models' own parser (:func:`~chattts_serving.serving.request.parse_entry`: the same
errors, the same defaults), then refuses with INVALID, naming the ``chattts`` door:
``refine_text``, ``segmentation`` ``chattts``, a reference recording or ``spk_smp``, the
``codes`` vocoder, and a text that the BLS door would cut into more than one sentence segment.
A voice of the voices file that stands for a recording works (its prompt codes come from the
front end). The degraded mode of the BLS door does not apply here.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .. import contract
from ..audio.chunking import ChunkSchedule
from ..contract import Segmentation, VocoderPath
from ..errors import RequestError
from ..text.request_text import carry_speed
from ..text.segments import SegmentRules, split_segments
from .boundary import FrontendOutput
from .frontend_service import FrontendService
from .job import PreparedText, StreamResult, SynthesisJob, info_json, seconds_left
from .request import EntryLimits, EntryRequest, FrontendCall, parse_entry


@dataclass(frozen=True, kw_only=True)
class EnsembleRequest:
    """One ensemble stream ready for the engine: the prepared segment (prompt ids, speaker
    vector, audio-prompt codes), the engine sequence's ``stream_id`` (a fresh UUID hex), its
    scheduling class, what is left of the deadline in ms (0: none), the request's lookahead
    (-1: the profile's schedule) and the ``info`` JSON of the first chunk."""

    request: EntryRequest
    segment: FrontendOutput
    stream_id: str
    engine_priority: int
    timeout_ms: int
    lookahead_tokens: int
    info_header: str


def door_error(what: str, param: str) -> RequestError:
    """The INVALID refusal of what only the BLS door does: names ``chattts``."""
    return RequestError(f"{what} is not served by {contract.MODEL_ENSEMBLE}; send this request to "
                        f"{contract.MODEL_STREAM} (the BLS door does it)", param=param)


def prepare_request(inputs: Mapping[str, np.ndarray], params: Mapping[str, object], request_id: str,
                    service: FrontendService, limits: EntryLimits, rules: SegmentRules, schedule: ChunkSchedule,
                    arrival_s: float | None = None) -> EnsembleRequest:
    """Validate, check and prepare one ensemble request (see the module docstring):
    ``inputs`` are the entry inputs by name, ``params`` the Triton request parameters (refused
    as the BLS door refuses them), ``request_id`` the client's (or a generated one),
    ``limits`` and ``rules`` the profile's, ``schedule`` the profile's chunk schedule (for
    ``info``). Raises RequestError (INVALID), DeadlineExceeded."""
    arrival = time.monotonic() if arrival_s is None else arrival_s
    req = parse_entry(inputs, limits, params, request_id)
    if req.refine is not None:
        raise door_error("refine_text", contract.IN_REFINE_TEXT.name)
    if req.segmentation != Segmentation.STREAMING:
        raise door_error(f"segmentation {req.segmentation.value!r} (ChatTTS' split and first-piece audio prompt)",
                         contract.IN_SEGMENTATION.name)
    if req.reference is not None:
        param = contract.IN_SPK_SMP.name if req.reference.codes is not None else contract.IN_REFERENCE_AUDIO.name
        raise door_error("a reference recording or spk_smp sent with the request", param)
    if req.vocoder != VocoderPath.HIDDEN:
        raise door_error(f"vocoder {req.vocoder.value!r}", contract.IN_VOCODER.name)
    texts = carry_speed(split_segments(req.text, rules))
    if not texts:
        raise RequestError("text is empty", param=contract.IN_TEXT.name)
    if len(texts) > 1:
        raise door_error(f"a text of {len(texts)} sentence segments (one sentence of at most {rules.max_chars} "
                         "characters is one GPT sequence)", contract.IN_TEXT.name)
    (segment,) = service.prepare(FrontendCall(texts=(texts[0],), voice=req.voice, request_id=request_id,
                                              language=req.language))
    source = "voice" if segment.prompt_codes is not None and len(segment.prompt_codes) else ""
    job = SynthesisJob(req=req, schedule=schedule, emit_tokens=0, arrival_s=arrival, segments=rules)
    result = StreamResult()
    result.add_prepared(PreparedText([segment], source))
    left = seconds_left(job)
    return EnsembleRequest(request=req, segment=segment, stream_id=uuid.uuid4().hex,
                           engine_priority=req.priority.engine_class,
                           timeout_ms=max(1, math.ceil(left * 1000)) if left is not None else 0,
                           lookahead_tokens=req.lookahead_tokens if req.lookahead_tokens is not None else -1,
                           info_header=info_json(job, result, final=False))
