"""Per-stage wall-clock accounting (seconds and call counts), shared by pipeline and bench."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StageTimes:
    """Accumulated seconds and call counts per stage name."""

    seconds: dict = field(default_factory=lambda: defaultdict(float))
    calls: dict = field(default_factory=lambda: defaultdict(int))

    @contextmanager
    def measure(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start
            self.calls[stage] += 1

    def add(self, stage: str, seconds: float, calls: int = 1) -> None:
        """Account ``seconds`` and ``calls`` to ``stage`` (for a stage timed as a whole but
        made of several backend calls, e.g. the estimator calls of one ODE solve)."""
        self.seconds[stage] += seconds
        self.calls[stage] += calls

    def merge(self, other: "StageTimes") -> None:
        for k, v in other.seconds.items():
            self.seconds[k] += v
        for k, v in other.calls.items():
            self.calls[k] += v

    @property
    def total(self) -> float:
        return float(sum(self.seconds.values()))

    def as_dict(self) -> dict:
        return {k: {"seconds": round(self.seconds[k], 6), "calls": self.calls[k]}
                for k in self.seconds}


def audio_stats(times: StageTimes, audio_seconds: float, wall: float, n_tokens: int) -> dict:
    """The ``Audio.stats`` dict of a chunk or a whole synthesis: per-stage seconds/calls,
    speech tokens, audio and wall seconds, and RTF (wall / audio seconds; None for no audio)."""
    return {
        "stages": times.as_dict(),
        "speech_tokens": n_tokens,
        "audio_seconds": round(audio_seconds, 4),
        "wall_seconds": round(wall, 4),
        "rtf": round(wall / audio_seconds, 4) if audio_seconds > 0 else None,
    }
