"""ChatTTS' optional refine-text stage: prompts, parameters and decoding (pure logic).

ChatTTS 0.2.5's ``Chat.infer(..., skip_refine_text=False)`` (``ChatTTS/core.py``: ``_infer``
and ``_refine_text``) runs the GPT in text mode before the speech codes:

1. the normalised text becomes the prompt ``[Sbreak]{text}[Pbreak]{prompt}``
   (``Speaker.decorate_text_prompts``), tokenised without special tokens and embedded with
   ``emb_text`` only (no speaker vector): :func:`refine_prompt_ids`;
2. ``GPT.generate(infer_text=True)`` samples from the text head with the parameters of
   ``RefineTextParams`` (:class:`RefineParams`) until ``[Ebreak]`` (not included) or
   ``max_new_token``. In this project the engine does it: a
   :class:`~chattts_serving.engine.sequence.Sequence` in text mode
   (:class:`~chattts_serving.contract.SequenceMode`);
3. the generated ids are turned back into text: ids from ``[break_0]`` (21147) up are
   dropped (``[break_N]``, ``[laugh_N]``, ``[oral_N]``, ``[speed_N]``), ids below it are kept,
   ``[uv_break]``, ``[laugh]`` and ``[lbreak]`` included, and the tokenizer decodes them with
   ``skip_special_tokens=False`` (BERT's decode puts spaces between tokens, so Chinese comes
   back as ``你 好 [uv_break] 。``): :func:`decode_refined`;
4. that text, not normalised again, is the code stage's text: ``[Stts]``, ``[spk_emb]`` and
   ``[empty_spk]`` are removed and it is stripped (``Speaker.decorate_code_prompts``), then
   ``[Stts][spk_emb][speed_N]{text}[Ptts]`` is tokenised: :func:`code_prompt_ids`.

Differences from ChatTTS, on purpose: when the first sampled token is ``[Ebreak]`` ChatTTS
regenerates without bound (unless ``manual_seed`` is set, then it returns empty text); here the
sequence ends with no tokens and :func:`code_stage_text` falls back to the unrefined text. A
repetition penalty other than 1.0 raises inside ChatTTS 0.2.5's text mode (see
:func:`chattts_serving.engine.sampling.sample_text_batch`); here it works as in the code mode.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

import numpy as np

from .. import contract
from ..params import ParamError, SamplingParams, check_params

__all__ = ["BREAK_0_ID", "REFINE_PARAMS", "RefineParams", "code_prompt_ids", "code_stage_text", "decode_refined",
           "load_tokenizer", "refine_prompt", "refine_prompt_ids", "speech_prompt_ids"]

BREAK_0_ID: Final = contract.SPECIAL_TOKEN_IDS["[break_0]"]
"""ChatTTS' ``tokenizer.break_0_ids`` (21147): refined ids ``>=`` this are dropped before
decoding (``text_tokens = [i[i.less(self.tokenizer.break_0_ids)] ...]`` in ``Chat._infer``)."""

PROMPT_TOKEN: Final = re.compile(r"\[(?:oral_[0-9]|laugh_[0-2]|break_[0-7])\]")
"""The control tokens a refine prompt may hold (ChatTTS' documented use:
``RefineTextParams(prompt='[oral_2][laugh_0][break_6]')``)."""
MAX_PROMPT_TOKENS: Final = 16

REFINE_PARAMS: Final = contract.REFINE_PARAMS
"""Numeric refine parameters (see ``contract.REFINE_PARAMS``): defaults are ChatTTS 0.2.5's
``Chat.RefineTextParams``; ranges as the code stage's ``contract.SAMPLING_PARAMS`` with top_k
up to the text vocabulary (21178). ``spec.tensor()`` gives an optional [1] input."""

_SPEC = {p.name: p for p in REFINE_PARAMS}


@dataclass(frozen=True)
class RefineParams:
    """Parameters of one refine-text request (defaults: ChatTTS' ``RefineTextParams``).

    prompt: control tokens appended after ``[Pbreak]`` (ChatTTS' ``RefineTextParams.prompt``,
    default ''), e.g. ``[oral_2][laugh_0][break_6]``; temperature, top_p, top_k,
    repetition_penalty, max_new_tokens, min_new_tokens: as in :data:`REFINE_PARAMS` (ChatTTS'
    top_P, top_K, max_new_token, min_new_token); seed: the engine sampler's seed (ChatTTS'
    ``manual_seed``; the random source differs, see :mod:`chattts_serving.engine.sampling`).
    """

    prompt: str = ""
    temperature: float = float(_SPEC["temperature"].default)
    top_p: float = float(_SPEC["top_p"].default)
    top_k: int = int(_SPEC["top_k"].default)
    repetition_penalty: float = float(_SPEC["repetition_penalty"].default)
    max_new_tokens: int = int(_SPEC["max_new_tokens"].default)
    min_new_tokens: int = int(_SPEC["min_new_tokens"].default)
    seed: int = int(_SPEC["seed"].default)

    def validate(self, max_new_tokens_cap: int | None = None) -> RefineParams:
        """Return self when every field is valid.

        Raises:
            ParamError: a number outside its range in :data:`REFINE_PARAMS` (message names
                the field as ``refine_<name>``), a non-integer top_k/max_new_tokens/
                min_new_tokens/seed, min_new_tokens > max_new_tokens, max_new_tokens over
                ``max_new_tokens_cap``, or a prompt that is not a sequence of at most 16 of
                ``[oral_0-9]``, ``[laugh_0-2]``, ``[break_0-7]``.
        """
        check_params(self, REFINE_PARAMS, max_new_tokens_cap, prefix=contract.REFINE_PREFIX)
        if not isinstance(self.prompt, str):
            raise ParamError(f"refine_prompt must be a string, got {type(self.prompt).__name__}")
        tokens = PROMPT_TOKEN.findall(self.prompt)
        if "".join(tokens) != self.prompt or len(tokens) > MAX_PROMPT_TOKENS:
            raise ParamError(f"refine_prompt {self.prompt[:80]!r} must be at most {MAX_PROMPT_TOKENS} control tokens "
                             "among [oral_0-9], [laugh_0-2], [break_0-7], e.g. '[oral_2][laugh_0][break_6]'")
        return self

    def sampling_params(self) -> SamplingParams:
        """These parameters as the engine's :class:`SamplingParams` (not validated against the
        code stage's ranges: top_k may exceed 626)."""
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(SamplingParams)})


