"""The code mode's partition top-p/top-k against the full-sort form it replaced
(``top_p_top_k_full_sort``): the same kept set and the same drawn code per uniform, over random
rows at every scale, ties, ``top_p = 1`` and ``top_k >= n``; and the batched repetition penalty
against the per-row one."""

from __future__ import annotations

import numpy as np

from chattts_serving import contract
from chattts_serving.engine.sampling import (
    _draw,
    _penalised,
    _penalised_rows,
    _top_p_top_k,
    top_p_top_k_full_sort,
)

N = contract.NUM_AUDIO_TOKENS


def _borderline(x: np.ndarray, top_p: float) -> bool:
    """True when some cumulative mass of the row's ascending order lies within float32 rounding
    of ``1 - top_p``: there the full sort's float32 cumsum and the partition form's float64 one
    may decide differently (the stated change)."""
    xs = np.sort(x.astype(np.float64))
    p = np.exp(xs - xs[-1])
    cum = np.cumsum(p / p.sum())
    return bool((np.abs(cum - (1.0 - top_p)) < 1e-5).any())


def _random_rows(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = rng.choice([0.05, 0.5, 1.0, 3.0, 10.0, 1e4], rows)
    x = (rng.normal(0, 1, (rows, N)) * scale[:, None]).astype(np.float32)
    ties = rng.random(rows) < 0.3  # rounded logits: many ties, also at the K-th value
    x[ties] = np.round(x[ties] * 2) / 2
    flat = rng.random(rows) < 0.05  # a constant row: every code tied
    x[flat] = 1.0
    top_p = rng.choice([0.01, 0.3, 0.7, 0.9, 0.999, 1.0], rows).astype(np.float32)
    top_k = rng.choice([1, 2, 3, 4, 20, 50, N - 1, N, N + 100], rows)
    return x, top_p, top_k


def test_partition_keeps_the_same_set_and_draws_the_same_code_as_the_full_sort() -> None:
    rng = np.random.default_rng(41)
    differ = 0
    for trial in range(200):
        rows = int(rng.choice([1, 4, 16, 64]))
        x, top_p, top_k = _random_rows(rng, rows)
        # batches of one kind of row as well as mixed ones (one k for all rows: the fast path)
        if trial % 3 == 0:
            top_k[:] = top_k[0]
        ours, ref = x.copy(), x.copy()
        _top_p_top_k(ours, top_p, top_k)
        top_p_top_k_full_sort(ref, top_p, top_k)
        u = rng.random(rows)
        for r in range(rows):
            same = np.array_equal(np.isfinite(ours[r]), np.isfinite(ref[r]))
            if not same:
                assert _borderline(x[r], float(top_p[r])), f"trial {trial} row {r}: kept sets differ off the boundary"
                differ += 1
                continue
            kept = np.isfinite(ours[r])
            np.testing.assert_array_equal(ours[r][kept], x[r][kept])
            assert kept.sum() >= min(3, N)
            assert _draw(ours[r:r + 1], u[r:r + 1])[0] == _draw(ref[r:r + 1], u[r:r + 1])[0]
    assert differ <= 5, differ


def test_partition_handles_ties_at_the_kth_value() -> None:
    """Ten codes tied at the 20th largest value: all of them stay candidates, as the stable
    sort keeps every value equal to its K-th."""
    x = np.linspace(-5, 5, N).astype(np.float32)[None].repeat(2, 0)
    x[:, N - 25:N - 15] = x[0, N - 20]
    ours, ref = x.copy(), x.copy()
    top_p, top_k = np.array([1.0, 0.99], np.float32), np.array([20, 20])
    _top_p_top_k(ours, top_p, top_k)
    top_p_top_k_full_sort(ref, top_p, top_k)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref))
    assert np.isfinite(ours[0]).sum() > 20


def test_batched_repetition_penalty_equals_per_row() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (12, N)).astype(np.float32)
    hists = [rng.integers(0, N, (4, steps)) for steps in (1, 16, 7)]
    penalty = np.repeat(np.array([1.05, 1.5, 2.0], np.float32), 4)
    got = _penalised_rows(x, hists, penalty)
    rows = [row for h in hists for row in h]
    for r in range(12):
        np.testing.assert_array_equal(got[r], _penalised(x[r], rows[r], float(penalty[r]), N))
