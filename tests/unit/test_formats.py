"""Output formats: magic bytes, stated and decoded sample rates, streaming (header once),
and the audio decoded back by an independent decoder (FFmpeg through PyAV)."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from chattts_serving import contract
from chattts_serving.audio import formats as audio_format
from chattts_serving.audio.formats import (
    FLAC_BLOCK_SAMPLES,
    FORMATS,
    FormatError,
    encode,
    new_encoder,
    sealed_wav,
    to_pcm16,
    wav_header,
)

RATE = contract.SAMPLE_RATE_HZ
CHUNKS = (1000, 2500, 7000, 333, 12000, 1167)
"""Uneven streaming chunk sizes, 24000 samples (1 s) in all."""


def _signal() -> np.ndarray:
    t = np.arange(sum(CHUNKS)) / RATE
    return (0.5 * np.sin(2 * np.pi * 440.0 * t) * np.minimum(1.0, t * 20)).astype(np.float32)


def _chunks(x: np.ndarray) -> list[np.ndarray]:
    out, pos = [], 0
    for n in CHUNKS:
        out.append(x[pos:pos + n])
        pos += n
    return out


def _stream(name: str, x: np.ndarray) -> list[bytes]:
    enc = new_encoder(name)
    parts = [enc.encode(c) for c in _chunks(x)]
    parts.append(enc.finish())
    return parts


def _decode(data: bytes) -> tuple[np.ndarray, int, str]:
    """(mono float samples, sample rate, codec name) decoded by FFmpeg."""
    import av

    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().astype(np.float64).reshape(-1) for f in c.decode(stream)]
        rate, codec = int(stream.codec_context.sample_rate), str(stream.codec_context.name)
    y = np.concatenate(frames)
    if y.size and np.abs(y).max() > 2.0:  # integer samples
        y = y / 32768.0
    return y, rate, codec


def _best_correlation(x: np.ndarray, y: np.ndarray, max_lag: int = 4096) -> float:
    """Highest normalised correlation of x against y shifted by 0..max_lag samples (codec delay)."""
    best = 0.0
    n = x.size - max_lag
    for lag in range(0, max_lag, 1):
        seg = y[lag:lag + n]
        if seg.size < n:
            break
        c = float(np.dot(x[:n], seg) / (np.linalg.norm(x[:n]) * np.linalg.norm(seg) + 1e-12))
        best = max(best, c)
    return best


# name, magic check, decoded rate, codec, lossless
FORMAT_TABLE = [
    ("wav", lambda b: b[:4] == b"RIFF" and b[8:16] == b"WAVEfmt ", RATE, "pcm_s16le", True),
    ("flac", lambda b: b[:4] == b"fLaC", RATE, "flac", True),
    ("mp3", lambda b: b[0] == 0xFF and (b[1] & 0xE0) == 0xE0 and (b[1] >> 3) & 3 == 2, RATE, "mp3", False),
    ("aac", lambda b: b[0] == 0xFF and (b[1] & 0xF6) == 0xF0 and (b[2] >> 2) & 0xF == 6, RATE, "aac", False),
    ("opus", lambda b: b[:4] == b"OggS" and b[28:36] == b"OpusHead", 48000, "opus", False),
]
"""MP3: frame sync and version bits 10 (MPEG-2, the 24 kHz family). AAC: ADTS sync and
sampling-frequency index 6 (24000 Hz). Opus: Ogg page holding the OpusHead packet."""


@pytest.mark.parametrize("name, magic, rate, codec, lossless", FORMAT_TABLE, ids=[f[0] for f in FORMAT_TABLE])
def test_streamed_format_has_magic_rate_and_decodes_back(name: str, magic, rate: int, codec: str,
                                                         lossless: bool) -> None:
    x = _signal()
    parts = _stream(name, x)
    data = b"".join(parts)
    assert magic(data), data[:16]
    assert FORMATS[name].sample_rate_hz == rate == new_encoder(name).sample_rate_hz
    assert FORMATS[name].input_rate_hz == RATE
    y, got_rate, got_codec = _decode(data)
    assert got_rate == rate
    assert got_codec.startswith(codec)
    if lossless:
        ref = np.frombuffer(to_pcm16(x), "<i2") / 32768.0
        assert y.size == x.size
        np.testing.assert_allclose(y, ref, atol=1e-9)
    else:
        y24 = y[::rate // RATE]  # opus decodes at 48 kHz: take every other sample
        assert abs(y24.size - x.size) < 4096, (y24.size, x.size)
        assert _best_correlation(x.astype(np.float64), y24) > 0.95
    assert sum(1 for p in parts if p) >= 3, "the encoder held everything back until the end"


def test_wav_stream_has_one_header_with_maximal_sizes() -> None:
    x = _signal()
    parts = _stream("wav", x)
    data = b"".join(parts)
    assert parts[0][:4] == b"RIFF" and data.count(b"RIFF") == 1 and data.count(b"WAVEfmt ") == 1
    riff, = struct.unpack("<I", data[4:8])
    fmt = struct.unpack("<IHHIIHH", data[16:36])
    assert fmt == (16, 1, 1, RATE, RATE * 2, 2, 16)
    assert data[36:40] == b"data"
    size, = struct.unpack("<I", data[40:44])
    assert size % 2 == 0 and size > 2**31 and riff == size + 36 <= 0xFFFFFFFF
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        assert w.readframes(10**9) == to_pcm16(x)


def test_whole_wav_has_exact_sizes() -> None:
    x = _signal()
    data = encode("wav", x)
    assert len(data) == 44 + 2 * x.size
    assert struct.unpack("<I", data[4:8])[0] == 36 + 2 * x.size
    assert struct.unpack("<I", data[40:44])[0] == 2 * x.size
    assert wav_header(2 * x.size) == data[:44]


@pytest.mark.parametrize("name", ["flac", "mp3"])
def test_whole_file_encoding_writes_length_headers(name: str) -> None:
    """A whole utterance gets FLAC's total-samples field and MP3's Xing/LAME frame, so that
    decoders know the exact length (a stream cannot seek back to write them)."""
    import soundfile

    x = _signal()
    y, rate = soundfile.read(io.BytesIO(encode(name, x)))
    assert rate == RATE and y.shape == x.shape


RAW = [("pcm", 2, "<i2"), ("float32", 4, "<f4")]


@pytest.mark.parametrize("name, width, dtype", RAW)
def test_raw_formats_are_headerless_little_endian(name: str, width: int, dtype: str) -> None:
    x = _signal()
    parts = _stream(name, x)
    data = b"".join(parts)
    assert len(data) == width * x.size
    assert [len(p) for p in parts[:-1]] == [width * n for n in CHUNKS] and parts[-1] == b""
    y = np.frombuffer(data, dtype)
    if name == "pcm":
        np.testing.assert_array_equal(y, np.round(x * 32767).astype("<i2"))
    else:
        np.testing.assert_array_equal(y, x)
    assert FORMATS[name].sample_rate_hz == RATE and FORMATS[name].bits_per_sample == width * 8


def test_pcm_clips_and_cleans_non_finite_samples() -> None:
    pcm = np.frombuffer(to_pcm16(np.array([2.0, -2.0, np.nan, 0.5], np.float32)), "<i2")
    assert pcm.tolist() == [32767, -32767, 0, 16384]


def test_every_format_states_media_type_and_rate() -> None:
    assert set(audio_format.OPENAI_FORMATS) <= set(FORMATS)
    for name, info in FORMATS.items():
        assert info.name == name and info.media_type.startswith("audio/")
        assert info.sample_rate_hz in (RATE, 48000) and info.channels == 1


def test_encoder_errors() -> None:
    with pytest.raises(FormatError, match="unknown audio format"):
        new_encoder("ogg-vorbis")
    enc = new_encoder("pcm")
    with pytest.raises(FormatError, match="1-D"):
        enc.encode(np.zeros((2, 10), np.float32))
    assert enc.finish() == b"" and enc.finish() == b""
    with pytest.raises(RuntimeError, match="finished"):
        enc.encode(np.zeros(10, np.float32))


@pytest.mark.parametrize("name", list(FORMATS))
def test_empty_stream_is_still_a_valid_start(name: str) -> None:
    enc = new_encoder(name)
    data = enc.encode(np.zeros(0, np.float32)) + enc.finish()
    if name == "wav":
        assert data[:4] == b"RIFF" and len(data) == 44
    elif name in ("pcm", "float32"):
        assert data == b""


def _first_chunk_samples() -> int:
    """The smallest first chunk of a stream on any profile: first_chunk_tokens tokens less
    half a crossfade (what the first vocoder window delivers; 1792 samples on the profiles)."""
    from chattts_serving.serving.profile import PROFILES_DIR, load_profile

    sizes = []
    for path in PROFILES_DIR.glob("*.toml"):
        stream = load_profile(path.stem).stream
        sizes.append(stream.first_chunk_tokens * contract.SAMPLES_PER_TOKEN - stream.crossfade_samples // 2)
    return min(sizes)


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_first_chunk_gives_bytes_at_once(name: str) -> None:
    """Every format gives encoded bytes as soon as a stream's first (small) chunk is fed,
    without waiting for the next chunk: aac and flac held it back (the gateway's first byte
    then waited for the second chunk). The lossless ones give that chunk's own samples (flac:
    all but the last partial frame)."""
    first = _first_chunk_samples()
    x = _signal()[:first]
    enc = new_encoder(name)
    data = enc.encode(x)
    assert data, f"{name} held the first {first} samples back"
    if name == "flac":
        import av

        with av.open(io.BytesIO(data), format="flac") as c:
            got = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
        ref = np.frombuffer(to_pcm16(x), "<i2")
        assert first - FLAC_BLOCK_SAMPLES < got.size <= first
        np.testing.assert_array_equal(got, ref[:got.size])
    if name == "aac":
        assert data[0] == 0xFF and (data[1] & 0xF6) == 0xF0  # an ADTS frame


def test_a_streamed_flac_has_no_padding_block_and_small_frames() -> None:
    data = new_encoder("flac").encode(_signal()[:4096])
    assert len(data) < 4096 * 2, len(data)  # no 8 KiB PADDING block before the audio
    whole = encode("flac", _signal())
    assert whole[:4] == b"fLaC"


@pytest.mark.parametrize("law", [None, "mulaw"])
def test_a_streamed_wav_made_whole_tells_its_sizes(law: str | None) -> None:
    """A streamed WAV's sizes are its 32-bit maxima (its length unknown when the header went out);
    the gateway's JSON body holds the whole file, whose sizes ``sealed_wav`` sets."""
    from chattts_serving.audio.rates import g711_wav_header

    body = bytes(range(256)) * 10
    streamed = (g711_wav_header(law) if law else wav_header()) + body
    whole = sealed_wav(streamed)
    assert len(whole) == len(streamed) and whole.endswith(body)
    assert struct.unpack_from("<I", whole, 4)[0] == len(whole) - 8
    data = whole.index(b"data")
    assert struct.unpack_from("<I", whole, data + 4)[0] == len(body)
    if law:
        fact = whole.index(b"fact")
        assert struct.unpack_from("<I", whole, fact + 8)[0] == len(body)  # one byte a sample
    else:
        with wave.open(io.BytesIO(whole)) as w:
            assert w.getnframes() == len(body) // 2
    with pytest.raises(FormatError):
        sealed_wav(b"RIFF\0\0\0\0WAVEfmt ")
