"""The causal convolutions of the CosyVoice3 vocoder, each with an optional context.

Upstream ``cosyvoice/transformer/convolution.py`` (``CausalConv1d`` with ``causal_type``,
``CausalConv1dUpsample``, ``CausalConv1dDownSample``); CosyVoice3 architecture sheet §6.1. Each is
an ``nn.Conv1d`` subclass, so its parameters are ``weight`` / ``bias`` directly under the module's
key (after weight-norm folding), as in ``hift.pt``.

Every convolution pads one side by :attr:`pad` frames: with zeros (upstream's default), or with a
``context`` of exactly that many frames given by the caller: the real frames before the input
('left'), or the look-ahead frames after it ('right', only ``conv_pre`` and the f0 predictor's
first layer). An incremental vocoder passes the last :attr:`pad` input frames of the previous
call as the next call's left context. Depends on torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalConv1d", "CausalConv1dDownSample", "CausalConv1dUpsample", "causal_padding"]


def causal_padding(kernel_size: int, dilation: int = 1) -> int:
    """Upstream's ``int((k·d − d) / 2) · 2 + (k + 1) % 2``: ``d·(k−1)`` for odd k, ``k−1`` for
    even k with d = 1 (sheet §6.1)."""
    return int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2


def _join(x: torch.Tensor, context: torch.Tensor | None, pad: int, left: bool) -> torch.Tensor:
    if context is None:
        return F.pad(x, (pad, 0) if left else (0, pad))
    if context.shape[-1] != pad:
        raise ValueError(f"context has {context.shape[-1]} frames, expected {pad}")
    return torch.cat([context, x] if left else [x, context], dim=-1)


class CausalConv1d(nn.Conv1d):
    """Stride-1 convolution padded on one side: x ``[B, C_in, T]`` -> ``[B, C_out, T]``.

    Args:
        in_channels, out_channels, kernel_size, dilation: as ``nn.Conv1d``.
        causal_type: ``'left'`` (frame t sees t − pad .. t) or ``'right'`` (t .. t + pad).

    Raises:
        ValueError: an even kernel with dilation > 1 (upstream's padding would not keep the
            length; upstream asserts), or an unknown ``causal_type``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 dilation: int = 1, causal_type: str = "left"):
        super().__init__(in_channels, out_channels, kernel_size, stride=1, padding=0,
                         dilation=dilation)
        self.pad = causal_padding(kernel_size, dilation)
        if self.pad != dilation * (kernel_size - 1):
            raise ValueError(f"kernel {kernel_size} with dilation {dilation} does not keep the "
                             "length under upstream's causal padding")
        if causal_type not in ("left", "right"):
            raise ValueError(f"causal_type must be 'left' or 'right', got {causal_type!r}")
        self.causal_type = causal_type

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """``context`` [B, C_in, pad]: the frames before ('left') or after ('right') ``x``;
        None pads with zeros."""
        return super().forward(_join(x, context, self.pad, self.causal_type == "left"))


class CausalConv1dUpsample(nn.Conv1d):
    """Nearest-neighbour upsampling ×``stride``, left padding ``kernel_size − 1``, Conv1d:
    x ``[B, C_in, T]`` -> ``[B, C_out, stride·T]`` (a Conv1d weight ``[out, in, k]``, not a
    transposed convolution; sheet §6.1). ``context``: the last ``pad`` frames of the
    previous UPSAMPLED input."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__(in_channels, out_channels, kernel_size, stride=1, padding=0)
        self.pad = kernel_size - 1
        self.scale = int(stride)

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest-neighbour ×``stride`` along time (each frame repeated; an expand and a
        reshape, which export to any backend)."""
        b, c, t = x.shape
        return x.unsqueeze(-1).expand(b, c, t, self.scale).reshape(b, c, t * self.scale)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(_join(self.upsample(x), context, self.pad, True))


class CausalConv1dDownSample(nn.Conv1d):
    """Left padding ``stride − 1``, then Conv1d(kernel, stride): x ``[B, C_in, L]`` ->
    ``[B, C_out, floor((L − 1 − kernel + stride) / stride) + 1]`` (``2u`` kernel, stride u on
    ``120·T + 1`` STFT frames gives ``120·T / u`` frames; sheet §6.1).

    Raises:
        ValueError: stride 1 or a kernel that is not a multiple of the stride (upstream
            asserts both)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        if stride == 1 or kernel_size % stride:
            raise ValueError(f"downsampling needs stride > 1 dividing the kernel, got kernel "
                             f"{kernel_size} stride {stride}")
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0)
        self.pad = stride - 1

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(_join(x, context, self.pad, True))
