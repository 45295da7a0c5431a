"""OpenVINO implementation of :class:`cosyvino.backends.Stages` (CPU). Must not import torch.

One compiled model per stage; the LLM is stateful (KV cache in OpenVINO state): every
:class:`OpenVINOLLMSession` owns its own InferRequest (state is per request), ``reset`` calls
``reset_state()``. The other stages keep a pool of InferRequests (one per concurrent caller).
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import openvino as ov

from cosyvino.families.cosyvoice1.stages import (
    CosyVoice1Stages,
    LLMBatch,
    LLMSession,
    left_pad,
)
from cosyvino.families.cosyvoice1.serving_tables import ServingTablesMixin
from cosyvino.converted import find_converted_dir, validate_converted_dir
from cosyvino.families.cosyvoice1.graphs import GRAPH_NAMES, graph_table, llm_pos_key_names
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.families.cosyvoice1.yaml_config import read_model_config

from . import MAX_ESTIMATOR_BATCH, MAX_LLM_BATCH
from .memory import IntermediateReleaser, fold_weight_broadcasts, release_weight_pages
from .snake import polynomial_sin_squares

log = logging.getLogger("cosyvino.openvino")

_PRECISIONS = {"f32", "bf16", "f16"}
_KV_PRECISIONS = {"f32", "f16", "bf16", "u8"}
#: backend options accepted by :class:`OpenVINOStages` (see the package docstring)
_OPTIONS = {"num_threads", "precision", "kv_cache_precision", "performance_hint", "num_streams",
            "cpu_pinning", "cache_dir", "properties", "release_weight_pages",
            "release_intermediate_memory", "stage_precision", "stage_threads",
            "llm_dynamic_quantization"}
#: properties read back after compiling and reported in ``compile_info``
_REPORTED = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "PERFORMANCE_HINT",
             "NUM_STREAMS", "INFERENCE_NUM_THREADS", "ENABLE_CPU_PINNING",
             "EXECUTION_MODE_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
#: LLM activations are quantized on the fly in groups of this many channels for its INT8/INT4
#: weight-compressed MatMuls (no effect on fp32 weights): faster per token than the plugin's
#: default 32 at the same logits (docs/performance.md, "Measurements behind code constants").
LLM_DYNAMIC_QUANTIZATION_GROUP_SIZE = 128


def default_cache_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cosyvino", "ov_cache")


def compile_properties(*, num_threads=None, precision="f32", kv_cache_precision=None,
                       performance_hint="LATENCY", num_streams=1, cpu_pinning=None,
                       cache_dir=None, properties=None, llm_dynamic_quantization=None
                       ) -> tuple[dict, dict]:
    """(properties for every stage, extra properties for the LLM) from backend options.
    ``llm_dynamic_quantization``: the LLM's DYNAMIC_QUANTIZATION_GROUP_SIZE (0 = off; None =
    :data:`LLM_DYNAMIC_QUANTIZATION_GROUP_SIZE`; a raw ``properties`` value wins). Raises
    BackendError for a bad value."""
    props: dict = {}
    if performance_hint:
        props["PERFORMANCE_HINT"] = str(performance_hint).upper()
    if num_streams is not None:
        props["NUM_STREAMS"] = int(num_streams)
    if num_threads is not None:
        if int(num_threads) < 1:
            raise BackendError(f"num_threads must be >= 1, got {num_threads}")
        props["INFERENCE_NUM_THREADS"] = int(num_threads)
    if cpu_pinning is not None:
        props["ENABLE_CPU_PINNING"] = bool(cpu_pinning)
    if precision is not None:
        if precision not in _PRECISIONS:
            raise BackendError(f"precision must be one of {sorted(_PRECISIONS)}, got "
                               f"{precision!r}")
        props["INFERENCE_PRECISION_HINT"] = precision
    if cache_dir is None:
        # Known problem (OpenVINO 2026.4.1, this CPU): bf16 models imported from a CACHE_DIR
        # blob segfault in a CPU kernel during a full-length utterance (fresh compiles run
        # fine), so the blob cache is on by default only for f32.
        cache_dir = default_cache_dir() if precision == "f32" else ""
    if cache_dir:
        props["CACHE_DIR"] = str(cache_dir)
    props.update(properties or {})
    llm_props = {}
    group = (LLM_DYNAMIC_QUANTIZATION_GROUP_SIZE if llm_dynamic_quantization is None
             else llm_dynamic_quantization)
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise BackendError("llm_dynamic_quantization must be an integer group size >= 0 "
                           f"(0 = off), got {llm_dynamic_quantization!r}")
    if "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in props:  # raw `properties` win
        llm_props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group
    if kv_cache_precision is not None:
        if kv_cache_precision not in _KV_PRECISIONS:
            raise BackendError(f"kv_cache_precision must be one of {sorted(_KV_PRECISIONS)}, "
                               f"got {kv_cache_precision!r}")
        llm_props["KV_CACHE_PRECISION"] = kv_cache_precision
    return props, llm_props


def stage_properties(props: dict, stage_precision: dict | None,
                     names=GRAPH_NAMES) -> dict[str, dict]:
    """Per-stage copies of ``props`` for the graphs ``names`` (default: v1's) with
    ``stage_precision`` (stage -> "f32" | "bf16" | "f16") as that stage's
    INFERENCE_PRECISION_HINT. A stage moved off f32 gets no CACHE_DIR
    (the bf16-from-blob segfault of :func:`compile_properties`). Used for the vocoder of an
    INT8 dir, where bf16 pays and the int8-weight LLM's f32 does (docs/quantization.md).
    Raises BackendError for an unknown stage name or precision."""
    names = tuple(names)
    per = {stage: dict(props) for stage in names}
    for stage, prec in (stage_precision or {}).items():
        if stage not in names:
            raise BackendError(f"stage_precision: unknown stage {stage!r}; known: "
                               f"{', '.join(names)}")
        if prec not in _PRECISIONS:
            raise BackendError(f"stage_precision[{stage!r}] must be one of "
                               f"{sorted(_PRECISIONS)}, got {prec!r}")
        per[stage]["INFERENCE_PRECISION_HINT"] = prec
        if prec != "f32":
            per[stage].pop("CACHE_DIR", None)
    return per


def stage_threads_properties(per_stage: dict[str, dict], stage_threads: dict | None
                             ) -> dict[str, dict]:
    """``per_stage`` with ``stage_threads`` (stage -> threads >= 1) as those stages'
    INFERENCE_NUM_THREADS: how the planner splits the cores between the LLM lane and the
    flow/vocoder lane when they run at the same time (docs/performance.md, "Token-level
    streaming"). Raises BackendError for an unknown stage or a bad count."""
    for stage, n in (stage_threads or {}).items():
        if stage not in per_stage:
            raise BackendError(f"stage_threads: unknown stage {stage!r}; known: "
                               f"{', '.join(per_stage)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BackendError(f"stage_threads[{stage!r}] must be an integer >= 1, got {n!r}")
        per_stage[stage]["INFERENCE_NUM_THREADS"] = n
    return per_stage


def compile_ir(core: ov.Core, path: str, cfg: dict, *, dynamic_batch: bool = False
               ) -> tuple[ov.CompiledModel, dict[str, int]]:
    """Compile one IR for the CPU with properties ``cfg``; returns it and its rewrite counts
    (``weight_broadcasts``, ``sin_squares``). IRs with broadcast weights
    (:func:`fold_weight_broadcasts`) and, for a stage compiled in bf16, Snake ``sin^2`` terms
    (:func:`polynomial_sin_squares`) are rewritten first; the others compile from the path
    (its blob-cache key). ``dynamic_batch``: the inputs' first dim becomes dynamic (v1's
    estimator: one compiled model serves batch 2 and the batched calls of several requests;
    measured as fast as the static batch-2 IR at batch 2 and with no second copy of its
    weights, docs/performance.md).

    Raises BackendError: OpenVINO cannot read or compile it."""
    try:
        model = core.read_model(path)
        if dynamic_batch:
            model.reshape({p.get_any_name(): ov.PartialShape([-1] + list(
                p.get_partial_shape())[1:]) for p in model.inputs})
        folded = fold_weight_broadcasts(model)
        if folded:
            log.debug("%s: %d MatMul weights no longer broadcast", path, folded)
        sines = (polynomial_sin_squares(model)
                 if cfg.get("INFERENCE_PRECISION_HINT") == "bf16" else 0)
        if sines:
            log.debug("%s: %d sin^2 terms as polynomials", path, sines)
        compiled = core.compile_model(model if folded or sines or dynamic_batch else path,
                                      "CPU", cfg)
    except Exception as e:  # openvino raises RuntimeError with a long message
        raise BackendError(f"OpenVINO failed to compile {path}: {e}") from e
    return compiled, {"weight_broadcasts": folded, "sin_squares": sines}


def read_back(compiled: ov.CompiledModel) -> dict:
    """The :data:`_REPORTED` properties the CPU plugin chose for ``compiled`` (as strings)."""
    out = {}
    for key in _REPORTED:
        try:
            v = compiled.get_property(key)
            out[key] = v.get_type_name() if isinstance(v, ov.Type) else str(v)
        except Exception:  # property not supported by this device/version
            pass
    return out


class _PageReleaser:
    """Drops the resident pages of the mapped weight files (:func:`release_weight_pages`) after
    loading and again once each watched stage has run its first few inferences: the CPU plugin
    repacks some weights lazily at the first inference, reading the mapped originals again."""

    def __init__(self, dirs):
        self.dirs = tuple(d for d in dirs if d)
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def watch(self, key: str, calls: int) -> None:
        """Release once more after ``key`` has run ``calls`` inferences."""
        if self.dirs:
            self._pending[key] = calls

    def release(self) -> int:
        return release_weight_pages(self.dirs) if self.dirs else 0

    def after_call(self, key: str) -> None:
        if key not in self._pending:  # the common case: nothing left to do, no lock
            return
        with self._lock:
            left = self._pending.get(key)
            if left is None:
                return
            if left > 1:
                self._pending[key] = left - 1
                return
            del self._pending[key]
        self.release()


class _Runner:
    """One compiled stage and a pool of InferRequests: concurrent calls each take their own
    request (created on demand), so stage calls are thread-safe."""

    def __init__(self, compiled: ov.CompiledModel, name: str = "",
                 pages: _PageReleaser | None = None,
                 intermediates: IntermediateReleaser | None = None):
        self.compiled = compiled
        self.name = name
        self._pages = pages
        self._intermediates = intermediates or IntermediateReleaser(enabled=False)
        self._n_out = len(compiled.outputs)
        self._free = [compiled.create_infer_request()]
        self._lock = threading.Lock()

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        self._intermediates.enter(self.name)
        try:
            with self._lock:
                req = self._free.pop() if self._free else self.compiled.create_infer_request()
            try:
                req.infer([np.ascontiguousarray(a) for a in inputs], share_inputs=True)
                return [req.get_output_tensor(i).data.copy() for i in range(self._n_out)]
            finally:
                with self._lock:
                    self._free.append(req)
                if self._pages is not None:
                    self._pages.after_call(self.name)
        finally:
            self._intermediates.exit(self.name)


class OpenVINOLLMSession(LLMSession):
    """KV cache in the state of this session's own InferRequest (batch 1)."""

    def __init__(self, compiled: ov.CompiledModel, positional_keys,
                 pages: _PageReleaser | None = None,
                 intermediates: IntermediateReleaser | None = None):
        self._intermediates = intermediates or IntermediateReleaser(enabled=False)
        self._compiled = compiled
        self._pos = positional_keys
        self._pos_names = llm_pos_key_names(positional_keys.layers)
        self._req = compiled.create_infer_request()
        self._beam = np.zeros(1, dtype=np.int32)
        self._length = 0
        self._pages = pages

    def reset(self) -> None:
        self._check_open()
        self._req.reset_state()
        self._length = 0

    def close(self) -> None:
        """Drop this session's request and with it its KV cache. Idempotent."""
        self._req = None

    def _check_open(self) -> None:
        if self._req is None:
            raise BackendError("LLM session used after close()")

    def forward(self, inputs_embeds: np.ndarray) -> np.ndarray:
        self._check_open()
        x = np.ascontiguousarray(inputs_embeds, np.float32)
        mask = np.ones((1, self._length + x.shape[1]), np.float32)
        offset, keys = self._pos.rows(self._length, x.shape[1])
        feed = {"inputs_embeds": x, "attention_mask": mask, "beam_idx": self._beam,
                "pos_offset": offset, **dict(zip(self._pos_names, keys))}
        self._intermediates.enter("llm")
        try:
            self._req.infer(feed, share_inputs=True)
        finally:
            self._intermediates.exit("llm")
        if self._pages is not None:
            self._pages.after_call("llm")
        self._length += x.shape[1]
        return self._req.get_tensor("logp").data[0].copy()

    def cache_length(self) -> int:
        """Number of cached positions."""
        self._check_open()
        return self._length

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The KV cache (copies), state name -> float32 [1, H, P, d_k]."""
        self._check_open()
        return {s.name: s.state.data.copy() for s in self._req.query_state()}


class OpenVINOLLMBatch(LLMBatch):
    """Rows of :class:`OpenVINOLLMSession` s in the states of one InferRequest (batch B, left-
    padded to the longest row), one ``llm`` call per step.

    Per step the CPU plugin appends the new position to its preallocated KV cache in place
    (stateful SDPA), so no cache is copied; a row leaves through ``beam_idx`` (the next step
    continues from the other rows only: a row gather inside the plugin, no copy here). A join
    reads every state, left-pads and writes it back (one copy of every cache per join), and
    drops leading padding no row needs any more.
    """

    def __init__(self, compiled: ov.CompiledModel, positional_keys,
                 pages: _PageReleaser | None = None,
                 intermediates: IntermediateReleaser | None = None):
        super().__init__()
        self._compiled = compiled
        self._pos = positional_keys
        self._pos_names = llm_pos_key_names(positional_keys.layers)
        self._req = compiled.create_infer_request()
        self._pages = pages
        self._intermediates = intermediates or IntermediateReleaser(enabled=False)
        self._beam = np.zeros(0, np.int32)  # state rows the next step continues from
        self._width = 0
        #: bytes of cache read and written back by joins so far (benchmarks/llm_batch.py)
        self.join_bytes = 0

    def _join(self, session):
        if not isinstance(session, OpenVINOLLMSession) or session._compiled is not \
                self._compiled:
            raise BackendError("only LLM sessions of the same OpenVINO model join this batch")
        length = session.cache_length()
        if length < 1:
            return length
        new = session.state_arrays()
        keep = self._beam
        width = max([self._lengths[i] for i in range(len(self))] + [length])
        states = self._req.query_state()
        for st in states:
            parts = []
            if len(keep):
                parts.append(left_pad(st.state.data[keep], width))
            parts.append(left_pad(new[st.name], width))
            merged = np.ascontiguousarray(np.concatenate(parts))
            self.join_bytes += 2 * merged.nbytes
            st.state = ov.Tensor(merged)
        self._beam = np.arange(len(keep) + 1, dtype=np.int32)
        self._width = width
        session.reset()
        return length

    def _leave(self, index):
        self._beam = np.delete(self._beam, index)
        if not len(self._beam):
            self._req.reset_state()
            self._width = 0

    def _step(self, inputs_embeds):
        offset, keys = self._pos.rows(self._width, 1)
        feed = {"inputs_embeds": inputs_embeds, "attention_mask": self.key_mask(self._width),
                "beam_idx": self._beam, "pos_offset": offset,
                **dict(zip(self._pos_names, keys))}
        self._intermediates.enter("llm")
        try:
            self._req.infer(feed, share_inputs=True)
        finally:
            self._intermediates.exit("llm")
        if self._pages is not None:
            self._pages.after_call("llm")
        self._beam = np.arange(len(self._beam), dtype=np.int32)
        self._width += 1
        return self._req.get_tensor("logp").data.copy()

    def close(self) -> None:
        super().close()
        self._req = None


class OpenVINOStages(ServingTablesMixin, CosyVoice1Stages):
    # Every stage call takes its own InferRequest from a pool and every LLM session owns one,
    # so concurrent calls from several threads are safe.
    thread_safe = True

    def __init__(self, model_dir: str, **options):
        conv_dir, source_dir = find_converted_dir(model_dir, runtime="openvino")
        self.converted_dir = conv_dir
        self.manifest = validate_converted_dir(conv_dir, source_dir, runtime="openvino")
        self.config = read_model_config(os.path.join(conv_dir, "cosyvoice.yaml"))
        self._load_serving_tables(conv_dir, "openvino",
                                  int(self.manifest.get("llm", {}).get("pos_bucket", 1)))

        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise BackendError(f"openvino backend: unknown options {unknown}; known: "
                               f"{sorted(_OPTIONS)}")
        release = bool(options.pop("release_weight_pages", True))
        release_intermediates = bool(options.pop("release_intermediate_memory", True))
        stage_precision = options.pop("stage_precision", None)
        stage_threads = options.pop("stage_threads", None)
        props, llm_props = compile_properties(**options)
        per_stage = stage_threads_properties(stage_properties(props, stage_precision),
                                             stage_threads)
        self.core = ov.Core()
        self.compile_info: dict[str, dict] = {}
        self.load_rewrites: dict[str, dict[str, int]] = {}
        self._pages = _PageReleaser((conv_dir, props.get("CACHE_DIR")) if release else ())
        self._intermediates = IntermediateReleaser(
            release_intermediates, on_release=self._pages.release if release else None)
        compiled = {}
        for stage, stem in graph_table(self.config).stems.items():
            cfg = dict(per_stage[stage], **llm_props) if stage == "llm" else per_stage[stage]
            compiled[stage] = self._compile(os.path.join(conv_dir, stem + ".xml"), cfg,
                                            dynamic_batch=stage == "estimator")
            self.compile_info[stage] = self._read_back(compiled[stage])
            # after each stage, so the load peak holds one stage's mapped pages, not all
            self._pages.release()
            # the plugin repacks some weights lazily at the first inference (for the LLM:
            # the first prefill and the first single-token step)
            self._pages.watch(stage, 2 if stage == "llm" else 1)
        log.info("openvino %s: compiled %s; CPU chose %s", ov.get_version(), conv_dir,
                 self.compile_info["llm"])
        self._llm = compiled["llm"]
        llm_inputs = {n for p in self._llm.inputs for n in p.get_names()}
        if "attention_mask" not in llm_inputs or "pos_keys.0" not in llm_inputs:
            raise ConvertedModelError(
                f"{conv_dir}: its LLM was exported before batched decoding with positional "
                "tables as inputs (no attention_mask / pos_keys inputs); re-run "
                "`cosyvino convert --force` (and `cosyvino quantize`)", conv_dir)
        for k, v in compiled.items():
            self._intermediates.register(k, v)
        self._runners = {k: _Runner(v, k, self._pages, self._intermediates)
                         for k, v in compiled.items() if k != "llm"}

    def _compile(self, path: str, cfg: dict, dynamic_batch: bool = False) -> ov.CompiledModel:
        """:func:`compile_ir` with its rewrite counts in ``self.load_rewrites`` (by IR file
        name)."""
        compiled, rewrites = compile_ir(self.core, path, cfg, dynamic_batch=dynamic_batch)
        self.load_rewrites[os.path.basename(path)] = rewrites
        return compiled

    def kernel_isas(self) -> dict[str, dict[str, int]]:
        """Per stage, ``{ISA class: heavy nodes}`` of the kernels the CPU plugin runs
        (:func:`cosyvino_openvino.kernels.kernel_isas`; call after the stages have run)."""
        from .kernels import kernel_isas

        compiled = {"llm": self._llm, **{k: r.compiled for k, r in self._runners.items()}}
        return {k: kernel_isas(c) for k, c in compiled.items()}

    @staticmethod
    def _read_back(compiled: ov.CompiledModel) -> dict:
        return read_back(compiled)

    # ---- LLM -------------------------------------------------------------------------------
    def encode_text(self, text_token):
        return self._runners["text_encoder"](np.asarray(text_token, np.int64))[0]

    def new_llm_session(self):
        return OpenVINOLLMSession(self._llm, self.positional_keys, self._pages,
                                  self._intermediates)

    #: one stateful ``llm`` call advances every row (:class:`OpenVINOLLMBatch`)
    max_llm_batch = MAX_LLM_BATCH

    def new_llm_batch(self):
        return OpenVINOLLMBatch(self._llm, self.positional_keys, self._pages,
                                self._intermediates)

    # ---- flow ------------------------------------------------------------------------------
    def flow_encode(self, tokens, embedding):
        h, spks = self._runners["flow_encoder"](np.asarray(tokens, np.int64),
                                                np.asarray(embedding, np.float32))
        return h, spks

    def length_regulate(self, h, interp):
        return self._runners["length_regulator"](np.asarray(h, np.float32),
                                                 np.asarray(interp, np.float32))[0]

    #: requests (CFG pairs) one :meth:`estimate` call can hold: the estimator is compiled with
    #: a dynamic batch dim
    max_estimator_batch = MAX_ESTIMATOR_BATCH

    def estimate(self, x, mask, mu, t, spks, cond):
        return self._runners["estimator"](*(np.asarray(a, np.float32)
                                            for a in (x, mask, mu, t, spks, cond)))[0]

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder_f0(self, mel):
        return self._runners["hift_f0"](np.asarray(mel, np.float32))[0]

    def vocoder_source(self, f0, phase, noise):
        return self._runners["hift_source"](*(np.asarray(a, np.float32)
                                              for a in (f0, phase, noise)))[0]

    def vocoder_decode(self, mel, source):
        return self._runners["hift_decode"](np.asarray(mel, np.float32),
                                            np.asarray(source, np.float32))[0]
