"""Text front end: text normalisation, ChatTTS' normaliser, prompt building and voices.

``FrontEnd.prepare(text, voice)`` runs, in order:

1. :func:`chattts_serving.text.normalize.normalize`: numbers, dates, times, phone numbers, money,
   percentages, units and symbols verbalised per Chinese/English segment, punctuation mapped,
   control tokens kept, unspeakable characters reported (never dropped silently); with
   ``wetext`` on, a few Chinese entity kinds are read by WeTextProcessing;
2. ChatTTS' own ``Normalizer`` (its homophone replacement and full-width marks for Chinese),
   which then finds nothing to delete;
3. every character left is checked against the vocabulary of the tokenizer loaded here (with
   the tokenizer's own normalisation, so ``A`` counts as ``a``): a character it would turn into
   ``[UNK]`` (a Chinese character outside the vocabulary that step 2's homophone map did not
   already replace by a common one, as it does 龠 -> 月) is left out of the prompt and reported
   in ``dropped`` like the others, so ``[UNK]`` never reaches the GPT;
4. the prompt, ChatTTS' ``Speaker.decorate_code_prompts`` form::

       [Stts][spk_emb][speed_N]{normalised text}[Ptts]

   with N from the first ``[speed_N]`` token in the text (default 5), tokenised without
   special tokens; the ``[spk_emb]`` position later receives the speaker vector (a reference
   transcript goes before ``[speed_N]``, and ``[empty_spk]`` replaces ``[spk_emb]`` without a
   speaker: :func:`chattts_serving.text.refine.speech_prompt_ids`);
5. the voice (:mod:`chattts_serving.text.voices`): seed, name or spk_emb string, through a bounded
   LRU cache of speaker vectors.

The same text and voice always give the same ids and the same speaker-vector bytes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..errors import NOTHING_SPEAKABLE, quoted
from ..params import ParamError
from ..runtime import Artifacts
from . import normalize as textnorm
from . import refine
from . import wetext as textnorm_wetext
from .request_text import RAW_LENGTH_FACTOR, length_error
from .voices import DEFAULT_CACHE_ENTRIES, MAX_VOICE_SEED, SpeakerCache, Voice, VoiceBook, VoiceError

log = logging.getLogger(__name__)

__all__ = ["MAX_VOICE_SEED", "RAW_LENGTH_FACTOR", "FrontEnd", "FrontendError", "Prepared"]

_SPEED_TOKEN = re.compile(r"\[speed_\d+\]")


class FrontendError(ValueError):
    """Input the front end refuses (empty text, nothing speakable, unknown voice, too long, a
    control token out of range); the message is meant for the client."""


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine.

    input_ids: (T,) int32 prompt ids; spk_emb: (H,) float32 normalised speaker vector, None
    without one (``[empty_spk]`` in the prompt);
    normalized: the text actually spoken (control tokens included, ``[speed_N]`` moved into
    the prompt); dropped: characters that could not be spoken and reserved tokens that were
    removed, each once in order of appearance; speed: N of the prompt's ``[speed_N]`` (0..9);
    refine_ids: (T',) int32 prompt of the refine-text stage for the normalised text
    (:func:`chattts_serving.text.refine.refine_prompt_ids`), None when not asked for.
    """

    input_ids: np.ndarray
    spk_emb: np.ndarray | None
    normalized: str
    dropped: tuple[str, ...]
    speed: int = textnorm.DEFAULT_SPEED
    refine_ids: np.ndarray | None = None


