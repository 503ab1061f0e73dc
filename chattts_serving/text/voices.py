"""Voices: integer seeds, ChatTTS ``spk_emb`` strings and named voices, with a speaker cache.

A request's ``voice`` is one of

* ``''``: the deployment's default seed (profile ``frontend.default_voice_seed``);
* an integer seed in [0, 2**32-1]: the speaker ChatTTS samples after ``torch.manual_seed(seed)``
  (:func:`chattts_serving.text.speaker.speaker_from_seed`);
* a name from the voice book (case-insensitive): the built-in OpenAI names (``alloy``,
  ``echo``, ``fable``, ``onyx``, ``nova``, ``shimmer``, ...) and the entries of a voices file;
* otherwise a ChatTTS ``spk_emb`` string (base16384 text of the compressed float16 vector).

Voices file: TOML or JSON (by suffix), a mapping ``name -> seed`` (integer),
``name -> spk_emb`` (string) or ``name -> reference recording`` (a table), either at the top
level or under a ``voices`` table::

    [voices]
    narrator = 1234
    alloy = 7            # overrides the built-in seed of "alloy"
    custom = "蘁淰敥欀..."  # a ChatTTS spk_emb string
    reader = { recording = "reader.wav", transcript = "这是一段参考录音。" }
    reader7 = { recording = "reader.wav", transcript = "这是一段参考录音。", speaker = 7 }

A reference voice speaks like its recording (ChatTTS' ``spk_smp`` + ``txt_smp``: the
recording, encoded by the DVAE encoder, and its transcript precede every sentence's prompt);
``recording`` is a path relative to the voices file, ``transcript`` the words spoken in it,
``speaker`` an optional seed or spk_emb string used as well (without it the prompt has no
speaker vector, ChatTTS' ``spk_emb=None``). The front-end model reads, checks and encodes
each recording once, when it starts.

Its path comes from the ``CHATTTS_VOICES`` environment variable, else ``voices/voices.toml``
at the repository root when that file exists. Names match ``[A-Za-z][A-Za-z0-9_.-]*`` so that
they never look like a seed or a spk_emb string.

:class:`SpeakerCache` keeps the last ``max_entries`` speaker vectors (LRU), so that a popular
voice is sampled or decoded once; the same voice always gives the same vector bytes.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from ..errors import quoted
from .speaker import SpeakerError, decode_spk_emb, normalize_speaker, speaker_from_seed

MAX_VOICE_SEED: Final = 2**32 - 1
ENV_VOICES: Final = "CHATTTS_VOICES"
"""Environment variable naming the voices file."""
DEFAULT_VOICES_FILE: Final = Path(__file__).resolve().parents[2] / "voices" / "voices.toml"
"""The repository's sample voices file (used when it exists and ``CHATTTS_VOICES`` is unset)."""
DEFAULT_CACHE_ENTRIES: Final = 256
"""Speaker vectors kept by default (768 float32 each: about 3 KB)."""

OPENAI_VOICES: Final[dict[str, int]] = {
    "alloy": 1001, "ash": 1002, "ballad": 1003, "coral": 1004, "echo": 1005, "fable": 1006, "onyx": 1007,
    "nova": 1008, "sage": 1009, "shimmer": 1010, "verse": 1011, "marin": 1012, "cedar": 1013,
}
"""OpenAI's voice names mapped to fixed seeds, so that OpenAI clients get a stable voice per
name. They are ChatTTS voices chosen by seed, not imitations of OpenAI's."""

_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_SEED: Final = re.compile(r"[+-]?\d+")


class VoiceError(ValueError):
    """A voice that cannot be resolved, or a malformed voices file (message says which)."""


@dataclass(frozen=True)
class Voice:
    """A resolved voice: ``kind`` 'seed' (``seed`` set), 'spk_emb' (``spk_emb`` set) or
    'reference' (``recording``, an absolute path, and ``transcript`` set; ``speaker`` the
    seed or spk_emb voice spoken with it, or None); ``name``: the voice-book name it came
    from, if any."""

    kind: Literal["seed", "spk_emb", "reference"]
    seed: int | None = None
    spk_emb: str | None = None
    name: str | None = None
    recording: Path | None = None
    transcript: str | None = None
    speaker: Voice | None = None

    @property
    def key(self) -> tuple[str, int | str]:
        """Cache key: equal for voices that give the same speaker vector (not defined for a
        reference voice: use its ``speaker``)."""
        if self.kind == "reference":
            raise ValueError("a reference voice has no speaker-vector key of its own")
        if self.kind == "seed":
            assert self.seed is not None
            return ("seed", self.seed)
        assert self.spk_emb is not None
        return ("spk_emb", self.spk_emb)


