"""Output audio at a rate the request chooses, and telephone audio (G.711).

The vocoder's samples are 24 kHz (:data:`chattts_serving.contract.SAMPLE_RATE_HZ`); the codecs
of :mod:`chattts_serving.audio.formats` encode them at that rate (opus: decoded at 48 kHz).
Here a request's ``sample_rate`` and ``container`` are honoured: ``pcm``, ``wav`` and
``float32`` at any of :data:`OUTPUT_RATES_HZ` through one streaming :class:`Resampler` (libsoxr)
per stream, and G.711 (``mulaw``, ``alaw``) at its only rate, 8 kHz, raw or in a WAV file.
:func:`new_output_encoder`, :func:`output_info` and :func:`encode_output` are what a request
asks: they pick a codec at its own rate or a :class:`RateEncoder`, and refuse the rest with
:class:`~chattts_serving.audio.formats.FormatError`.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final, cast

import numpy as np

from .formats import (
    FORMATS,
    INPUT_RATE_HZ,
    WAV_HEADER_BYTES,
    AudioEncoder,
    FormatError,
    FormatInfo,
    encode,
    format_info,
    new_encoder,
    to_pcm16,
    wav_header,
)

OUTPUT_RATES_HZ: Final = (8000, 16000, 22050, 24000, 44100, 48000)
"""Sample rates a client may choose (``sample_rate``) for :data:`RATE_FORMATS`, in Hz."""
RATE_FORMATS: Final = ("pcm", "wav", "float32")
"""Formats delivered at a chosen rate (resampled from 24 kHz); the others keep their own."""
G711_RATE_HZ: Final = 8000
"""G.711's only sample rate (ITU-T G.711: 8-bit samples at 8 kHz, one channel)."""
G711_FORMATS: Final[dict[str, FormatInfo]] = {
    "mulaw": FormatInfo("mulaw", "audio/PCMU", G711_RATE_HZ, bits_per_sample=8,
                        description="G.711 mu-law, 8 kHz, 8-bit, raw (RFC 4856 audio/PCMU; Twilio's audio/x-mulaw)"),
    "alaw": FormatInfo("alaw", "audio/PCMA", G711_RATE_HZ, bits_per_sample=8,
                       description="G.711 A-law, 8 kHz, 8-bit, raw (RFC 4856 audio/PCMA)"),
}
"""Telephone formats: raw, or in a WAV file (``wav=True`` of :func:`new_output_encoder`)."""
_G711_CODECS: Final = {"mulaw": ("pcm_mulaw", 7), "alaw": ("pcm_alaw", 6)}
"""FFmpeg encoder and WAVE format tag (WAVE_FORMAT_MULAW 7, WAVE_FORMAT_ALAW 6) per G.711 law."""
CONTAINERS: Final = ("raw", "wav")
"""How G.711 and PCM samples are packed: bare, or after a streamed WAV header."""


RESAMPLER_QUALITY: Final = "HQ"
"""libsoxr's quality recipe for :class:`Resampler` ('HQ': 20-bit precision; measured here with a
swept sine, energy folded back from above the new Nyquist frequency is 83 dB below the band's
at 8 kHz)."""


def resampled_length(samples: int, out_rate_hz: int, in_rate_hz: int = INPUT_RATE_HZ) -> int:
    """How many samples :class:`Resampler` delivers for ``samples`` input samples:
    ``samples * out_rate_hz / in_rate_hz`` rounded half up (integer arithmetic)."""
    return (2 * int(samples) * int(out_rate_hz) + int(in_rate_hz)) // (2 * int(in_rate_hz))


