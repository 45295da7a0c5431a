"""The random input of the CosyVoice2 NSF source (numpy only, no torch).

Upstream ``SineGen2`` (``cosyvoice/hifigan/generator.py``, non-causal) draws a random initial
phase per harmonic and a standard-normal sample per harmonic and output sample on every call.
The initial phase is added at sample 0 only, which the frame-rate phase integration never reads,
so it has no effect (CosyVoice2 architecture sheet §6.2); the additive Gaussian noise is the only
randomness that reaches the waveform. cosyvino draws it on the host so every backend's source
stage is a pure function of (f0, noise) and a run is reproducible from a seed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["draw_sine_noise"]


def draw_sine_noise(rng: np.random.Generator, n_frames: int, nb_harmonics: int = 8,
                    hop: int = 480) -> np.ndarray:
    """Standard-normal noise of the SineGen2 source for ``n_frames`` mel frames.

    Args:
        rng: numpy random generator (e.g. ``numpy.random.default_rng(seed)``).
        n_frames: mel frames T (>= 0).
        nb_harmonics: harmonics above the fundamental (8 for CosyVoice2: 9 sines).
        hop: output samples per mel frame (480 at 24 kHz: ``prod(upsample_rates) *
            istft_hop_len``, sheet §2).

    Returns:
        float32 [1, nb_harmonics + 1, hop * n_frames], N(0, 1); the source stage scales it by
        ``nsf_sigma`` where voiced and ``nsf_alpha / 3`` where unvoiced. (Upstream's draw is
        laid out [1, hop * T, H]; this is its transpose.)

    Raises:
        ValueError: negative ``n_frames``/``nb_harmonics`` or non-positive ``hop``.
    """
    if n_frames < 0 or nb_harmonics < 0 or hop <= 0:
        raise ValueError(f"draw_sine_noise: bad sizes n_frames={n_frames}, "
                         f"nb_harmonics={nb_harmonics}, hop={hop}")
    return rng.standard_normal(size=(1, nb_harmonics + 1, hop * n_frames), dtype=np.float32)
