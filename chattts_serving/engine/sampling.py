"""Per-request sampling of ChatTTS codes, vectorised over a batch.

Reproduces ChatTTS 0.2.5's ``GPT.generate`` logits pipeline (``ChatTTS/model/gpt.py`` and
``processors.py``), per row of 626 logits (one row per request and code head):

1. divide by the temperature;
2. ChatTTS' repetition penalty: for each code seen ``n`` times in the last 16 steps of that
   head, ``alpha = penalty ** n``; negative logits are multiplied by alpha, others divided;
3. top-p (transformers' ``TopPLogitsWarper``, ``min_tokens_to_keep=3``): sort ascending, drop
   tokens whose cumulative softmax mass is ``<= 1 - top_p``, always keeping the top 3;
4. top-k (``TopKLogitsWarper``, ``min_tokens_to_keep=3``): keep logits ``>=`` the
   ``max(top_k, 3)``-th largest;
5. before ``min_new_tokens`` steps, the end code (625) is set to -inf;
6. softmax, then one draw per row from the request's own ``numpy.random.Generator``
   (PCG64 seeded with the request's seed), by inverse CDF.

:func:`sample_text_batch` does the same for the text mode (ChatTTS' refine-text stage): one
row of 21178 text logits per request, end token ``[Ebreak]``.

The only difference from ChatTTS is the random source (ChatTTS draws with torch.multinomial
from a generator it re-seeds every step); with a temperature near 0 both pick the argmax, which
the greedy-equality test relies on.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .. import contract
from ..params import SamplingParams


class RequestSampler:
    """The sampling state of one request: its generator and its last 16 steps of codes."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.history: deque[np.ndarray] = deque(maxlen=contract.REPETITION_WINDOW)
        self.steps = 0

    def record(self, codes: np.ndarray) -> None:
        """Remember the codes (4,) chosen at this step."""
        self.history.append(codes.copy())
        self.steps += 1


def sample_batch(logits: np.ndarray, samplers: list[RequestSampler]) -> np.ndarray:
    """Sample one step's codes for a batch.

    Args:
        logits: (B, 4, 626) float32 code-head logits; row b belongs to ``samplers[b]``.
        samplers: one per row; each draws from its own generator.

    Returns:
        codes: (B, 4) int64 in [0, 625]; 625 (EOS) on any head ends that sequence.
    """
    b = logits.shape[0]
    n = contract.NUM_AUDIO_TOKENS
    x = logits.reshape(b * contract.NUM_VQ, n).astype(np.float32, copy=True)
    temp = np.repeat(np.array([s.params.temperature for s in samplers], np.float32), contract.NUM_VQ)
    x /= temp[:, None]

    # repetition penalty over each head's last 16 codes
    for i, s in enumerate(samplers):
        if s.params.repetition_penalty == 1.0 or not s.history:
            continue
        hist = np.stack(s.history)  # (steps, 4)
        rows = x[i * contract.NUM_VQ:(i + 1) * contract.NUM_VQ]
        for q in range(contract.NUM_VQ):
            rows[q] = _penalised(rows[q], hist[:, q], s.params.repetition_penalty, n)

    top_p = np.repeat(np.array([s.params.top_p for s in samplers], np.float32), contract.NUM_VQ)
    top_k = np.repeat(np.array([s.params.top_k for s in samplers]), contract.NUM_VQ)
    _top_p_top_k(x, top_p, top_k)
    # min_new_tokens
    for i, s in enumerate(samplers):
        if s.steps < s.params.min_new_tokens:
            x[i * contract.NUM_VQ:(i + 1) * contract.NUM_VQ, contract.EOS_CODE] = -np.inf

    codes = _draw(x, np.concatenate([s.rng.random(contract.NUM_VQ) for s in samplers]))
    return codes.reshape(b, contract.NUM_VQ).astype(np.int64)


def sample_text_batch(logits: np.ndarray, samplers: list[RequestSampler], eos_id: int) -> np.ndarray:
    """Sample one step's text tokens for a batch of text-mode (refine) sequences.

    ChatTTS 0.2.5's ``GPT.generate(infer_text=True)`` as ``Chat._refine_text`` calls it
    (``ChatTTS/core.py``, ``ChatTTS/model/gpt.py``, ``ChatTTS/model/processors.py``), per row
    of the text vocabulary: divide by the temperature; repetition penalty (only when it is not
    1.0, ChatTTS' default for refinement); top-p then top-k (transformers' warpers with
    ``min_tokens_to_keep=3``); before ``min_new_tokens`` steps ``eos_id`` is set to -inf;
    softmax; one draw from the request's own generator (one uniform per row and step).

    The repetition penalty counts each id among the row's last 16 generated tokens, as the
    code mode does per head. ChatTTS 0.2.5 itself cannot run a penalty other than 1.0 in text
    mode: its processor gets a (B, n, 1) history there, whose one-hot sum broadcasts to
    (B, B, V) and the sampler then fails ("index ... is out of bounds"); ours applies the
    penalty the processor describes.

    Args:
        logits: (B, V) float32 text-head logits (V = 21178); row b belongs to ``samplers[b]``.
        samplers: one per row; ``history`` holds (4,) arrays whose column 0 is the text id.
        eos_id: the end token (``[Ebreak]``, 21136, ChatTTS' ``tokenizer.eos_token``).

    Returns:
        ids: (B,) int64 in [0, V); ``eos_id`` ends that sequence.
    """
    n = logits.shape[1]
    x = logits.astype(np.float32, copy=True)
    x /= np.array([s.params.temperature for s in samplers], np.float32)[:, None]
    for i, s in enumerate(samplers):
        if s.params.repetition_penalty != 1.0 and s.history:
            x[i] = _penalised(x[i], np.stack(s.history)[:, 0], s.params.repetition_penalty, n)
    for i, s in enumerate(samplers):
        _top_p_top_k_row(x[i], s.params.top_p, s.params.top_k)
        if s.steps < s.params.min_new_tokens:
            x[i, eos_id] = -np.inf
    return _draw(x, np.concatenate([s.rng.random(1) for s in samplers])).astype(np.int64)


