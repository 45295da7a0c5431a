"""The transformer block of the CosyVoice3 DiT and its final modulation: adaptive LayerNorm-Zero
on the flow-time embedding, self-attention with rotary head 0, tanh-GELU feed-forward.

Upstream ``cosyvoice/flow/DiT/modules.py`` (``AdaLayerNormZero``, ``AdaLayerNormZero_Final``,
``Attention`` + ``AttnProcessor``, ``FeedForward``, ``DiTBlock``); sheet v3 §5.3. Module and
parameter names equal upstream (``attn_norm.linear``, ``attn.to_q``/``to_k``/``to_v``/``to_out.0``,
``ff.ff.0.0``/``ff.ff.2``, ``norm_out.linear``). Dropout is inactive at inference and left out
(``ff.ff.1`` is an identity placeholder, ``to_out`` holds only its Linear). Depends on torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice3.torch.rotary import apply_rotary

Tensor = torch.Tensor

#: eps of every DiT LayerNorm (no affine parameters), sheet §5.3
NORM_EPS = 1e-6


def _norm(x: Tensor) -> Tensor:
    # the feature width as a Python int: a traced (ONNX) graph needs a constant normalized shape
    return F.layer_norm(x, (int(x.shape[-1]),), eps=NORM_EPS)


class AdaLayerNormZero(nn.Module):
    """``linear(SiLU(t_emb))`` -> 6 × dim: (shift, scale, gate) for attention, then for the
    feed-forward (this order, sheet §5.3)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 6 * dim)

    def forward(self, t_emb: Tensor) -> tuple[Tensor, ...]:
        """float ``[B, dim]`` -> six ``[B, 1, dim]`` (broadcast over frames)."""
        return self.linear(F.silu(t_emb)).unsqueeze(1).chunk(6, dim=-1)


class AdaLayerNormZeroFinal(nn.Module):
    """``LayerNorm(x) * (1 + scale) + shift`` with (scale, shift) = ``linear(SiLU(t_emb))`` —
    scale FIRST here, unlike the blocks (upstream ``AdaLayerNormZero_Final``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: Tensor, t_emb: Tensor) -> Tensor:
        """x float ``[B, T, dim]``, t_emb ``[B, dim]`` -> ``[B, T, dim]``."""
        scale, shift = self.linear(F.silu(t_emb)).unsqueeze(1).chunk(2, dim=-1)
        return _norm(x) * (1 + scale) + shift


class Attention(nn.Module):
    """Multi-head self-attention; q, k, v, out projections with bias; rotary on the first
    ``dim_head`` features of q and k before the head split (head 0 only); SDPA with scale
    ``1/sqrt(dim_head)`` and a boolean mask; output rows of invalid frames zeroed."""

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: Tensor, allowed: Tensor, frame_mask: Tensor, angles: Tensor) -> Tensor:
        """Args:
            x: float ``[B, T, dim]``.
            allowed: bool ``[B, 1, 1 or T, T]``, True = the query may attend to the key.
            frame_mask: float ``[B, T, 1]``, 1 = valid frame.
            angles: float32 ``[T, dim_head]`` rotary angles.
        Returns:
            float ``[B, T, dim]``.
        """
        q = apply_rotary(self.to_q(x), angles)
        k = apply_rotary(self.to_k(x), angles)
        v = self.to_v(x)
        q, k, v = (a.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2)
                   for a in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        out = self.to_out[0](out.transpose(1, 2).flatten(2))
        return out * frame_mask.to(out.dtype)


class FeedForward(nn.Module):
    """``Linear(dim -> inner)``, GELU (tanh approximation), ``Linear(inner -> dim)``; keys
    ``ff.0.0`` and ``ff.2``."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                nn.Identity(), nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """Sheet §5.3::

        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = attn_norm(t_emb)
        h = h + gate_a * attn(LN(h) * (1 + scale_a) + shift_a)
        h = h + gate_f * ff(LN(h) * (1 + scale_f) + shift_f)

    (``ff_norm`` of upstream is a parameter-free LayerNorm, applied inline.)
    """

    def __init__(self, dim: int, heads: int, dim_head: int, ff_inner: int):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_inner)

    def forward(self, h: Tensor, t_emb: Tensor, allowed: Tensor, frame_mask: Tensor,
                angles: Tensor) -> Tensor:
        """h float ``[B, T, dim]``, t_emb ``[B, dim]`` (other args: :meth:`Attention.forward`)
        -> ``[B, T, dim]``."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.attn_norm(t_emb)
        h = h + gate_a * self.attn(_norm(h) * (1 + scale_a) + shift_a, allowed, frame_mask,
                                   angles)
        return h + gate_f * self.ff(_norm(h) * (1 + scale_f) + shift_f)
