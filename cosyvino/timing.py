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
