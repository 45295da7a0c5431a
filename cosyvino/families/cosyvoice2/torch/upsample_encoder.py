"""The CosyVoice2 flow encoder: ``UpsampleConformerEncoder`` (tokens -> 2 frames per token).

Upstream ``cosyvoice/transformer/upsample_encoder.py``; CosyVoice2 sheet §5.1-§5.2. Reuses the
v1 rel-pos conformer layer and linear input embedding
(:mod:`cosyvino.families.cosyvoice1.torch.transformer`: identical math; v2 builds the layers'
norms with eps 1e-12), adds the pre-lookahead layer, the repeat-and-conv up-sampling and the
static chunk masks of streaming mode. Batch 1 without padding (the flow's only caller); no
Python branch on tensor values. Depends on torch and the modules named above.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.torch.transformer import (
    ConformerEncoderLayer,
    LinearInput,
    rel_position_table,
)
from cosyvino.families.cosyvoice2.flow_config import UpsampleEncoderConfig
from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_mask
from cosyvino.families.cosyvoice23.torch.pre_lookahead import PreLookaheadLayer

Tensor = torch.Tensor


class Upsample1D(nn.Module):
    """Nearest-neighbour repeat ×``stride``, ``2*stride`` zero frames on the left, Conv1d
    k = ``2*stride + 1`` (key ``conv``): ``[B, C, L] -> [B, C, stride*L]``, output frame ``t``
    sees up-sampled frames ``t - 2 stride .. t`` (sheet §5.2)."""

    def __init__(self, channels: int, out_channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, 2 * stride + 1)

    def forward(self, x: Tensor) -> Tensor:
        up = torch.repeat_interleave(x, self.stride, dim=2)  # = interpolate(nearest, ×stride)
        return self.conv(F.pad(up, (2 * self.stride, 0)))


def _layers(cfg: UpsampleEncoderConfig, count: int) -> nn.ModuleList:
    return nn.ModuleList([
        ConformerEncoderLayer(cfg.output_size, cfg.attention_heads, cfg.linear_units,
                              key_bias=cfg.key_bias, normalize_before=True,
                              eps=cfg.block_norm_eps)
        for _ in range(count)])


class UpsampleConformerEncoder(nn.Module):
    """Submodules in upstream registration order (``embed``, ``after_norm``,
    ``pre_lookahead_layer``, ``encoders``, ``up_layer``, ``up_embed``, ``up_encoders``), so
    the ``encoder.*`` keys of ``flow.pt`` load strictly."""

    def __init__(self, cfg: UpsampleEncoderConfig, pre_lookahead_len: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.output_size
        self.embed = LinearInput(cfg.input_size, d, legacy=False, eps=cfg.norm_eps)
        self.after_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.pre_lookahead_layer = PreLookaheadLayer(d, d, pre_lookahead_len)
        self.encoders = _layers(cfg, cfg.num_blocks)
        self.up_layer = Upsample1D(d, d, cfg.upsample_stride)
        self.up_embed = LinearInput(cfg.input_size, d, legacy=False, eps=cfg.norm_eps)
        self.up_encoders = _layers(cfg, cfg.num_up_blocks)

    def _stack(self, layers: nn.ModuleList, x: Tensor, chunk: int, streaming: bool) -> Tensor:
        t = x.shape[1]
        pos = rel_position_table(t - 1, 2 * t - 1, self.cfg.output_size, dtype=x.dtype,
                                 device=x.device)
        mask = chunk_mask(t, chunk, x.device).unsqueeze(0) if streaming and chunk > 0 else None
        for layer in layers:
            x, _, _ = layer(x, pos, mask)
        return x

    def forward(self, xs: Tensor, context: Tensor | None = None,
                streaming: bool = False) -> Tensor:
        """Encode embedded tokens.

        Args:
            xs: float ``[1, L, input_size]`` token embeddings (prompt tokens first).
            context: ``None`` for a final call, or float ``[1, pre_lookahead_len, input_size]``
                the embeddings of the look-ahead tokens that follow ``xs`` (a non-final
                streaming call; they produce no frames).
            streaming: chunk attention masks (``static_chunk_size`` tokens, then
                ``static_chunk_size * upsample_stride`` frames, counted from frame 0) instead of
                full attention.
        Returns:
            float ``[1, upsample_stride * L, output_size]`` (after ``after_norm``).
        """
        chunk = self.cfg.static_chunk_size
        x = self.embed(xs)
        ctx = None if context is None else self.embed(context)
        x = self.pre_lookahead_layer(x, ctx)
        x = self._stack(self.encoders, x, chunk, streaming)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x = self.up_embed(x)
        x = self._stack(self.up_encoders, x, chunk * self.cfg.upsample_stride, streaming)
        return self.after_norm(x)
