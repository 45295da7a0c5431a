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
