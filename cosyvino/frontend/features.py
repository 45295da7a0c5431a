"""Audio feature extractors of the CosyVoice v1 frontend, numpy only (no torch, no librosa).

Three features, each reproducing the official implementation's numbers:

* :func:`campplus_fbank` — input of ``campplus.onnx`` (speaker embedding): Kaldi-compatible
  log-mel filterbank (``torchaudio.compliance.kaldi.fbank`` defaults: 25 ms / 10 ms frames,
  povey window, pre-emphasis 0.97, DC removal, 512-point power spectrum, 80 mel bins from 20 Hz,
  ``snip_edges``), then per-utterance mean normalization (upstream ``frontend.py``).
* :func:`whisper_log_mel` — input of ``speech_tokenizer_v1.onnx``: whisper's
  ``log_mel_spectrogram(n_mels=128)`` (openai-whisper ``audio.py``).
* :func:`prompt_mel` — flow prompt feature: Matcha-TTS ``mel_spectrogram`` (n_fft 1024, hop 256,
  80 mels, fmax 8000, ``center=False`` with reflect padding), natural log; :func:`prompt_mel_of`
  takes the parameters from a mel config (CosyVoice2: 24 kHz, n_fft 1920, hop 480).

Mel filter banks: Slaney-style (librosa ``filters.mel`` defaults: slaney scale, slaney area
norm) for whisper and Matcha; Kaldi's ``1127 ln(1 + f/700)`` triangles for the fbank.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import InputError


def _mono(wav: np.ndarray, min_samples: int, what: str) -> np.ndarray:
    x = np.asarray(wav, dtype=np.float64)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise InputError(f"{what}: expected mono audio [N] or [1, N], got shape {list(x.shape)}")
    if x.size < min_samples:
        raise InputError(f"{what}: audio too short ({x.size} samples, need >= {min_samples})")
    if not np.isfinite(x).all():
        raise InputError(f"{what}: audio contains NaN or infinity")
    return x


# ---- mel filter banks ------------------------------------------------------------------------

def _hz_to_mel_slaney(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz)
                    / logstep, f / f_sp)


def _mel_to_hz_slaney(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=8)
def slaney_mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                       fmax: float | None = None) -> np.ndarray:
    """Slaney mel filter bank [n_mels, n_fft // 2 + 1] (librosa ``filters.mel`` defaults)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_freqs = np.linspace(0, sample_rate / 2, 1 + n_fft // 2)
    mel_pts = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax),
                                            n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = mel_pts[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_pts[2:n_mels + 2] - mel_pts[:n_mels]))[:, None]
    return weights


@lru_cache(maxsize=4)
def kaldi_mel_banks(n_mels: int, n_fft: int, sample_rate: int, low_freq: float,
                    high_freq: float) -> np.ndarray:
    """Kaldi triangular mel banks [n_mels, n_fft // 2 + 1] (last column, Nyquist, is zero)."""
    def mel(f):
        return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)

    n_bins = n_fft // 2
    fft_mel = mel(np.arange(n_bins) * sample_rate / n_fft)
    lo, hi = mel(low_freq), mel(high_freq)
    delta = (hi - lo) / (n_mels + 1)
    left = lo + np.arange(n_mels)[:, None] * delta
    center, right = left + delta, left + 2 * delta
    up = (fft_mel[None, :] - left) / (center - left)
    down = (right - fft_mel[None, :]) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.concatenate([banks, np.zeros((n_mels, 1))], axis=1)


# ---- framing / STFT --------------------------------------------------------------------------

def _frames(x: np.ndarray, length: int, hop: int) -> np.ndarray:
    n = 1 + (x.size - length) // hop
    idx = np.arange(length)[None, :] + hop * np.arange(n)[:, None]
    return x[idx]