def load_tokenizer(artifacts_root: Any) -> Any:
    """The checkpoint's ``BertTokenizerFast`` from ``<artifacts>/tokenizer`` (what ChatTTS'
    ``Tokenizer`` wraps). Raises OSError when the directory is missing."""
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return BertTokenizerFast.from_pretrained(str(Path(artifacts_root) / contract.TOKENIZER_DIR))


def refine_prompt(text: str, prompt: str = "") -> str:
    """``[Sbreak]{text}[Pbreak]{prompt}``: ChatTTS' ``Speaker.decorate_text_prompts``.
    ``text`` is the normalised text (``Prepared.normalized`` of the front end, which, like
    ChatTTS' ``_infer``, normalises before refining)."""
    return f"[Sbreak]{text}[Pbreak]{prompt}"


def refine_prompt_ids(tokenizer: Any, text: str, prompt: str = "") -> np.ndarray:
    """Prompt ids (T,) int32 of the refine-text sequence, as ChatTTS'
    ``Tokenizer.encode(decorate_text_prompts([text], prompt), num_vq)`` gives them (column 0,
    no padding for one text): ``add_special_tokens=False``.

    Raises:
        ValueError: ``text`` is empty or only whitespace.
    """
    if not text.strip():
        raise ValueError("refine text is empty")
    ids = tokenizer(refine_prompt(text, prompt), add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int32)


