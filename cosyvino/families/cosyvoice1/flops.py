"""FLOP count of the v1 flow estimator for ``cosyvino bench`` (:meth:`CosyVoice1.estimator_cost`).
Imports torch only when called."""

from __future__ import annotations


def estimator_gflop(config, frames: int) -> float | None:
    """FLOP of one CFM estimator call (batch 2, ``frames`` mel frames) in GFLOP, counted by
    ``torch.utils.flop_counter`` on the torch module built on the meta device (shapes only, no
    weights); None without torch."""
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from .torch.estimator import ConditionalDecoder
    except ImportError:
        return None
    c = config.flow.output_size
    with torch.device("meta"):
        module = ConditionalDecoder(config.flow.estimator)
        args = (torch.zeros(2, c, frames), torch.ones(2, 1, frames), torch.zeros(2, c, frames),
                torch.zeros(2), torch.zeros(2, c), torch.zeros(2, c, frames))
        with FlopCounterMode(display=False) as counter:
            module(*args)
    return counter.get_total_flops() / 1e9
