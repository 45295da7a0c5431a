"""RAS sampling draws exactly what a full stable sort draws (the nucleus step selects the
top-k tokens without sorting the whole vocabulary)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice1.sampling import _softmax, _top_order, nucleus_sample, ras_sample


def _nucleus_full_sort(logp, rng, top_p, top_k):
    """The nucleus draw written with a full stable sort (the definition)."""
    probs = _softmax(logp)
    order = np.argsort(-probs, kind="stable")
    sorted_p = probs[order]
    mass_before = np.cumsum(sorted_p) - sorted_p
    keep = (mass_before < top_p) & (np.arange(sorted_p.size) < top_k)
    kept = sorted_p[keep]
    return int(order[rng.choice(kept.size, p=kept / kept.sum())])


def _distributions(rng):
    v = 4097
    yield rng.standard_normal(v).astype(np.float32) * 3  # spread
    yield rng.standard_normal(v).astype(np.float32) * 30  # peaked
    flat = np.zeros(v, np.float32)
    yield flat  # every token tied
    ties = np.round(rng.standard_normal(v) * 2).astype(np.float32)  # many ties at the bound
    yield ties
    masked = rng.standard_normal(v).astype(np.float32)
    masked[rng.choice(v, 4000, replace=False)] = -np.inf  # fewer finite tokens than top_k
    yield masked
    few = np.full(v, -np.inf, np.float32)
    few[[5, 17, 4096]] = (0.0, 0.0, -1.0)
    yield few


@pytest.mark.parametrize("top_k", [1, 2, 25, 4096, 4097, 5000])
@pytest.mark.parametrize("top_p", [0.3, 0.8, 1.0])
def test_nucleus_draw_equals_the_full_sort(top_k, top_p):
    gen = np.random.default_rng(top_k * 10 + int(top_p * 10))
    for i, logp in enumerate(_distributions(gen)):
        for seed in range(4):
            got = nucleus_sample(logp, np.random.default_rng(seed), top_p, top_k)
            want = _nucleus_full_sort(logp, np.random.default_rng(seed), top_p, top_k)
            assert got == want, (i, seed)


def test_an_empty_nucleus_is_refused_as_before():
    logp = np.zeros(10, np.float32)
    for draw in (nucleus_sample, _nucleus_full_sort):
        with pytest.raises(ValueError):
            draw(logp, np.random.default_rng(0), 0.0, 5)  # top_p 0 keeps nothing


def test_top_order_is_the_stable_sort_prefix():
    gen = np.random.default_rng(0)
    for logp in _distributions(gen):
        p = _softmax(logp)
        full = np.argsort(-p, kind="stable")
        for k in (1, 3, 25, 100, p.size - 1, p.size, p.size + 3):
            np.testing.assert_array_equal(_top_order(p, k), full[:k])
    assert _top_order(np.array([0.2, 0.5, 0.3]), 0).size == 0


def test_ras_sample_sequence_unchanged():
    """A whole RAS decode (with re-draws on repetition) gives the full sort's tokens."""
    cfg = SamplingConfig(top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
    gen = np.random.default_rng(1)
    logits = gen.standard_normal((300, 4097)).astype(np.float32) * 4
    logits[:, 7] += 40  # one dominant token: the repetition re-draw happens
    got, want = [], []
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for row in logits:
        got.append(ras_sample(row, got, rng_a, cfg))
        # the reference: the same RAS rule around the full-sort nucleus draw
        tok = _nucleus_full_sort(row, rng_b, cfg.top_p, cfg.top_k)
        if want[-cfg.win_size:].count(tok) >= cfg.win_size * cfg.tau_r:
            masked = row.astype(np.float64, copy=True)
            masked[tok] = -np.inf
            tok = int(rng_b.choice(masked.size, p=_softmax(masked)))
        want.append(tok)
    assert got == want
    # the dominant token is drawn whenever the window allows it and re-drawn otherwise
    assert 20 <= got.count(7) <= 40
