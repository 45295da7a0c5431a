"""CosyVoice v1 streaming policy: how a segment's speech tokens are cut into flow/vocoder hops.
Must not import torch.

Schedules (a request's ``streaming.hop_schedule``):

* ``segment``: one hop per text segment: the flow and the vocoder run once on all of a
  segment's tokens (the official non-streaming computation).
* ``official``: the official v1 token hops (``CosyVoiceModel`` constants: hop 100 tokens,
  overlap 20, mel cross-fade 34 frames, HiFT cache 20 frames / 5120 samples; architecture
  sheet section 7). First audio after 120 speech tokens (2.4 s of speech) are decoded.
* ``latency``: the same algorithm with a small first hop that doubles (10, 20, 40, 80, 160,
  200 tokens ...), a 4-token overlap with a 6-frame mel cross-fade and an 8-frame HiFT cache,
  and the first hop's ODE solved in 3 Euler steps instead of 10 (a first hop that is also the
  segment's last keeps 10; later hops have 10), so the first chunk leaves after 14 speech
  tokens and 3 estimator calls. Why these numbers (measured first-chunk time and mel distance
  of each candidate first hop) and what the shorter joins cost against ``official``:
  docs/performance.md, "Token-level streaming" and "First chunk: how the `latency`
  schedule's first hop was chosen".

A hop is a window of tokens ``[start, stop)`` of the segment plus ``finalize`` (the last hop of
the segment). The windows depend only on token counts, never on timing, so a seed gives the same
audio however the steps are scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

from .official_stream import StreamConstants

#: the official v1 constants (``CosyVoiceModel.__init__``)
OFFICIAL = StreamConstants()
#: the latency-first schedule (see the module docstring). The mel cross-fade is the whole
#: frames the overlap tokens make (4 x 22050 / 256 / 50 = 6.9 -> 6, as upstream's 20 tokens ->
#: 34 frames), so the faded frames belong to tokens both hops saw; HiFT source cache = mel
#: cache x hop 256
LATENCY = StreamConstants(token_min_hop_len=10, token_max_hop_len=200, token_overlap_len=4,
                          mel_overlap_len=6, mel_cache_len=8, source_cache_len=8 * 256,
                          stream_scale_factor=2, first_hop_n_timesteps=3)


@dataclass(frozen=True)
class Hop:
    """One flow + vocoder hop: tokens ``[start, stop)`` of the segment; ``finalize`` on the
    segment's last hop (flushes the caches)."""

    start: int
    stop: int
    finalize: bool


class SegmentHops:
    """One hop per segment, due when the segment's decoding has ended."""

    name = "segment"
    constants = None  # not a token-hop stream

    def __init__(self):
        self.done = False

    def due(self, n_tokens: int, finished: bool) -> list[Hop]:
        """The hops that are due once the segment has ``n_tokens`` tokens (``finished``: the LLM
        stopped); each hop is returned once."""
        if not finished or self.done:
            return []
        self.done = True
        return [Hop(0, n_tokens, True)]


class TokenHops:
    """Token hops of ``hop + overlap`` tokens advancing by ``hop`` while that many are pending;
    the hop grows by ``stream_scale_factor`` after each one (capped at ``token_max_hop_len``);
    the remainder is the final hop once the LLM has ended (upstream ``CosyVoiceModel.tts``)."""

    def __init__(self, name: str, constants: StreamConstants):
        self.name = name
        self.constants = constants
        self.start = 0
        self.hop = constants.token_min_hop_len
        self.done = False

    def due(self, n_tokens: int, finished: bool) -> list[Hop]:
        """See :meth:`SegmentHops.due`."""
        c = self.constants
        out = []
        while not self.done and n_tokens - self.start >= self.hop + c.token_overlap_len:
            out.append(Hop(self.start, self.start + self.hop + c.token_overlap_len, False))
            self.start += self.hop
            self.hop = min(c.token_max_hop_len, int(self.hop * c.stream_scale_factor))
        if finished and not self.done:
            out.append(Hop(self.start, n_tokens, True))
            self.done = True
        return out


SCHEDULES = {
    "segment": SegmentHops,
    "official": lambda: TokenHops("official", OFFICIAL),
    "latency": lambda: TokenHops("latency", LATENCY),
}


def policy(hop_schedule: str) -> SegmentHops | TokenHops:
    """A fresh hop policy (one per text segment) for a request's ``streaming.hop_schedule``.

    Raises:
        KeyError: unknown schedule (requests are validated against ``SCHEDULES`` first).
    """
    return SCHEDULES[hop_schedule]()