def _hann_periodic(n: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


# ---- features --------------------------------------------------------------------------------

def campplus_fbank(wav_16k: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """Mean-normalized Kaldi fbank of 16 kHz audio in [-1, 1] -> float32 [T, n_mels].

    T = 1 + (N - 400) // 160. Raises InputError for audio shorter than one 25 ms frame.
    """
    sr, length, hop, n_fft = 16000, 400, 160, 512
    x = _mono(wav_16k, length, "campplus_fbank")
    frames = _frames(x, length, hop)
    frames = frames - frames.mean(axis=1, keepdims=True)
    prev = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = frames - 0.97 * prev
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / (length - 1))) ** 0.85
    spec = np.abs(np.fft.rfft(frames * window, n=n_fft, axis=1)) ** 2
    mel = spec @ kaldi_mel_banks(n_mels, n_fft, sr, 20.0, sr / 2).T
    feat = np.log(np.maximum(mel, np.finfo(np.float32).eps))
    return (feat - feat.mean(axis=0, keepdims=True)).astype(np.float32)


def whisper_log_mel(wav_16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """Whisper log-mel of 16 kHz audio -> float32 [1, n_mels, N // 160].

    n_fft 400, hop 160, periodic Hann, centred (reflect pad 200), last frame dropped, power
    spectrum, Slaney mel, log10 floored at max - 8, then (x + 4) / 4.
    """
    n_fft, hop = 400, 160
    x = _mono(wav_16k, n_fft // 2 + 1, "whisper_log_mel")
    x = np.pad(x, n_fft // 2, mode="reflect")
    frames = _frames(x, n_fft, hop)[:-1]
    power = np.abs(np.fft.rfft(frames * _hann_periodic(n_fft), axis=1)) ** 2
    mel = slaney_mel_filters(16000, n_fft, n_mels) @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)[None]


def prompt_mel(wav: np.ndarray, sample_rate: int = 22050, n_fft: int = 1024, hop: int = 256,
               n_mels: int = 80, fmin: float = 0.0, fmax: float | None = 8000.0,
               win: int | None = None) -> np.ndarray:
    """Matcha mel of prompt audio at ``sample_rate`` -> float32 [1, n_mels, T], T = N // hop.

    Reflect-pad (n_fft - hop) / 2 each side, STFT without centring, periodic Hann of ``win``
    samples (default ``n_fft``; a shorter window is zero-padded to ``n_fft`` in the middle, as
    ``torch.stft`` does), magnitude sqrt(re^2 + im^2 + 1e-9), Slaney mel, natural log of
    max(x, 1e-5). The flow takes it time-major ([1, T, n_mels]). Defaults: the v1 flow prompt
    mel (22.05 kHz, sheet v1 §3.6); CosyVoice2's is 24 kHz, n_fft = win 1920, hop 480 (sheet v2
    §3.6; :func:`prompt_mel_of` with a mel config).

    Raises: InputError for audio of at most (n_fft - hop) / 2 samples, NaN/inf, or ``win``
    outside 1..n_fft.
    """
    win = n_fft if win is None else win
    if not 0 < win <= n_fft:
        raise InputError(f"prompt_mel: window {win} must be in 1..n_fft ({n_fft})")
    pad = (n_fft - hop) // 2
    x = _mono(wav, pad + 1, "prompt_mel")
    x = np.pad(x, pad, mode="reflect")
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left:left + win] = _hann_periodic(win)
    spec = np.fft.rfft(_frames(x, n_fft, hop) * window, axis=1)
    mag = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    mel = slaney_mel_filters(sample_rate, n_fft, n_mels, fmin, fmax) @ mag.T
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)[None]


def prompt_mel_of(wav: np.ndarray, mel) -> np.ndarray:
    """:func:`prompt_mel` with the parameters of ``mel``, a yaml ``feat_extractor`` as
    :class:`cosyvino.families.cosyvoice1.config.MelConfig` holds it (``n_fft``, ``num_mels``,
    ``sampling_rate``, ``hop_size``, ``win_size``, ``fmin``, ``fmax``); ``wav`` must be at
    ``mel.sampling_rate``. -> float32 [1, num_mels, N // hop_size]."""
    return prompt_mel(wav, sample_rate=mel.sampling_rate, n_fft=mel.n_fft, hop=mel.hop_size,
                      n_mels=mel.num_mels, fmin=mel.fmin, fmax=mel.fmax, win=mel.win_size)