def seed_voice(seed: int, name: str | None = None) -> Voice:
    """A seed voice. Raises :class:`VoiceError` if ``seed`` is outside [0, 2**32-1]."""
    if not 0 <= seed <= MAX_VOICE_SEED:
        raise VoiceError(f"voice seed {seed} is out of range [0, {MAX_VOICE_SEED}]")
    return Voice("seed", seed=seed, name=name)


_REFERENCE_KEYS: Final = {"recording", "transcript", "speaker"}


def _reference_entry(name: str, value: Mapping[str, Any], where: str, base_dir: Path | None) -> Voice:
    unknown = sorted(set(value) - _REFERENCE_KEYS)
    if unknown:
        raise VoiceError(f"{where}: voice {name!r} has unknown keys {unknown}; a reference voice has "
                         f"{sorted(_REFERENCE_KEYS)}")
    recording, transcript = value.get("recording"), value.get("transcript")
    if not isinstance(recording, str) or not recording.strip():
        raise VoiceError(f"{where}: voice {name!r} needs 'recording', the path of its recording")
    if not isinstance(transcript, str) or not transcript.strip():
        raise VoiceError(f"{where}: voice {name!r} needs 'transcript', the words spoken in its recording")
    path = Path(recording.strip())
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    speaker = _entry(name, value["speaker"], where, base_dir) if "speaker" in value else None
    if speaker is not None and speaker.kind == "reference":
        raise VoiceError(f"{where}: voice {name!r}: 'speaker' must be a seed or a spk_emb string")
    return Voice("reference", name=name, recording=path.resolve(), transcript=transcript, speaker=speaker)


def _entry(name: str, value: Any, where: str, base_dir: Path | None = None) -> Voice:
    if isinstance(value, Mapping):
        return _reference_entry(name, value, where, base_dir)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise VoiceError(f"{where}: voice {name!r} must be an integer seed, a spk_emb string or a reference "
                         f"recording table, got {type(value).__name__}")
    if isinstance(value, str) and _SEED.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, int):
        try:
            return seed_voice(value, name)
        except VoiceError as exc:
            raise VoiceError(f"{where}: voice {name!r}: {exc}") from None
    if not value.strip():
        raise VoiceError(f"{where}: voice {name!r} is empty")
    return Voice("spk_emb", spk_emb=value.strip(), name=name)


def parse_voices(data: Mapping[str, Any], where: str = "voices", base_dir: Path | None = None) -> dict[str, Voice]:
    """Voice-book entries from a parsed voices file (a mapping, or one with a ``voices`` table);
    ``base_dir``: the directory relative recording paths start from (the file's).

    Returns lower-cased name -> :class:`Voice`. Raises :class:`VoiceError` on a bad name or value.
    """
    table = data.get("voices", data) if isinstance(data, Mapping) else data
    if not isinstance(table, Mapping):
        raise VoiceError(f"{where}: expected a mapping of voice names, got {type(table).__name__}")
    out: dict[str, Voice] = {}
    for name, value in table.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise VoiceError(f"{where}: voice name {name!r} must match {_NAME.pattern}")
        out[name.lower()] = _entry(name.lower(), value, where, base_dir)
    return out


