"""The engine: a request becomes a program (a state machine of prefill, decode steps, flow and
vocoder hops) that an :class:`Engine` steps on one loaded model; a :class:`Scheduler` drives many
requests on worker threads. Random draws are indexed by seed and position
(:class:`RandomDraws`). Must not import torch."""

from .draws import RandomDraws
from .engine import Engine, RequestState
from .program import Phase, Program
from .rendezvous import CallRendezvous
from .scheduler import RequestHandle, Scheduler

__all__ = ["CallRendezvous", "Engine", "Phase", "Program", "RandomDraws", "RequestHandle", "RequestState",
           "Scheduler"]
