"""The CosyVoice2 CFM velocity estimator: ``CausalConditionalDecoder``, a one-level 1-D U-Net of
causal conv blocks and transformer blocks with full or chunk-mask attention.

Upstream ``cosyvoice/flow/decoder.py`` (``CausalConditionalDecoder``, ``CausalBlock1D``,
``CausalResnetBlock1D``); CosyVoice2 sheet §5.5 and §5.7 (I/O contract). The time embedding and
the transformer blocks are the v1 ones (:mod:`cosyvino.families.cosyvoice1.torch.estimator`,
identical math); the v2 blocks differ by causal k3 convolutions (left pad 2) and a LayerNorm over
channels instead of GroupNorm. Module and parameter names equal upstream, so the
``decoder.estimator.*`` keys of ``flow.pt`` (prefix stripped) load strictly.

Export notes: ``streaming`` is a Python flag fixed per exported graph (one graph per attention
mode), never a tensor; every size is read from ``x`` (tests/test_cosyvoice2_flow_export.py).
"""

from __future__ import annotations

import torch
from torch import nn

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.torch.estimator import (
    BasicTransformerBlock,
    SinusoidalPosEmb,
    TimestepEmbedding,
)
from cosyvino.families.cosyvoice2.flow_config import CausalEstimatorConfig
from cosyvino.families.cosyvoice23.torch.causal_conv import CausalConv1d
from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_mask

Tensor = torch.Tensor

#: upstream ``mask_to_bias``: additive attention bias of a hidden key
_MASK_BIAS = -1.0e10
#: LayerNorm eps of the causal blocks (``nn.LayerNorm`` default, as upstream builds it)
_NORM_EPS = 1e-5
_APPROXIMATE = {"gelu": "none", "gelu-approximate": "tanh"}


class _Transpose(nn.Module):
    """Swap time and channel axes (upstream ``Transpose(1, 2)``; holds no parameters, but
    keeps the LayerNorm at index 2 of ``block`` as in the official keys)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2)


class CausalBlock1D(nn.Module):
    """``Mish(LayerNorm_channels(CausalConv1d_k3(x * mask))) * mask``; keys ``block.0``
    (conv) and ``block.2`` (LayerNorm). x ``[B, dim, T]``, mask ``[B, 1, T]`` ->
    ``[B, dim_out, T]``."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), _Transpose(),
                                   nn.LayerNorm(dim_out, eps=_NORM_EPS), _Transpose(), nn.Mish())

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.block(x * mask) * mask


