"""The CosyVoice2/3 CFM solve: the v1 Euler + classifier-free-guidance solver started from the
fixed noise table instead of a fresh draw.

Upstream ``CausalConditionalCFM.forward`` (``cosyvoice/flow/flow_matching.py``): ``z =
rand_noise[:, :, :T]``, cosine time grid, ``solve_euler`` with CFG on a batch of 2 (sheet v2
§5.4, unchanged from v1 §5.3, which :func:`cosyvino.families.cosyvoice1.cfm.solve_euler_cfg`
implements). numpy only; a backend provides the estimator call.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cosyvino.families.cosyvoice1.cfm import Estimator, solve_euler_cfg
from cosyvino.families.cosyvoice23.fixed_noise import noise_columns


def solve_fixed_noise(estimator: Estimator, noise_table: np.ndarray, mu: np.ndarray,
                      mask: np.ndarray, spks: np.ndarray, cond: np.ndarray, *,
                      n_timesteps: int = 10, cfg_rate: float = 0.7,
                      before_step: Callable[[], None] | None = None) -> np.ndarray:
    """Integrate the flow from the fixed noise.

    Args:
        estimator: ``f(x, mask, mu, t, spks, cond) -> velocity`` on a batch of 2 (the
            streaming/full attention choice is bound by the caller).
        noise_table: float32 ``[1, 80, frames]`` (:func:`make_cfm_noise_table`, or the table
            stored in a converted dir).
        mu: float32 ``[1, 80, T]`` (encoder_proj output, channel-major).
        mask: float32 ``[1, 1, T]``; spks float32 ``[1, 80]``; cond float32 ``[1, 80, T]``.
        n_timesteps: Euler steps (10); cfg_rate: guidance rate (0.7).
        before_step: called before every estimator call (cancellation point).
    Returns:
        mel, float32 ``[1, 80, T]`` (prompt frames included).
    Raises:
        InputError: ``T`` exceeds the noise table.
    """
    z = noise_columns(noise_table, mu.shape[-1])
    return solve_euler_cfg(estimator, z, mask, mu, spks, cond, n_timesteps=n_timesteps,
                           cfg_rate=cfg_rate, before_step=before_step)