class FrontEnd:
    """Text -> prompt conversion for one artifact directory.

    ``max_text_chars``: the longest text accepted, in characters, control tokens not counted
    (with them, at most ``RAW_LENGTH_FACTOR`` times as many). ``default_voice_seed``: the
    voice of requests without one. ``voices``: the voice book (default: built-in names plus
    the voices file of :func:`chattts_serving.text.voices.default_voices_path`).
    ``speaker_cache_entries``: size of the speaker-vector LRU cache. ``wetext``: let
    WeTextProcessing read the Chinese entity kinds of :data:`chattts_serving.text.normalize.LIBRARY_KINDS`
    (profile ``[frontend] wetext``); False: our rules alone.

    Raises :class:`FrontendError` at construction when the voices file is malformed.
    """

    def __init__(self, artifacts: Artifacts, max_text_chars: int, default_voice_seed: int,
                 voices: VoiceBook | None = None, speaker_cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 wetext: bool = True) -> None:
        self.tokenizer = refine.load_tokenizer(artifacts.root)
        self.vocabulary = TokenizerVocabulary(self.tokenizer)
        self.wetext = wetext
        if wetext and not textnorm_wetext.preload():
            log.warning("wetext is not installed: text normalisation uses our rules alone")
        stats = np.load(artifacts.root / "speaker_stats.npz")
        self.std, self.mean = stats["std"], stats["mean"]
        self.dim = int(self.std.shape[0])
        self.max_text_chars = max_text_chars
        self.default_voice_seed = default_voice_seed
        try:
            self.voices = voices if voices is not None else VoiceBook.load()
            self.voices.validate(self.dim)
        except VoiceError as exc:
            raise FrontendError(str(exc)) from None
        self.speakers = SpeakerCache(self.std, self.mean, speaker_cache_entries)
        self.normalizer = _chattts_normalizer()
        for sample in NORMALIZER_WARM_UP:  # numba compiles ChatTTS' normaliser per path on first use
            self.normalizer(sample, do_text_normalization=True, do_homophone_replacement=True)

    def voice(self, voice: str) -> Voice:
        """The :class:`~chattts_serving.text.voices.Voice` of a request's ``voice``: '' (default
        voice), an integer seed in [0, 2**32-1], a voice name (a reference-recording voice
        included), or a ChatTTS spk_emb string.

        Raises:
            FrontendError: seed out of range or unknown name.
        """
        try:
            return self.voices.resolve(voice, self.default_voice_seed)
        except VoiceError as exc:
            raise FrontendError(_voice_message(exc)) from None

    def speaker(self, voice: str) -> np.ndarray | None:
        """(H,) normalised speaker vector (read-only) for ``voice`` (see :meth:`voice`); for a
        reference-recording voice the vector of its ``speaker``, None when it has none.

        Raises:
            FrontendError: seed out of range, unknown name, or an invalid spk_emb string.
        """
        v = self.voice(voice)
        if v.kind == "reference":
            if v.speaker is None:
                return None
            v = v.speaker
        try:
            return self.speakers.get(v)
        except VoiceError as exc:
            raise FrontendError(_voice_message(exc)) from None

    def prepare(self, text: str, voice: str = "", refine_prompt: str | None = None,
                refined_ids: np.ndarray | None = None, *, txt_smp: str | None = None, no_speaker: bool = False,
                keep_unspeakable: bool = False, language: str = "auto") -> Prepared:
        """Normalise ``text``, build the prompts and tokenize them, and resolve ``voice``.

        ``txt_smp``: a reference transcript placed before ``[speed_N]`` in the code prompt, as
        it is (ChatTTS' ``InferCodeParams.txt_smp``; :func:`chattts_serving.text.refine.speech_prompt_ids`).
        ``no_speaker``: no speaker vector (``[empty_spk]`` prompt, ``spk_emb`` None), ChatTTS'
        ``spk_emb=None``; a reference-recording voice without a ``speaker`` has none either.
        ``keep_unspeakable``: ``text`` is a piece of ChatTTS' split
        (:func:`chattts_serving.text.segments.split_like_chattts`, the ``chattts`` segmentation),
        read as ChatTTS reads it: where our normalisation changes no spoken word (nothing but
        pause marks and spaces: no digits, symbols read aloud or reserved tokens) the text is what
        ChatTTS' own normaliser makes of the piece (it keeps ``？`` out of the text where ours
        would write ``。``), so the GPT sees what ``Chat.infer`` gives it; and the piece is
        prompted even when nothing in it can be spoken (a blank line, a lone ``。``), as ChatTTS
        synthesises such pieces too.

        ``language``: ``'auto'``, ``'zh'`` or ``'en'``, the language of what the text gives no
        context for (:func:`chattts_serving.text.normalize.normalize`).

        With ``refine_prompt`` (control tokens, '' for none; validated by
        :class:`chattts_serving.text.refine.RefineParams`) the refine-text prompt is built too
        (``refine_ids``; None without). With
        ``refined_ids`` ((N,) ints the refine stage generated for this same ``text``), the
        code prompt is built from the refined text instead, not normalised again, as ChatTTS
        does (:func:`chattts_serving.text.refine.code_prompt_ids`), and ``normalized`` is that text.

        Raises:
            FrontendError: text too long, empty, without anything speakable, or with a control
                token out of range; a voice that cannot be resolved; an invalid refine prompt
                or refined ids outside the text vocabulary.
        """
        too_long = length_error(text, self.max_text_chars)
        if too_long:
            raise FrontendError(too_long)
        if not text.strip() and not keep_unspeakable:
            raise FrontendError("text is empty")
        try:
            norm = textnorm.normalize(text, library=self.wetext, language=language)
        except textnorm.TextNormError as exc:
            raise FrontendError(str(exc)) from None
        spk = None if no_speaker else self.speaker(voice)
        normalized = self.normalizer(norm.text, do_text_normalization=True, do_homophone_replacement=True).strip()
        if keep_unspeakable:  # ChatTTS' segmentation: its own reading wherever ours changes no word
            theirs = self.normalizer(_SPEED_TOKEN.sub("", text), do_text_normalization=True,
                                     do_homophone_replacement=True).strip()
            if _spoken(theirs) == _spoken(normalized):
                normalized = theirs
        normalized, unknown = self.vocabulary.remove_unknown(normalized)
        speakable = textnorm.speakable(normalized)
        if not speakable and keep_unspeakable:  # ChatTTS speaks the piece as its own normaliser leaves it
            raw = _SPEED_TOKEN.sub("", text)  # the speed is in the prompt already
            plain = self.normalizer(raw, do_text_normalization=True, do_homophone_replacement=True).strip()
            normalized, more = self.vocabulary.remove_unknown(plain)
            unknown = (*unknown, *more)
        dropped = tuple(sorted(dict.fromkeys((*norm.dropped, *unknown)),
                               key=lambda d: text.find(d) if d in text else len(text)))
        if not speakable and not keep_unspeakable:
            what = f": {quoted(''.join(dropped))}" if dropped else ""
            raise FrontendError(f"{NOTHING_SPEAKABLE} (only punctuation, symbols or unsupported characters{what})")
        speed = norm.speed if norm.speed is not None else textnorm.DEFAULT_SPEED
        refine_ids = None
        if refine_prompt is not None and speakable:  # an unspeakable piece is not refined (it keeps its text)
            try:
                refine_ids = refine.refine_prompt_ids(self.tokenizer, normalized,
                                                      refine.RefineParams(prompt=refine_prompt).validate().prompt)
            except ParamError as exc:
                raise FrontendError(str(exc)) from None
        code_ids, normalized = self.code_prompt(normalized, speed, refined_ids, txt_smp=txt_smp,
                                                speaker=spk is not None)
        if dropped:
            log.info("characters not spoken: %r", "".join(dropped))
        return Prepared(code_ids, spk, normalized, dropped, speed, refine_ids)

    def code_prompt(self, normalized: str, speed: int, refined_ids: np.ndarray | None = None, *,
                    txt_smp: str | None = None, speaker: bool = True) -> tuple[np.ndarray, str]:
        """The code prompt (T,) int32 of a text :meth:`prepare` normalised (its ``normalized``,
        not normalised again) at ``speed``, and the text it speaks: ``normalized``, or with
        ``refined_ids`` ((N,) ints the refine stage generated for it) the refined text
        (:func:`chattts_serving.text.refine.code_prompt_ids`). ``txt_smp`` and ``speaker`` as in
        :meth:`prepare` (``speaker``: a speaker vector takes the ``[spk_emb]`` position).

        Raises:
            FrontendError: refined ids outside the text vocabulary, a speed outside 0..9.
        """
        if refined_ids is not None:
            ids = np.asarray(refined_ids).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= contract.TEXT_VOCAB_SIZE):
                raise FrontendError(f"refined_ids must be text ids in [0, {contract.TEXT_VOCAB_SIZE})")
            refined = refine.decode_refined(self.tokenizer, ids)
            try:
                code_ids = refine.code_prompt_ids(self.tokenizer, refined, normalized, speed, txt_smp, speaker)
            except ValueError as exc:
                raise FrontendError(str(exc)) from None
            return code_ids.astype(np.int32), refine.code_stage_text(refined, normalized)
        try:
            code_ids = refine.speech_prompt_ids(self.tokenizer, normalized, speed, txt_smp, speaker)
        except ValueError as exc:
            raise FrontendError(str(exc)) from None
        return code_ids.astype(np.int32), normalized