class CausalResnetBlock1D(nn.Module):
    """``block2(block1(x) + Linear(Mish(t_emb))) + res_conv(x * mask)`` (keys ``mlp.1``,
    ``block1``, ``block2``, ``res_conv``). x ``[B, dim, T]``, t_emb ``[B, time_emb_dim]`` ->
    ``[B, dim_out, T]``."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: Tensor, mask: Tensor, t_emb: Tensor) -> Tensor:
        h = self.block1(x, mask) + self.mlp(t_emb).unsqueeze(-1)
        return self.block2(h, mask) + self.res_conv(x * mask)


def attention_bias(mask: Tensor, chunk: int) -> Tensor:
    """Additive attention bias ``(1 - allowed) * -1e10`` (upstream ``mask_to_bias``).

    Args:
        mask: float ``[B, 1, T]``, 1 = valid frame.
        chunk: 0 = full attention over the valid keys; > 0 = additionally only keys
            ``j < (i // chunk + 1) * chunk`` for query ``i`` (sheet §5.5, streaming).
    Returns:
        float ``[B, 1, 1, T]`` (full) or ``[B, 1, T, T]`` (chunk), broadcast over heads.
    """
    if chunk <= 0:
        return ((1.0 - mask) * _MASK_BIAS).unsqueeze(1)
    allowed = chunk_mask(mask.shape[-1], chunk, mask.device).unsqueeze(0) & (mask > 0)
    return ((1.0 - allowed.to(mask.dtype)) * _MASK_BIAS).unsqueeze(1)


def _transformers(blocks: nn.ModuleList, x: Tensor, bias: Tensor) -> Tensor:
    """Transformer blocks on channel-major x ``[B, C, T]`` (time-major inside)."""
    h = x.transpose(1, 2).contiguous()
    for block in blocks:
        h = block(h, bias)
    return h.transpose(1, 2)


class CausalConditionalDecoder(nn.Module):
    """``time_mlp``; ``down_blocks.0`` = [CausalResnetBlock1D(in -> c), n_blocks ×
    BasicTransformerBlock, CausalConv1d k3]; ``mid_blocks.{j}`` = [CausalResnetBlock1D(c -> c),
    transformers]; ``up_blocks.0`` = [CausalResnetBlock1D(2c -> c), transformers,
    CausalConv1d k3]; ``final_block`` CausalBlock1D; ``final_proj`` Conv1d k1 (sheet §5.5).

    Raises:
        ConfigError: ``act_fn`` other than gelu / gelu-approximate, or more than one level.
    """

    def __init__(self, cfg: CausalEstimatorConfig):
        super().__init__()
        if cfg.act_fn not in _APPROXIMATE:
            raise ConfigError(f"estimator act_fn {cfg.act_fn!r} is not supported "
                              f"(expected one of {sorted(_APPROXIMATE)})")
        if len(cfg.channels) != 1:
            raise ConfigError(f"the CosyVoice2 estimator has one U-Net level; got channels "
                              f"{list(cfg.channels)}")
        self.cfg = cfg
        c = cfg.channels[0]
        time_dim = 4 * c
        approximate = _APPROXIMATE[cfg.act_fn]

        def transformers() -> nn.ModuleList:
            return nn.ModuleList([
                BasicTransformerBlock(c, cfg.num_heads, cfg.attention_head_dim, approximate)
                for _ in range(cfg.n_blocks)])

        self.time_embeddings = SinusoidalPosEmb(cfg.in_channels)
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_dim)
        self.down_blocks = nn.ModuleList([nn.ModuleList([
            CausalResnetBlock1D(cfg.in_channels, c, time_dim), transformers(),
            CausalConv1d(c, c, 3)])])
        self.mid_blocks = nn.ModuleList([
            nn.ModuleList([CausalResnetBlock1D(c, c, time_dim), transformers()])
            for _ in range(cfg.num_mid_blocks)])
        self.up_blocks = nn.ModuleList([nn.ModuleList([
            CausalResnetBlock1D(2 * c, c, time_dim), transformers(), CausalConv1d(c, c, 3)])])
        self.final_block = CausalBlock1D(c, c)
        self.final_proj = nn.Conv1d(c, cfg.out_channels, 1)

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor,
                cond: Tensor, streaming: bool = False) -> Tensor:
        """Velocity of the flow (I/O contract: sheet §5.7).

        Args:
            x: ODE state, float32 ``[B, 80, T]``.
            mask: float32 ``[B, 1, T]``, 1 for valid frames.
            mu: encoder_proj output (channel-major), float32 ``[B, 80, T]``.
            t: flow time, float32 ``[B]``.
            spks: projected speaker embedding, float32 ``[B, 80]``.
            cond: prompt mel in the first frames, zeros elsewhere, float32 ``[B, 80, T]``.
            streaming: chunk-mask attention (``static_chunk_size`` frames from frame 0) instead
                of full attention; the same mask at every level (the U-Net never resamples).
        Returns:
            velocity, float32 ``[B, 80, T]`` (zero where mask is 0).
        """
        t_emb = self.time_mlp(self.time_embeddings(t).to(t.dtype))
        spks_t = spks.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        h = torch.cat([x, mu, spks_t, cond], dim=1)
        bias = attention_bias(mask, self.cfg.static_chunk_size if streaming else 0)

        resnet, blocks, down = self.down_blocks[0]
        h = _transformers(blocks, resnet(h, mask, t_emb), bias)
        skip = h
        h = down(h * mask)
        for resnet, blocks in self.mid_blocks:
            h = _transformers(blocks, resnet(h, mask, t_emb), bias)
        resnet, blocks, up = self.up_blocks[0]
        h = torch.cat([h, skip], dim=1)
        h = _transformers(blocks, resnet(h, mask, t_emb), bias)
        h = up(h * mask)
        h = self.final_block(h, mask)
        return self.final_proj(h * mask) * mask