class Resampler:
    """Streaming sample-rate conversion of mono float32 audio with soxr (libsoxr,
    :data:`RESAMPLER_QUALITY`: passband to about 91 % of the lower Nyquist frequency, stopband
    from it, so nothing above the new Nyquist frequency folds back into the band).

    The converter keeps its filter state between :meth:`process` calls, so a signal fed in
    chunks of any size gives the samples it gives whole (no clicks at chunk joins); the
    output is aligned with the input (soxr removes its filter delay), and after :meth:`flush`
    the total is exactly :func:`resampled_length` of the input (soxr's own count can differ by
    one sample where the product is a half: the tail is cut or padded by that sample). At
    equal rates it passes the samples through.
    """

    def __init__(self, out_rate_hz: int, in_rate_hz: int = INPUT_RATE_HZ) -> None:
        self.in_rate_hz, self.out_rate_hz = int(in_rate_hz), int(out_rate_hz)
        self.samples_in = 0
        self.samples_out = 0
        self._stream: Any = None
        if self.in_rate_hz != self.out_rate_hz:
            import soxr

            self._stream = soxr.ResampleStream(self.in_rate_hz, self.out_rate_hz, 1, dtype="float32",
                                               quality=RESAMPLER_QUALITY)
        self._flushed = False

    def _out(self, y: np.ndarray) -> np.ndarray:
        self.samples_out += y.size
        return y

    def process(self, samples: np.ndarray) -> np.ndarray:
        """(N,) float32 at ``in_rate_hz`` -> the output samples ready now (float32)."""
        x = np.ascontiguousarray(samples, dtype=np.float32)
        self.samples_in += x.size
        if self._stream is None:
            return self._out(x)
        return self._out(np.asarray(self._stream.resample_chunk(x, last=False), np.float32).reshape(-1))

    def flush(self) -> np.ndarray:
        """The remaining output samples; call once at the end (later calls return none)."""
        if self._stream is None or self._flushed:
            return np.zeros(0, np.float32)
        self._flushed = True
        tail = np.asarray(self._stream.resample_chunk(np.zeros(0, np.float32), last=True), np.float32).reshape(-1)
        want = resampled_length(self.samples_in, self.out_rate_hz, self.in_rate_hz) - self.samples_out
        if want < tail.size:
            tail = tail[:max(want, 0)]
        elif want > tail.size:
            tail = np.concatenate([tail, np.zeros(want - tail.size, np.float32)])
        return self._out(tail)


def g711_wav_header(law: str) -> bytes:
    """The streamed WAV header of G.711 audio (``law`` 'mulaw' or 'alaw'): ``fmt`` of 18 bytes
    (format tag 7 or 6, one channel, 8 kHz, 8 bits, cbSize 0), the ``fact`` chunk that
    non-PCM WAVE files carry, and ``data``; the lengths are unknown while streaming, so the
    RIFF, fact and data sizes are at their 32-bit maximum (decoders read to the end)."""
    tag = _G711_CODECS[law][1]
    fmt = struct.pack("<HHIIHHH", tag, 1, G711_RATE_HZ, G711_RATE_HZ, 1, 8, 0)
    data = 0xFFFFFFFF - 4 - (8 + len(fmt)) - 12 - 8
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"fact" + struct.pack("<II", 4, 0xFFFFFFFF) + b"data" + struct.pack("<I", data))


class _G711:
    """FFmpeg's G.711 encoder (``pcm_mulaw`` / ``pcm_alaw``) through PyAV: 16-bit samples at
    8 kHz in, one byte per sample out."""

    def __init__(self, law: str) -> None:
        import av

        cc = cast(Any, av.CodecContext.create(_G711_CODECS[law][0], "w"))
        cc.sample_rate = G711_RATE_HZ
        cc.format = "s16"
        cc.layout = "mono"
        cc.open()
        self._cc = cc
        self._pts = 0

    def encode(self, pcm16: bytes) -> bytes:
        import av

        n = len(pcm16) // 2
        if not n:
            return b""
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16, "<i2")[None, :], format="s16", layout="mono")
        frame.sample_rate = G711_RATE_HZ
        frame.pts = self._pts
        self._pts += n
        return b"".join(bytes(p) for p in self._cc.encode(frame))