_SPOKEN: re.Pattern[str] = re.compile(textnorm.CONTROL_TOKEN.pattern + r"|[\u4e00-\u9fffA-Za-z]")


def _spoken(text: str) -> list[str]:
    """What of ``text`` is spoken: its letters, Chinese characters and control tokens, in order
    (pause marks and spaces left out)."""
    return _SPOKEN.findall(text)


def _voice_message(exc: VoiceError) -> str:
    msg = str(exc)
    return msg if msg.startswith(("unknown voice", "voice seed")) else f"unknown voice: {msg}"


class TokenizerVocabulary:
    """Which characters a BERT WordPiece tokenizer can spell, built once from its vocabulary.

    A character is known when, after the tokenizer's own normaliser (lower-casing, accent
    stripping where configured), every character it becomes is a one-character token or a
    ``##`` continuation of one; anything else would be tokenised as ``[UNK]``. Whitespace and
    the tokenizer's added tokens (``[uv_break]``, ...) are not checked.
    """

    def __init__(self, tokenizer: Any) -> None:
        vocab = tokenizer.get_vocab()
        self.chars = frozenset(t for t in vocab if len(t) == 1) | frozenset(
            t[2:] for t in vocab if len(t) == 3 and t.startswith("##"))
        self._normalizer = tokenizer.backend_tokenizer.normalizer
        self._known: dict[str, bool] = {}

    def known(self, c: str) -> bool:
        """Whether ``c`` is tokenised as itself rather than ``[UNK]`` (cached per character)."""
        hit = self._known.get(c)
        if hit is None:
            plain = self._normalizer.normalize_str(c) if self._normalizer is not None else c
            hit = all(ch.isspace() or ch in self.chars for ch in plain)
            self._known[c] = hit
        return hit

    def remove_unknown(self, text: str) -> tuple[str, tuple[str, ...]]:
        """``text`` without the characters the tokenizer would map to ``[UNK]`` (control tokens
        kept; a space keeps two Latin letters apart), and those characters once each, in order."""
        if all(self._known.get(c, False) for c in text):
            return text, ()
        out: list[str] = []
        unknown: list[str] = []
        pos = 0
        for m in [*textnorm.CONTROL_TOKEN.finditer(text), None]:
            end = m.start() if m is not None else len(text)
            for c in text[pos:end]:
                if c.isspace() or self.known(c):
                    out.append(c)
                    continue
                if c not in unknown:
                    unknown.append(c)
                out.append("\0")
            if m is not None:
                out.append(m.group(0))
                pos = m.end()
        if not unknown:
            return text, ()
        cleaned = re.sub(r"(?<=[A-Za-z])\0+(?=[A-Za-z])", " ", "".join(out)).replace("\0", "")
        return cleaned, tuple(unknown)


