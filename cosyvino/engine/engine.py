"""The engine: runs requests' programs on one loaded model. Must not import torch.

``Engine.start`` validates a :class:`cosyvino.request.SynthesisRequest` against the loaded
model and builds its program (through the model's family); ``Engine.step`` runs one step of it
while holding the model's stage lock, checking cancellation first. ``Engine.run`` drives one
request to the end in the caller's thread (what ``Synthesizer.stream`` does); the
:class:`~cosyvino.engine.scheduler.Scheduler` drives many.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator

from ..audio import Audio
from ..errors import SynthesisCancelled
from ..request import SynthesisRequest
from ..voices import Voice, builtin_voices
from .draws import RandomDraws
from .program import Phase, Program


@dataclass(eq=False)
class RequestState:
    """One started request: the validated request, its program and its cancel event."""

    request: SynthesisRequest
    program: Program
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.program.phase is Phase.DONE

    @property
    def total_segments(self) -> int:
        return self.program.total_segments


class Engine:
    """Requests on one loaded model.

    Args:
        stages: the loaded model (a family's :class:`cosyvino.backends.Stages` subclass).
        family: its :class:`cosyvino.families.base.ModelFamily` class.
        frontend: the family's text frontend.
        lock: held around every step (a ``Lock`` for stages that are not thread-safe, a
            ``BoundedSemaphore(n)`` to let ``n`` steps run at once); None = no lock.
        voices: registered voices besides the built-in speakers (name -> :class:`Voice`).
    """

    def __init__(self, stages, family, frontend, *, lock=None,
                 voices: dict[str, Voice] | None = None):
        self.stages = stages
        self.family = family
        self.frontend = frontend
        self.lock = lock
        self.voices = dict(builtin_voices(stages.speakers))
        self.voices.update(voices or {})

    def start(self, request: SynthesisRequest,
              cancel: threading.Event | None = None) -> RequestState:
        """Validate ``request`` and build its program (text split into segments here).

        Raises:
            InputError and subclasses (EmptyTextError, UnknownSpeakerError): a bad request.
        """
        req = request.validated(modes=self.family.modes, voices=self.voices,
                                speech_vocab=self.speech_vocab)
        program = self.family.new_program(self.stages, req, RandomDraws(req.seed),
                                          self.frontend)
        return RequestState(req, program, cancel or threading.Event())

    @property
    def speech_vocab(self) -> int | None:
        return self.family.speech_vocab(self.stages.config)

    def step(self, state: RequestState) -> list[Audio]:
        """One step of ``state``'s program. On cancellation, error or completion the program is
        closed.

        Raises:
            SynthesisCancelled: ``state.cancel`` was set before the step.
        """
        if state.cancel.is_set():
            state.program.close()
            raise SynthesisCancelled("synthesis cancelled")
        try:
            if self.lock is None:
                out = state.program.step()
            else:
                with self.lock:
                    out = state.program.step()
        except BaseException:
            state.program.close()
            raise
        if state.done:
            state.program.close()
        return out

    def run(self, state: RequestState) -> Iterator[Audio]:
        """Step ``state`` to the end in this thread, yielding its chunks; closing the iterator
        early closes the program."""
        try:
            while not state.done:
                yield from self.step(state)
        finally:
            state.program.close()
