"""ChatTTS' audio prompts, free of Triton: ``spk_smp`` strings, reference recordings and the
bounded cache of their encodings (reference-recording voices, ChatTTS' ``spk_smp`` +
``txt_smp``).

What ChatTTS 0.2.5 does (``ChatTTS/core.py``, ``ChatTTS/model/speaker.py``,
``ChatTTS/model/tokenizer.py``; docs/chattts-multisentence.md has the whole flow):

- ``Chat.sample_audio_speaker(wav)`` encodes 24 kHz audio with the DVAE encoder
  (``DVAE.sample_audio``: codes (4, T); ours: :class:`chattts_serving.audio.encoder.DvaeEncoderRunner`)
  and packs the codes as the ``spk_smp`` string: the shape as two little-endian uint16, then
  the codes as little-endian uint16 compressed with raw LZMA2 (preset 9 | extreme), all in
  base16384: :func:`encode_spk_smp`, :func:`decode_spk_smp`.
- ``Chat._infer_code`` with ``spk_smp`` and ``txt_smp`` puts the transcript in the text prompt
  (:func:`chattts_serving.text.refine.speech_prompt_ids`) and lets
  ``Tokenizer.encode(..., prompt=codes)`` append the T code positions after it (``text_mask``
  false there, so ``Embed`` sums the 4 code embeddings); the engine takes the codes as
  ``SequenceRequest.prompt_codes``.

Reference recordings reach the encoder through :func:`prepare_recording` (checks and
resampling to 24 kHz) and :class:`PromptCache` (one encoding per distinct recording,
transcript and sample rate, bounded LRU); a voices-file recording is read by
:func:`load_recording`.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from .. import contract

__all__ = ["AudioPrompt", "PromptCache", "RecordingError", "ReferenceLimits", "SpkSmpError", "decode_spk_smp",
           "encode_spk_smp", "load_recording", "prepare_recording", "recording_key", "resample_to_model_rate"]

# --- spk_smp strings -----------------------------------------------------------------------
_LZMA_FILTERS: Final = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
MAX_SPK_SMP_TOKENS: Final = 65535
"""Longest audio prompt a ``spk_smp`` string can describe (its shape is stored as uint16)."""


class SpkSmpError(ValueError):
    """A ``spk_smp`` string or code array that is not a valid ChatTTS audio prompt."""


def encode_spk_smp(codes: np.ndarray) -> str:
    """ChatTTS' ``spk_smp`` string of audio-prompt codes (T, 4) ints in [0, 625), byte for
    byte what ``Chat.sample_audio_speaker`` returns for the audio that gave these codes
    (``Speaker.encode_prompt`` on ``DVAE.sample_audio``'s (4, T)): base16384 of the shape
    (4, T) as two ``<u2`` followed by the raw-LZMA2 (preset 9 | extreme) compression of the
    (4, T) codes as ``<u2``.

    Raises:
        SpkSmpError: not (T, 4) integers in [0, 625), or T > 65535.
    """
    import pybase16384 as b14

    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] != contract.NUM_VQ or not np.issubdtype(arr.dtype, np.integer):
        raise SpkSmpError(f"audio-prompt codes must be integers of shape (T, {contract.NUM_VQ}), "
                          f"got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= contract.EOS_CODE):
        raise SpkSmpError(f"audio-prompt codes must lie in [0, {contract.EOS_CODE})")
    if arr.shape[0] > MAX_SPK_SMP_TOKENS:
        raise SpkSmpError(f"an audio prompt has at most {MAX_SPK_SMP_TOKENS} tokens, got {arr.shape[0]}")
    chans = np.ascontiguousarray(arr.T.astype("<u2"))  # (4, T), ChatTTS' layout
    head = np.array(chans.shape, dtype="<u2").tobytes()
    body = lzma.compress(chans.tobytes(), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    return str(b14.encode_to_string(head + body))


def decode_spk_smp(spk_smp: str, max_tokens: int = MAX_SPK_SMP_TOKENS) -> np.ndarray:
    """Audio-prompt codes (T, 4) int32 of a ChatTTS ``spk_smp`` string (the inverse of
    :func:`encode_spk_smp`; ChatTTS' ``Speaker.decode_prompt`` gives their (4, T) transpose).
    Decompression stops after ``max_tokens`` tokens' worth of bytes, so a hostile string
    cannot make it allocate more.

    Raises:
        SpkSmpError: not base16384, shorter than its header, a first dimension other than 4,
            more than ``max_tokens`` tokens, LZMA data that is corrupt or of another length
            than the header says, or codes outside [0, 625).
    """
    import pybase16384 as b14

    if not isinstance(spk_smp, str) or not spk_smp.strip():
        raise SpkSmpError("spk_smp must be a non-empty ChatTTS audio-prompt string")
    try:
        raw = bytes(b14.decode_from_string(spk_smp.strip()))
    except Exception:  # pybase16384 raises several types on garbage
        raise SpkSmpError("spk_smp is not a base16384 string (ChatTTS' sample_audio_speaker format)") from None
    if len(raw) < 5:
        raise SpkSmpError("spk_smp is too short to be a ChatTTS audio prompt")
    rows, tokens = (int(v) for v in np.frombuffer(raw[:4], dtype="<u2"))
    if rows != contract.NUM_VQ:
        raise SpkSmpError(f"spk_smp holds {rows} code rows; ChatTTS' audio prompts have {contract.NUM_VQ}")
    if tokens > max_tokens:
        raise SpkSmpError(f"spk_smp holds {tokens} tokens; at most {max_tokens} are accepted")
    want = rows * tokens * 2
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        data = dec.decompress(raw[4:], max_length=want + 1)
    except lzma.LZMAError:
        raise SpkSmpError("spk_smp's compressed codes are corrupt") from None
    if len(data) != want or not dec.eof or dec.unused_data:
        raise SpkSmpError(f"spk_smp's compressed codes do not hold the {want} bytes its header announces")
    codes = np.frombuffer(data, dtype="<u2").reshape(rows, tokens).T.astype(np.int32)
    if codes.size and codes.max() >= contract.EOS_CODE:
        raise SpkSmpError(f"spk_smp holds codes outside [0, {contract.EOS_CODE})")
    return np.ascontiguousarray(codes)


# --- audio prompts -------------------------------------------------------------------------
@dataclass(frozen=True)
class AudioPrompt:
    """An encoded reference: codes (P, 4) int32 in [0, 625) (ChatTTS' ``spk_smp``) and the
    transcript spoken in it (ChatTTS' ``txt_smp``, placed before ``[speed_N]`` in every text
    prompt). ``tokens`` is P; 46.875 tokens are one second of the recording."""

    codes: np.ndarray
    transcript: str

    @property
    def tokens(self) -> int:
        return len(self.codes)

    @property
    def nbytes(self) -> int:
        """Memory held: the codes' bytes plus the transcript's UTF-8 bytes."""
        return int(self.codes.nbytes) + len(self.transcript.encode("utf-8"))

    def spk_smp(self) -> str:
        """These codes as a ChatTTS ``spk_smp`` string (:func:`encode_spk_smp`)."""
        return encode_spk_smp(self.codes)

    @classmethod
    def from_spk_smp(cls, spk_smp: str, txt_smp: str, max_tokens: int = MAX_SPK_SMP_TOKENS) -> AudioPrompt:
        """A prompt from ChatTTS' own strings. Raises :class:`SpkSmpError` (bad ``spk_smp``)
        and :class:`RecordingError` (``txt_smp`` empty: ChatTTS would speak an audio prompt
        with no transcript, which its authors never use)."""
        codes = decode_spk_smp(spk_smp, max_tokens)
        return cls(codes, check_transcript(txt_smp))


# --- reference recordings --------------------------------------------------------------------
class RecordingError(ValueError):
    """A reference recording or transcript that is refused; the message is for the client."""


@dataclass(frozen=True)
class ReferenceLimits:
    """What a reference recording may be.

    min_s, max_s: its duration in seconds (after resampling). The whole recording becomes
    audio-prompt tokens in every sentence's prompt (46.875 per second: 30 s = 1406 tokens of
    the GPT's 4096-token context, and prefill cost with them), so long recordings are refused
    rather than cut. min_rate_hz, max_rate_hz: accepted sample rates in Hz (a request holds
    its recording until it ends: 30 s at 48 kHz is 5.8 MB of float32).
    max_transcript_chars: longest transcript, in characters.
    """

    min_s: float = 0.5
    max_s: float = 30.0
    min_rate_hz: int = 8000
    max_rate_hz: int = 48000
    max_transcript_chars: int = 1000

    @property
    def max_tokens(self) -> int:
        """Audio-prompt tokens of a recording of ``max_s`` seconds."""
        return contract.encoder_tokens(int(self.max_s * contract.SAMPLE_RATE_HZ))


def check_transcript(transcript: str, limits: ReferenceLimits | None = None) -> str:
    """``transcript`` when it is a non-blank string of at most ``limits.max_transcript_chars``
    characters (it is used as given: ChatTTS does not normalise ``txt_smp``). Raises
    RecordingError: missing (blank) or too long."""
    if not isinstance(transcript, str) or not transcript.strip():
        raise RecordingError("a reference recording needs its transcript (txt_smp): the text spoken in it")
    limit = (limits or ReferenceLimits()).max_transcript_chars
    if len(transcript) > limit:
        raise RecordingError(f"reference transcript has {len(transcript)} characters; at most {limit} are accepted")
    return transcript


def resample_to_model_rate(audio: np.ndarray, rate_hz: int) -> np.ndarray:
    """Mono float32 ``audio`` (N,) at ``rate_hz`` resampled to 24 kHz with FFmpeg's
    libswresample through PyAV (``av.AudioResampler``, as ChatTTS' web demo loads its sample
    audio); returned as it is when already 24 kHz. Raises RecordingError when PyAV fails."""
    x = np.ascontiguousarray(audio, dtype=np.float32)
    if int(rate_hz) == contract.SAMPLE_RATE_HZ or x.size == 0:
        return x
    import av

    try:
        frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
        frame.sample_rate = int(rate_hz)
        res = av.AudioResampler(format="flt", layout="mono", rate=contract.SAMPLE_RATE_HZ)
        frames = [*res.resample(frame), *res.resample(None)]
    except Exception as exc:  # FFmpeg errors come in several types
        raise RecordingError(f"could not resample the recording from {rate_hz} Hz: {exc}") from None
    if not frames:
        return np.zeros(0, np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)


def check_recording(audio: np.ndarray, rate_hz: int, limits: ReferenceLimits | None = None) -> None:
    """Check a reference recording without converting it (cheap: the entry models run it at
    admission, so that a bad recording is refused before any work).

    Args:
        audio: (N,) float samples in [-1, 1] (int16 PCM is not accepted: convert it first).
        rate_hz: its sample rate in Hz.
        limits: what is accepted (default :class:`ReferenceLimits`).

    Raises:
        RecordingError: not 1-D float samples, NaN or infinite samples, a sample rate outside
            ``[min_rate_hz, max_rate_hz]``, or a duration outside ``[min_s, max_s]``.
    """
    lim = limits or ReferenceLimits()
    x = np.asarray(audio)
    if x.ndim != 1 or not np.issubdtype(x.dtype, np.floating):
        raise RecordingError(f"a reference recording must be 1-D float samples (mono), got {x.dtype} {x.shape}")
    if isinstance(rate_hz, bool) or not isinstance(rate_hz, (int, np.integer)) or \
            not lim.min_rate_hz <= int(rate_hz) <= lim.max_rate_hz:
        raise RecordingError(f"reference sample rate must be an integer in [{lim.min_rate_hz}, {lim.max_rate_hz}] Hz, "
                             f"got {rate_hz!r}")
    if not np.isfinite(x).all():
        raise RecordingError("reference recording holds NaN or infinite samples")
    seconds = x.size / int(rate_hz)
    if seconds > lim.max_s:
        raise RecordingError(f"reference recording is too long: {seconds:.2f} s, at most {lim.max_s:g} s")
    if seconds < lim.min_s:
        raise RecordingError(f"reference recording is too short: {seconds:.2f} s, at least {lim.min_s:g} s")


def prepare_recording(audio: np.ndarray, rate_hz: int, limits: ReferenceLimits | None = None) -> np.ndarray:
    """A reference recording checked (:func:`check_recording`) and brought to the encoder's
    input: (N,) float32 mono at 24 kHz (:func:`resample_to_model_rate`). Raises RecordingError."""
    check_recording(audio, rate_hz, limits)
    return resample_to_model_rate(np.asarray(audio, np.float32), int(rate_hz))


MAX_DECODED_S: Final = 90.0
"""Longest recording :func:`load_recording` decodes: 4096 audio-prompt tokens (the GPT's
whole context) are 87 s, so a longer one can never be a reference, and a small compressed
file must not decode into gigabytes."""


def load_recording(path: str | Path | bytes, max_s: float = MAX_DECODED_S) -> tuple[np.ndarray, int]:
    """A recording file (WAV, FLAC, MP3, Ogg, AAC, ... whatever FFmpeg decodes, through PyAV),
    or its bytes, as ((N,) float32 mono samples, sample rate in Hz); several channels are
    averaged to one. The one decoding path of every recording: a voices file's
    (:mod:`chattts_serving.text.voices`), an uploaded saved voice's and a request's
    ``reference_audio`` (the gateway's).

    Raises:
        RecordingError: the file cannot be read or decoded (the message has FFmpeg's reason,
            without its error number), holds no audio stream, or is longer than ``max_s``.
    """
    import av

    try:
        name = "the recording" if isinstance(path, bytes) else str(path)
        source: io.BytesIO | str = io.BytesIO(path) if isinstance(path, bytes) else str(path)
        with av.open(source, mode="r") as container:
            if not container.streams.audio:
                raise RecordingError(f"{name} holds no audio stream")
            stream = container.streams.audio[0]
            rate = int(stream.codec_context.sample_rate)
            parts = []
            decoded = 0
            for frame in container.decode(stream):
                decoded += frame.samples
                if rate and decoded > max_s * rate:
                    raise RecordingError(f"{name} is longer than {max_s:g} s; a reference recording is at "
                                         "most 30 s by default")
                data = frame.to_ndarray().astype(np.float32)
                if frame.format.name.rstrip("p") in ("s16", "s32"):  # integer PCM -> [-1, 1]
                    data = data / float(np.iinfo(np.int16 if frame.format.name.startswith("s16") else np.int32).max + 1)
                chans = len(frame.layout.channels)
                data = data.reshape(chans, -1) if frame.format.is_planar else data.reshape(-1, chans).T
                parts.append(data.mean(axis=0))
    except RecordingError:
        raise
    except Exception as exc:  # FileNotFoundError, av.error.*: several types
        reason = getattr(exc, "strerror", None) or str(exc)  # FFmpeg's words without "[Errno 1094995529]"
        what = "the recording" if isinstance(path, bytes) else f"the recording {path}"
        hint = " (not audio in a format FFmpeg decodes: WAV, MP3, FLAC, Ogg, AAC/M4A, WebM, ...)" \
            if isinstance(exc, av.error.FFmpegError) and isinstance(path, bytes) else ""
        raise RecordingError(f"cannot read {what}: {reason}{hint}") from None
    audio = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    return audio, rate


def recording_key(audio: np.ndarray, rate_hz: int, transcript: str) -> str:
    """Cache key of a reference: sha256 over the float32 samples' bytes, the sample rate and the
    transcript's UTF-8 bytes (hex)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    h.update(f"|{int(rate_hz)}|".encode())
    h.update(transcript.encode("utf-8"))
    return h.hexdigest()


DEFAULT_PROMPT_CACHE_ENTRIES: Final = 64
"""Encoded references kept by default: at most 1406 x 4 int32 codes (22 KB) each at the
default 30 s limit."""


class PromptCache:
    """Encoded reference recordings, at most ``max_entries`` (least recently used evicted),
    keyed by :func:`recording_key`; the recordings themselves are never kept, so memory stays
    bounded by ``max_entries`` times the largest prompt (:attr:`ReferenceLimits.max_tokens`
    tokens). Thread-safe; an encoding runs outside the lock.

    ``encode``: 24 kHz audio (N,) float32 -> codes (T, 4) int32 (e.g.
    :meth:`chattts_serving.audio.encoder.DvaeEncoderRunner.run`). ``limits``: what
    :func:`prepare_recording` accepts. Raises ValueError for ``max_entries < 1``.
    """

    def __init__(self, encode: Callable[[np.ndarray], np.ndarray], limits: ReferenceLimits | None = None,
                 max_entries: int = DEFAULT_PROMPT_CACHE_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._encode = encode
        self.limits = limits or ReferenceLimits()
        self.max_entries = max_entries
        self._items: OrderedDict[str, AudioPrompt] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached prompts (codes and transcripts)."""
        with self._lock:
            return sum(p.nbytes for p in self._items.values())

    def get(self, audio: np.ndarray, rate_hz: int, transcript: str) -> AudioPrompt:
        """The :class:`AudioPrompt` of a reference recording ``audio`` (N,) float at
        ``rate_hz`` with ``transcript``: from the cache, or checked (:func:`prepare_recording`),
        encoded and cached.

        Raises:
            RecordingError: transcript missing or too long, or a recording
                :func:`prepare_recording` refuses.
        """
        transcript = check_transcript(transcript, self.limits)
        key = recording_key(np.asarray(audio, np.float32), rate_hz, transcript)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return hit
        wav = prepare_recording(audio, rate_hz, self.limits)
        codes = np.ascontiguousarray(self._encode(wav), dtype=np.int32)
        codes.setflags(write=False)
        prompt = AudioPrompt(codes, transcript)
        with self._lock:
            self.misses += 1
            self._items[key] = prompt
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return prompt
