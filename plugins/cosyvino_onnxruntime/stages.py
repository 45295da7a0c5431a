"""ONNX Runtime (CPU) serving of a converted ONNX dir, for any model family. Must not import
torch.

:class:`ORTGraphRunner` is the backend: one ``InferenceSession`` per graph of the dir's family
table (:meth:`cosyvino.families.base.ModelFamily.graphs`), loaded from ``<stem>.onnx``; ``run``
feeds the table's input names and returns the table's outputs in order (``run`` may be called
from several threads at once). The family builds its stages over it
(:meth:`~cosyvino.families.base.ModelFamily.stages_from_runner`, :func:`load_stages`);
CosyVoice v1 gets :class:`ORTStages`, its graph stages plus what tools and tests inspect
(``sessions``, ``converted_dir``, ``manifest``, the LLM session's ``cache_length``).

A stateful graph (v1: the LLM, its KV cache) has no state inside ONNX: every session keeps its
own state between calls and feeds the previous call's state outputs (``present.*``) back as the
next call's state inputs (``past_key_values.*``): by default through ``session.run`` (numpy
arrays, :class:`cosyvino.backends.graphs.ExplicitStateSession`), with the ``io_binding`` option
as bound ``OrtValue`` s (:class:`BoundStateSession`). ``run`` is the default: IO binding saves
nothing measurable (the cache is a few MB against the weights read per step; docs/performance.md,
"Measurements behind code constants").
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np
import onnxruntime as ort

from cosyvino.backends.base import Stages
from cosyvino.backends.graphs import ExplicitStateSession, GraphRunner, GraphSession
from cosyvino.converted import STAGE_EXTS, find_converted_dir, validate_converted_dir
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.families import detect_family
from cosyvino.families.base import GraphSpec, GraphTable
from cosyvino.families.cosyvoice1.graph_stages import GraphLLMSession, GraphStages

from . import MAX_LLM_BATCH

log = logging.getLogger("cosyvino.onnxruntime")

RUNTIME = "onnxruntime"
EXT = STAGE_EXTS[RUNTIME]
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_EXEC_MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
               "parallel": ort.ExecutionMode.ORT_PARALLEL}
#: backend options accepted by :func:`load_stages` (see the package docstring)
_OPTIONS = {"num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
            "enable_cpu_mem_arena", "io_binding", "optimized_model_dir"}
_HINT = "re-run `cosyvino convert --format onnx`"


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BackendError(f"onnxruntime backend: {name} must be an integer >= 1, got "
                           f"{value!r}")
    return int(value)


def session_options(*, num_threads=None, inter_op_num_threads=None,
                    graph_optimization_level="all", execution_mode="sequential",
                    enable_cpu_mem_arena=True, optimized_model_dir=None,
                    stem: str = "") -> ort.SessionOptions:
    """``ort.SessionOptions`` from backend options (package docstring); BackendError on a bad
    value. ``stem`` names the optimized-model file when ``optimized_model_dir`` is set."""
    so = ort.SessionOptions()
    if num_threads is not None:
        so.intra_op_num_threads = _count("num_threads", num_threads)
    if inter_op_num_threads is not None:
        so.inter_op_num_threads = _count("inter_op_num_threads", inter_op_num_threads)
    level = _OPT_LEVELS.get(str(graph_optimization_level).lower())
    if level is None:
        raise BackendError(f"onnxruntime backend: graph_optimization_level must be one of "
                           f"{sorted(_OPT_LEVELS)}, got {graph_optimization_level!r}")
    so.graph_optimization_level = level
    mode = _EXEC_MODES.get(str(execution_mode).lower())
    if mode is None:
        raise BackendError(f"onnxruntime backend: execution_mode must be one of "
                           f"{sorted(_EXEC_MODES)}, got {execution_mode!r}")
    so.execution_mode = mode
    if not isinstance(enable_cpu_mem_arena, bool):
        raise BackendError("onnxruntime backend: enable_cpu_mem_arena must be true or false, "
                           f"got {enable_cpu_mem_arena!r}")
    so.enable_cpu_mem_arena = enable_cpu_mem_arena
    if optimized_model_dir:
        os.makedirs(optimized_model_dir, exist_ok=True)
        so.optimized_model_filepath = os.path.join(optimized_model_dir, stem + ".opt" + EXT)
    so.log_severity_level = 3  # warnings about unused initializers etc. are noise here
    return so


def _check_options(options: dict) -> tuple[dict, bool]:
    """(session options, io_binding) from backend options; BackendError on an unknown option
    or a bad value (checked before any file is read: a typo fails fast)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise BackendError(f"onnxruntime backend: unknown options {unknown}; known: "
                           f"{sorted(_OPTIONS)}")
    options = dict(options)
    io_binding = options.pop("io_binding", False)
    if not isinstance(io_binding, bool):
        raise BackendError(f"onnxruntime backend: io_binding must be true or false, got "
                           f"{io_binding!r}")
    session_options(**options)  # validates every value; optimized_model_dir is created here
    return options, io_binding


