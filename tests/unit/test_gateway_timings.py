"""What an interrupt reports (``gateway/timings.py``): samples counted from the bytes a client
was sent (headers left out, resampled and G.711 streams exactly what their encoders gave), and
the utterance's text cut after the sentences wholly sent."""

from __future__ import annotations

import numpy as np
import pytest

from chattts_serving.audio import rates
from chattts_serving.gateway.timings import DeliveryClock, interruption_fields, raw_layout, split_spoken
from chattts_serving.text.sentences import SentenceSplitter


@pytest.mark.parametrize(("fmt", "rate", "container"), [
    ("pcm", None, None), ("wav", None, None), ("float32", None, None), ("pcm", 16000, None), ("wav", 8000, None),
    ("mulaw", None, None), ("alaw", None, "wav"), ("pcm", None, "wav"),
])
def test_the_clock_counts_the_samples_a_client_can_decode(fmt: str, rate: int | None, container: str | None) -> None:
    """Cut a stream after a few chunks (no ``finish``): the clock's count is the samples in the
    bytes sent, which for a resampled stream is what its resampler gave so far."""
    enc = rates.new_output_encoder(fmt, rate, container)
    clock = DeliveryClock(enc.info.sample_rate_hz, fmt, container)
    sent = b""
    rng = np.random.default_rng(0)
    for n in (1792, 3000, 777):
        data = enc.encode(rng.uniform(-0.5, 0.5, n).astype(np.float32))
        clock.sent(data, n)
        sent += data
    layout = raw_layout(fmt, container)
    assert layout is not None
    width, header = layout
    assert not header or sent[:4] == b"RIFF"
    assert clock.samples == (len(sent) - header) // width > 0


def test_a_codec_counts_the_samples_given_to_it() -> None:
    clock = DeliveryClock(48000, "opus")
    clock.sent(b"xx", 24000)
    assert raw_layout("opus") is None and clock.samples == 48000


def test_the_text_is_cut_after_the_sentences_sent_keeping_its_spacing() -> None:
    text = "Hello there.  1.\nOpen the door. 你好，世界。 And the rest"
    splitter = SentenceSplitter(400)
    sentences = splitter.feed(text) + splitter.end()
    assert len(sentences) == 4
    for n in range(len(sentences) + 1):
        spoken, unspoken = split_spoken(text, sentences[:n])
        assert "".join((spoken + unspoken).split()) == "".join(text.split())
        assert "".join(spoken.split()) == "".join("".join(sentences[:n]).split())
    assert split_spoken(text, sentences[:2]) == ("Hello there.  1.\nOpen the door.", "你好，世界。 And the rest")


def test_nothing_playing_reports_nothing() -> None:
    assert interruption_fields(8000, 0, "", [], None, None, 0) == {
        "sentence_index": None, "sentence_text": None, "sentence_samples": 0, "sentence_s": 0.0,
        "delivered_samples": 0, "delivered_s": 0.0, "sample_rate_hz": 8000, "spoken_text": "", "unspoken_text": ""}
    fields = interruption_fields(24000, 36000, "A. B. C.", ["A."], 1, "B.", 12000)
    assert fields["delivered_s"] == 1.5 and fields["sentence_s"] == 0.5
    assert (fields["spoken_text"], fields["unspoken_text"]) == ("A.", "B. C.")
