"""CosyVoice2 streaming policy (sheet v2 §7.2): how a segment's speech tokens are cut into
flow/vocoder hops. Must not import torch.

Schedules (a request's ``streaming.hop_schedule``):

* ``segment``: one hop per text segment, the official non-streaming computation (the flow once
  over all tokens with full attention, the vocoder once).
* ``official``: the official v2 token hops: hop 25 tokens (the first one padded so that the
  prompt tokens plus the first hop end on a 25-token boundary), then 50, 100, 100 ...; each hop
  waits for 3 look-ahead tokens; every non-final hop re-runs the flow over ALL tokens so far
  (streaming chunk attention, ``finalize=False``) and keeps its new frames; the last hop runs
  over all tokens with full attention. First audio after 25 + pad + 3 tokens.
* ``latency``: for CosyVoice2 the same hops as ``official`` (its first hop is already short:
  28 tokens = 1.1 s of speech without a prompt).

Unlike v1, the hop counter is per segment: upstream keeps ``token_hop_len`` on the model object,
so a second streaming request there starts at hop 100 (sheet v2 §7.2); per-segment hops make a
seed's audio independent of what ran before.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cosyvoice1.streaming import Hop, SegmentHops


@dataclass(frozen=True)
class StreamConstants2:
    """Upstream ``CosyVoice2Model`` streaming constants (sheet v2 §7.2)."""

    token_hop_len: int = 25
    token_max_hop_len: int = 100
    stream_scale_factor: int = 2
    pre_lookahead_len: int = 3
    mel_cache_len: int = 8
    source_cache_len: int = 3840


#: the official constants
OFFICIAL = StreamConstants2()


class TokenHops2:
    """The v2 hop policy of one segment: ``due(n_tokens, finished)`` returns the hops that are
    due, each once. A hop is :class:`~..cosyvoice1.streaming.Hop` ``(start, stop, finalize)``:
    ``start`` = the token offset of its new frames, ``stop`` = the tokens the flow sees
    (``tokens[0:stop]``: from token 0, the last ``pre_lookahead_len`` of a non-final hop are
    look-ahead only); the final hop has ``stop`` = all tokens."""

    def __init__(self, name: str, prompt_tokens: int, constants: StreamConstants2 = OFFICIAL):
        self.name = name
        self.constants = constants
        c = constants
        self.pad = -(-prompt_tokens // c.token_hop_len) * c.token_hop_len - prompt_tokens
        self.offset = 0
        self.hop_len = c.token_hop_len
        self.done = False

    def due(self, n_tokens: int, finished: bool) -> list[Hop]:
        c = self.constants
        out = []
        while not self.done:
            hop = self.hop_len + (self.pad if self.offset == 0 else 0)
            if n_tokens - self.offset < hop + c.pre_lookahead_len:
                break
            out.append(Hop(self.offset, self.offset + hop + c.pre_lookahead_len, False))
            self.offset += hop
            self.hop_len = min(c.token_max_hop_len, self.hop_len * c.stream_scale_factor)
        if finished and not self.done:
            out.append(Hop(self.offset, n_tokens, True))
            self.done = True
        return out


def policy(hop_schedule: str, prompt_tokens: int = 0):
    """A fresh hop policy (one per text segment) for ``hop_schedule``; ``prompt_tokens``: the
    flow prompt's tokens (they shift the first hop's padding). Raises KeyError for an unknown
    schedule (requests are validated first)."""
    if hop_schedule == "segment":
        return SegmentHops()
    if hop_schedule in ("official", "latency"):
        return TokenHops2(hop_schedule, prompt_tokens)
    raise KeyError(hop_schedule)