class BoundStateSession(GraphSession):
    """The state of one stateful graph kept as ``OrtValue`` s bound through an IO binding (the
    ``io_binding`` option): the previous call's state outputs are bound as the next call's
    state inputs, so the state never becomes numpy. ORT allocates the outputs (they are
    re-bound every call because the state grows). Not thread-safe; one per request.
    """

    def __init__(self, spec: GraphSpec, session: ort.InferenceSession):
        if not spec.state:
            raise BackendError(f"graph {spec.name!r} has no state")
        self._spec = spec
        self._session = session
        self._binding = session.io_binding()
        self._data_in = [t.name for t in spec.data_inputs]
        self._dtypes = {t.name: t.dtype for t in spec.inputs}
        self._out_index = {name: i for i, name in enumerate(spec.output_names)}
        self._data_out = [self._out_index[t.name] for t in spec.data_outputs]
        self._empty = {s.input: s.initial() for s in spec.state}
        self._state: dict[str, ort.OrtValue] | None = None  # state input name -> value

    def reset(self) -> None:
        self._state = None

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Data inputs (:attr:`GraphSpec.data_inputs` order) -> data outputs, as numpy.

        Raises: BackendError (wrong input count, or ORT failed; the state is then unchanged)."""
        if len(inputs) != len(self._data_in):
            raise BackendError(f"graph {self._spec.name!r} takes {len(self._data_in)} data "
                               f"inputs, got {len(inputs)}")
        b = self._binding
        try:
            for name, a in zip(self._data_in, inputs):
                b.bind_cpu_input(name, np.ascontiguousarray(a, self._dtypes[name]))
            if self._state is None:
                for name, empty in self._empty.items():
                    b.bind_cpu_input(name, empty)
            else:
                for name, value in self._state.items():
                    b.bind_ortvalue_input(name, value)
            for name in self._spec.output_names:
                b.bind_output(name, "cpu")
            self._session.run_with_iobinding(b)
            out = b.get_outputs()
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            raise BackendError(f"onnxruntime: graph {self._spec.name!r} failed: {e}") from e
        finally:
            # drop the binding's references to the inputs; the state lives on in self._state
            b.clear_binding_inputs()
            b.clear_binding_outputs()
        self._state = {s.input: out[self._out_index[s.output]] for s in self._spec.state}
        return [out[i].numpy() for i in self._data_out]

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The bound state as numpy arrays (copies), state input name -> array."""
        if self._state is None:
            return dict(self._empty)
        return {name: value.numpy() for name, value in self._state.items()}

    def state_length(self) -> int:
        """Positions carried so far (along the first state's :attr:`StateSpec.axis`)."""
        if self._state is None:
            return 0
        first = self._spec.state[0]
        return int(self._state[first.input].shape()[first.axis])


