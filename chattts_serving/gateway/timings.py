"""Sentence timings: where each sentence starts in the delivered audio, and for how long.

The synthesis runs at :data:`chattts_serving.contract.SAMPLE_RATE_HZ` (24 kHz); the audio a
client receives may be at another rate (``sample_rate``, G.711's 8 kHz, Opus' 48 kHz). A
position of ``n`` samples at 24 kHz is ``round(n * rate / 24000)`` samples of the delivered
audio: the resampler (:class:`chattts_serving.audio.formats.Resampler`) keeps the time axis
(its delay is removed) and delivers exactly that many samples for N (rounded half up), so the
durations of consecutive sentences add up to the delivered length exactly.

ChatTTS gives no word-level timing (its GPT emits audio tokens, not aligned text), so these are
sentence timings only: a sentence is one segment of the entry model (HTTP) or one sentence of
the WebSocket stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import contract
from ..audio.formats import resampled_length


def delivered_samples(samples_24k: int, rate_hz: int) -> int:
    """``samples_24k`` samples at 24 kHz as a count of samples at ``rate_hz`` (rounded half up,
    as :func:`chattts_serving.audio.formats.resampled_length` delivers them)."""
    return resampled_length(samples_24k, rate_hz, contract.SAMPLE_RATE_HZ)


@dataclass(frozen=True)
class SentenceTiming:
    """One sentence's place in the delivered audio: ``start_samples`` and
    ``duration_samples`` at ``sample_rate_hz`` (the delivered rate), ``text`` as spoken
    (normalised) when known."""

    index: int
    start_samples: int
    duration_samples: int
    sample_rate_hz: int
    text: str | None = None

    @classmethod
    def between(cls, index: int, start_24k: int, end_24k: int, rate_hz: int, text: str | None = None) -> SentenceTiming:
        """The sentence spanning samples ``[start_24k, end_24k)`` of the 24 kHz synthesis."""
        start = delivered_samples(start_24k, rate_hz)
        return cls(index, start, delivered_samples(end_24k, rate_hz) - start, rate_hz, text)

    def fields(self) -> dict[str, Any]:
        """``start_samples``, ``duration_samples``, ``start_s``, ``duration_s``,
        ``sample_rate_hz`` (seconds rounded to 0.1 ms)."""
        rate = self.sample_rate_hz
        return {"start_samples": self.start_samples, "duration_samples": self.duration_samples,
                "start_s": round(self.start_samples / rate, 4), "duration_s": round(self.duration_samples / rate, 4),
                "sample_rate_hz": rate}

    def as_dict(self) -> dict[str, Any]:
        """``index``, ``text`` and :meth:`fields`."""
        return {"index": self.index, "text": self.text, **self.fields()}


class SegmentClock:
    """Follows one ``chattts`` stream's ``info.segment_starts`` (24 kHz offsets where each
    entry-model segment's audio begins) and turns finished segments into
    :class:`SentenceTiming` at the delivered ``rate_hz``."""

    def __init__(self, rate_hz: int) -> None:
        self.rate_hz = rate_hz
        self.starts: list[int] = []
        self.texts: list[str] = []
        self._reported = 0

    def update(self, info: dict[str, Any]) -> None:
        """Take an ``info`` object of the stream (header, segment marker or final)."""
        starts = info.get("segment_starts")
        if isinstance(starts, list) and len(starts) >= len(self.starts):
            self.starts = [int(s) for s in starts]
        texts = info.get("normalized_text")
        if isinstance(texts, list):
            self.texts = [str(t) for t in texts]

    def finished(self, samples_24k: int, final: bool) -> list[SentenceTiming]:
        """The sentences completed and not yet returned: every segment followed by a started
        one, and with ``final`` (the stream ended after ``samples_24k`` samples) the last."""
        out = []
        starts = self.starts or ([0] if final and samples_24k else [])  # a server without segment_starts
        bounds = [*starts[1:], samples_24k] if final else starts[1:]
        while self._reported < len(bounds):
            i = self._reported
            text = self.texts[i] if i < len(self.texts) else None
            out.append(SentenceTiming.between(i, starts[i], bounds[i], self.rate_hz, text))
            self._reported += 1
        return out
