"""Any family's graph table on OpenVINO (CPU): the generic
:class:`cosyvino.backends.graphs.GraphRunner` over a converted IR dir, what the backend serves
for a family without OpenVINO stages of its own (CosyVoice2: the family builds its stages over
it, :meth:`cosyvino.families.ModelFamily.stages_from_runner`). Must not import torch.

What v1's stages do for speed applies to every graph here: the same compile properties
(:func:`.stages.compile_properties`: threads, precision hint, streams, pinning, blob cache; the
stateful graph's KV cache precision and dynamic quantization group), the same IR rewrites at
load (:func:`.stages.compile_ir`), the mapped weight pages and stage buffers released as there.
A graph with state (:attr:`GraphSpec.state`) was exported stateful (its state in OpenVINO
state, fed by ``beam_idx``: :mod:`cosyvino.export.openvino.stateful`): each
:class:`OpenVINOStateSession` owns an InferRequest, so its KV cache never leaves the plugin.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import openvino as ov

from cosyvino.backends.base import Stages
from cosyvino.backends.graphs import GraphRunner, GraphSession
from cosyvino.converted import find_converted_dir, validate_converted_dir
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.families import GraphSpec, GraphTable, detect_family

from .memory import IntermediateReleaser
from .stages import (
    _OPTIONS,
    _PageReleaser,
    _Runner,
    compile_ir,
    compile_properties,
    read_back,
    stage_properties,
    stage_threads_properties,
)

log = logging.getLogger("cosyvino.openvino")

#: the reorder input a stateful IR has besides its data inputs
#: (:data:`cosyvino.export.openvino.stateful.BEAM_IDX`; not imported: that module is export-side)
BEAM_IDX = "beam_idx"
_HINT = "re-run `cosyvino convert --force`"


def _names(ports) -> set[str]:
    return {n for p in ports for n in p.get_names()}


def _state_axis(model: ov.Model) -> int:
    """The growing axis of a stateful IR's states: the last dynamic dim of its first
    variable (axis 0 is the batch, also dynamic). Raises ConvertedModelError: no variable."""
    variables = model.get_variables()
    if not variables:
        raise ConvertedModelError("a graph with state was exported without OpenVINO state")
    shape = variables[0].get_info().data_shape
    dynamic = [i for i in range(shape.rank.get_length()) if shape[i].is_dynamic]
    return dynamic[-1] if dynamic else 0


class OpenVINOStateSession(GraphSession):
    """One request's state of a stateful graph: the state lives in this session's own
    InferRequest (``reset_state()`` empties it). ``run`` feeds the data inputs and
    ``beam_idx = 0 .. B-1`` (every row continues from its own state); the first call after a
    reset sets the batch (B empty rows) and every later call must have it (a row index past
    the state's rows would crash the CPU plugin: refused before the call). Not thread-safe."""

    def __init__(self, spec: GraphSpec, compiled: ov.CompiledModel, state_axis: int,
                 pages: _PageReleaser | None = None,
                 intermediates: IntermediateReleaser | None = None):
        self._spec = spec
        self._compiled = compiled
        self._axis = state_axis
        self._pages = pages
        self._intermediates = intermediates or IntermediateReleaser(enabled=False)
        self._data_in = [(t.name, t.dtype) for t in spec.data_inputs]
        self._data_out = [t.name for t in spec.data_outputs]
        self._req = compiled.create_infer_request()
        self._length = 0
        self._rows = 0  # rows in the state; 0: empty (after a reset)

    def _check_open(self) -> None:
        if self._req is None:
            raise BackendError(f"graph {self._spec.name!r}: session used after close()")

    def reset(self) -> None:
        self._check_open()
        self._req.reset_state()
        self._length = 0
        self._rows = 0

    def close(self) -> None:
        """Drop the request and with it the state. Idempotent."""
        self._req = None

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Data inputs (:attr:`GraphSpec.data_inputs` order) -> data outputs (copies).

        Raises BackendError: closed, wrong input count, or OpenVINO failed (bad shapes)."""
        self._check_open()
        if len(inputs) != len(self._data_in):
            raise BackendError(f"graph {self._spec.name!r} takes {len(self._data_in)} data "
                               f"inputs, got {len(inputs)}")
        feed = {name: np.ascontiguousarray(a, dtype) for (name, dtype), a in
                zip(self._data_in, inputs)}
        rows = next(iter(feed.values())).shape[0]
        if self._rows and rows != self._rows:
            raise BackendError(f"graph {self._spec.name!r}: the state holds {self._rows} "
                               f"rows, this call has {rows}; reset() first")
        if not self._rows and rows > 1:
            self._empty_rows(rows)
        feed[BEAM_IDX] = np.arange(rows, dtype=np.int32)
        self._intermediates.enter(self._spec.name)
        try:
            self._req.infer(feed, share_inputs=True)
        except Exception as e:  # openvino raises RuntimeError with a long message
            raise BackendError(f"openvino: graph {self._spec.name!r} failed: {e}") from e
        finally:
            self._intermediates.exit(self._spec.name)
        if self._pages is not None:
            self._pages.after_call(self._spec.name)
        self._rows = rows
        self._length = -1  # known again on request (state_length)
        return [self._req.get_tensor(n).data.copy() for n in self._data_out]

    def _empty_rows(self, rows: int) -> None:
        """Set every (empty) state to ``rows`` empty rows: the plugin's stateful attention
        gathers the rows by ``beam_idx`` from the state it holds, which after a reset has
        none (gathering row 1 of it crashed the process)."""
        for st in self._req.query_state():
            shape = list(st.state.shape)
            shape[0] = rows
            st.state = ov.Tensor(np.zeros(shape, st.state.data.dtype))

    def state_length(self) -> int:
        """Positions in the state (read from the plugin: a copy of one state tensor)."""
        self._check_open()
        if self._length < 0:
            states = self._req.query_state()
            self._length = int(states[0].state.shape[self._axis]) if states else 0
        return self._length

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The states as the IR holds them (copies), OpenVINO variable name -> array (v2: one
        per layer and K/V, not the table's stacked tensors)."""
        self._check_open()
        return {s.name: s.state.data.copy() for s in self._req.query_state()}


class OpenVINOGraphRunner(GraphRunner):
    """The graphs of a converted OpenVINO dir, one compiled model each.

    Args:
        conv_dir: the converted dir (validated against its manifest).
        table: the family's graph table for ``config``; each graph is ``<stem>.xml``.
        config: the family's typed config.
        **options: the backend's options (:mod:`cosyvino_openvino` docstring); per-stage
            options (``stage_precision``, ``stage_threads``) take this table's graph names.

    Attributes:
        compiled: graph name -> ``ov.CompiledModel``.
        compile_info: graph name -> the properties the CPU plugin chose.
        load_rewrites: IR file name -> rewrite counts (:func:`.stages.compile_ir`).

    Raises:
        BackendError: unknown option or bad value, or OpenVINO cannot compile a graph.
        ConvertedModelError: a graph's IR lacks the table's data inputs/outputs, or a graph
            with state has no OpenVINO state (a conversion of another model or version).
    """

    # each pure graph keeps a pool of InferRequests, each session owns its own
    thread_safe = True

    def __init__(self, conv_dir: str, table: GraphTable, config, **options):
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise BackendError(f"openvino backend: unknown options {unknown}; known: "
                               f"{sorted(_OPTIONS)}")
        self.conv_dir = conv_dir
        self.table = table
        self.config = config
        release = bool(options.pop("release_weight_pages", True))
        release_intermediates = bool(options.pop("release_intermediate_memory", True))
        stage_precision = options.pop("stage_precision", None)
        stage_threads = options.pop("stage_threads", None)
        props, state_props = compile_properties(**options)
        per_stage = stage_threads_properties(
            stage_properties(props, stage_precision, names=table), stage_threads)
        self.core = ov.Core()
        self.compiled: dict[str, ov.CompiledModel] = {}
        self.compile_info: dict[str, dict] = {}
        self.load_rewrites: dict[str, dict[str, int]] = {}
        self._axes: dict[str, int] = {}
        self._pages = _PageReleaser((conv_dir, props.get("CACHE_DIR")) if release else ())
        self._intermediates = IntermediateReleaser(
            release_intermediates, on_release=self._pages.release if release else None)
        for name, spec in table.items():
            path = os.path.join(conv_dir, spec.stem + ".xml")
            cfg = dict(per_stage[name], **state_props) if spec.state else per_stage[name]
            compiled, rewrites = compile_ir(self.core, path, cfg)
            _check_io(compiled, spec, path)
            if spec.state:
                self._axes[name] = _state_axis(self.core.read_model(path))
            self.compiled[name] = compiled
            self.load_rewrites[os.path.basename(path)] = rewrites
            self.compile_info[name] = read_back(compiled)
            self._intermediates.register(name, compiled)
            # after each graph, so the load peak holds one graph's mapped pages, not all
            self._pages.release()
            # the plugin repacks some weights lazily at the first inference (a stateful
            # graph: the first prefill and the first single-position step)
            self._pages.watch(name, 2 if spec.state else 1)
        self._runners = {name: _Runner(c, name, self._pages, self._intermediates)
                         for name, c in self.compiled.items() if not table[name].state}

    def _spec(self, graph: str) -> GraphSpec:
        try:
            return self.table[graph]
        except KeyError:
            raise BackendError(f"openvino: no graph {graph!r}; this model has "
                               f"{', '.join(self.table)}") from None

    def run(self, graph: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """A pure graph: ``inputs`` in the spec's order (converted to its dtypes) -> outputs.

        Raises: BackendError (unknown or stateful graph, wrong input count, OpenVINO failed)."""
        spec = self._spec(graph)
        if spec.state:
            raise BackendError(f"openvino: graph {graph!r} keeps its state in OpenVINO; call "
                               "it through new_session()")
        if len(inputs) != len(spec.inputs):
            raise BackendError(f"graph {graph!r} takes {len(spec.inputs)} inputs, got "
                               f"{len(inputs)}")
        arrays = [np.ascontiguousarray(a, t.dtype) for t, a in zip(spec.inputs, inputs)]
        try:
            return self._runners[graph](*arrays)
        except Exception as e:  # openvino raises RuntimeError with a long message
            raise BackendError(f"openvino: graph {graph!r} failed: {e}") from e

    def new_session(self, graph: str) -> GraphSession:
        """A session of a stateful graph with empty state (:class:`OpenVINOStateSession`).

        Raises: BackendError (unknown graph, or one without state)."""
        spec = self._spec(graph)
        if not spec.state:
            raise BackendError(f"openvino: graph {graph!r} has no state")
        return OpenVINOStateSession(spec, self.compiled[graph], self._axes[graph],
                                    self._pages, self._intermediates)

    def close(self) -> None:
        self._runners.clear()
        self.compiled.clear()


def _check_io(compiled: ov.CompiledModel, spec: GraphSpec, path: str) -> None:
    """ConvertedModelError unless the IR has the spec's data inputs and outputs (a stateful
    IR: the data inputs plus ``beam_idx``; the state tensors are inside)."""
    if spec.state:
        want_in = {t.name for t in spec.data_inputs} | {BEAM_IDX}
        want_out = {t.name for t in spec.data_outputs}
    else:
        want_in, want_out = set(spec.input_names), set(spec.output_names)
    # a port may carry its traced name too: the table's names must be there, one per port
    for what, ports, want in (("inputs", compiled.inputs, want_in),
                              ("outputs", compiled.outputs, want_out)):
        got = _names(ports)
        if not want <= got or len(ports) != len(want):
            raise ConvertedModelError(
                f"{path} does not match the {spec.name!r} graph of this model ({len(ports)} "
                f"{what}, {len(want)} expected; missing {sorted(want - got)[:4]}); {_HINT}",
                path)


def load_graph_stages(model_dir: str, **options) -> Stages:
    """The model in ``model_dir`` (an OpenVINO converted dir, or an official dir with one in
    ``openvino/``) on OpenVINO: its family's stages (manifest ``family``) over an
    :class:`OpenVINOGraphRunner`.

    Raises:
        BackendError: unknown option or bad value, or a graph fails to compile.
        ConvertedModelError: no converted dir, a stale or damaged one, or IRs of another
            table.
        ModelDirError / ConfigError: the family or its config cannot be read.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:  # before any file is read: a typo fails fast
        raise BackendError(f"openvino backend: unknown options {unknown}; known: "
                           f"{sorted(_OPTIONS)}")
    conv_dir, source_dir = find_converted_dir(model_dir, runtime="openvino")
    manifest = validate_converted_dir(conv_dir, source_dir, runtime="openvino")
    family = detect_family(conv_dir)
    config = family.read_config(conv_dir)
    runner = OpenVINOGraphRunner(conv_dir, family.graphs(config), config, **options)
    stages = family.stages_from_runner(runner, conv_dir)
    stages.converted_dir = conv_dir
    stages.manifest = manifest
    log.info("openvino %s: loaded %s (%s); CPU chose %s", ov.get_version(), conv_dir,
             family.name, {n: i for n, i in runner.compile_info.items()
                           if runner.table[n].state})
    return stages


__all__ = ["OpenVINOGraphRunner", "OpenVINOStateSession", "load_graph_stages"]
