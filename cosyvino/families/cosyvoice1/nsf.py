"""Random inputs of the HiFT neural-source-filter (NSF) source module (numpy only, no torch).

Upstream ``SineGen`` (``cosyvoice/hifigan/generator.py``) draws, on every call, one initial
phase per harmonic ~ U(-pi, pi) (zero for the fundamental) and one standard-normal sample per
harmonic and output sample. cosyvino draws them here, on the host, so every backend's source
stage is a pure function of (f0, phase, noise) and runs are reproducible from a seed.
"""

from __future__ import annotations

import numpy as np


def draw_source_noise(rng: np.random.Generator, n_frames: int, nb_harmonics: int = 8,
                      hop: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Draw the random phases and noise of the NSF source for ``n_frames`` mel frames.

    Args:
        rng: numpy random generator (e.g. ``numpy.random.default_rng(seed)``).
        n_frames: number of mel frames T (>= 0).
        nb_harmonics: harmonics above the fundamental (8 for v1: 9 sines in total).
        hop: output samples per mel frame (256 at 22050 Hz for v1:
            ``prod(upsample_rates) * istft_hop_len``).

    Returns:
        ``(phase, noise)``: ``phase`` float32 [1, nb_harmonics + 1], radians, uniform in
        [-pi, pi) with column 0 (the fundamental) exactly 0; ``noise`` float32
        [1, nb_harmonics + 1, hop * n_frames], standard normal (the source stage scales it).

    Raises:
        ValueError: negative ``n_frames``/``nb_harmonics`` or non-positive ``hop``.
    """
    if n_frames < 0 or nb_harmonics < 0 or hop <= 0:
        raise ValueError(f"draw_source_noise: bad sizes n_frames={n_frames}, "
                         f"nb_harmonics={nb_harmonics}, hop={hop}")
    dim = nb_harmonics + 1
    phase = rng.uniform(-np.pi, np.pi, size=(1, dim)).astype(np.float32)
    phase[:, 0] = 0.0
    noise = rng.standard_normal(size=(1, dim, hop * n_frames), dtype=np.float32)
    return phase, noise
