"""CosyVoice v1 streaming policy: how a segment's speech tokens are cut into flow/vocoder hops.
Must not import torch.

Today one hop per text segment (``hop_schedule="segment"``): the flow and the vocoder run once
on all of a segment's tokens, and each segment is one chunk. The official token hops (overlap,
flow cache, mel cross-fade, HiFT cache; architecture sheet section 7) plug in here as further
schedules, and the program asks the policy when a hop is due.
"""

from __future__ import annotations


class SegmentHops:
    """One hop per segment: a hop is due when the segment's decoding has ended."""

    name = "segment"

    def hop_due(self, n_tokens: int, finished: bool) -> bool:
        """True when the tokens so far (``n_tokens``; ``finished``: the LLM has stopped) should
        go through the flow now."""
        return finished


SCHEDULES = {"segment": SegmentHops}


def policy(hop_schedule: str) -> SegmentHops:
    """The hop policy of a request's ``streaming.hop_schedule``."""
    return SCHEDULES[hop_schedule]()
