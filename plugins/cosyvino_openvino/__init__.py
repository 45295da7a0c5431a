"""cosyvino's OpenVINO backend (CPU), registered through the ``cosyvino`` entry point group.

Serves the converted directory written by ``cosyvino convert`` (OpenVINO IRs + numpy tables,
see :mod:`cosyvino.converted`); never imports torch. Discovery stays cheap: openvino is
imported only when the backend is loaded.

Backend options (``Synthesizer(..., backend="openvino", **options)`` / ``load``):

    num_threads         INFERENCE_NUM_THREADS (None = OpenVINO default: all cores)
    precision           INFERENCE_PRECISION_HINT: "f32" (default), "bf16", "f16", or None =
                        the device default (bf16 on CPUs with AMX/AVX512-BF16).
    kv_cache_precision  KV_CACHE_PRECISION of the LLM: "f32", "f16", "bf16", "u8" (None =
                        default, u8 on recent CPUs). Parity runs use precision="f32" and
                        kv_cache_precision="f32".
    performance_hint    PERFORMANCE_HINT (default "LATENCY")
    num_streams         NUM_STREAMS (default 1)
    cpu_pinning         ENABLE_CPU_PINNING (None = default)
    cache_dir           CACHE_DIR for compiled blobs (default ~/.cache/cosyvino/ov_cache for
                        f32, none otherwise: with OpenVINO 2026.4.1, bf16 models imported from
                        a cached blob segfaulted mid-utterance here; "" disables)
    properties          dict of extra raw OpenVINO properties for every stage (the LLM gets
                        DYNAMIC_QUANTIZATION_GROUP_SIZE 128 unless this sets it: ~10 % faster
                        INT8-weight decoding than the plugin's 32)
    llm_dynamic_quantization  the LLM's DYNAMIC_QUANTIZATION_GROUP_SIZE for its INT8/INT4
                        weights: activations quantized on the fly in groups of this many
                        channels for int8 dot products; 0 = off (weights widened to f32 per
                        use: one-row decode steps 0.91-0.96x the time on an AVX-512/VNNI/BF16
                        Zen 4, but prefills 2.3-2.9x and batched steps 1.2x slower, so not the
                        planner's choice; docs/performance.md); None = 128
    stage_precision     dict stage -> "f32" | "bf16" | "f16": that stage's compute precision
                        instead of ``precision`` (e.g. {"hift_decode": "bf16", "hift_f0":
                        "bf16"} with an INT8 dir: f32 where int8 weights are fastest, bf16
                        in the vocoder); such stages skip the blob cache
    stage_threads       dict stage -> threads: that stage's INFERENCE_NUM_THREADS instead of
                        ``num_threads`` (how the LLM lane and the flow/vocoder lane share the
                        cores when they run at the same time)
    release_weight_pages  True (default): after compiling (and after each stage's first call,
                        when the CPU plugin repacks weights) drop the page-cache pages of the
                        mapped IR .bin files from this process's RSS (madvise DONTNEED) — the
                        plugin keeps its own repacked copies, so the mapped originals only
                        doubled resident memory (fp32 300M: peak RSS 4.8 -> 2.5 GB)
    release_intermediate_memory  True (default): when a stage starts while nothing else runs,
                        free the intermediate buffers of the stages that ran before it
                        (CompiledModel.release_memory + malloc_trim), so a segment holds one
                        stage's activations at a time instead of all of them; False keeps them
                        (faster: ~36 frees and re-allocations per streamed 5 s request; the
                        plan's `keep_buffers` turns it off where memory is plentiful)
"""

from __future__ import annotations

import importlib.util
import os

from cosyvino.backends.base import Backend, Capabilities, Stages
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.hookspecs import hookimpl

from . import inventory as _inventory

