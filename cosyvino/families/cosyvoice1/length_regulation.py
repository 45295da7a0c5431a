"""Token-to-frame length regulation of the flow, as a matrix (numpy only, no torch).

Upstream: ``cosyvoice/flow/length_regulator.py`` (``InterpolateRegulator.inference``) and
``cosyvoice/flow/flow.py`` (``MaskedDiffWithXvec.inference``). Upstream stretches the encoder
output along time with ``F.interpolate(mode='linear', align_corners=False)``, separately for
the prompt part and for the generated part, and the generated part in three pieces when it has
more than 40 tokens (first 20 tokens -> 34 frames, middle, last 20 tokens -> 34 frames) so the
token/frame boundary of streaming chunks stays fixed. All of that depends only on the four
lengths, so here it becomes one constant matrix ``W`` [M1+M2, N1+N2] and the model computes
``W @ h``; the exported graphs then have no data-dependent resize.
"""

from __future__ import annotations

import numpy as np

from cosyvino.errors import InputError

# Upstream constants (flow.py / length_regulator.py): token rate 50 Hz, mel at 22050 Hz with hop
# 256, the >40-token rule with 20-token head and tail pieces.
TOKEN_RATE = 50
SAMPLE_RATE = 22050
HOP = 256
SPLIT_THRESHOLD = 40
EDGE_TOKENS = 20


def mel_frames_for_tokens(n_tokens: int, token_rate: int = TOKEN_RATE,
                          sample_rate: int = SAMPLE_RATE, hop: int = HOP) -> int:
    """Mel frames for ``n_tokens`` speech tokens: ``int(n / token_rate * sample_rate / hop)``.

    Evaluated in Python floats in the same order as upstream (``flow.py``), e.g. 60 -> 103,
    20 -> 34.
    """
    return int(n_tokens / token_rate * sample_rate / hop)


def linear_interp_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``F.interpolate(x, size=n_out, mode='linear', align_corners=False)`` as a matrix.

    Returns float32 [n_out, n_in] with ``y = W @ x`` along time. Reproduces PyTorch's CPU
    index/weight computation bit for bit: ``scale = float32(n_in / n_out)``,
    ``src = max(float32(scale * (i + 0.5) - 0.5), 0)`` (one rounding, as the kernel's FMA), ``i0 = floor(src)``, ``i1 = min(i0 + 1, n_in - 1)``,
    ``lambda = src - i0``, weights ``(1 - lambda, lambda)``.
    """
    if n_in <= 0 or n_out <= 0:
        raise InputError(f"linear interpolation needs positive sizes, got {n_in} -> {n_out}")
    f32 = np.float32
    scale = f32(f32(n_in) / f32(n_out))
    # PyTorch's CPU kernel evaluates ``scale * (i + 0.5) - 0.5`` with one rounding (a fused
    # multiply-add); float64 is exact for these operands, so one cast to float32 matches it.
    dst = np.arange(n_out, dtype=np.float64)
    src = (np.float64(scale) * (dst + 0.5) - 0.5).astype(f32)
    src = np.maximum(src, f32(0.0)).astype(f32)
    i0 = np.floor(src).astype(np.int64)
    i0 = np.minimum(i0, n_in - 1)
    lam = np.clip(src - i0.astype(f32), f32(0.0), f32(1.0)).astype(f32)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    w = np.zeros((n_out, n_in), dtype=f32)
    rows = np.arange(n_out)
    np.add.at(w, (rows, i0), (f32(1.0) - lam).astype(f32))
    np.add.at(w, (rows, i1), lam)
    return w


def interpolation_matrix(n_prompt_tokens: int, n_tokens: int, n_prompt_frames: int,
                         n_frames: int) -> np.ndarray:
    """The whole length regulation of ``h = [prompt part (N1 tokens), generated part (N2)]``.

    Args:
        n_prompt_tokens: N1 (0 without a prompt).
        n_tokens: N2, generated tokens.
        n_prompt_frames: M1, frames of the prompt mel (0 without a prompt).
        n_frames: M2, normally ``mel_frames_for_tokens(N2)``.

    Returns:
        float32 [M1+M2, N1+N2], block diagonal: the prompt block ``N1 -> M1``; the generated
        block ``N2 -> M2`` in one piece if ``N2 <= 40``, else three pieces
        ``20 -> 34``, ``N2-40 -> M2-68``, ``20 -> 34`` (34 = ``mel_frames_for_tokens(20)``).
    """
    n1, n2, m1, m2 = int(n_prompt_tokens), int(n_tokens), int(n_prompt_frames), int(n_frames)
    if min(n1, n2, m1, m2) < 0:
        raise InputError(f"negative length in interpolation_matrix({n1}, {n2}, {m1}, {m2})")
    if (n1 == 0) != (m1 == 0):
        raise InputError(f"prompt of {n1} tokens cannot map to {m1} frames")
    if (n2 == 0) != (m2 == 0):
        raise InputError(f"{n2} generated tokens cannot map to {m2} frames")
    pieces = []  # (tokens, frames)
    if n1 > 0:
        pieces.append((n1, m1))
    if n2 > SPLIT_THRESHOLD:
        edge = mel_frames_for_tokens(EDGE_TOKENS)
        mid = m2 - 2 * edge
        if mid <= 0:
            raise InputError(f"{n2} generated tokens need more than {2 * edge} frames, got {m2}")
        pieces += [(EDGE_TOKENS, edge), (n2 - 2 * EDGE_TOKENS, mid), (EDGE_TOKENS, edge)]
    elif n2 > 0:
        pieces.append((n2, m2))
    w = np.zeros((m1 + m2, n1 + n2), dtype=np.float32)
    r = c = 0
    for n_in, n_out in pieces:
        w[r:r + n_out, c:c + n_in] = linear_interp_matrix(n_in, n_out)
        r += n_out
        c += n_in
    return w
