"""The flow's length regulator (upstream ``cosyvoice/flow/length_regulator.py``).

Upstream ``InterpolateRegulator.inference`` resizes the encoder output with data-dependent
``F.interpolate`` calls and then runs a conv stack. Here the resize is a constant matrix built
outside the graph by :func:`cosyvino.families.cosyvoice1.length_regulation.interpolation_matrix`, and the module
only does ``model(interp @ h)``: a matmul plus static convolutions, which export with dynamic
sizes and no resize op.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class InterpolateRegulator(nn.Module):
    """Conv stack of the length regulator; ``model`` keys as upstream.

    ``model`` = for each sampling ratio [Conv1d(C, C, k3, p1), GroupNorm(groups, C), Mish],
    then Conv1d(C, out_channels, k1): keys ``model.{0,3,6,9}`` (conv),
    ``model.{1,4,7,10}`` (GroupNorm), ``model.12`` (1x1 conv) for 4 ratios. CosyVoice v1:
    ``channels=80, sampling_ratios=[1,1,1,1], groups=1``. The ratios only count layers (upstream
    uses them for nothing else at inference).
    """

    def __init__(self, channels: int, sampling_ratios: Sequence[int],
                 out_channels: int | None = None, groups: int = 1):
        super().__init__()
        self.sampling_ratios = tuple(sampling_ratios)
        out_channels = out_channels or channels
        layers: list[nn.Module] = []
        for _ in self.sampling_ratios:
            layers += [nn.Conv1d(channels, channels, 3, 1, 1), nn.GroupNorm(groups, channels),
                       nn.Mish()]
        layers.append(nn.Conv1d(channels, out_channels, 1, 1))
        self.model = nn.Sequential(*layers)

    def forward(self, h: torch.Tensor, interp: torch.Tensor) -> torch.Tensor:
        """Length-regulate one utterance.

        Args:
            h: encoder_proj output for prompt ⧺ generated tokens, float32 [1, N, C] (time-major).
            interp: float32 [M, N] from ``interpolation_matrix`` (M = M1 + M2).

        Returns:
            mu, float32 [1, M, C_out] (time-major, as upstream returns it).
        """
        x = torch.matmul(interp, h)            # [1, M, C]
        y = self.model(x.transpose(1, 2))      # channel-major [1, C_out, M]
        return y.transpose(1, 2)


class LengthRegulatorStage(nn.Module):
    """Exportable stage ``(h [1, N, 80], interp [M, N]) -> mu [1, M, 80]``.

    Wraps an :class:`InterpolateRegulator` (normally ``Flow.length_regulator``) without copying
    it; state_dict keys are those of the wrapped module under ``regulator.``.
    """

    def __init__(self, regulator: InterpolateRegulator):
        super().__init__()
        self.regulator = regulator

    def forward(self, h: torch.Tensor, interp: torch.Tensor) -> torch.Tensor:
        return self.regulator(h, interp)
