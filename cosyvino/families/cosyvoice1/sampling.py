"""Repetition-aware sampling (RAS) of speech tokens, numpy only.

Upstream: ``cosyvoice/utils/common.py`` (``ras_sampling``, ``nucleus_sampling``,
``random_sampling``); method from VALL-E 2 (Chen et al. 2024, "repetition aware sampling").
Randomness comes from a caller-owned ``numpy.random.Generator`` so runs are reproducible.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cosyvino.families.cosyvoice1.config import SamplingConfig


def _softmax(logp: np.ndarray) -> np.ndarray:
    x = logp.astype(np.float64)
    x = x - np.max(x)
    p = np.exp(x)
    return p / p.sum()


def _top_order(probs: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` indices of ``np.argsort(-probs, kind="stable")`` (descending
    probability, ties by index) without sorting all of ``probs``: the ``k``-th largest value
    bounds the candidates, which are then sorted by (-p, index). A full stable sort of the 4097
    speech-token probabilities was ~45 % of a draw."""
    if not 0 < k < probs.size:
        return np.argsort(-probs, kind="stable")[:max(k, 0)]
    kth = np.partition(probs, probs.size - k)[probs.size - k]
    cand = np.flatnonzero(probs >= kth)  # ascending index: every tie at the bound included
    return cand[np.argsort(-probs[cand], kind="stable")][:k]


def nucleus_sample(logp: np.ndarray, rng: np.random.Generator, top_p: float, top_k: int) -> int:
    """Draw from the smallest prefix of the (stably) sorted distribution whose mass reaches
    ``top_p`` (the crossing token included), capped at ``top_k`` tokens."""
    probs = _softmax(logp)
    # only the first top_k tokens of the order can be kept; the prefix sums below are the
    # same as over the whole sorted array (np.cumsum adds in order)
    order = _top_order(probs, top_k)
    sorted_p = probs[order]
    mass_before = np.cumsum(sorted_p) - sorted_p
    keep = (mass_before < top_p) & (np.arange(sorted_p.size) < top_k)
    kept = sorted_p[keep]
    choice = rng.choice(kept.size, p=kept / kept.sum())
    return int(order[choice])


def ras_sample(logp: np.ndarray, decoded: Sequence[int], rng: np.random.Generator,
               cfg: SamplingConfig) -> int:
    """One RAS draw.

    Args:
        logp: float32 [V+1] log-probabilities (EOS already masked by the caller if needed).
        decoded: speech tokens emitted so far for this utterance.
        rng: random generator.
        cfg: top_p, top_k, win_size, tau_r (0.8, 25, 10, 0.1 for CosyVoice v1).

    Returns:
        The token id. If the nucleus draw already occurs at least ``win_size * tau_r`` times in
        the last ``win_size`` tokens, it is rejected and a token is re-drawn from the full
        distribution with the rejected token excluded (upstream HEAD behaviour since 2026-02;
        the v1-era code could re-draw the same token).
    """
    token = nucleus_sample(logp, rng, cfg.top_p, cfg.top_k)
    window = list(decoded[-cfg.win_size:]) if cfg.win_size > 0 else []
    if window.count(token) >= cfg.win_size * cfg.tau_r:
        masked = logp.astype(np.float64, copy=True)
        masked[token] = -np.inf
        if np.isfinite(masked).any():
            probs = _softmax(masked)
            token = int(rng.choice(probs.size, p=probs))
    return token
