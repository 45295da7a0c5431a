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
from typing import Callable, Iterator, Mapping, Protocol, Sequence

from ..audio import Audio
from ..errors import SynthesisCancelled
from ..request import SynthesisRequest
from ..voices import Voice, builtin_voices
from .draws import RandomDraws
from .program import Phase, Program, pausing


class Hold(Protocol):
    """What :meth:`Engine.step` asks of a scheduler that may hold a step (first-chunk hold,
    :mod:`.scheduler`): ``needed()`` says, cheaply, whether the step should wait now;
    ``wait()`` blocks until it need not (or the hold's own time limit passes)."""

    def needed(self) -> bool: ...

    def wait(self) -> None: ...


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
        lane_locks: lane name -> the lock held around that lane's steps instead of ``lock``
            (lanes that use disjoint parts of the model, e.g. v1 ``llm`` and ``audio``, may
            then run at the same time); lanes not named use ``lock``.
        voices: registered voices besides the built-in speakers (name -> :class:`Voice`), read
            at each :meth:`start` (a live mapping such as
            :class:`cosyvino.voice_store.VoiceStore` may change between requests).
        model_dir: the dir the model was loaded from (the family decides its modes by it).
        modes: mode names this engine offers (None: what the family says the checkpoint
            offers, :meth:`ModelFamily.modes_for`).
        prompts: the family's prompt encoder (:meth:`ModelFamily.prompt_encoder`) for requests
            with ``prompt_audio`` / ``source_audio``; None: such requests are refused.
        batchers: stage name -> :class:`~cosyvino.engine.rendezvous.CallRendezvous` shared by
            the programs of this engine (:meth:`ModelFamily.new_program` ``batchers``):
            concurrent requests' calls of that stage with equal shapes run as one call.
    """

    def __init__(self, stages, family, frontend, *, lock=None, lane_locks: dict | None = None,
                 voices: Mapping[str, Voice] | None = None, model_dir: str | None = None,
                 modes: Sequence[str] | None = None, prompts=None,
                 batchers: Mapping | None = None):
        self.stages = stages
        self.lane_locks = dict(lane_locks or {})
        self.family = family
        self.frontend = frontend
        self.lock = lock
        self.model_dir = model_dir
        self.prompts = prompts
        self.batchers = dict(batchers or {})
        self.builtin_voices = dict(builtin_voices(stages.speakers))
        # voices a family's stages ship ready-made (CosyVoice2: the zero-shot bundles of
        # spk2info.pt), served by name like the built-in speakers
        self.builtin_voices.update(getattr(stages, "prompt_voices", None) or {})
        self.registered = voices if voices is not None else {}
        self._mode_names = None if modes is None else tuple(modes)

    @property
    def voices(self) -> dict[str, Voice]:
        """Built-in speakers and registered voices by name (a snapshot)."""
        registered = self.registered
        snapshot = registered.snapshot() if hasattr(registered, "snapshot") else dict(registered)
        return {**self.builtin_voices, **snapshot}

    @property
    def modes(self) -> dict:
        """The modes this engine offers (name -> :class:`~cosyvino.families.base.Mode`), in
        the family's matching order."""
        if self._mode_names is not None:
            return {n: m for n, m in self.family.modes.items() if n in self._mode_names}
        return self.family.modes_for(self.model_dir, self.stages)

    def start(self, request: SynthesisRequest,
              cancel: threading.Event | None = None) -> RequestState:
        """Validate ``request`` and build its program (text split into segments here; the
        prompt processing of ``prompt_audio`` / ``source_audio`` runs here, once).

        Raises:
            InputError and subclasses (EmptyTextError, UnknownSpeakerError, PromptAudioError):
                a bad request.
            CorruptVoiceError: the request names a stored voice whose file is unusable.
            ModelDirError / BackendError: the prompt models are missing or failed.
        """
        voices = self.voices
        name = request.voice
        if isinstance(name, str) and name not in voices:
            try:  # a stored voice that failed its checks says so (CorruptVoiceError)
                voices[name] = self.registered[name]
            except KeyError:
                pass
        modes = self.modes
        unavailable = {}
        for n in self.family.modes:
            if n not in modes:
                why = self.family.mode_unavailable_reason(self.model_dir, self.stages, n)
                unavailable[n] = why or "not offered by this model"
        req = request.validated(modes=modes, voices=voices, speech_vocab=self.speech_vocab,
                                prompts=self.prompts, unavailable=unavailable)
        extra = {"batchers": self.batchers} if self.batchers else {}
        program = self.family.new_program(self.stages, req, RandomDraws(req.seed),
                                          self.frontend, **extra)
        state = RequestState(req, program, cancel or threading.Event())
        program.cancel = state.cancel
        return state

    @property
    def speech_vocab(self) -> int | None:
        return self.family.speech_vocab(self.stages.config)

    def step(self, state: RequestState, lane: str | None = None,
             hold: Hold | None = None) -> list[Audio]:
        """One step of ``state``'s program in ``lane`` (None: its most urgent ready lane). On
        completion the program is closed; on cancellation or error too when ``lane`` is None
        (a caller stepping named lanes from several threads closes it once all are out).

        ``hold`` (from a scheduler): the step waits while ``hold.needed()``, before it starts
        and between its stage calls (:meth:`Program.check_cancelled`), without its lock, so
        a held step keeps no slot from the steps it waits for.

        Raises:
            SynthesisCancelled: ``state.cancel`` was set before or during the step.
        """
        if hold is not None and not state.cancel.is_set() and hold.needed():
            hold.wait()
        if state.cancel.is_set():
            if lane is None:
                state.program.close()
            raise SynthesisCancelled("synthesis cancelled")
        lock = self.lock if lane is None else self.lane_locks.get(lane, self.lock)
        pause = None if hold is None else _pause_without(lock, hold)
        try:
            with pausing(pause):
                if lock is None:
                    out = state.program.step(lane)
                else:
                    with lock:
                        out = state.program.step(lane)
        except BaseException:
            if lane is None:
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


def _pause_without(lock, hold: Hold) -> Callable[[], None]:
    """The pause of a step that holds ``lock`` (or None): waits out ``hold`` with the lock
    released, then takes it again."""
    def pause() -> None:
        if not hold.needed():
            return
        if lock is None:
            hold.wait()
            return
        lock.release()
        try:
            hold.wait()
        finally:
            lock.acquire()
    return pause