def decode_refined(tokenizer: Any, ids: Any) -> str:
    """The refined text of generated ids (N,) ints, as ChatTTS' ``Chat._infer`` makes it:
    ids ``>= BREAK_0_ID`` dropped, then ``tokenizer.batch_decode`` with
    ``skip_special_tokens=False`` and the tokenizer's own ``clean_up_tokenization_spaces``.
    The end token is never among the ids (the engine does not emit it)."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    kept = [int(i) for i in arr[arr < BREAK_0_ID]]
    return str(tokenizer.batch_decode([kept], skip_special_tokens=False, clean_up_tokenization_spaces=None)[0])


_CODE_PROMPT_REMOVED: Final = ("[Stts]", "[spk_emb]", "[empty_spk]")
_SPOKEN = re.compile(r"[^\W_]")


def code_stage_text(refined: str, fallback: str) -> str:
    """The text the code stage speaks after refinement: ``refined`` with ``[Stts]``,
    ``[spk_emb]`` and ``[empty_spk]`` removed and stripped (ChatTTS'
    ``Speaker.decorate_code_prompts``), or ``fallback`` (the unrefined normalised text) when
    nothing speakable (no letter or digit outside ``[...]`` tokens) is left."""
    text = refined
    for tok in _CODE_PROMPT_REMOVED:
        text = text.replace(tok, "")
    text = text.strip()
    return text if _SPOKEN.search(re.sub(r"\[[^\]]*\]", "", text)) else fallback


def code_prompt_ids(tokenizer: Any, refined: str, fallback: str, speed: int = 5, txt_smp: str | None = None,
                    speaker: bool = True) -> np.ndarray:
    """Code-stage prompt ids (T,) int32 for refined text: :func:`speech_prompt_ids` of
    ``code_stage_text(refined, fallback)``, not normalised again (ChatTTS normalises before
    refining only). The ``[spk_emb]`` position takes the speaker vector as for unrefined
    prompts (the front end's ``Prepared.spk_emb``).

    Raises:
        ValueError: ``speed`` outside 0..9.
    """
    return speech_prompt_ids(tokenizer, code_stage_text(refined, fallback), speed, txt_smp, speaker)


def speech_prompt_ids(tokenizer: Any, text: str, speed: int = 5, txt_smp: str | None = None,
                      speaker: bool = True) -> np.ndarray:
    """Prompt ids (T,) int32 of the code (speech) stage, ChatTTS 0.2.5's
    ``Speaker.decorate_code_prompts`` with ``InferCodeParams(prompt='[speed_N]', txt_smp=...)``:
    ``[Stts][spk_emb]{txt_smp}[speed_N]{text}[Ptts]`` with a speaker vector,
    ``[Stts][empty_spk]...`` without one (``speaker=False``: ChatTTS' ``spk_emb=None``, the
    usual way to speak with only a reference recording), tokenised as ChatTTS'
    ``Tokenizer.encode`` does (``add_special_tokens=False``, the whole string at once).
    ``text`` (normalised or refined) has ``[Stts]``, ``[spk_emb]`` and ``[empty_spk]`` removed
    and is stripped; ``txt_smp`` (a reference recording's transcript, or the first piece's text
    in ChatTTS' multi-sentence flow) is inserted as it is, not normalised, nothing when None.
    With an audio prompt the engine appends its codes after these ids
    (``SequenceRequest.prompt_codes``); without a speaker the sequence takes ``spk_emb=None``
    (``[empty_spk]`` is embedded as text).

    Raises:
        ValueError: ``speed`` outside 0..9.
    """
    if not isinstance(speed, (int, np.integer)) or not 0 <= int(speed) <= 9:
        raise ValueError(f"speed must be an integer in [0, 9], got {speed!r}")
    for tok in _CODE_PROMPT_REMOVED:
        text = text.replace(tok, "")
    spk = "[spk_emb]" if speaker else "[empty_spk]"
    prompt = f"[Stts]{spk}{txt_smp or ''}[speed_{int(speed)}]{text.strip()}[Ptts]"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int32)
