"""ONNX Runtime implementation of :class:`cosyvino.backends.Stages` (CPU). Must not import torch.

One ``InferenceSession`` per stage (``run`` may be called from several threads at once). The LLM
graph takes and returns its KV cache explicitly; every :class:`ORTLLMSession` keeps its own
cache between steps and feeds the previous step's ``present.*`` outputs back as the next
``past_key_values.*`` inputs: by default through ``session.run`` (numpy arrays), with the
``io_binding`` option as bound ``OrtValue`` s. Measured on one InferenceSession, the two
kinds of session stepped alternately (shared 2-core machine, 1 thread, medians per decode
step): synthetic 300M, cache 40..240 positions, ``run`` 125.7 ms wall / 80.0 ms CPU, IO binding
129.5 / 79.1 ms (the cache is a few MB against ~790 MB of weights read per step, so skipping
its numpy round trip does not show); tiny model, cache up to 2040 positions, ``run`` 1.14 ms,
IO binding 1.17 ms (one bind call per cache tensor and step costs more than it saves). Hence
``run`` by default.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import onnxruntime as ort

from cosyvino.backends.base import LLMSession, Stages
from cosyvino.backends.tables import ServingTablesMixin
from cosyvino.converted import STAGE_EXTS, STAGES, find_converted_dir, validate_converted_dir
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.families.cosyvoice1.yaml_config import read_model_config

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
#: backend options accepted by :class:`ORTStages` (see the package docstring)
_OPTIONS = {"num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
            "enable_cpu_mem_arena", "io_binding", "optimized_model_dir"}


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


class ORTLLMSession(LLMSession):
    """KV cache of one utterance, held between steps.

    ``io_binding=False`` (default): plain ``session.run``, the cache as numpy arrays.
    ``io_binding=True``: the previous step's present ``OrtValue`` s are bound as the next
    step's past inputs and ORT allocates the outputs (the cache never becomes numpy; outputs
    must be re-bound every step because their length grows).
    """

    def __init__(self, session: ort.InferenceSession, past_names: list[str],
                 present_names: list[str], empty_shape: tuple[int, int, int, int],
                 io_binding: bool = False):
        self._session = session
        self._past = past_names
        self._present = present_names
        self._empty = np.zeros(empty_shape, np.float32)
        self._io_binding = io_binding
        self._binding = session.io_binding() if io_binding else None
        self._cache: list | None = None  # per past name: OrtValue (binding) or ndarray

    def reset(self) -> None:
        self._cache = None

    def forward(self, inputs_embeds: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(inputs_embeds, np.float32)
        if self._binding is None:
            feeds = {"inputs_embeds": x}
            cache = self._cache or [self._empty] * len(self._past)
            feeds.update(zip(self._past, cache))
            out = self._session.run(None, feeds)
            self._cache = out[1:]
            return out[0][0]
        b = self._binding
        b.bind_cpu_input("inputs_embeds", x)
        if self._cache is None:
            for name in self._past:
                b.bind_cpu_input(name, self._empty)
        else:
            for name, value in zip(self._past, self._cache):
                b.bind_ortvalue_input(name, value)
        b.bind_output("logp", "cpu")
        for name in self._present:
            b.bind_output(name, "cpu")
        self._session.run_with_iobinding(b)
        out = b.get_outputs()
        self._cache = [out[i] for i in range(1, len(self._present) + 1)]
        # drop the binding's references to the inputs; the cache lives on in self._cache
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        return out[0].numpy()[0]

    def cache_length(self) -> int:
        """Number of cached positions."""
        if self._cache is None:
            return 0
        first = self._cache[0]
        return int(first.shape()[2] if isinstance(first, ort.OrtValue) else first.shape[2])


class ORTStages(ServingTablesMixin, Stages):
    # InferenceSession.run is safe to call concurrently; each LLM session owns its cache and
    # IO binding, so one loaded model serves several threads.
    thread_safe = True

    def __init__(self, model_dir: str, **options):
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise BackendError(f"onnxruntime backend: unknown options {unknown}; known: "
                               f"{sorted(_OPTIONS)}")
        io_binding = options.pop("io_binding", False)
        if not isinstance(io_binding, bool):
            raise BackendError(f"onnxruntime backend: io_binding must be true or false, got "
                               f"{io_binding!r}")
        self._io_binding = io_binding
        session_options(**options)  # validate before the (slow) file checks and loads
        conv_dir, source_dir = find_converted_dir(model_dir, RUNTIME)
        self.converted_dir = conv_dir
        self.manifest = validate_converted_dir(conv_dir, source_dir, runtime=RUNTIME)
        self.config = read_model_config(os.path.join(conv_dir, "cosyvoice.yaml"))
        self._load_serving_tables(conv_dir, RUNTIME)

        self.sessions: dict[str, ort.InferenceSession] = {}
        for stage, stem in STAGES.items():
            path = os.path.join(conv_dir, stem + EXT)
            try:
                self.sessions[stage] = ort.InferenceSession(
                    path, session_options(**options, stem=stem),
                    providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ConvertedModelError(f"onnxruntime cannot load {path} ({e}); re-run "
                                          "`cosyvino convert --format onnx`", path) from e
        llm = self.sessions["llm"]
        self._past = [i.name for i in llm.get_inputs() if i.name.startswith("past_key_values.")]
        self._present = [o.name for o in llm.get_outputs() if o.name.startswith("present.")]
        m = self.manifest["llm"]
        self._empty_cache = (1, m["heads"], 0, m["head_dim"])
        if len(self._past) != 2 * m["layers"] or len(self._present) != len(self._past):
            path = os.path.join(conv_dir, STAGES["llm"] + EXT)
            raise ConvertedModelError(f"{path} has {len(self._past)} cache inputs, the manifest "
                                      f"records {m['layers']} layers; re-run `cosyvino convert "
                                      "--format onnx`", path)
        log.info("onnxruntime %s: loaded %s (io_binding=%s)", ort.__version__, conv_dir,
                 io_binding)

    def _run(self, stage: str, **feeds: np.ndarray) -> list[np.ndarray]:
        return self.sessions[stage].run(None, feeds)

    # ---- LLM -------------------------------------------------------------------------------
    def encode_text(self, text_token):
        return self._run("text_encoder", text_token=np.asarray(text_token, np.int64))[0]

    def new_llm_session(self):
        return ORTLLMSession(self.sessions["llm"], self._past, self._present, self._empty_cache,
                             self._io_binding)

    # ---- flow ------------------------------------------------------------------------------
    def flow_encode(self, tokens, embedding):
        h, spks = self._run("flow_encoder", token=np.asarray(tokens, np.int64),
                            embedding=np.asarray(embedding, np.float32))
        return h, spks

    def length_regulate(self, h, interp):
        return self._run("length_regulator", h=np.asarray(h, np.float32),
                         interp=np.asarray(interp, np.float32))[0]

    def estimate(self, x, mask, mu, t, spks, cond):
        feeds = {k: np.asarray(v, np.float32) for k, v in
                 (("x", x), ("mask", mask), ("mu", mu), ("t", t), ("spks", spks),
                  ("cond", cond))}
        return self._run("estimator", **feeds)[0]

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder_f0(self, mel):
        return self._run("hift_f0", mel=np.asarray(mel, np.float32))[0]

    def vocoder_source(self, f0, phase, noise):
        return self._run("hift_source", f0=np.asarray(f0, np.float32),
                         phase=np.asarray(phase, np.float32),
                         noise=np.asarray(noise, np.float32))[0]

    def vocoder_decode(self, mel, source):
        return self._run("hift_decode", mel=np.asarray(mel, np.float32),
                         source=np.asarray(source, np.float32))[0]
