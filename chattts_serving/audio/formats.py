"""Audio output formats: float32 samples -> pcm, wav, flac, mp3, opus, aac, float32 bytes.

Input everywhere is mono float32 at :data:`chattts_serving.contract.SAMPLE_RATE_HZ` (24 kHz),
nominally in [-1, 1] (clipped for the integer formats; NaN becomes 0). Each format has an
incremental encoder for streaming: feed chunks with :meth:`AudioEncoder.encode`, which returns
the bytes ready so far (possibly none), and call :meth:`AudioEncoder.finish` once at the end
for the rest. Concatenating every returned piece gives a complete file/stream.

| format | container / codec | sample rate of the result | notes |
|---|---|---|---|
| ``pcm`` | raw 16-bit signed little-endian | 24000 Hz mono | OpenAI's ``pcm`` |
| ``float32`` | raw 32-bit float little-endian | 24000 Hz mono | the model's own samples |
| ``wav`` | RIFF/WAVE PCM 16-bit | 24000 Hz mono | streamed: header once, sizes at their maximum |
| ``flac`` | native FLAC, 16-bit | 24000 Hz mono | streamed: STREAMINFO without total length |
| ``mp3`` | MPEG-2 Layer III (LAME), 64 kbit/s | 24000 Hz mono | raw frames, no ID3/Xing header |
| ``aac`` | AAC-LC in ADTS, 64 kbit/s | 24000 Hz mono | |
| ``opus`` | Opus in Ogg, 32 kbit/s | 48000 Hz mono | encoded from 24 kHz (``OpusHead`` says so) |

Opus decoders output 48 kHz whatever the input rate was (RFC 7845), hence 48000 for ``opus``.
flac, mp3, aac and opus use FFmpeg's encoders through PyAV (``av``), which ships them in its
wheels; nothing is downloaded at run time. A streamed FLAC carries no total length in its
STREAMINFO (allowed by the format; FFmpeg and browsers play it, libsndfile cannot seek in it);
:func:`encode` of a whole utterance writes FLAC and MP3 with their length headers.

Other rates (a request's ``sample_rate``) and G.711 telephone audio, and the entry points a
request goes through: :mod:`chattts_serving.audio.rates`.
"""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, cast

import numpy as np

from .. import contract

INPUT_RATE_HZ: Final = contract.SAMPLE_RATE_HZ
"""Sample rate of the float32 samples every encoder takes, in Hz."""


class FormatError(ValueError):
    """An unknown format name, or audio that is not 1-D."""


@dataclass(frozen=True)
class FormatInfo:
    """What a format produces.

    name: the ``response_format`` value. media_type: HTTP Content-Type. sample_rate_hz: rate
    of the audio a decoder returns, in Hz. input_rate_hz: rate of the samples encoded, in Hz.
    bits_per_sample: 16 or 32 for raw/PCM-based formats, None for lossy codecs.
    bit_rate_bps: target bit rate of lossy codecs in bit/s, None otherwise.
    """

    name: str
    media_type: str
    sample_rate_hz: int
    input_rate_hz: int = INPUT_RATE_HZ
    channels: int = 1
    bits_per_sample: int | None = None
    bit_rate_bps: int | None = None
    description: str = ""


FORMATS: Final[dict[str, FormatInfo]] = {
    "mp3": FormatInfo("mp3", "audio/mpeg", INPUT_RATE_HZ, bit_rate_bps=64000,
                      description="MPEG-2 Layer III frames (LAME), 64 kbit/s"),
    "opus": FormatInfo("opus", "audio/ogg", 48000, bit_rate_bps=32000,
                       description="Opus in Ogg, 32 kbit/s, encoded from 24 kHz, decoded at 48 kHz"),
    "aac": FormatInfo("aac", "audio/aac", INPUT_RATE_HZ, bit_rate_bps=64000,
                      description="AAC-LC in ADTS frames, 64 kbit/s"),
    "flac": FormatInfo("flac", "audio/flac", INPUT_RATE_HZ, bits_per_sample=16,
                       description="native FLAC, 16-bit, lossless"),
    "wav": FormatInfo("wav", "audio/wav", INPUT_RATE_HZ, bits_per_sample=16,
                      description="RIFF/WAVE, 16-bit PCM"),
    "pcm": FormatInfo("pcm", "audio/pcm", INPUT_RATE_HZ, bits_per_sample=16,
                      description="raw 16-bit signed little-endian PCM, no header"),
    "float32": FormatInfo("float32", "audio/x-float32", INPUT_RATE_HZ, bits_per_sample=32,
                          description="raw 32-bit float little-endian samples, no header"),
}
"""Every output format by name."""

