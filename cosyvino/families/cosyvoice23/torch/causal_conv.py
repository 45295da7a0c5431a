"""A causal 1-D convolution: left zero padding of ``kernel_size - 1`` frames, none on the right,
so output frame ``t`` sees input frames ``t - k + 1 .. t``.

Upstream ``cosyvoice/transformer/convolution.py`` / ``cosyvoice/flow/decoder.py::CausalConv1d``
(stride 1, dilation 1), CosyVoice2 sheet §5.5. A ``Conv1d`` subclass, so its parameters are
``weight`` / ``bias`` directly under the module's key, as in ``flow.pt``
(``decoder.estimator.down_blocks.0.2.weight``). Depends on torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalConv1d(nn.Conv1d):
    """x float ``[B, in_channels, T]`` -> ``[B, out_channels, T]``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size, stride=1, padding=0)
        self.left_pad = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left_pad, 0)))


def conv_with_left(conv: nn.Conv1d, x: torch.Tensor, left: torch.Tensor, commit: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One span of a left-padded (causal) stride-1 ``conv`` given the frames before the span:
    the incremental form of ``conv(F.pad(whole, (k - 1, 0)))`` (sheet v2 §5.6: causal
    convolutions never see later frames).

    Args:
        conv: any ``nn.Conv1d`` without padding, stride 1, dilation 1, kernel ``k``.
        x: float ``[B, C_in, T]``, the span's input frames.
        left: float ``[B, C_in, k - 1]``, the ``k - 1`` input frames before the span (zeros at
            the start of the sequence, as the padding).
        commit: frames of the span (``0 <= commit <= T``) after which the next span starts.
    Returns:
        (float ``[B, C_out, T]``, the next span's ``left``: input frames ``commit - k + 1 ..
        commit - 1`` of this span, reaching into ``left`` when ``commit < k - 1``).
    """
    inp = torch.cat([left, x], dim=2)
    y = F.conv1d(inp, conv.weight, conv.bias)
    return y, inp[:, :, commit:commit + left.shape[2]]
