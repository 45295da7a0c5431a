"""The CosyVoice3 CFM velocity estimator: ``DiT``, a diffusion transformer over mel frames with
full or chunk-mask attention.

Upstream ``cosyvoice/flow/DiT/dit.py`` (``DiT``, ``InputEmbedding``) and ``modules.py``
(``TimestepEmbedding``, ``CausalConvPositionEmbedding``); sheet v3 §5.3. The blocks are in
:mod:`cosyvino.families.cosyvoice3.torch.dit_block`, the rotary embedding in
:mod:`~cosyvino.families.cosyvoice3.torch.rotary`, the chunk mask is the shared
:func:`cosyvino.families.cosyvoice23.torch.chunk_mask.chunk_mask`. Module and parameter names
equal upstream, so the ``decoder.estimator.*`` keys of ``flow.pt`` (prefix stripped) load
strictly, ``rotary_embed.inv_freq`` included.

Export notes: ``streaming`` is a Python flag fixed per exported graph (one graph per attention
mode), never a tensor; every size is read from ``x``
(``tests/test_parity_cosyvoice3_flow.py::test_estimator_exports_with_dynamic_frames``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.torch.estimator import SinusoidalPosEmb
from cosyvino.families.cosyvoice3.flow_config import DiTConfig
from cosyvino.families.cosyvoice3.torch.dit_block import AdaLayerNormZeroFinal, DiTBlock
from cosyvino.families.cosyvoice3.torch.rotary import RotaryEmbedding
from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_mask

Tensor = torch.Tensor


class TimestepEmbedding(nn.Module):
    """Flow time ``t`` -> ``time_mlp(SinusPositionEmbedding_256(t))``; ``time_mlp`` = Linear
    256 -> dim, SiLU, Linear dim -> dim (keys ``time_mlp.0`` / ``time_mlp.2``). The sinusoid is
    Matcha's (``freq_i = exp(-i ln(10000) / (half - 1))``, argument ``1000 t``, [sin | cos]),
    the same formula as v1's estimator (sheet v3 §5.3)."""

    def __init__(self, dim: int, freq_embed_dim: int):
        super().__init__()
        self.time_embed = SinusoidalPosEmb(freq_embed_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(),
                                      nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        """float ``[B]`` -> ``[B, dim]``."""
        return self.time_mlp(self.time_embed(t).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """Two grouped Conv1d(dim, dim, k) + Mish, each after ``k - 1`` zero frames on the left:
    output frame ``t`` sees input frames ``t - 2(k - 1) .. t`` (keys ``conv1.0``, ``conv2.0``).
    x float ``[B, T, dim]`` -> ``[B, T, dim]`` (the position term only; the caller adds x)."""

    def __init__(self, dim: int, kernel_size: int, groups: int):
        super().__init__()
        self.left = kernel_size - 1
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.pad(x.transpose(1, 2), (self.left, 0)))
        h = self.conv2(F.pad(h, (self.left, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """``h = proj(cat[x, cond, mu, spks over T])`` (that order; v2's U-Net uses
    [x, mu, spks, cond]), then ``h + conv_pos_embed(h)`` (sheet §5.3)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.input_width, cfg.dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(cfg.dim, cfg.conv_pos_kernel,
                                                          cfg.conv_pos_groups)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        """x, cond ``[B, T, mel_dim]``, mu ``[B, T, mu_dim]``, spks ``[B, spk_dim]`` (all
        time-major) -> ``[B, T, dim]``."""
        spks_t = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spks_t], dim=-1))
        return h + self.conv_pos_embed(h)


def attention_allowed(mask: Tensor, chunk: int) -> Tensor:
    """Boolean attention mask (upstream ``add_optional_chunk_mask`` with all left chunks).

    Args:
        mask: float ``[B, 1, T]``, 1 = valid frame.
        chunk: 0 = every valid key; > 0 = additionally only keys ``j < (i // chunk + 1) *
            chunk`` for query ``i`` (streaming, chunks counted from frame 0; sheet §5.3).
    Returns:
        bool ``[B, 1, 1, T]`` (full) or ``[B, 1, T, T]`` (chunk), True = attend.
    """
    keys = (mask > 0).unsqueeze(1)
    if chunk <= 0:
        return keys
    return keys & chunk_mask(mask.shape[-1], chunk, mask.device)


class DiT(nn.Module):
    """``time_embed``, ``input_embed``, ``rotary_embed`` (buffer ``inv_freq``),
    ``transformer_blocks.{0..depth-1}``, ``norm_out``, ``proj_out`` Linear(dim -> mel_dim)
    (sheet §5.3; ``long_skip_connection`` is off in every CosyVoice3 config and not built)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.dim, cfg.freq_embed_dim)
        self.input_embed = InputEmbedding(cfg)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList([
            DiTBlock(cfg.dim, cfg.heads, cfg.dim_head, cfg.ff_inner) for _ in range(cfg.depth)])
        self.norm_out = AdaLayerNormZeroFinal(cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor,
                cond: Tensor, streaming: bool = False) -> Tensor:
        """Velocity of the flow (same I/O contract as the v2 estimator, sheet v3 §5.5).

        Args:
            x: ODE state, float32 ``[B, mel_dim, T]``.
            mask: float32 ``[B, 1, T]``, 1 for valid frames.
            mu: pre-lookahead output repeated per frame (channel-major), ``[B, mu_dim, T]``.
            t: flow time, float32 ``[B]``.
            spks: projected speaker embedding, float32 ``[B, spk_dim]``.
            cond: prompt mel in the first frames, zeros elsewhere, ``[B, mel_dim, T]``.
            streaming: chunk-mask attention (``static_chunk_size`` frames from frame 0) instead
                of full attention.
        Returns:
            velocity, float32 ``[B, mel_dim, T]`` (not multiplied by ``mask``, as upstream).
        """
        t_emb = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        angles = self.rotary_embed(x.shape[-1])
        allowed = attention_allowed(mask, self.cfg.static_chunk_size if streaming else 0)
        frame_mask = mask.transpose(1, 2)
        for block in self.transformer_blocks:
            h = block(h, t_emb, allowed, frame_mask, angles)
        return self.proj_out(self.norm_out(h, t_emb)).transpose(1, 2)
