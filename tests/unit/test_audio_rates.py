"""Chosen output rates and telephone audio (G.711), without a server: the resampler keeps
lengths and chunk joins, does not fold energy from above the new Nyquist frequency back into
the band, and every format/rate/container combination decodes with FFmpeg (PyAV) at the rate
it states; combinations the formats refuse raise FormatError."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio import formats as F
from chattts_serving.audio import rates as R
from chattts_serving.audio.formats import FormatError
from chattts_serving.audio.rates import Resampler, new_output_encoder, resampled_length

RATE = contract.SAMPLE_RATE_HZ
CHUNKS = (1000, 2500, 7000, 333, 12000, 1167, 512 * 37 - 256)


def _sweep(f0_hz: float, f1_hz: float, seconds: float = 2.0) -> np.ndarray:
    """A linear sine sweep at 24 kHz, faded in and out over 50 ms (an abrupt edge is a click,
    which has energy at every frequency)."""
    t = np.arange(int(RATE * seconds)) / RATE
    fade = np.minimum(1.0, np.minimum(t, seconds - t) / 0.05)
    phase = 2 * np.pi * (f0_hz * t + 0.5 * (f1_hz - f0_hz) / seconds * t * t)
    return (0.5 * fade * np.sin(phase)).astype(np.float32)


def _chunked(x: np.ndarray) -> list[np.ndarray]:
    out, pos = [], 0
    for n in CHUNKS:
        out.append(x[pos:pos + n])
        pos += n
    out.append(x[pos:])
    return out


def _resample(x: np.ndarray, rate: int) -> np.ndarray:
    r = Resampler(rate)
    return np.concatenate([*(r.process(c) for c in _chunked(x)), r.flush()])


@pytest.mark.parametrize("rate", R.OUTPUT_RATES_HZ)
def test_resampling_in_chunks_equals_resampling_whole_and_keeps_the_length(rate: int) -> None:
    x = _sweep(50, 11_000, 2.5)
    whole = Resampler(rate)
    y_whole = np.concatenate([whole.process(x), whole.flush()])
    y = _resample(x, rate)
    assert y.size == y_whole.size == resampled_length(x.size, rate)
    np.testing.assert_array_equal(y, y_whole)  # the state carries across joins: no clicks


@pytest.mark.parametrize("rate", [8000, 16000, 22050])
def test_no_aliasing_energy_above_the_new_nyquist_is_40_db_below_the_band(rate: int) -> None:
    nyquist = rate / 2
    band = _resample(_sweep(50, 0.9 * nyquist), rate)
    above = _resample(_sweep(nyquist, 0.99 * RATE / 2), rate)
    ratio_db = 10 * np.log10(np.sum(above.astype(np.float64) ** 2) / np.sum(band.astype(np.float64) ** 2))
    assert ratio_db < -40, ratio_db


def test_the_resampler_keeps_the_time_axis_and_any_length() -> None:
    x = np.zeros(RATE, np.float32)
    x[12_000] = 1.0
    for rate in (8000, 22050, 44100):
        y = _resample(x, rate)
        assert int(np.argmax(np.abs(y))) == round(12_000 * rate / RATE)
    for rate in R.OUTPUT_RATES_HZ:
        for n in (0, 1, 2, 199, 200, 280, 4097):
            r = Resampler(rate)
            got = np.concatenate([r.process(np.ones(n // 2, np.float32)), r.process(np.ones(n - n // 2, np.float32)),
                                  r.flush()])
            assert got.size == resampled_length(n, rate), (rate, n)


def _decode(data: bytes, raw_format: str | None = None) -> tuple[np.ndarray, int, str]:
    import av

    options = {"sample_rate": "8000", "ch_layout": "mono"} if raw_format else {}
    with av.open(io.BytesIO(data), format=raw_format, options=options) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(stream)]
        rate, codec = int(stream.codec_context.sample_rate), str(stream.codec_context.name)
    y = np.concatenate(frames).astype(np.float64)
    return (y / 32768.0 if np.abs(y).max(initial=0) > 2 else y), rate, codec


CASES = [("pcm", r, None) for r in R.OUTPUT_RATES_HZ] + [("wav", r, None) for r in R.OUTPUT_RATES_HZ] + [
    ("float32", 16000, None), ("pcm", 8000, "wav"), ("mulaw", None, None), ("mulaw", 8000, "wav"),
    ("alaw", None, None), ("alaw", None, "wav")]


@pytest.mark.parametrize("name, rate, container", CASES, ids=[f"{n}-{r}-{c}" for n, r, c in CASES])
def test_every_rate_and_telephone_format_decodes_at_its_stated_rate(name: str, rate: int | None,
                                                                    container: str | None) -> None:
    x = _sweep(100, 3000, 1.5)
    enc = new_output_encoder(name, rate, container)
    want_rate = rate or (8000 if name in R.G711_FORMATS else RATE)
    assert enc.info.sample_rate_hz == want_rate
    data = b"".join([*(enc.encode(c) for c in _chunked(x)), enc.finish()])
    n = resampled_length(x.size, want_rate)
    if name == "float32":
        y = np.frombuffer(data, "<f4")
    elif container == "wav" or name == "wav":
        assert data[:4] == b"RIFF" and enc.info.media_type == "audio/wav"
        y, got_rate, codec = _decode(data)
        assert got_rate == want_rate and codec == {"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}.get(name, "pcm_s16le")
    elif name in R.G711_FORMATS:
        assert len(data) == n  # one byte per sample
        y, got_rate, codec = _decode(data, name)
        assert got_rate == 8000 and codec == f"pcm_{name}"
    else:
        y = np.frombuffer(data, "<i2") / 32768.0
    assert y.size == n
    reference = _resample(x, want_rate)
    tolerance = 0.02 if name in R.G711_FORMATS else 1e-4  # G.711: 8-bit logarithmic steps
    assert np.abs(y - reference).max() < tolerance


def test_g711_wav_header_says_g711_at_8_khz() -> None:
    for law, tag in (("mulaw", 7), ("alaw", 6)):
        head = R.g711_wav_header(law)
        assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt "
        assert struct.unpack("<IHHIIHHH", head[16:38]) == (18, tag, 1, 8000, 8000, 1, 8, 0)
        assert head[38:42] == b"fact" and head[50:54] == b"data"


REFUSED = [("pcm", 11025, None, "sample_rate must be one of"), ("mp3", 8000, None, "24000 Hz only"),
           ("opus", 24000, None, "48000 Hz only"), ("mulaw", 16000, None, "8000 Hz"),
           ("mp3", None, "wav", "container 'wav' applies"), ("flac", None, "wav", "container 'wav' applies"),
           ("float32", None, "wav", "container 'wav' applies"), ("pcm", None, "ogg", "container must be"),
           ("float32", 8000, "wav", "no WAV form"), ("vorbis", None, None, "unknown audio format")]


@pytest.mark.parametrize("name, rate, container, message", REFUSED, ids=[f"{r[0]}-{r[1]}-{r[2]}" for r in REFUSED])
def test_refused_combinations_name_the_problem(name: str, rate: int | None, container: str | None,
                                               message: str) -> None:
    with pytest.raises(FormatError, match=message):
        R.output_info(name, rate, container)


def test_own_rates_and_raw_containers_are_accepted_unchanged() -> None:
    assert R.output_info("mp3", 24000).sample_rate_hz == 24000
    assert R.output_info("opus", 48000).sample_rate_hz == 48000
    assert R.output_info("pcm", 24000, "raw") == F.FORMATS["pcm"]
    assert R.output_info("pcm", None, "wav") == F.FORMATS["wav"]
    x = _sweep(100, 3000, 0.5)
    assert R.encode_output("pcm", x) == F.encode("pcm", x)
    whole = R.encode_output("wav", x, 16000)
    assert struct.unpack("<I", whole[40:44])[0] == 2 * resampled_length(x.size, 16000) == len(whole) - 44
