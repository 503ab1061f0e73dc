"""The front-end model's logic (``chattts_frontend``), free of Triton: a request's segments,
voice and audio prompt -> the GPT's prompt for each segment, the text normalised once per
request (a later call prompts the texts it made again: refine-text, the first-piece prompt).

:class:`FrontendService` puts together the text front end
(:class:`~chattts_serving.text.frontend.FrontEnd`: normalisation, prompt ids, voices) and the
DVAE encoder (:class:`~chattts_serving.audio.encoder.DvaeEncoderRunner`) with the prompt cache
(:class:`~chattts_serving.audio.reference.PromptCache`), so that a reference recording becomes
audio-prompt codes where the tokenizer, the voice book and torch (whose STFT the encoder's mel
must use) already are: a recording sent with a request is checked, resampled, encoded once and
cached (LRU, keyed by its samples, rate and transcript); the recording of a voice from the
voices file is read, checked and encoded when the service starts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import contract
from ..audio.reference import (
    DEFAULT_PROMPT_CACHE_ENTRIES,
    AudioPrompt,
    PromptCache,
    RecordingError,
    ReferenceLimits,
    check_transcript,
    load_recording,
    prepare_recording,
)
from ..errors import ErrorKind, RequestError
from ..params import ParamError
from ..text.frontend import FrontEnd, FrontendError
from ..text.refine import RefineParams
from .boundary import FrontendOutput
from .request import FrontendCall


class FrontendService:
    """One per front-end model instance.

    ``frontend``: the text front end; ``encode``: 24 kHz audio (N,) float32 -> audio-prompt
    codes (T, 4) int32 (:meth:`chattts_serving.audio.encoder.DvaeEncoderRunner.run`);
    ``limits``: what a reference recording may be (profile ``[reference]``);
    ``cache_entries``: encoded recordings kept.

    Raises FrontendError at construction when a voice of the voices file has a recording that
    cannot be read, is outside ``limits`` or has a transcript outside them.
    """

    def __init__(self, frontend: FrontEnd, encode: Callable[[np.ndarray], np.ndarray],
                 limits: ReferenceLimits | None = None, cache_entries: int = DEFAULT_PROMPT_CACHE_ENTRIES) -> None:
        self.frontend = frontend
        self.encode = encode
        self.cache = PromptCache(encode, limits, cache_entries)
        self.voice_prompts: dict[str, AudioPrompt] = {}
        """The audio prompt of every reference voice of the voices file, by name."""
        for name, voice in frontend.voices.references().items():
            assert voice.recording is not None and voice.transcript is not None
            try:
                audio, rate = load_recording(voice.recording)
                wav = prepare_recording(audio, rate, self.cache.limits)
                transcript = check_transcript(voice.transcript, self.cache.limits)
            except RecordingError as exc:
                raise FrontendError(f"voice {name!r}: {exc}") from None
            codes = np.ascontiguousarray(encode(wav), dtype=np.int32)
            codes.setflags(write=False)
            self.voice_prompts[name] = AudioPrompt(codes, transcript)

    def prepare(self, call: FrontendCall) -> list[FrontendOutput]:
        """Every segment of the call for the GPT
        (:class:`~chattts_serving.serving.request.FrontendCall`), one output per text, in order:
        prompt ids with the transcript of its audio prompt, the speaker vector (None for
        ``no_speaker`` or a reference voice without a speaker), and the audio-prompt codes of
        the call's recording (which wins over a reference voice's) or of its reference voice.
        The voice, the refine prompt and the audio prompt are resolved once for the call; each
        text is normalised once, or, with ``call.speeds``, only prompted again.

        Raises:
            RequestError: INVALID for what the front end refuses, its ``param`` the input at
                fault: ``voice`` (checked first: an unknown name, a seed out of range, a bad
                spk_emb string), ``refine_prompt``, ``reference_audio`` (a recording outside
                the limits or without transcript), else ``text``; INTERNAL for a transient
                (generated) recording the encoder cannot take.
        """
        try:
            voice = self.frontend.voice(call.voice)
            speaker = None if call.no_speaker else self.frontend.speaker(call.voice)
        except FrontendError as exc:
            raise RequestError(str(exc), param=contract.IN_VOICE.name) from None
        if call.refine_prompt is not None:
            try:
                RefineParams(prompt=call.refine_prompt).validate()
            except ParamError as exc:
                raise RequestError(str(exc), param=contract.IN_REFINE_PROMPT.name) from None
        refined: tuple[np.ndarray | None, ...] = call.refined_ids or (None,) * len(call.texts)
        if len(refined) != len(call.texts) or (call.speeds is not None and len(call.speeds) != len(call.texts)):
            raise RequestError("refined_ids and speeds must have one entry per text", param=contract.IN_TEXT.name)
        try:
            prompt = None
            txt_smp = call.reference_text
            if call.reference_audio is not None:
                prompt = self._encode(call)
            elif voice.kind == "reference" and txt_smp is None:
                assert voice.name is not None
                prompt = self.voice_prompts[voice.name]
                txt_smp = prompt.transcript
            codes = prompt.codes if prompt is not None else None
            if call.speeds is not None:
                return [self._again(text, speed, ids, txt_smp, speaker, codes)
                        for text, speed, ids in zip(call.texts, call.speeds, refined, strict=True)]
            out = []
            for text, ids in zip(call.texts, refined, strict=True):
                p = self.frontend.prepare(text, call.voice, call.refine_prompt, ids, txt_smp=txt_smp,
                                          no_speaker=call.no_speaker, keep_unspeakable=call.keep_unspeakable,
                                          language=call.language)
                out.append(FrontendOutput(input_ids=p.input_ids, spk_emb=p.spk_emb, normalized_text=p.normalized,
                                          dropped=p.dropped, refine_ids=p.refine_ids, prompt_codes=codes,
                                          speed=p.speed))
            return out
        except RecordingError as exc:
            raise RequestError(str(exc), param=contract.IN_REFERENCE_AUDIO.name) from None
        except FrontendError as exc:
            raise RequestError(str(exc), param=contract.IN_TEXT.name) from None

    def _again(self, text: str, speed: int, refined_ids: np.ndarray | None, txt_smp: str | None,
               speaker: np.ndarray | None, codes: np.ndarray | None) -> FrontendOutput:
        """A text this front end made before, prompted again as it is (not normalised): from
        ``refined_ids`` when given. Not held to the text length limit: normalisation may
        lengthen a text the first call accepted past it. Raises FrontendError (refined ids
        outside the vocabulary, a speed outside 0..9)."""
        ids, spoken = self.frontend.code_prompt(text, speed, refined_ids, txt_smp=txt_smp, speaker=speaker is not None)
        return FrontendOutput(input_ids=ids, spk_emb=speaker, normalized_text=spoken, prompt_codes=codes, speed=speed)

    def _encode(self, call: FrontendCall) -> AudioPrompt:
        """The call's recording as an audio prompt: from the cache (checked, resampled,
        encoded on a miss), or, for a transient one (24 kHz, the first piece's own audio),
        encoded as it is. Raises RecordingError, RequestError (INTERNAL)."""
        assert call.reference_audio is not None
        if not call.transient_reference:
            return self.cache.get(call.reference_audio, call.reference_rate_hz, call.reference_text or "")
        if call.reference_rate_hz != contract.SAMPLE_RATE_HZ:
            raise RecordingError(f"a transient reference must be {contract.SAMPLE_RATE_HZ} Hz audio")
        try:
            codes = self.encode(np.asarray(call.reference_audio, np.float32))
        except ValueError as exc:
            raise RequestError(f"the first piece's audio cannot be encoded: {exc}", ErrorKind.INTERNAL) from None
        return AudioPrompt(np.asarray(codes, np.int32), call.reference_text or "")
