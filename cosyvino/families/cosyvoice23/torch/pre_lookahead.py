"""The pre-lookahead layer of the causal flows: each token frame sees the next few frames.

Upstream ``PreLookaheadLayer`` (``cosyvoice/transformer/upsample_encoder.py``); CosyVoice2 sheet
§5.2 (inside the encoder, 512 -> 512, look-ahead 3) and CosyVoice3 sheet §5.1 (flow level,
80 -> 1024 -> 80). Keys ``conv1`` / ``conv2``. Depends on torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice23.torch.causal_conv import conv_with_left

Tensor = torch.Tensor

#: ``F.leaky_relu`` default slope, as upstream calls it
_LEAKY_SLOPE = 0.01


class PreLookaheadLayer(nn.Module):
    """``x + conv2(pad_left(leaky_relu(conv1(pad_right(x)))))``, channel-major inside.

    ``conv1`` Conv1d(in_channels -> channels, k = lookahead + 1, no padding) after padding the
    right with ``lookahead`` frames: zeros, or the ``context`` frames of a non-final streaming
    call; output frame ``i`` therefore sees frames ``i .. i + lookahead``. ``conv2``
    Conv1d(channels -> in_channels, k3) is causal (2 zero frames on the left).
    """

    def __init__(self, in_channels: int, channels: int, lookahead: int):
        super().__init__()
        if lookahead <= 0:
            raise ValueError(f"lookahead must be positive, got {lookahead}")
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(in_channels, channels, lookahead + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, 3)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Args:
            x: float ``[B, L, in_channels]`` (time-major).
            context: ``None`` (final call: zero look-ahead), or float
                ``[B, lookahead, in_channels]``: the frames after ``x`` that are look-ahead
                only (they produce no output frames).
        Returns:
            float ``[B, L, in_channels]``.
        Raises:
            ValueError: ``context`` does not hold exactly ``lookahead`` frames.
        """
        h = x.transpose(1, 2)
        if context is None:
            h = F.pad(h, (0, self.lookahead))
        else:
            if context.shape[1] != self.lookahead:
                raise ValueError(f"look-ahead context must hold {self.lookahead} frames, got "
                                 f"{context.shape[1]}")
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
        h = F.leaky_relu(self.conv1(h), _LEAKY_SLOPE)
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


def pre_lookahead_span(layer: PreLookaheadLayer, x: Tensor, context: Tensor | None,
                       left: Tensor, commit: int) -> tuple[Tensor, Tensor]:
    """:class:`PreLookaheadLayer` over one span of a longer sequence (incremental streaming).

    The span's outputs equal those of the whole sequence when ``context`` holds the
    ``lookahead`` frames that really follow the span (or ``None`` at the true end, where the
    whole-sequence call pads zeros) and ``left`` is the state this function returned for the
    previous span: ``conv2`` is causal and ``conv1`` reads only ``x`` and ``context``.

    Args:
        layer: the layer (its weights).
        x: float ``[B, T, in_channels]`` (time-major), the span.
        context: float ``[B, lookahead, in_channels]`` or ``None`` (zero look-ahead).
        left: float ``[B, channels, 2]``: ``leaky_relu(conv1)`` of the 2 frames before the span
            (zeros at the start of the sequence).
        commit: frames of the span after which the next span starts (``0 <= commit <= T``).
    Returns:
        (float ``[B, T, in_channels]``, the next span's ``left``).
    Raises:
        ValueError: ``context`` does not hold exactly ``lookahead`` frames.
    """
    h = x.transpose(1, 2)
    if context is None:
        h = F.pad(h, (0, layer.lookahead))
    else:
        if context.shape[1] != layer.lookahead:
            raise ValueError(f"look-ahead context must hold {layer.lookahead} frames, got "
                             f"{context.shape[1]}")
        h = torch.cat([h, context.transpose(1, 2)], dim=2)
    h = F.leaky_relu(layer.conv1(h), _LEAKY_SLOPE)
    y, left = conv_with_left(layer.conv2, h, left, commit)
    return y.transpose(1, 2) + x, left
