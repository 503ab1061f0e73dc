"""One admitted request (:class:`SynthesisJob`), what it did (:class:`StreamResult`) and the
``info`` JSON the entry models send about it, free of Triton.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .. import contract
from ..audio.chunking import ChunkSchedule
from ..contract import StopReason
from ..errors import DeadlineExceeded
from ..text.segments import SegmentRules
from .boundary import FrontendOutput
from .request import EntryRequest
from .slots import SlotToken

__all__ = ["PreparedText", "StreamResult", "SynthesisJob", "info_json", "seconds_left"]


@dataclass(frozen=True, kw_only=True)
class SynthesisJob:
    """One admitted request and how to run it.

    schedule: the chunk schedule (streaming; the request's ``lookahead_tokens`` is applied by
    :func:`stream_audio`); emit_tokens: tokens per engine batch; arrival_s:
    ``time.monotonic()`` at arrival (the deadline counts from it); segments: how the text is
    split; degraded: run in the server's degraded mode (reported in ``info``); slot: see below.
    """

    req: EntryRequest
    schedule: ChunkSchedule
    emit_tokens: int
    arrival_s: float
    segments: SegmentRules = SegmentRules()
    degraded: bool = False
    slot: SlotToken | None = field(default=None, compare=False)
    """The admission slot the request holds until it ends (released once, by whoever ends it)."""


@dataclass
class StreamResult:
    """What a finished request did: chunks and samples sent, tokens, stop reason, timings (s),
    and what the front end made of the text (per segment; ``dropped`` merged, in order)."""

    chunks: int = 0
    samples: int = 0
    tokens: int = 0
    stop_reason: StopReason | None = None
    first_audio_s: float | None = None
    chunk_samples: list[int] = field(default_factory=list)
    segments: int = 0
    capped_segments: list[int] = field(default_factory=list)
    """Indices of segments that hit max_new_tokens (their sentence may be cut short)."""
    normalized_text: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    reference: str = ""
    """Where the audio prompt came from (``contract.REFERENCE_SOURCES``)."""
    segment_starts: list[int] = field(default_factory=list)
    """Sample offset (24 kHz) in the request's audio where each segment's audio begins, one per
    segment whose audio has started (``info.segment_starts``)."""
    asked_work_s: float = 0.0
    """Seconds spent before any audio on work the request asked for (refine-text, ChatTTS'
    first-piece reference pass, encoding its reference recording): ``first_audio_s`` less this
    is what the load made it wait (the degraded mode's TTFA signal)."""

    def add_prepared(self, prepared: PreparedText) -> None:
        """Record the front end's view of every segment (before any audio is sent)."""
        self.normalized_text = [p.normalized_text for p in prepared.segments]
        self.dropped = list(dict.fromkeys(d for p in prepared.segments for d in p.dropped))
        self.reference = prepared.reference
        self.asked_work_s = prepared.asked_work_s

    @property
    def load_ttfa_s(self) -> float | None:
        """Time to first audio less the work the request asked for (s); None without audio."""
        return None if self.first_audio_s is None else max(0.0, self.first_audio_s - self.asked_work_s)

    @property
    def cancelled(self) -> bool:
        return self.stop_reason == StopReason.CANCELLED


def info_json(job: SynthesisJob, result: StreamResult, final: bool) -> str:
    """The entry models' ``info`` output (``contract.OUT_INFO``): a JSON object with the keys
    ``contract.INFO_HEADER_KEYS`` (``final`` false: a stream's first audio response) or
    ``contract.INFO_FINAL_KEYS`` (``final`` true). Non-ASCII text is kept as is (UTF-8)."""
    req = job.req
    info: dict[str, object] = {
        "request_id": req.request_id, "sample_rate_hz": contract.SAMPLE_RATE_HZ,
        "normalized_text": result.normalized_text, "dropped": result.dropped,
        "segments": len(result.normalized_text), "vocoder": req.vocoder, "refined": req.refine is not None,
        "degraded": job.degraded, "segmentation": req.segmentation, "reference": result.reference,
        "segment_starts": list(result.segment_starts), "final": final}
    if final:
        info.update(audio_s=round(result.samples / contract.SAMPLE_RATE_HZ, 6), chunks=result.chunks,
                    tokens=result.tokens, capped_segments=result.capped_segments,
                    stop_reason=result.stop_reason or "")
    return json.dumps(info, ensure_ascii=False)


def seconds_left(job: SynthesisJob) -> float | None:
    """Seconds before the request's deadline (None without one). Raises DeadlineExceeded."""
    timeout = job.req.timeout_s
    if timeout is None:
        return None
    left = timeout - (time.monotonic() - job.arrival_s)
    if left <= 0:
        raise DeadlineExceeded(timeout)
    return left


@dataclass(frozen=True)
class PreparedText:
    """A request's text ready for the engine: one :class:`FrontendOutput` per segment, each
    carrying the request's audio-prompt codes (None for none), and where that prompt came from
    (``contract.REFERENCE_SOURCES``)."""

    segments: list[FrontendOutput]
    reference: str = ""
    asked_work_s: float = 0.0
    """Seconds spent on work the request asked for (refine-text, the first-piece reference
    pass, encoding its recording): see :attr:`StreamResult.asked_work_s`."""
