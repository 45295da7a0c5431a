"""Distances between a quantized model's mel / waveform and the fp32 reference (numpy only).

Mels are CosyVoice's natural-log magnitude mel spectrograms, float [1, 80, T] (or [80, T]);
waveforms are float [S]. Both arguments must have the same shape (same seeds and forced
tokens make them so); otherwise :class:`~cosyvino.errors.InputError`.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError

#: dB per natural-log unit of magnitude: 20 * log10(e^m) = m * 20 / ln(10)
DB_PER_NEPER = 20.0 / math.log(10.0)
#: SNR reported when the signals are bit-identical (finite, so JSON and guards stay simple)
SNR_IDENTICAL_DB = 200.0


def _pair(ref, test, what: str) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(ref, np.float64)
    t = np.asarray(test, np.float64)
    if r.shape != t.shape or r.size == 0:
        raise InputError(f"{what}: shapes differ or empty ({r.shape} vs {t.shape})")
    return r, t


def mel_l1(ref_mel, test_mel) -> float:
    """Mean absolute difference of the log-mels, in natural-log units (the L1 mel loss of
    HiFi-GAN / Matcha-TTS training, here as a distance)."""
    r, t = _pair(ref_mel, test_mel, "mel_l1")
    return float(np.mean(np.abs(r - t)))


def log_spectral_distance(ref_mel, test_mel) -> float:
    """Log-spectral distance in dB over mel bins.

    ``LSD = mean over frames of sqrt(mean over bins of (20 log10 |R| - 20 log10 |Q|)^2)``,
    the RMS log-spectral difference of A. H. Gray and J. D. Markel, "Distance measures for
    speech processing", IEEE Trans. ASSP 24(5), 1976, as used for speech super-resolution
    (e.g. V. Kuleshov et al., "Audio super resolution using neural networks", 2017), applied to
    mel magnitudes. The mels hold ln |X|, so 20 log10 |X| = ``DB_PER_NEPER`` * mel.
    """
    r, t = _pair(ref_mel, test_mel, "log_spectral_distance")
    r = r.reshape(-1, r.shape[-1])  # [bins, frames]
    t = t.reshape(-1, t.shape[-1])
    diff_db = DB_PER_NEPER * (r - t)
    return float(np.mean(np.sqrt(np.mean(diff_db ** 2, axis=0))))


def snr_db(ref_wav, test_wav) -> float:
    """Waveform signal-to-noise ratio in dB: ``10 log10(sum ref^2 / sum (ref - test)^2)``;
    :data:`SNR_IDENTICAL_DB` when the error is exactly zero."""
    r, t = _pair(ref_wav, test_wav, "snr_db")
    err = float(np.sum((r - t) ** 2))
    sig = float(np.sum(r ** 2))
    if err == 0.0:
        return SNR_IDENTICAL_DB
    if sig == 0.0:
        return -SNR_IDENTICAL_DB
    return min(SNR_IDENTICAL_DB, 10.0 * math.log10(sig / err))
