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

from ..cosyvoice1.streaming import Hop, SegmentHops
from .official_stream import StreamConstants, TokenHopSchedule

#: the official constants (sheet v2 §7.2)
OFFICIAL = StreamConstants()


class TokenHops2:
    """The v2 hop policy of one segment over :class:`~.official_stream.TokenHopSchedule`:
    ``due(n_tokens, finished)`` returns the hops that are due, each once, as
    :class:`~..cosyvoice1.streaming.Hop` ``(start, stop, finalize)``: ``start`` = the token
    offset of its new frames, ``stop`` = the tokens the flow sees (``tokens[0:stop]``: from
    token 0; the last ``pre_lookahead_len`` of a non-final hop are look-ahead only); the final
    hop has ``stop`` = all tokens."""

    def __init__(self, name: str, prompt_tokens: int, constants: StreamConstants = OFFICIAL):
        self.name = name
        self.constants = constants
        self.schedule = TokenHopSchedule(prompt_tokens, constants)
        self.done = False

    def due(self, n_tokens: int, finished: bool) -> list[Hop]:
        out = []
        if self.done:
            return out
        while (call := self.schedule.next_call(n_tokens)) is not None:
            out.append(Hop(call.token_offset, call.n_tokens, False))
        if finished:
            call = self.schedule.final_call(n_tokens)
            out.append(Hop(call.token_offset, call.n_tokens, True))
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
