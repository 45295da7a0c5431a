"""FLOP count of the CosyVoice2 flow estimator for ``cosyvino bench``
(:meth:`CosyVoice2.estimator_cost`). Imports torch only when called."""

from __future__ import annotations


def estimator_gflop(flow_config, frames: int) -> float | None:
    """FLOP of one ``CausalConditionalDecoder`` call (batch 2 = conditional + unconditional,
    ``frames`` mel frames, full attention: the non-streamed call) in GFLOP, counted by
    ``torch.utils.flop_counter`` on the module built on the meta device (shapes only, no
    weights; sheet v2 §5.5); None without torch."""
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from .torch.estimator import CausalConditionalDecoder
    except ImportError:
        return None
    c = flow_config.output_size
    with torch.device("meta"):
        module = CausalConditionalDecoder(flow_config.estimator)
        args = (torch.zeros(2, c, frames), torch.ones(2, 1, frames), torch.zeros(2, c, frames),
                torch.zeros(2), torch.zeros(2, c), torch.zeros(2, c, frames))
        with FlopCounterMode(display=False) as counter:
            module(*args)
    return counter.get_total_flops() / 1e9
