"""The prompt alignment and prompt-rate check CosyVoice2 and CosyVoice3 share (sheet v2 §2, §3.6,
§3.8; v3 §3.1: the v2 prompt plumbing): both take 25 Hz speech tokens and a 24 kHz, hop-480 prompt
mel (50 frames/s, 2 per token). A :class:`~cosyvino.voices.Voice` keeps the uncut prompt; the
family cuts it per mode (:func:`align_prompt`). Must not import torch.
"""

from __future__ import annotations

import numpy as np

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.config import MelConfig

#: mel frames per speech token (``token_mel_ratio``, sheet v2 §2)
TOKEN_MEL_RATIO = 2
#: the 24 kHz flow prompt mel (sheet v2 §2, §3.6; the recipe yaml's ``feat_extractor``)
PROMPT_MEL = MelConfig(n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480,
                       win_size=1920, fmin=0.0, fmax=8000.0)
#: how far (relative) a voice's prompt mel rate may be from the model's: a v2 prompt has
#: samples // hop frames (under one frame short), a CosyVoice v1 voice is 72 % off (22.05 kHz,
#: hop 256: 86.1 frames/s; 1.72 frames per 50 Hz token)
RATE_TOLERANCE = 0.1


def align_prompt(tokens: np.ndarray, mel: np.ndarray, *,
                 token_mel_ratio: int = TOKEN_MEL_RATIO) -> tuple[np.ndarray, np.ndarray]:
    """The prompt alignment of zero-shot, cross-lingual and instruct2 (sheet v2 §3.6; not
    voice conversion, §3.8 note 3): ``L = min(M // token_mel_ratio, N)``, tokens cut to L and
    the mel to ``token_mel_ratio * L`` frames.

    Args:
        tokens: int [N] (or [1, N]) prompt speech tokens.
        mel: float [M, bins] (or [1, M, bins]) time-major prompt mel.
    Returns:
        ``(tokens int64 [L], mel float32 [token_mel_ratio * L, bins])``.
    Raises:
        InputError: bad shapes, or L = 0 (a prompt under one token).
    """
    t = np.asarray(tokens)
    m = np.asarray(mel)
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]
    if m.ndim == 3 and m.shape[0] == 1:
        m = m[0]
    if t.ndim != 1 or m.ndim != 2:
        raise InputError(f"prompt alignment: tokens must be [N] and the mel [M, bins], got "
                         f"{list(np.shape(tokens))} and {list(np.shape(mel))}")
    n = min(m.shape[0] // token_mel_ratio, t.size)
    if n < 1:
        raise InputError(f"prompt too short to align: {t.size} speech tokens, {m.shape[0]} mel "
                         f"frames (need at least 1 token and {token_mel_ratio} frames)")
    return t[:n].astype(np.int64), np.ascontiguousarray(m[:token_mel_ratio * n], np.float32)


def prompt_rate_reason(voice, mel: MelConfig = PROMPT_MEL, *,
                       token_mel_ratio: int = TOKEN_MEL_RATIO) -> str | None:
    """Why the prompt mel of ``voice`` (a :class:`~cosyvino.voices.Voice`) was not made at
    ``mel``'s frame rate, e.g. a CosyVoice v1 voice (22.05 kHz mel) offered to CosyVoice2;
    None when it was, or when the voice has no prompt.

    With ``prompt_seconds`` known: prompt mel frames per second against
    ``mel.sampling_rate / mel.hop_size`` (50 for CosyVoice2, sheet v2 §3.6); without: mel
    frames per prompt speech token against ``token_mel_ratio`` (2, sheet v2 §2). Either may
    be off by :data:`RATE_TOLERANCE` (relative)."""
    if not voice.has_prompt:
        return None
    frames = int(voice.prompt_mel.shape[0])
    want = mel.sampling_rate / mel.hop_size
    seconds = voice.prompt_seconds
    if seconds:
        rate = frames / float(seconds)
        if abs(rate - want) <= RATE_TOLERANCE * want:
            return None
        return (f"its prompt mel has {rate:.1f} frames per second ({frames} frames for "
                f"{seconds:g} s), this model takes {want:g} ({mel.sampling_rate} Hz, hop "
                f"{mel.hop_size}): a voice made for another model (CosyVoice v1: 22.05 kHz)")
    ratio = frames / max(int(voice.prompt_speech_tokens.size), 1)
    if abs(ratio - token_mel_ratio) <= RATE_TOLERANCE * token_mel_ratio:
        return None
    return (f"its prompt mel has {ratio:.2f} frames per speech token, this model takes "
            f"{token_mel_ratio} ({want:g} frames/s, 25 tokens/s): a voice made for another "
            "model (CosyVoice v1: 22.05 kHz mel, 50 Hz tokens)")


__all__ = ["PROMPT_MEL", "RATE_TOLERANCE", "TOKEN_MEL_RATIO", "align_prompt", "prompt_rate_reason"]