#: end-to-end synthesis speed relative to torch fp32 on the same CPU and threads: the planner's
#: cost hints, from the side-by-side runs in docs/performance.md (f32, bf16 compute)
SPEED_F32, SPEED_BF16 = 1.3, 1.8
#: quantized dir name -> speed vs torch (OpenVINO f32 1.3x times the measured int8/int4 gains)
SPEED_QUANTIZED = {"openvino-int8": 2.2, "openvino-int8-llm": 1.9, "openvino-int4-llm": 2.0}
#: resident bytes per byte of IR weights once OpenVINO has compiled the models (the CPU plugin
#: keeps repacked weight copies next to the mapped originals; docs/performance.md, "OpenVINO
#: memory")
OPENVINO_RESIDENT_FACTOR = 1.8
#: decode rows one batched LLM call advances (``Capabilities.max_llm_batch``, the stages'
#: ``max_llm_batch``): a bound for the scheduler, not a measured optimum (benchmarks/llm_batch.py
#: measures the step cost per batch size)
MAX_LLM_BATCH = 64
#: requests one estimator call can hold (``Capabilities.max_estimator_batch``; the stages load
#: the estimator with a dynamic batch dim): a bound, the planner's ``estimator_batch`` picks the
#: size (docs/performance.md, "Batched estimator calls across requests")
MAX_ESTIMATOR_BATCH = 4
#: the same for a ``cosyvino quantize --preset int8`` dir (static INT8 stages keep more than their
#: file size; docs/performance.md "INT8")
OPENVINO_QUANTIZED_RESIDENT_FACTOR = 2.0
#: resident bytes kept by not freeing stage buffers between calls (``release_intermediate_memory
#: =False``): peak RSS 1.47 -> 1.73 GiB for the INT8 300M streaming and synthesizing 5 s
#: segments (AMD Zen 4; docs/performance.md, "Stage buffers kept"), rounded up to 512 MiB
#: because the estimator's buffers grow with the segment's length
KEPT_BUFFER_BYTES = 512 * 2**20
#: the plan's component precision -> INFERENCE_PRECISION_HINT; int8 components run their
#: quantized IRs whatever the hint, the rest of them in f32
_HINT = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "f32"}
#: threads of the reference-backend candidate of ``--tune``: the 300M model's matmuls stop
#: scaling past ~16 threads (the planner's per-stream cap)
_REFERENCE_TUNE_THREADS = 16
#: the vocoder IRs moved to bf16 when the plan runs the vocoder in bf16 under an f32 hint
_VOCODER_STAGES = ("hift_f0", "hift_decode")

#: options of :meth:`onnx_runner` (plain ONNX files a checkpoint ships)
ONNX_RUNNER_OPTIONS = ("num_threads", "precision", "properties")

