"""Rotary position embedding of the CosyVoice3 DiT (x_transformers ``RotaryEmbedding`` and
``apply_rotary_pos_emb``, as upstream ``cosyvoice/flow/DiT`` uses them).

Sheet v3 §5.3: ``inv_freq_i = 10000^(-2i/d)`` for ``i < d/2`` with ``d = dim_head``; the angle of
position ``p`` is ``p * inv_freq_i``, each frequency used for one ADJACENT feature pair
(interleaved ``[f0, f0, f1, f1, ...]``, GPT-J style, unlike Qwen's split halves); positions are
absolute from frame 0; no xpos scaling. Only the first ``d`` features of the (all-heads) q / k
are rotated, so only head 0 carries the position. ``inv_freq`` is a persistent buffer: it is a
key of ``flow.pt`` (``decoder.estimator.rotary_embed.inv_freq``). Depends on torch only.
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor

#: x_transformers ``RotaryEmbedding`` default base
ROPE_BASE = 10000.0


def rope_inv_freq(dim: int) -> Tensor:
    """float32 ``[dim // 2]``: ``1 / base^(2i / dim)`` (the values stored in ``flow.pt``)."""
    return 1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


class RotaryEmbedding(nn.Module):
    """Holds ``inv_freq`` (buffer, ``[dim // 2]``); :meth:`forward` gives the per-position angles.

    Raises:
        ValueError: ``dim`` is odd (features are rotated in pairs).
    """

    def __init__(self, dim: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary dim must be even, got {dim}")
        self.dim = dim
        self.register_buffer("inv_freq", rope_inv_freq(dim), persistent=True)

    def forward(self, length: int) -> Tensor:
        """Angles of positions ``0 .. length-1``, float32 ``[length, dim]``, each frequency twice
        in a row (interleaved). ``length`` may be a symbolic size under export."""
        pos = torch.arange(length, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        angles = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return angles.repeat_interleave(2, dim=-1)


def _rotate_pairs(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): each adjacent pair turned by 90°."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the first ``angles.shape[-1]`` features of ``x``; the rest pass unchanged.

    Args:
        x: float ``[B, T, C]`` (q or k before the head split), C >= rotary dim.
        angles: float32 ``[T, d]`` from :meth:`RotaryEmbedding.forward`.
    Returns:
        ``x``'s dtype and shape. The rotation runs in float32 and is cast back (upstream
        disables autocast there).
    """
    d = angles.shape[-1]
    rot, rest = x[..., :d].float(), x[..., d:]
    rot = rot * angles.cos() + _rotate_pairs(rot) * angles.sin()
    return torch.cat((rot.to(x.dtype), rest), dim=-1)