def _penalised(row: np.ndarray, history: np.ndarray, penalty: float, n: int) -> np.ndarray:
    """ChatTTS' ``CustomRepetitionPenaltyLogitsProcessorRepeat`` on one row (n,) given the
    ids seen (steps,): ``alpha = penalty ** count``; negative logits times alpha, others
    divided by it."""
    freq = np.bincount(history, minlength=n)[:n]
    alpha = np.power(np.float32(penalty), freq.astype(np.float32))
    return np.where(row < 0, row * alpha, row / alpha)


def _top_p_top_k(x: np.ndarray, top_p: np.ndarray, top_k: np.ndarray) -> None:
    """transformers' ``TopPLogitsWarper`` then ``TopKLogitsWarper`` (both with
    ``min_tokens_to_keep=3``, as ChatTTS' ``gen_logits`` builds them), in place on rows
    (R, n) with one top_p (R,) float32 and top_k (R,) int per row."""
    n = x.shape[1]
    keep = contract.MIN_TOKENS_TO_KEEP
    order = np.argsort(x, axis=1, kind="stable")
    sorted_x = np.take_along_axis(x, order, axis=1)
    probs = _softmax(sorted_x)
    cum = np.cumsum(probs, axis=1)
    remove_sorted = cum <= (1.0 - top_p)[:, None]
    remove_sorted[:, -keep:] = False
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=1)
    x[remove] = -np.inf
    # the k-th largest value left after top-p, read from the ascending sort above (top-p removed
    # a prefix of it). np.partition with one kth per row partitions every row at all of them:
    # with top_k = 626 and most codes removed by top-p, up to 100 ms per step at batch 16.
    k = np.minimum(np.maximum(top_k, keep), n)
    kth = np.where(remove_sorted, -np.inf, sorted_x)[np.arange(x.shape[0]), n - k]
    x[x < kth[:, None]] = -np.inf


def _top_p_top_k_row(row: np.ndarray, top_p: float, top_k: int) -> None:
    """:func:`_top_p_top_k` on one finite row (n,) in place, without sorting the whole row (a
    stable argsort of the 21178 text logits cost more than the rest of a text step).

    Exact because top-k follows top-p: top-p removes a prefix of the ascending order, so
    whatever survives both lies among the ``K = max(top_k, 3)`` largest (ties at the K-th
    value included). Only those candidates are sorted (stably, as the full sort orders them);
    a candidate's ascending cumulative mass is ``1 - (mass of the candidates after it)``, with
    the softmax normaliser taken over the whole row (float64).
    """
    n = row.shape[0]
    keep = contract.MIN_TOKENS_TO_KEEP
    k = min(max(int(top_k), keep), n)
    kth = np.partition(row, n - k)[n - k]
    is_cand = row >= kth
    cand = np.flatnonzero(is_cand)
    vals = row[cand]
    order = np.lexsort((cand, vals))  # ascending value, ties by index: a stable ascending sort
    cand, vals = cand[order], vals[order]
    # float32 softmax probabilities; cumulative sums accumulated in float64 and rounded to
    # float32, as torch's CPU cumsum does (its accumulator type for float is double)
    e = np.exp(row - vals[-1])
    probs = e / e.sum(dtype=np.float32)
    below = probs[~is_cand].sum(dtype=np.float64)
    cum = (below + np.cumsum(probs[cand], dtype=np.float64)).astype(np.float32)
    remove = cum <= np.float32(1.0 - np.float32(top_p))
    remove[-keep:] = False
    survivors, s_vals = cand[~remove], vals[~remove]
    if len(survivors) >= k:
        kth2 = np.sort(s_vals)[len(s_vals) - k]
        survivors = survivors[s_vals >= kth2]
    kept = row[survivors].copy()
    row[:] = -np.inf
    row[survivors] = kept


def _draw(x: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One token per row of filtered logits (R, n) by inverse CDF of their softmax, with one
    uniform in [0, 1) per row; returns (R,) int64."""
    n = x.shape[1]
    p = _softmax(x)
    cdf = np.cumsum(p, axis=1)
    u = uniforms * cdf[:, -1]
    codes = (cdf <= u[:, None]).sum(axis=1)
    codes = np.minimum(codes, n - 1)
    # never pick a token of zero probability (guards float round-off at the top of the CDF)
    bad = p[np.arange(len(codes)), codes] == 0
    if bad.any():
        codes[bad] = np.argmax(p[bad], axis=1)
    return codes.astype(np.int64)


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=1, keepdims=True)
