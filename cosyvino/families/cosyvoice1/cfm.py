"""Conditional flow matching ODE solver shared by every backend (numpy only, no torch).

Upstream: ``cosyvoice/flow/flow_matching.py`` (``ConditionalCFM.forward`` / ``solve_euler``),
Matcha-TTS. A backend only provides the estimator call; the time grid, the Euler steps and
classifier-free guidance live here once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

Estimator = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                     np.ndarray]


def cosine_time_grid(n_timesteps: int) -> np.ndarray:
    """Time points ``t_k = 1 - cos(k/n * pi/2)``, k = 0..n, float32 [n+1] (upstream cosine schedule).

    Upstream computes ``1 - torch.cos(torch.linspace(0, 1, n+1) * 0.5 * pi)`` in float32. Here the
    argument is formed in float32 and the cosine rounded once from float64, which is bit-equal
    to torch for n = 10 (v1); numpy's float32 ``cos`` is 1 ulp off there at k = 7. For other n,
    torch's linspace/cos may differ from this by 1 ulp (harmless: ~1e-7 in t).
    """
    lin = np.linspace(0.0, 1.0, n_timesteps + 1, dtype=np.float32)
    arg = (lin * np.float32(0.5 * np.pi)).astype(np.float32)
    cos = np.cos(arg.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) - cos).astype(np.float32)


def solve_euler_cfg(estimator: Estimator, noise: np.ndarray, mask: np.ndarray, mu: np.ndarray,
                    spks: np.ndarray, cond: np.ndarray, *, n_timesteps: int = 10,
                    cfg_rate: float = 0.7,
                    before_step: Callable[[], None] | None = None) -> np.ndarray:
    """Integrate the CFM ODE from noise (t=0) to a mel (t=1) with Euler steps and CFG.

    Args:
        estimator: ``f(x, mask, mu, t, spks, cond) -> velocity`` on a batch of 2
            (row 0 conditional, row 1 unconditional), shapes as in the estimator I/O contract:
            x/mu/cond float32 [2, 80, T], mask [2, 1, T], t [2], spks [2, 80].
        noise: initial state z, float32 [1, 80, T] (drawn by the caller, so runs are seeded).
        mask: float32 [1, 1, T], 1 for valid frames.
        mu: length-regulated encoder output, float32 [1, 80, T].
        spks: projected speaker embedding, float32 [1, 80].
        cond: prompt mel in the first frames and zeros elsewhere, float32 [1, 80, T].
        n_timesteps: Euler steps (10 for CosyVoice v1).
        cfg_rate: guidance rate; velocity = (1 + rate) * cond - rate * uncond (0.7 for v1).
        before_step: called before every estimator call; raising there (e.g.
            :class:`cosyvino.errors.SynthesisCancelled`) stops the solve within one call.

    Returns:
        mel, float32 [1, 80, T] (natural-log magnitude).
    """
    t_span = cosine_time_grid(n_timesteps)
    x = noise.astype(np.float32, copy=True)
    zeros_mu = np.zeros_like(mu)
    mask2 = np.concatenate([mask, mask], axis=0)
    mu2 = np.concatenate([mu, zeros_mu], axis=0)
    spks2 = np.concatenate([spks, np.zeros_like(spks)], axis=0)
    cond2 = np.concatenate([cond, np.zeros_like(cond)], axis=0)
    t = t_span[0]
    dt = t_span[1] - t_span[0]
    a = np.float32(1.0 + cfg_rate)
    b = np.float32(cfg_rate)
    for step in range(1, n_timesteps + 1):
        if before_step is not None:
            before_step()
        x2 = np.concatenate([x, x], axis=0)
        t2 = np.full((2,), t, dtype=np.float32)
        v = estimator(x2, mask2, mu2, t2, spks2, cond2)
        x = (x + dt * (a * v[:1] - b * v[1:2])).astype(np.float32)
        t = np.float32(t + dt)
        if step < n_timesteps:
            dt = np.float32(t_span[step + 1] - t)
    return x