NORMALIZER_WARM_UP = ("你好，世界。今天天气很好！我们去公园散步吧？", "Hello, world! How are you today?",
                      "他说：“好的。”（是的）", "[uv_break]你好[laugh]")
"""Texts ChatTTS' normaliser reads once at start: its numba-compiled helpers compile on first
use, which would otherwise happen inside a request (seconds of latency, and numba keeps the
request's frames in reference cycles until the next full garbage collection)."""


def _chattts_normalizer() -> Any:
    """ChatTTS' own ``Normalizer`` with its homophones map, logging quietly. Its numba-compiled
    helpers keep their machine code in numba's on-disk cache (keyed by the source and the CPU),
    so that only a host's first start compiles them: the front end's start, and with it a
    supervised restart, does not pay for the compilation again (docs/operations.md, "Faults and
    recovery")."""
    import ChatTTS
    import ChatTTS.norm
    from ChatTTS.norm import Normalizer
    from numba.core.dispatcher import Dispatcher

    for helper in vars(ChatTTS.norm).values():
        if isinstance(helper, Dispatcher):
            helper.enable_caching()

    quiet = logging.getLogger("chattts_serving.chattts_norm")
    quiet.setLevel(logging.ERROR)
    res = Path(ChatTTS.__file__).parent / "res" / "homophones_map.json"
    return Normalizer(str(res), quiet)
