"""The toy family's stage calls (:class:`ToyStages`) and their implementation over any
backend's :class:`cosyvino.backends.graphs.GraphRunner` (:class:`ToyGraphStages`). Must not
import torch. Arrays are numpy; floats float32, ids int64; batch 1.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from cosyvino.backends import Stages

from . import NAME, ToyConfig


class ToyStages(Stages):
    """A toy model loaded on one backend."""

    family: ClassVar[str] = NAME
    config: ToyConfig
    #: speaker name -> embedding float32 [1, D]
    speakers: dict[str, np.ndarray]

    @abc.abstractmethod
    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids int64 [1, n] -> LM rows float32 [1, n, D]."""

    @abc.abstractmethod
    def new_lm_session(self):
        """A fresh LM session (empty KV state): ``run([rows [1, N, D]]) -> [logp [1, V+1]]``,
        ``reset()``, ``close()`` (a :class:`cosyvino.backends.graphs.GraphSession`)."""

    @abc.abstractmethod
    def acoustic(self, tokens: np.ndarray, speaker: np.ndarray, noise: np.ndarray
                 ) -> np.ndarray:
        """tokens int64 [1, N], speaker [1, D], noise [1, C, N*R] -> frames [1, C, N*R]."""

    @abc.abstractmethod
    def vocode(self, frames: np.ndarray) -> np.ndarray:
        """frames float32 [1, C, F] -> samples float32 [1, F*hop]."""


class ToyGraphStages(ToyStages):
    """Each stage call is one graph of the toy table on ``runner``; the speakers are the
    ``speaker`` graph's rows for the config's names (nothing else is read from the dir)."""

    def __init__(self, runner):
        self.runner = runner
        self.config = runner.config
        self.thread_safe = bool(getattr(runner, "thread_safe", False))
        self.speakers = {name: self._one("speaker", np.array([i], np.int64))
                         for i, name in enumerate(self.config.speakers)}

    def _one(self, graph: str, *inputs) -> np.ndarray:
        return self.runner.run(graph, list(inputs))[0]

    def embed(self, ids):
        return self._one("embed", np.ascontiguousarray(ids, np.int64))

    def new_lm_session(self):
        return self.runner.new_session("lm")

    def acoustic(self, tokens, speaker, noise):
        return self._one("acoustic", np.ascontiguousarray(tokens, np.int64),
                         np.ascontiguousarray(speaker, np.float32),
                         np.ascontiguousarray(noise, np.float32))

    def vocode(self, frames):
        return self._one("vocoder", np.ascontiguousarray(frames, np.float32))

    def close(self):
        self.runner.close()
