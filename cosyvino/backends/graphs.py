"""The generic graph runner: what a backend offers when it can run any family's graph table
(:class:`cosyvino.families.base.GraphTable`) — the family then builds its stages over it
(:meth:`cosyvino.families.base.ModelFamily.stages_from_runner`). Must not import torch.
"""

from __future__ import annotations

import abc
from typing import Callable, Sequence

import numpy as np

from ..errors import BackendError


class GraphSession(abc.ABC):
    """The carried state of one stateful graph for one request (a KV cache). Not thread-safe."""

    @abc.abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Call the graph with its data inputs (:attr:`GraphSpec.data_inputs`, in order) and the
        state so far; keep the new state; return the data outputs."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Empty the state."""

    def close(self) -> None:
        """Release the state (default: reset)."""
        self.reset()

    def state_length(self) -> int:
        """Positions carried so far: the length of the first state along its
        :attr:`StateSpec.axis` (0 after :meth:`reset`). Raises NotImplementedError for a
        session that cannot tell (default)."""
        raise NotImplementedError(f"{type(self).__name__} does not report its state length")

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The carried state as numpy arrays, state input name -> array (what the next call
        would feed; an empty state after :meth:`reset`). For batching rows of several sessions
        (:class:`cosyvino.families.cosyvoice1.graph_stages.GraphLLMBatch`). Raises
        NotImplementedError for a session that cannot export its state (default)."""
        raise NotImplementedError(f"{type(self).__name__} does not export its state")


class GraphRunner(abc.ABC):
    """Runs the graphs of one loaded model by name.

    Attributes:
        table: the family's :class:`~cosyvino.families.base.GraphTable`.
        config: the family's typed config.
        thread_safe: ``run`` and sessions may be used from several threads at once.
    """

    table = None
    config = None
    thread_safe: bool = False

    @abc.abstractmethod
    def run(self, graph: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Call a pure graph: ``inputs`` in :attr:`GraphSpec.inputs` order (numpy arrays of the
        spec's dtypes) -> outputs in :attr:`GraphSpec.outputs` order.

        Raises: BackendError (unknown graph, or the runtime failed)."""

    def new_session(self, graph: str) -> GraphSession:
        """A session of a stateful graph with empty state. Default: the state is fed back
        explicitly (:class:`ExplicitStateSession` over :meth:`run`)."""
        return ExplicitStateSession(self.table[graph], lambda arrays: self.run(graph, arrays))

    def close(self) -> None:
        """Release runtime resources."""


class ExplicitStateSession(GraphSession):
    """Carries a graph's state by passing the previous call's state outputs back as the next
    call's state inputs (ONNX Runtime, torch): for runtimes without in-graph state."""

    def __init__(self, spec, call: Callable[[list[np.ndarray]], list[np.ndarray]]):
        if not spec.state:
            raise BackendError(f"graph {spec.name!r} has no state")
        self._spec = spec
        self._call = call
        self._data_in = [t.name for t in spec.data_inputs]
        self._in_index = {t.name: i for i, t in enumerate(spec.inputs)}
        self._out_index = {t.name: i for i, t in enumerate(spec.outputs)}
        self._data_out = [self._out_index[t.name] for t in spec.data_outputs]
        self._state: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        self._state = {s.input: s.initial() for s in self._spec.state}

    def state_length(self) -> int:
        first = self._spec.state[0]
        return int(self._state[first.input].shape[first.axis])

    def state_arrays(self) -> dict[str, np.ndarray]:
        return dict(self._state)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self._data_in):
            raise BackendError(f"graph {self._spec.name!r} takes {len(self._data_in)} data "
                               f"inputs, got {len(inputs)}")
        arrays: list = [None] * len(self._spec.inputs)
        for name, a in zip(self._data_in, inputs):
            arrays[self._in_index[name]] = a
        for name, a in self._state.items():
            arrays[self._in_index[name]] = a
        outs = self._call(arrays)
        # the state is replaced only after a successful call: a failed call leaves the
        # session as it was (usable again after reset)
        self._state = {s.input: outs[self._out_index[s.output]] for s in self._spec.state}
        return [outs[i] for i in self._data_out]
