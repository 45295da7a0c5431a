"""The state machine of one request, as the engine sees it. Must not import torch.

A family's program (CosyVoice v1: :class:`cosyvino.families.cosyvoice1.program
.CosyVoice1Program`) moves one request through its phases, one :meth:`Program.step` at a time;
the engine and the scheduler only call ``step`` / ``close`` and look at ``phase``, so they can
interleave (and later batch) the steps of many requests.
"""

from __future__ import annotations

import abc
import enum

from ..audio import Audio


class Phase(enum.Enum):
    """What the next :meth:`Program.step` of a request does."""

    PREFILL = "prefill"   # build the LLM input of the next segment, run it through the LLM
    DECODE = "decode"     # sample one speech token, run it through the LLM
    FLOW = "flow"         # speech tokens -> mel (one hop)
    VOCODER = "vocoder"   # mel -> waveform (one hop); emits a chunk
    DONE = "done"


class Program(abc.ABC):
    """One request's state.

    Attributes:
        phase: the phase the next step runs (``Phase.DONE``: nothing left).
        total_segments: number of text segments (chunks with ``stats["is_last_in_segment"]``).
    """

    phase: Phase = Phase.PREFILL
    total_segments: int = 0

    @abc.abstractmethod
    def step(self) -> list[Audio]:
        """Run one step of the current phase; return the audio chunks it completed (usually
        none; a vocoder hop returns its chunk). Raises what the stages raise."""

    def close(self) -> None:
        """Release per-request resources (the LLM session). Idempotent; called on completion,
        error and cancellation."""