OPENAI_FORMATS: Final = ("mp3", "opus", "aac", "flac", "wav", "pcm")
"""The ``response_format`` values of OpenAI's speech API."""

WAV_HEADER_BYTES: Final = 44
_WAV_STREAM_DATA_BYTES: Final = (0xFFFFFFFF - 36) // 2 * 2
"""data-chunk size written when the length is unknown: the largest even size whose RIFF size
(data + 36) still fits in 32 bits. Players read such a file to its end."""


def _mono(samples: np.ndarray) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float32)
    if a.ndim != 1:
        raise FormatError(f"audio must be 1-D (mono samples), got shape {list(a.shape)}")
    return np.nan_to_num(a, nan=0.0, posinf=1.0, neginf=-1.0)


def to_pcm16(samples: np.ndarray) -> bytes:
    """(N,) float samples -> 2N bytes of 16-bit little-endian PCM (clipped to [-1, 1], scaled
    by 32767, rounded). Raises :class:`FormatError` if not 1-D."""
    a = _mono(samples)
    return np.round(np.clip(a, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_header(data_bytes: int | None = None, sample_rate_hz: int = INPUT_RATE_HZ, channels: int = 1,
               bits_per_sample: int = 16) -> bytes:
    """A 44-byte RIFF/WAVE header for PCM.

    ``data_bytes``: size of the sample data in bytes, or None for a stream of unknown length
    (data and RIFF sizes then at their 32-bit maximum, as streaming servers do).
    """
    block = channels * bits_per_sample // 8
    data = _WAV_STREAM_DATA_BYTES if data_bytes is None else int(data_bytes)
    return (b"RIFF" + struct.pack("<I", data + 36) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate_hz, sample_rate_hz * block, block,
                                    bits_per_sample)
            + b"data" + struct.pack("<I", data))


def sealed_wav(data: bytes) -> bytes:
    """A complete WAV file written as a stream (sizes at their 32-bit maximum, :func:`wav_header`,
    G.711's ``fact``) with its RIFF, ``fact`` and ``data`` sizes set to what it holds, for a
    body whose length is known once it is whole. Raises :class:`FormatError` for bytes that
    are not RIFF/WAVE or have no ``data`` chunk."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise FormatError("not a RIFF/WAVE file")
    out = bytearray(data)
    struct.pack_into("<I", out, 4, len(out) - 8)
    pos, block, fact = 12, 1, None
    while pos + 8 <= len(out):
        chunk, size = bytes(out[pos:pos + 4]), struct.unpack_from("<I", out, pos + 4)[0]
        if chunk == b"fmt ":
            block = max(1, struct.unpack_from("<H", out, pos + 20)[0])  # nBlockAlign
        elif chunk == b"fact":
            fact = pos + 8
        elif chunk == b"data":
            length = len(out) - pos - 8
            struct.pack_into("<I", out, pos + 4, length)
            if fact is not None:
                struct.pack_into("<I", out, fact, length // block)
            return bytes(out)
        pos += 8 + size + (size & 1)
    raise FormatError("WAV file without a data chunk")


class AudioEncoder(ABC):
    """Incremental encoder of mono float32 audio at ``INPUT_RATE_HZ`` into one format."""

    info: FormatInfo

    def __init__(self) -> None:
        self._finished = False

    @property
    def sample_rate_hz(self) -> int:
        """Sample rate of the decoded result, in Hz (see :class:`FormatInfo`)."""
        return self.info.sample_rate_hz

    @property
    def media_type(self) -> str:
        return self.info.media_type

    def encode(self, samples: np.ndarray) -> bytes:
        """Add (N,) float32 samples; return the encoded bytes ready now (maybe ``b''``).

        Raises :class:`FormatError` for non-1-D input and RuntimeError after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("encoder already finished")
        return self._encode(_mono(samples))

    def finish(self) -> bytes:
        """Flush: the remaining bytes. Call once; later calls return ``b''``."""
        if self._finished:
            return b""
        self._finished = True
        return self._finish()

    @abstractmethod
    def _encode(self, samples: np.ndarray) -> bytes: ...

    @abstractmethod
    def _finish(self) -> bytes: ...


class PcmEncoder(AudioEncoder):
    """Raw 16-bit little-endian PCM, no header."""

    info = FORMATS["pcm"]

    def _encode(self, samples: np.ndarray) -> bytes:
        return to_pcm16(samples)

    def _finish(self) -> bytes:
        return b""


class Float32Encoder(AudioEncoder):
    """Raw 32-bit float little-endian samples, no header."""

    info = FORMATS["float32"]

    def _encode(self, samples: np.ndarray) -> bytes:
        return samples.astype("<f4").tobytes()

    def _finish(self) -> bytes:
        return b""


class WavEncoder(AudioEncoder):
    """16-bit PCM WAV: the header comes once, with the first bytes.

    ``total_samples``: the length if known in advance (exact sizes in the header), else None
    for a stream (sizes at their maximum; decoders read to the end of the data).
    """

    info = FORMATS["wav"]

    def __init__(self, total_samples: int | None = None) -> None:
        super().__init__()
        self._header: bytes | None = wav_header(None if total_samples is None else 2 * int(total_samples))

    def _take_header(self) -> bytes:
        h, self._header = self._header or b"", None
        return h

    def _encode(self, samples: np.ndarray) -> bytes:
        return self._take_header() + to_pcm16(samples)

    def _finish(self) -> bytes:
        return self._take_header()


class _Sink:
    """A write-only, non-seekable file object that PyAV's muxers write into."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: Any) -> int:
        b = bytes(data)
        self._buf += b
        return len(b)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class AvEncoder(AudioEncoder):
    """FFmpeg encoders through PyAV, muxed into a non-seekable stream.

    ``container``: FFmpeg muxer name; ``codec``: encoder name; ``options``: muxer options.
    Muxers that would seek back to patch a header (FLAC's STREAMINFO, MP3's Xing frame) cannot
    on a stream and leave the length out, which decoders accept.
    """

    container_format: ClassVar[str] = ""
    codec_name: ClassVar[str] = ""
    muxer_options: ClassVar[dict[str, str]] = {}
    whole_file_options: ClassVar[dict[str, str]] = {}
    """Muxer options instead of ``muxer_options`` when the output is seekable."""
    pcm16_input: ClassVar[bool] = False
    """Hand the encoder 16-bit samples rounded by :func:`to_pcm16` (bit-identical to ``pcm``
    and ``wav``) instead of floats."""

    def __init__(self, bit_rate_bps: int | None = None, seekable: bool = False) -> None:
        """``bit_rate_bps``: override the format's bit rate (lossy codecs), bit/s.
        ``seekable``: encode a whole file in memory (length headers patched at the end; every
        byte is returned by :meth:`finish`) instead of a stream."""
        super().__init__()
        import av

        self._sink: _Sink | io.BytesIO = io.BytesIO() if seekable else _Sink()
        options = self.whole_file_options if seekable else self.muxer_options
        self._out = cast(Any, av.open(self._sink, mode="w", format=self.container_format, options=dict(options)))
        self._stream = cast(Any, self._out.add_stream(self.codec_name, rate=INPUT_RATE_HZ, layout="mono"))
        rate = bit_rate_bps if bit_rate_bps is not None else self.info.bit_rate_bps
        if rate:
            self._stream.bit_rate = int(rate)
        self._pts = 0

    def _mux(self, frame: Any) -> None:
        for packet in self._stream.encode(frame):
            self._out.mux(packet)

    def _encode(self, samples: np.ndarray) -> bytes:
        import av

        if samples.size:
            if self.pcm16_input:
                frame = av.AudioFrame.from_ndarray(np.frombuffer(to_pcm16(samples), "<i2")[None, :],
                                                   format="s16", layout="mono")
            else:
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(np.clip(samples, -1.0, 1.0))[None, :],
                                                   format="flt", layout="mono")
            frame.sample_rate = INPUT_RATE_HZ
            frame.pts = self._pts
            self._pts += samples.size
            self._mux(frame)
        return self._sink.take() if isinstance(self._sink, _Sink) else b""

    def _finish(self) -> bytes:
        self._mux(None)
        self._out.close()
        return self._sink.take() if isinstance(self._sink, _Sink) else self._sink.getvalue()


class Mp3Encoder(AvEncoder):
    """MPEG-2 Layer III at 24 kHz (LAME); plain frames without ID3 or Xing header."""

    info = FORMATS["mp3"]
    container_format = "mp3"
    codec_name = "libmp3lame"
    muxer_options: ClassVar[dict[str, str]] = {"id3v2_version": "0", "write_xing": "0"}
    whole_file_options: ClassVar[dict[str, str]] = {"id3v2_version": "0"}


AAC_FRAME_SAMPLES: Final = 1024
"""Samples per AAC-LC frame."""


class AacEncoder(AvEncoder):
    """AAC-LC in ADTS (FFmpeg's native encoder).

    The encoder emits its first packet once it holds two frames (its one-frame look-ahead) and
    only whole frames reach it, so the small first chunk of a stream (1792 samples on the
    profiles) gave no bytes until the next chunk came. The stream therefore starts with just
    enough silence (at most one frame, 256 samples for that chunk) for the first chunk to fill
    whole frames, at least two: its first packet leaves with it. ADTS carries no edit list, so
    a decoder plays the encoder's own 1024 priming samples at the start anyway; the first
    chunk's own sound decodes from the second packet, which needs the next frame of input (the
    format's look-ahead, not something an encoder can skip)."""

    info = FORMATS["aac"]
    container_format = "adts"
    codec_name = "aac"

    def __init__(self, bit_rate_bps: int | None = None, seekable: bool = False) -> None:
        super().__init__(bit_rate_bps, seekable)
        self._aligned = seekable  # a whole file has no first chunk to hurry

    def _encode(self, samples: np.ndarray) -> bytes:
        if not self._aligned and samples.size:
            self._aligned = True
            n = samples.size
            lead = 2 * AAC_FRAME_SAMPLES - n if n < 2 * AAC_FRAME_SAMPLES else -n % AAC_FRAME_SAMPLES
            samples = np.concatenate([np.zeros(lead, np.float32), samples])
        return super()._encode(samples)


class OpusEncoder(AvEncoder):
    """Opus (libopus) in Ogg, pages flushed every 20 ms of audio so that streams flow."""

    info = FORMATS["opus"]
    container_format = "ogg"
    codec_name = "libopus"
    muxer_options: ClassVar[dict[str, str]] = {"page_duration": "20000"}


FLAC_BLOCK_SAMPLES: Final = 1024
"""Samples per FLAC frame of a stream: a streamed chunk leaves at most this many samples
(43 ms) behind in the encoder, and the profiles' smallest first chunk (4 tokens less half a
crossfade: 1792 samples) fills one frame. FFmpeg's default at 24 kHz (2304) held the whole
first chunk back until the next one."""


class FlacEncoder(AvEncoder):
    """Native FLAC, 16-bit (FFmpeg's encoder), in frames of :data:`FLAC_BLOCK_SAMPLES` when
    streamed (FFmpeg's default block size for a whole file)."""

    info = FORMATS["flac"]
    container_format = "flac"
    codec_name = "flac"
    pcm16_input = True
    muxer_options: ClassVar[dict[str, str]] = {"metadata_header_padding": "0"}
    """No PADDING block (8 KiB by default, room for tags a stream can never go back to write)."""

    def __init__(self, bit_rate_bps: int | None = None, seekable: bool = False) -> None:
        super().__init__(bit_rate_bps, seekable)
        if not seekable:
            self._stream.codec_context.options = {"frame_size": str(FLAC_BLOCK_SAMPLES)}


_ENCODERS: Final[dict[str, type[AudioEncoder]]] = {
    "pcm": PcmEncoder, "float32": Float32Encoder, "wav": WavEncoder, "mp3": Mp3Encoder, "aac": AacEncoder,
    "opus": OpusEncoder, "flac": FlacEncoder,
}


def format_info(name: str) -> FormatInfo:
    """The :class:`FormatInfo` of ``name``. Raises :class:`FormatError` if unknown."""
    try:
        return FORMATS[name]
    except KeyError:
        raise FormatError(f"unknown audio format {name!r}; one of {', '.join(FORMATS)}") from None


def new_encoder(name: str) -> AudioEncoder:
    """A fresh incremental encoder for format ``name`` (a key of :data:`FORMATS`).

    Raises :class:`FormatError` if unknown.
    """
    format_info(name)
    return _ENCODERS[name]()


def encode(name: str, samples: np.ndarray | Iterable[np.ndarray]) -> bytes:
    """Encode a whole utterance (an array, or an iterable of chunks) into format ``name``.

    From a single array, ``wav`` gets exact sizes in its header and ``flac``/``mp3`` their
    length headers (STREAMINFO total, Xing/LAME frame); from chunks, the stream forms. Raises
    :class:`FormatError` for an unknown format or non-1-D audio.
    """
    format_info(name)
    if isinstance(samples, np.ndarray):
        enc: AudioEncoder
        if name == "wav":
            enc = WavEncoder(total_samples=samples.size)
        else:
            cls = _ENCODERS[name]
            enc = cls(seekable=True) if issubclass(cls, AvEncoder) else cls()
        return enc.encode(samples) + enc.finish()
    enc = new_encoder(name)
    parts = [enc.encode(chunk) for chunk in samples]
    parts.append(enc.finish())
    return b"".join(parts)
