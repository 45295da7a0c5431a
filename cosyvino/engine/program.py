"""The state machine of one request, as the engine sees it. Must not import torch.

A family's program (CosyVoice v1: :class:`cosyvino.families.cosyvoice1.program
.CosyVoice1Program`) moves one request through its phases, one :meth:`Program.step` at a time;
the engine and the scheduler only call ``step`` / ``close`` and look at ``phase`` and
``ready_lanes``, so they can interleave (and later batch) the steps of many requests.

A program may have several *lanes* (CosyVoice v1: ``llm`` making speech tokens and ``audio``
turning due hops into chunks): the scheduler runs at most one step per lane of a request at a
time, and may run different lanes of one request at the same time.

Between the stage calls of a long step, a program calls :meth:`Program.check_cancelled`: it
raises when the request was cancelled and, when the step runs under a scheduler that holds it
(first-chunk hold, :mod:`cosyvino.engine.scheduler`), waits there until the hold ends. The
pause belongs to the thread running the step (:func:`pausing`), so the two lanes of one
request, stepped from two threads, are held independently.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import threading
from typing import Callable, Iterator

from ..audio import Audio
from ..errors import SynthesisCancelled


_step_context = threading.local()


@contextlib.contextmanager
def pausing(pause: Callable[[], None] | None) -> Iterator[None]:
    """Within the block, :meth:`Program.check_cancelled` calls ``pause()`` (in this thread
    only) after its cancellation check: the engine installs the scheduler's hold here for the
    length of one step. Nested blocks restore the outer pause."""
    outer = getattr(_step_context, "pause", None)
    _step_context.pause = pause
    try:
        yield
    finally:
        _step_context.pause = outer


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
    #: the lanes this program's steps belong to (one lane: steps run strictly one by one)
    lanes: tuple[str, ...] = ("main",)
    #: set by the engine: the request's cancel event (see :meth:`check_cancelled`)
    cancel: threading.Event | None = None

    @abc.abstractmethod
    def step(self, lane: str | None = None) -> list[Audio]:
        """Run one step of ``lane`` (None: the first of :meth:`ready_lanes`); return the audio
        chunks it completed (usually none; a vocoder hop returns its chunk). Raises what the
        stages raise."""

    def ready_lanes(self) -> tuple[str, ...]:
        """The lanes that have a step to run now, most urgent first (empty when DONE or when
        every lane waits for another one)."""
        return () if self.phase is Phase.DONE else self.lanes[:1]

    def decode_ready(self, lane: str) -> bool:
        """Whether ``lane``'s next step is one LLM decode step that the scheduler may run as a
        row of a batch (:mod:`cosyvino.engine.batching`). A program that says True offers
        ``decode_session()`` (its prefilled LLM session), ``decode_input()`` (sample its next
        token with its own draws -> the embedding float32 [1, 1, D] of the next position, or
        None when its decoding ends), ``decode_accept(logp [V+1], times)`` and
        ``decode_leave()`` (after None). Default: False (never batched)."""
        return False

    def check_cancelled(self) -> None:
        """Raise :class:`SynthesisCancelled` when the request was cancelled; long steps call
        it between their stage calls (e.g. before every estimator call), so cancellation
        reaches every stage within one stage call. It is also where a held step waits (the
        pause the engine installed for this thread, :func:`pausing`); the cancellation is
        checked again after a wait."""
        if self.cancel is not None and self.cancel.is_set():
            raise SynthesisCancelled("synthesis cancelled")
        pause = getattr(_step_context, "pause", None)
        if pause is not None:
            pause()
            if self.cancel is not None and self.cancel.is_set():
                raise SynthesisCancelled("synthesis cancelled")

    def close(self) -> None:
        """Release per-request resources (the LLM session). Idempotent; called on completion,
        error and cancellation."""