class RateEncoder(AudioEncoder):
    """``pcm``, ``float32``, ``wav``, ``mulaw`` or ``alaw`` at a chosen rate: the 24 kHz input
    goes through one :class:`Resampler` for the whole stream, then is packed as the format.

    ``name``: the format; ``sample_rate_hz``: the output rate (one of :data:`OUTPUT_RATES_HZ`;
    G.711 only 8000); ``wav``: G.711 inside a WAV file (``pcm`` with ``wav`` is ``wav``).
    Raises :class:`FormatError` for another format or rate.
    """

    def __init__(self, name: str, sample_rate_hz: int | None = None, wav: bool = False) -> None:
        super().__init__()
        g711 = name in G711_FORMATS
        if name not in RATE_FORMATS and not g711:
            raise FormatError(f"{name!r} has no chosen rate; rates apply to {', '.join(RATE_FORMATS)}, mulaw, alaw")
        default = G711_RATE_HZ if g711 else INPUT_RATE_HZ
        rate = default if sample_rate_hz is None else int(sample_rate_hz)
        if g711 and rate != G711_RATE_HZ:
            raise FormatError(f"{name} is delivered at {G711_RATE_HZ} Hz only, not {rate}")
        if rate not in OUTPUT_RATES_HZ:
            raise FormatError(f"sample_rate must be one of {', '.join(map(str, OUTPUT_RATES_HZ))} Hz, not {rate}")
        if wav and name == "pcm":
            name = "wav"
        if wav and name == "float32":
            raise FormatError("float32 has no WAV form here; use wav (16-bit)")
        base = G711_FORMATS[name] if g711 else FORMATS[name]
        self.info = dataclasses.replace(base, sample_rate_hz=rate, media_type="audio/wav" if wav else base.media_type)
        self.wav = wav or name == "wav"
        self._resampler = Resampler(rate)
        self._g711 = _G711(name) if g711 else None
        self._float = name == "float32"
        header = b""
        if self.wav:
            header = g711_wav_header(name) if g711 else wav_header(None, sample_rate_hz=rate)
        self._header: bytes | None = header

    def _pack(self, samples: np.ndarray) -> bytes:
        head, self._header = self._header or b"", None
        if self._float:
            return head + samples.astype("<f4").tobytes()
        pcm = to_pcm16(samples)
        return head + (self._g711.encode(pcm) if self._g711 is not None else pcm)

    def _encode(self, samples: np.ndarray) -> bytes:
        return self._pack(self._resampler.process(samples))

    def _finish(self) -> bytes:
        return self._pack(self._resampler.flush())


def output_info(name: str, sample_rate_hz: int | None = None, container: str | None = None) -> FormatInfo:
    """What a request for format ``name`` at ``sample_rate_hz`` (None: the format's own) in
    ``container`` (None or 'raw': bare samples; 'wav': G.711 or PCM in a WAV file) delivers.

    Raises :class:`FormatError` naming what is wrong: an unknown format, a rate outside
    :data:`OUTPUT_RATES_HZ`, a rate for a format that has only its own (mp3, aac, flac: 24000;
    opus: 48000), G.711 at another rate than 8000, a container other than raw/wav, or 'wav'
    for a format that is not PCM or G.711.
    """
    return new_output_encoder(name, sample_rate_hz, container).info


def new_output_encoder(name: str, sample_rate_hz: int | None = None, container: str | None = None) -> AudioEncoder:
    """A fresh incremental encoder for a request's ``response_format`` ``name``,
    ``sample_rate`` and ``container`` (see :func:`output_info`): :func:`new_encoder`'s at the
    format's own rate, a :class:`RateEncoder` otherwise and for G.711. Raises :class:`FormatError`."""
    if container not in (None, *CONTAINERS):
        raise FormatError(f"container must be one of {', '.join(CONTAINERS)}, not {container!r}")
    wav = container == "wav"
    if name in G711_FORMATS or (name in RATE_FORMATS and sample_rate_hz not in (None, INPUT_RATE_HZ)):
        return RateEncoder(name, sample_rate_hz, wav)
    info = format_info(name)
    if wav and name not in ("pcm", "wav"):
        raise FormatError(f"container 'wav' applies to pcm, mulaw and alaw, not {name}")
    if sample_rate_hz is not None and int(sample_rate_hz) != info.sample_rate_hz:
        if name in RATE_FORMATS:
            raise FormatError(f"sample_rate must be one of {', '.join(map(str, OUTPUT_RATES_HZ))} Hz, "
                              f"not {sample_rate_hz}")
        raise FormatError(f"{name} is delivered at {info.sample_rate_hz} Hz only; sample_rate applies to "
                          f"{', '.join(RATE_FORMATS)}")
    return new_encoder("wav" if wav else name)


def encode_output(name: str, samples: np.ndarray, sample_rate_hz: int | None = None,
                  container: str | None = None) -> bytes:
    """A whole utterance (N,) float32 at 24 kHz as one file of ``name`` at ``sample_rate_hz``
    in ``container`` (:func:`new_output_encoder`); at the format's own rate, :func:`encode`'s
    whole-file form (exact WAV sizes, length headers). Raises :class:`FormatError`."""
    enc = new_output_encoder(name, sample_rate_hz, container)
    if not isinstance(enc, RateEncoder):
        return encode(enc.info.name, samples)
    data = enc.encode(samples) + enc.finish()
    if enc.wav and name in RATE_FORMATS:  # exact sizes for a whole PCM file
        pcm = data[WAV_HEADER_BYTES:]
        return wav_header(len(pcm), sample_rate_hz=enc.info.sample_rate_hz) + pcm
    return data
