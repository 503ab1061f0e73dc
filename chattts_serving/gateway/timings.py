"""Sentence timings: where each sentence starts in the delivered audio, and for how long.

The synthesis runs at :data:`chattts_serving.contract.SAMPLE_RATE_HZ` (24 kHz); the audio a
client receives may be at another rate (``sample_rate``, G.711's 8 kHz, Opus' 48 kHz). A
position of ``n`` samples at 24 kHz is ``round(n * rate / 24000)`` samples of the delivered
audio: the resampler (:class:`chattts_serving.audio.rates.Resampler`) keeps the time axis
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
from ..audio.formats import WAV_HEADER_BYTES
from ..audio.rates import g711_wav_header, resampled_length


def delivered_samples(samples_24k: int, rate_hz: int) -> int:
    """``samples_24k`` samples at 24 kHz as a count of samples at ``rate_hz`` (rounded half up,
    as :func:`chattts_serving.audio.rates.resampled_length` delivers them)."""
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


# --- barge-in: what a client was sent of an utterance cut short --------------------------------

RAW_LAYOUTS: dict[str, int] = {"pcm": 2, "wav": 2, "float32": 4, "mulaw": 1, "alaw": 1}
"""Bytes per sample of the formats whose bytes are bare samples (after a header)."""
G711_WAV_HEADER_BYTES = len(g711_wav_header("mulaw"))
"""The header of a streamed G.711 WAV (58 bytes; a PCM WAV's is ``WAV_HEADER_BYTES``, 44)."""


def raw_layout(fmt: str, container: str | None = None) -> tuple[int, int] | None:
    """``(bytes per sample, header bytes)`` of a stream of format ``fmt`` in ``container``,
    or None for a codec (mp3, aac, opus, flac), whose bytes do not count samples."""
    width = RAW_LAYOUTS.get(fmt)
    if width is None:
        return None
    if fmt == "wav" or (container == "wav" and fmt == "pcm"):
        return width, WAV_HEADER_BYTES
    if container == "wav":
        return width, G711_WAV_HEADER_BYTES
    return width, 0


class DeliveryClock:
    """Counts the samples (at the delivered ``rate_hz``) of one encoded stream that a client has
    been sent: from the bytes of a raw format (its header left out), so the count is what the
    client can play; for a codec, the 24 kHz samples given to the encoder at that rate (a codec
    frame may still be in the encoder)."""

    def __init__(self, rate_hz: int, fmt: str, container: str | None = None) -> None:
        self.rate_hz = rate_hz
        self.layout = raw_layout(fmt, container)
        self._bytes = 0
        self._fed_24k = 0

    def sent(self, data: bytes, fed_24k: int) -> None:
        """``data`` was sent; the encoder had been given ``fed_24k`` more samples at 24 kHz for it."""
        self._bytes += len(data)
        self._fed_24k += fed_24k

    @property
    def samples(self) -> int:
        if self.layout is None:
            return delivered_samples(self._fed_24k, self.rate_hz)
        width, header = self.layout
        return max(self._bytes - header, 0) // width


def split_spoken(received: str, spoken: list[str]) -> tuple[str, str]:
    """``received`` (the utterance's text as the client sent it) cut after the sentences
    ``spoken`` (cut from it in order, so its first characters, white space aside): the spoken
    part and the rest, each stripped. White space is kept as sent, so the two parts are the
    text again (modulo white space at the cut)."""
    need = sum(1 for s in spoken for ch in s if not ch.isspace())
    pos = 0
    while need and pos < len(received):
        if not received[pos].isspace():
            need -= 1
        pos += 1
    return received[:pos].strip(), received[pos:].strip()


def interruption_fields(rate_hz: int, delivered: int, received: str, spoken: list[str],
                        cut_index: int | None, cut_text: str | None, cut_samples: int) -> dict[str, Any]:
    """What an interrupt answers (``interrupted``, ``audio.cancelled``): ``sentence_index`` /
    ``sentence_text`` of the sentence cut (None when the cut fell between sentences or nothing
    was playing), ``sentence_samples`` / ``sentence_s`` of it sent, ``delivered_samples`` /
    ``delivered_s`` of the whole utterance sent, ``sample_rate_hz``, and the text spoken (the
    sentences wholly sent) and not spoken (the cut sentence, those after it, text not yet
    a sentence). ChatTTS has no word timing, so the cut sentence is unspoken as a whole."""
    spoken_text, unspoken_text = split_spoken(received, spoken)
    return {"sentence_index": cut_index, "sentence_text": cut_text, "sentence_samples": cut_samples,
            "sentence_s": round(cut_samples / rate_hz, 4), "delivered_samples": delivered,
            "delivered_s": round(delivered / rate_hz, 4), "sample_rate_hz": rate_hz,
            "spoken_text": spoken_text, "unspoken_text": unspoken_text}