def load_voices_file(path: str | Path) -> dict[str, Voice]:
    """Read a TOML (``.toml``) or JSON (any other suffix) voices file.

    Raises:
        VoiceError: the file cannot be read or parsed, or holds a bad entry.
    """
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise VoiceError(f"cannot read voices file {p}: {exc.strerror or exc}") from None
    try:
        if p.suffix.lower() == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
            data = tomllib.loads(raw)
        else:
            data = json.loads(raw)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise VoiceError(f"voices file {p} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
    return parse_voices(data, str(p), p.parent)


def default_voices_path() -> Path | None:
    """``$CHATTTS_VOICES`` if set (even if missing: loading it then fails loudly), else the
    repository's ``voices/voices.toml`` if it exists, else None."""
    env = os.environ.get(ENV_VOICES, "").strip()
    if env:
        return Path(env)
    return DEFAULT_VOICES_FILE if DEFAULT_VOICES_FILE.is_file() else None


class VoiceBook:
    """Resolves request voices: seeds, names (built-in OpenAI names plus a voices file) and
    spk_emb strings."""

    def __init__(self, entries: Mapping[str, Voice] | None = None, builtin: bool = True) -> None:
        book: dict[str, Voice] = {}
        if builtin:
            book.update({n: Voice("seed", seed=s, name=n) for n, s in OPENAI_VOICES.items()})
        book.update({k.lower(): v for k, v in (entries or {}).items()})
        self._book = book

    @classmethod
    def load(cls, path: str | Path | None = None) -> VoiceBook:
        """The built-in names plus the voices file at ``path`` (default:
        :func:`default_voices_path`). Raises :class:`VoiceError` for a bad file."""
        p = Path(path) if path is not None else default_voices_path()
        return cls(load_voices_file(p) if p is not None else None)

    def names(self) -> list[str]:
        """Every known voice name, sorted."""
        return sorted(self._book)

    def get(self, name: str) -> Voice | None:
        """The entry named ``name`` (case-insensitive), or None."""
        return self._book.get(name.strip().lower())

    def resolve(self, voice: str, default_seed: int) -> Voice:
        """The :class:`Voice` for a request's ``voice`` string (see the module docstring).

        Raises:
            VoiceError: a seed out of range, or an unknown name (a string that is neither a
                seed, a known name nor plausibly a spk_emb string).
        """
        v = voice.strip()
        if not v:
            return seed_voice(default_seed)
        if _SEED.fullmatch(v):
            return seed_voice(int(v))
        entry = self.get(v)
        if entry is not None:
            return entry
        if _NAME.fullmatch(v):
            raise VoiceError(f"unknown voice {quoted(v)}: not a seed, not one of the voice names "
                             f"({', '.join(self.names()[:20])}{', ...' if len(self._book) > 20 else ''})"
                             ", and not a ChatTTS spk_emb string")
        return Voice("spk_emb", spk_emb=v)

    def references(self) -> dict[str, Voice]:
        """The reference-recording voices by name."""
        return {n: v for n, v in self._book.items() if v.kind == "reference"}

    def validate(self, dim: int) -> None:
        """Decode every spk_emb entry once (``dim``: the model's speaker dimension) and check
        that every reference recording is a file, so that a bad voices file fails at load
        rather than on a request (the recordings themselves are decoded by the front-end
        model). Raises :class:`VoiceError`."""
        for name, voice in self._book.items():
            if voice.kind == "reference":
                assert voice.recording is not None
                if not voice.recording.is_file():
                    raise VoiceError(f"voice {name!r}: recording {voice.recording} is not a file")
                voice = voice.speaker if voice.speaker is not None else voice
            if voice.kind == "spk_emb":
                assert voice.spk_emb is not None
                try:
                    decode_spk_emb(voice.spk_emb, dim)
                except SpeakerError as exc:
                    raise VoiceError(f"voice {name!r}: {exc}") from None


class SpeakerCache:
    """Bounded LRU cache of normalised speaker vectors for one checkpoint's speaker statistics.

    ``std``, ``mean``: (H,) arrays of ``speaker_stats.npz``; ``max_entries`` >= 1. Thread-safe.
    Returned vectors are read-only (H,) float32 arrays, L2-normalised as ChatTTS does.
    """

    def __init__(self, std: np.ndarray, mean: np.ndarray, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.std, self.mean = std, mean
        self.dim = int(np.asarray(std).shape[0])
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, int | str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, voice: Voice) -> np.ndarray:
        """The (H,) normalised speaker vector of a seed or spk_emb ``voice``.

        Raises:
            VoiceError: a spk_emb string that does not decode to an H-dimensional vector.
            ValueError: a reference voice (take its ``speaker``).
        """
        key = voice.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        vec = self._compute(voice)
        vec.setflags(write=False)
        with self._lock:
            self.misses += 1
            self._cache[key] = vec
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return vec

    def _compute(self, voice: Voice) -> np.ndarray:
        if voice.kind == "seed":
            assert voice.seed is not None
            raw = speaker_from_seed(voice.seed, self.std, self.mean)
        else:
            assert voice.spk_emb is not None
            try:
                raw = decode_spk_emb(voice.spk_emb, self.dim)
            except SpeakerError as exc:
                raise VoiceError(str(exc)) from None
        return np.ascontiguousarray(normalize_speaker(raw), dtype=np.float32)
