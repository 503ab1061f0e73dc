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

    # repetition penalty over each head's last 16 codes, all rows at once
    pen = [i for i, s in enumerate(samplers) if s.params.repetition_penalty != 1.0 and s.history]
    if pen:
        hists = [np.stack(samplers[i].history).T for i in pen]  # (4, steps) each
        rows = np.concatenate([np.arange(i * contract.NUM_VQ, (i + 1) * contract.NUM_VQ) for i in pen])
        penalty = np.repeat(np.array([samplers[i].params.repetition_penalty for i in pen], np.float32),
                            contract.NUM_VQ)
        x[rows] = _penalised_rows(x[rows], hists, penalty)

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
    _top_p_top_k(x, np.array([s.params.top_p for s in samplers], np.float32),
                 np.array([s.params.top_k for s in samplers], np.int64))
    for i, s in enumerate(samplers):
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


def _penalised_rows(x: np.ndarray, histories: list[np.ndarray], penalty: np.ndarray) -> np.ndarray:
    """:func:`_penalised` on rows (R, n) at once: ``histories`` holds (rows, steps) int arrays
    whose rows stack to R (one per row: the ids seen), ``penalty`` (R,) float32. Only the ids
    seen change (``alpha = penalty ** 0 = 1`` leaves the others as they are)."""
    n = x.shape[1]
    offsets = np.cumsum([0] + [h.shape[0] for h in histories])[:-1]
    flat = np.concatenate([((o + np.arange(h.shape[0]))[:, None] * n + h).ravel()
                           for o, h in zip(offsets, histories)])
    seen, count = np.unique(flat, return_counts=True)
    row, col = np.divmod(seen, n)
    alpha = np.power(penalty[row], count.astype(np.float32))
    v = x[row, col]
    out = x.copy()
    out[row, col] = np.where(v < 0, v * alpha, v / alpha)
    return out


def _top_p_top_k(x: np.ndarray, top_p: np.ndarray, top_k: np.ndarray) -> None:
    """transformers' ``TopPLogitsWarper`` then ``TopKLogitsWarper`` (both with
    ``min_tokens_to_keep=3``, as ChatTTS' ``gen_logits`` builds them), in place on finite rows
    (R, n) float32 with one top_p (R,) float and top_k (R,) int per row; what is filtered out
    becomes -inf.

    Without sorting whole rows (a stable argsort of every row was most of a code step's
    sampling at batch 16). Exact because top-k follows top-p: top-p removes a prefix of the
    ascending order, so whatever survives both lies among the ``K = max(top_k, 3)`` largest of
    the row (ties at the K-th value included: the candidates). Only the candidates are
    gathered (one ``np.argpartition`` for the batch at its rows' largest K, a second only where
    ties at a row's K-th value make more candidates) and sorted stably (value, then index), which is
    the tail of the row's stable ascending sort. A candidate's ascending cumulative mass is the
    mass of the non-candidates plus the cumulative mass of the candidates up to it: float32
    softmax probabilities with the normaliser over the whole row, accumulated in float64 and
    rounded to float32, as torch's CPU cumsum does (its accumulator for float is double). Top-p
    removes candidates whose cumulative mass is ``<= 1 - top_p`` except the 3 largest; top-k
    then keeps the survivors ``>=`` the K-th largest survivor.
    """
    r, n = x.shape
    keep = contract.MIN_TOKENS_TO_KEEP
    k = np.minimum(np.maximum(np.asarray(top_k, np.int64), keep), n)
    k_max = int(k.max())
    rows, ar = np.arange(r)[:, None], np.arange(r)
    idx = _largest(x, k_max)
    kth = np.sort(x[rows, idx], axis=1)[ar, k_max - k]  # each row's K-th largest value
    is_cand = x >= kth[:, None]
    c_max = int(is_cand.sum(axis=1).max())
    if c_max > k_max:
        # ties at some row's K-th value: gather the c_max largest instead, which hold every
        # row's candidates (a row's candidates are its c <= c_max largest values)
        idx = _largest(x, c_max)
    else:
        c_max = k_max  # each row's candidates are among its k_max largest
    vals = x[rows, idx]
    cand = vals >= kth[:, None]
    vals = np.where(cand, vals, -np.inf)
    order = np.lexsort((idx, vals), axis=1)  # ascending value, ties by index; non-candidates first
    idx, vals, cand = idx[rows, order], vals[rows, order], cand[rows, order]
    e = np.exp(x - vals[:, -1:])
    z = e.sum(axis=1, dtype=np.float32, keepdims=True)
    probs = e / z
    below = np.where(is_cand, np.float32(0), probs).sum(axis=1, dtype=np.float64)
    cum = (below[:, None] + np.cumsum(np.where(cand, probs[rows, idx], np.float32(0)), axis=1, dtype=np.float64)
           ).astype(np.float32)
    threshold = (np.float32(1.0) - np.asarray(top_p, np.float32))[:, None]
    survive = cand & ~(cum <= threshold)
    survive[:, -keep:] = cand[:, -keep:]
    # top-k among the survivors (a suffix of the candidates): the K-th largest survivor sits in
    # column c_max - K when at least K survived, else every survivor stays
    kth2 = np.where(survive[ar, c_max - k], vals[ar, c_max - k], -np.inf)
    kept = survive & (vals >= kth2[:, None])
    out = np.full_like(x, -np.inf)
    out[rows, idx] = np.where(kept, vals, -np.inf)
    x[:] = out


def _largest(x: np.ndarray, m: int) -> np.ndarray:
    """Column indices (R, m) of the m largest values of each row of x (R, n), in no order (ties
    at the m-th value: any of them)."""
    n = x.shape[1]
    if m >= n:
        return np.broadcast_to(np.arange(n), x.shape)
    return np.argpartition(x, n - m, axis=1)[:, n - m:]


def _top_p_top_k_row(row: np.ndarray, top_p: float, top_k: int) -> None:
    """:func:`_top_p_top_k` on one finite row (n,) in place."""
    x = row[None]
    _top_p_top_k(x, np.array([top_p], np.float32), np.array([top_k], np.int64))


def top_p_top_k_full_sort(x: np.ndarray, top_p: np.ndarray, top_k: np.ndarray) -> None:
    """The full-sort form of :func:`_top_p_top_k` that the code mode ran before it: a stable
    ascending argsort of every row, float32 softmax and cumulative sum in that order. Kept as
    the reference the partition form is tested and benchmarked against (tests/unit/test_sampling.py,
    scripts/bench_sampling.py); it keeps the same set except where a cumulative mass lies
    within float32 rounding of ``1 - top_p`` (its float32 cumsum against float64 there)."""
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
    k = np.minimum(np.maximum(top_k, keep), n)
    kth = np.where(remove_sorted, -np.inf, sorted_x)[np.arange(x.shape[0]), n - k]
    x[x < kth[:, None]] = -np.inf


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