class ORTGraphRunner(GraphRunner):
    """The graphs of a converted ONNX dir, one ``InferenceSession`` each.

    Args:
        conv_dir: the converted dir (already validated against its manifest).
        table: the family's graph table for ``config``; each graph is ``<stem>.onnx``.
        config: the family's typed config.
        io_binding: stateful graphs keep their state as bound OrtValues
            (:class:`BoundStateSession`) instead of numpy (:class:`ExplicitStateSession`).
        **options: session options (:func:`session_options`).

    Attributes:
        sessions: graph name -> ``ort.InferenceSession``.

    Raises:
        ConvertedModelError: a graph file cannot be loaded, or its input/output names are not
            the table's (a conversion of another model or cosyvino version).
    """

    # InferenceSession.run is safe to call concurrently; each state session owns its state
    # (and IO binding), so one loaded model serves several threads.
    thread_safe = True

    def __init__(self, conv_dir: str, table: GraphTable, config, *, io_binding: bool = False,
                 **options):
        self.conv_dir = conv_dir
        self.table = table
        self.config = config
        self.io_binding = io_binding
        self.sessions: dict[str, ort.InferenceSession] = {}
        for name, spec in table.items():
            path = os.path.join(conv_dir, spec.stem + EXT)
            try:
                session = ort.InferenceSession(path, session_options(**options, stem=spec.stem),
                                               providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ConvertedModelError(f"onnxruntime cannot load {path} ({e}); {_HINT}",
                                          path) from e
            _check_io(session, spec, path)
            self.sessions[name] = session

    def _spec(self, graph: str) -> GraphSpec:
        try:
            return self.table[graph]
        except KeyError:
            raise BackendError(f"onnxruntime: no graph {graph!r}; this model has "
                               f"{', '.join(self.table)}") from None

    def run(self, graph: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``inputs`` in the spec's input order -> outputs in its output order (numpy). Inputs
        are converted to the spec's dtypes (a no-op when they have them already).

        Raises: BackendError (unknown graph, wrong input count, or ORT failed: wrong shapes)."""
        spec = self._spec(graph)
        if len(inputs) != len(spec.inputs):
            raise BackendError(f"graph {graph!r} takes {len(spec.inputs)} inputs, got "
                               f"{len(inputs)}")
        feeds = {t.name: np.ascontiguousarray(a, t.dtype) for t, a in zip(spec.inputs, inputs)}
        try:
            return self.sessions[graph].run(spec.output_names, feeds)
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            raise BackendError(f"onnxruntime: graph {graph!r} failed: {e}") from e

    def new_session(self, graph: str) -> GraphSession:
        """A session of a stateful graph with empty state (see ``io_binding``)."""
        spec = self._spec(graph)
        if self.io_binding and spec.state:
            return BoundStateSession(spec, self.sessions[graph])
        return ExplicitStateSession(spec, lambda arrays: self.run(graph, arrays))


def _check_io(session: ort.InferenceSession, spec: GraphSpec, path: str) -> None:
    """ConvertedModelError unless the ONNX file's input and output names are the spec's."""
    for what, got, want in (("inputs", [i.name for i in session.get_inputs()], spec.input_names),
                            ("outputs", [o.name for o in session.get_outputs()],
                             spec.output_names)):
        if sorted(got) != sorted(want):
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            raise ConvertedModelError(
                f"{path} does not match the {spec.name!r} graph of this model "
                f"({len(got)} {what}, {len(want)} expected; missing {missing[:4]}, unexpected "
                f"{extra[:4]}); {_HINT}", path)


class ORTLLMSession(GraphLLMSession):
    """The v1 LLM's KV cache of one utterance, in a runner session (numpy or IO binding);
    rows of several join a :class:`cosyvino.families.cosyvoice1.graph_stages.GraphLLMBatch`
    (``ORTStages.new_llm_batch``)."""


class ORTStages(GraphStages):
    """CosyVoice v1 on ONNX Runtime: the family's graph stages
    (:class:`cosyvino.families.cosyvoice1.graph_stages.GraphStages`, what
    ``CosyVoice1.stages_from_runner`` builds) over an :class:`ORTGraphRunner`, plus the ORT
    view tools and tests use: ``sessions``, ``converted_dir``, ``manifest`` and LLM sessions
    with ``cache_length()``. The tables' errors name ``cosyvino convert --format onnx``.

    Raises: ConvertedModelError when the tables or speakers cannot be read.
    """

    def __init__(self, runner: ORTGraphRunner, conv_dir: str, manifest: dict):
        super().__init__(runner, conv_dir, RUNTIME)
        self.converted_dir = conv_dir
        self.manifest = manifest

    @property
    def sessions(self) -> dict[str, ort.InferenceSession]:
        """graph name -> ``ort.InferenceSession``."""
        return self.runner.sessions

    def new_llm_session(self) -> ORTLLMSession:
        return ORTLLMSession(self.runner.new_session("llm"), self.positional_keys)

    max_llm_batch = MAX_LLM_BATCH


def load_stages(model_dir: str, **options) -> Stages:
    """The model in ``model_dir`` (an ONNX converted dir, or an official dir with one in
    ``onnx/``) on ONNX Runtime: the stages of its family (manifest ``family``) over an
    :class:`ORTGraphRunner`; v1 gets :class:`ORTStages`.

    Raises:
        BackendError: unknown option or bad option value (before any file is read).
        ConvertedModelError: no converted dir, a stale or damaged one (manifest, file hashes,
            source changed), or a graph file ORT cannot load.
        ModelDirError / ConfigError: the family or its config cannot be read.
    """
    session_opts, io_binding = _check_options(options)
    conv_dir, source_dir = find_converted_dir(model_dir, RUNTIME)
    manifest = validate_converted_dir(conv_dir, source_dir, runtime=RUNTIME)
    family = detect_family(conv_dir)
    config = family.read_config(conv_dir)
    runner = ORTGraphRunner(conv_dir, family.graphs(config), config, io_binding=io_binding,
                            **session_opts)
    if family.name == "cosyvoice1":
        stages = ORTStages(runner, conv_dir, manifest)
    else:
        stages = family.stages_from_runner(runner, conv_dir)
    log.info("onnxruntime %s: loaded %s (%s, io_binding=%s)", ort.__version__, conv_dir,
             family.name, io_binding)
    return stages