class OpenVINOBackend(Backend):
    """OpenVINO runtime on CPU, from IRs made by ``cosyvino convert``."""

    name = "openvino"
    description = "OpenVINO IR on CPU (run `cosyvino convert` first; no torch at serving)"
    install_hint = "pip install 'cosyvino[openvino]'"
    convert_format = "openvino"
    #: what :func:`cosyvino.export.openvino.convert_model_dir` stores (its ``WEIGHTS``)
    convert_weights = ("fp32", "fp16")
    #: ``cosyvino bench --backends openvino:PRESET``: f32 = f32 compute and KV cache (parity,
    #: the bare default); u8kv = f32 compute, u8 KV cache; vocbf16 = f32 with the HiFT vocoder
    #: in bf16; served = u8kv with HiFT and the estimator's non-int8 ops in bf16 (what the
    #: planner serves for an INT8 dir on a bf16 CPU); default = the CPU plugin's own choice
    option_presets = {
        "": {"precision": "f32", "kv_cache_precision": "f32"},
        "f32": {"precision": "f32", "kv_cache_precision": "f32"},
        "u8kv": {"precision": "f32", "kv_cache_precision": "u8"},
        "bf16": {"precision": "bf16"},
        "f16": {"precision": "f16"},
        "default": {"precision": None},
        "vocbf16": {"precision": "f32", "kv_cache_precision": "f32",
                    "stage_precision": {"hift_f0": "bf16", "hift_decode": "bf16"}},
        "served": {"precision": "f32", "kv_cache_precision": "u8",
                   "stage_precision": {"hift_f0": "bf16", "hift_decode": "bf16",
                                       "estimator": "bf16"}},
    }

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("openvino") is None:
            return False, f"openvino is not installed ({cls.install_hint})"
        return True, ""

    # ---- what is on disk ------------------------------------------------------------------
    @classmethod
    def inventory(cls, model_dir: str | None) -> dict:
        """The converted IR dirs of ``model_dir`` (``openvino/``, the ``openvino-<preset>/``
        dirs of ``cosyvino quantize``, or ``model_dir`` itself), found by manifest: see
        :func:`.inventory.scan` for the keys. Imports no openvino."""
        return _inventory.scan(model_dir)

    @classmethod
    def device_info(cls) -> dict:
        """OpenVINO's FULL_DEVICE_NAME and OPTIMIZATION_CAPABILITIES of the CPU (imports
        openvino when installed): :func:`.inventory.device_view`."""
        return _inventory.device_view()

    @classmethod
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Ready when converted IRs are found (:meth:`inventory`); a quantized dir is served
        when present. Imports no openvino."""
        ov = cls.inventory_of(model_dir, probe)
        where = model_dir or "the model dir"
        precisions = ["fp32"]
        if probe is not None and probe.bf16:
            precisions.append("bf16")
        if probe is not None and (probe.vnni or probe.amx):
            precisions.append("int8")
        common = dict(thread_safe=True, streams=True, pinning=True,
                      precisions=tuple(precisions), max_llm_batch=MAX_LLM_BATCH,
                      max_estimator_batch=MAX_ESTIMATOR_BATCH,
                      kept_buffer_bytes=KEPT_BUFFER_BYTES)
        if not ov.get("present"):
            reason = (f"no converted IRs at {where}/openvino/manifest.json (run "
                      "`cosyvino convert` to enable OpenVINO)")
            if ov.get("stale"):
                reason = "; ".join(ov["stale"])
            return Capabilities(ready=False, reason=reason, relative_speed=SPEED_F32, **common)
        dirs = ov.get("dirs") or ["openvino"]
        qdir = ov.get("quantized_dir")
        if qdir:
            speed, load_dir = SPEED_QUANTIZED.get(os.path.basename(qdir), 1.9), qdir
            what = f"quantized IRs in {qdir} (`cosyvino quantize`)"
        else:
            speed = SPEED_BF16 if "bf16" in precisions else SPEED_F32
            load_dir = (model_dir if dirs[0] in _inventory.PLAIN_DIRS
                        else os.path.join(model_dir or "", dirs[0]))
            what = f"IRs found in {where}/{'|'.join(dirs)}"
        factor, served_bytes = OPENVINO_RESIDENT_FACTOR, ov.get("bytes")
        if qdir and ov.get("dir_bytes", {}).get(qdir):
            factor, served_bytes = OPENVINO_QUANTIZED_RESIDENT_FACTOR, ov["dir_bytes"][qdir]
        resident = int(served_bytes * factor) if served_bytes else None
        return Capabilities(
            ready=True, reason=what, load_dir=load_dir, relative_speed=speed,
            resident_bytes=resident,
            resident_basis=f"OpenVINO IR .bin files of the served dir x {factor} once compiled",
            weight_precisions=_inventory.served_precisions(ov, load_dir or model_dir),
            **common)

    # ---- planning -------------------------------------------------------------------------
    @classmethod
    def plan_options(cls, decisions: dict) -> dict:
        """The plan's decisions in this backend's option names (module docstring):
        ``num_threads``, ``num_streams``, ``performance_hint`` (LATENCY / THROUGHPUT from the
        goal), ``cpu_pinning``, ``precision`` (the LLM's compute precision as a hint), with an
        f32 hint ``kv_cache_precision`` (``u8`` when the plan decided a u8 KV cache, else
        ``f32`` for reference parity: OpenVINO would pick u8 on recent CPUs) and, when the
        vocoder runs in bf16, ``stage_precision`` for the HiFT IRs (and the estimator with
        bf16 activations); ``properties`` keep inference off SMT siblings and E-cores."""
        prec = decisions["precision"]
        compute = _HINT[prec["llm"]]
        opts = dict(decisions["capabilities"].options)
        opts.update(num_threads=decisions["threads"], num_streams=decisions["streams"],
                    performance_hint="LATENCY" if decisions["goal"] == "latency"
                    else "THROUGHPUT",
                    cpu_pinning=decisions["pinning"], precision=compute)
        if "keep_buffers" in decisions:
            opts["release_intermediate_memory"] = not decisions["keep_buffers"]
        if compute == "f32":
            opts["kv_cache_precision"] = "u8" if prec.get("kv_cache") == "u8" else "f32"
        if compute == "f32" and prec.get("vocoder") == "bf16":
            opts["stage_precision"] = {s: "bf16" for s in _VOCODER_STAGES}
            if prec.get("estimator_activations") == "bf16":
                opts["stage_precision"]["estimator"] = "bf16"
        props = {}
        if decisions["smt"]:
            props["ENABLE_HYPER_THREADING"] = False
        if decisions["hybrid"]:
            props["SCHEDULING_CORE_TYPE"] = "PCORE_ONLY"
        if props:
            opts["properties"] = props
        return opts

    @classmethod
    def tuning_candidates(cls, plan, probe) -> list[dict]:
        """Pinning off (when the plan pins), bf16 compute (on a bf16-capable CPU) and the
        reference backend (when usable), each measured against the plan."""
        out = []
        if plan.pinning:
            out.append({"label": "pinning=off", "backend": cls.name,
                        "options": dict(plan.backend_options, cpu_pinning=False),
                        "streams": plan.streams, "pinning": False})
        if probe.bf16:
            opts = dict(plan.backend_options, precision="bf16")
            opts.pop("kv_cache_precision", None)
            out.append({"label": "precision=bf16", "backend": cls.name, "options": opts,
                        "streams": plan.streams, "bf16": True})
        from cosyvino.plugins import backend_classes

        usable = {n for n, b in (probe.backends or {}).items() if b.get("available")}
        refs = sorted(n for n, c in backend_classes().items()
                      if getattr(c, "reference", False) and n in usable and n != cls.name)
        if refs:
            n = min(plan.total_threads, _REFERENCE_TUNE_THREADS)
            out.append({"label": f"{refs[0]} threads={n}", "backend": refs[0],
                        "options": {"num_threads": n}, "streams": 1})
        return out

    # ---- conversion -----------------------------------------------------------------------
    @classmethod
    def prepared_dir(cls, model_dir: str) -> str | None:
        """``model_dir`` when it is an OpenVINO converted dir, else its ``openvino/`` when that
        holds one (what :meth:`load` serves), else None. Reads only the manifest."""
        from cosyvino.converted import find_converted_dir, read_manifest

        try:
            conv_dir, _ = find_converted_dir(model_dir, cls.name)
            read_manifest(conv_dir, cls.name)
        except ConvertedModelError:
            return None
        return conv_dir

    @classmethod
    def conversion_status(cls, model_dir: str, out_dir: str | None = None, *,
                          weights: str = "fp32"):
        """:func:`cosyvino.converted.conversion_status` of ``out_dir`` (default
        ``model_dir/openvino``) against what a fresh conversion writes here: ``weights``, this
        cosyvino's version and, when the exporter can run here, the installed openvino version
        (``openvino_version``) and the exporter's LLM layout (``llm.pos_bucket``,
        ``llm.positional``, ``llm.qkv``...: a dir from an older exporter is rewritten). Imports
        openvino and torch when both are installed."""
        from cosyvino.version import __version__
        from cosyvino.converted import conversion_status

        expected: dict = {"weights": weights, "cosyvino_version": __version__}
        if importlib.util.find_spec("openvino") is not None:
            import openvino

            expected["openvino_version"] = openvino.get_version()
            if importlib.util.find_spec("torch") is not None:
                try:
                    layout = _export_layout(model_dir)
                except ImportError:
                    pass  # the exporter cannot run here: convert() says why
                else:
                    if layout:
                        expected["llm"] = layout
        return conversion_status(model_dir, out_dir, cls.name, expected)

    @classmethod
    def convert(cls, model_dir: str, out_dir: str | None = None, progress=None, *,
                weights: str = "fp32") -> str:
        """Convert the checkpoint in ``model_dir`` to IRs in ``out_dir`` (default
        ``model_dir/openvino``) with :func:`cosyvino.export.openvino.convert_model_dir`
        (``weights`` fp32 or fp16, written atomically) and return ``out_dir``. Needs torch and
        openvino.

        Raises:
            ModelDirError / ConfigError / CheckpointError: bad source dir.
            BackendError: torch or openvino is not installed.
            ValueError: other ``weights``.
        """
        if weights not in cls.convert_weights:
            raise ValueError(f"weights must be one of {cls.convert_weights}, got {weights!r}")
        for pkg, extra in (("openvino", "openvino"), ("torch", "torch")):
            if importlib.util.find_spec(pkg) is None:
                raise BackendError(f"converting to OpenVINO IR needs {pkg} "
                                   f"(pip install 'cosyvino[{extra}]')")
        from cosyvino.export.openvino import convert_model_dir

        return convert_model_dir(model_dir, out_dir, weights=weights, progress=progress)

    @classmethod
    def conversion_summary(cls, manifest: dict) -> tuple[str, dict]:
        version = manifest.get("openvino_version", "unknown")
        return f"OpenVINO {version}", {"openvino": version}

    runs_onnx = True

    @classmethod
    def onnx_runner(cls, path: str, **options):
        """A runner of the plain ONNX file ``path`` (a model file a checkpoint ships as ONNX,
        e.g. ``campplus.onnx``): ``run(inputs) -> outputs``, inputs by position; OpenVINO reads
        ONNX directly. Options: ``num_threads``, ``precision`` ("f32" default, "bf16",
        "f16", None = device default), ``properties`` (raw OpenVINO properties).

        Raises:
            ModelDirError: ``path`` is missing or not a readable ONNX model (names it).
            BackendError: openvino is not installed, a bad option, or compiling failed.
        """
        cls.check_onnx_runner_options(options, ONNX_RUNNER_OPTIONS)
        from .onnx_runner import OpenVINOOnnxRunner

        return OpenVINOOnnxRunner(path, **options)

    @classmethod
    def load(cls, model_dir: str, **options) -> Stages:
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        from cosyvino.families import detect_family

        family = detect_family(model_dir)
        if family.name != "cosyvoice1":  # v1 has stages of its own; others run their table
            from .graph_runner import load_graph_stages

            return load_graph_stages(model_dir, **options)
        from .stages import OpenVINOStages

        return OpenVINOStages(model_dir, **options)


def _export_layout(model_dir: str) -> dict:
    """The ``llm`` layout fields a fresh conversion of ``model_dir`` records: its family's
    (:meth:`cosyvino.families.ModelFamily.export_layout`; v1's when the family cannot be
    told, e.g. a missing dir: conversion_status says why). Raises ImportError: no exporter."""
    from cosyvino.errors import CosyvinoError
    from cosyvino.families import detect_family

    try:
        family = detect_family(model_dir)
    except CosyvinoError:
        from cosyvino.export.openvino.model_patcher import LLM_LAYOUT

        return dict(LLM_LAYOUT)
    return family.export_layout(True)  # OpenVINO keeps the state in the graph


@hookimpl
def register_backends(register):
    register(OpenVINOBackend)
