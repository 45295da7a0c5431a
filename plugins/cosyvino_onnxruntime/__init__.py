"""cosyvino's ONNX Runtime backend (CPU), registered through the ``cosyvino`` entry point group.

Serves the ONNX directory written by ``cosyvino convert --format onnx`` (one ``.onnx`` per stage
+ numpy tables, see :mod:`cosyvino.converted`); never imports torch. Discovery stays cheap:
onnxruntime is imported only when the backend is loaded.

Backend options (``Synthesizer(..., backend="onnxruntime", **options)`` / ``load``):

    num_threads               intra_op_num_threads of every stage session (None = ORT
                              default: one thread per physical core)
    inter_op_num_threads      threads between independent graph nodes (parallel mode only)
    graph_optimization_level  "disable" | "basic" | "extended" | "all" (default "all")
    execution_mode            "sequential" (default) | "parallel"
    enable_cpu_mem_arena      bool (default True): ORT's CPU memory arena
    io_binding                bool (default False): the LLM decode loop feeds the KV cache back
                              as bound OrtValues instead of numpy arrays through ``run`` (no
                              faster here, see :mod:`.stages`; kept to re-measure elsewhere)
    optimized_model_dir       write the graph ORT actually runs (after its optimizations) to
                              ``DIR/<stage>.opt.onnx``, for inspection
"""

from __future__ import annotations

import importlib.util
import os

from cosyvino.backends.base import Backend, Capabilities, Stages
from cosyvino.errors import BackendError, ConvertedModelError
from cosyvino.hookspecs import hookimpl

#: LLM export layout a fresh :mod:`cosyvino.export.onnx` conversion records (manifest ``llm``
#: fields, ``cosyvino.export.onnx.convert.LLM_LAYOUT``, written here too so the check needs no
#: torch): the exact-length relative position table, ``pos_bucket`` 1, and the key-mask input
#: with a batch dimension (batched decode)
LLM_LAYOUT = {"pos_bucket": 1, "positional": "keys_input", "attention_mask": "batch"}
#: end-to-end synthesis speed relative to torch fp32 on the same CPU and threads: the planner's
#: cost hint, from the side-by-side runs in docs/performance.md ("ONNX Runtime"), rounded down
RELATIVE_SPEED = 1.4
#: decode rows one batched LLM call advances (``Capabilities.max_llm_batch``, the stages'
#: ``max_llm_batch``): a bound for the scheduler, not a measured optimum (benchmarks/llm_batch.py
#: measures the step cost per batch size)
MAX_LLM_BATCH = 64

#: options of :meth:`onnx_runner` (plain ONNX files a checkpoint ships)
ONNX_RUNNER_OPTIONS = ("num_threads",)

class ONNXRuntimeBackend(Backend):
    """ONNX Runtime (CPU execution provider), from ONNX files made by ``cosyvino convert
    --format onnx``."""

    name = "onnxruntime"
    description = ("ONNX Runtime on CPU (run `cosyvino convert --format onnx` first; no torch at "
                   "serving)")
    install_hint = "pip install 'cosyvino[onnxruntime]'"
    convert_format = "onnx"
    #: ONNX Runtime's CPU kernels compute in fp32: the export stores fp32 weights only
    convert_weights = ("fp32",)
    #: ``cosyvino bench --backends onnxruntime:PRESET``: run (plain ``run`` calls, the bare
    #: default) or iobinding (the LLM decode loop through IO binding)
    option_presets = {"": {}, "run": {}, "iobinding": {"io_binding": True}}

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("onnxruntime") is None:
            return False, f"onnxruntime is not installed ({cls.install_hint})"
        return True, ""

    @classmethod
    def _converted(cls, model_dir) -> tuple[str, dict]:
        """(dir, manifest) of the ONNX conversion :meth:`load` of ``model_dir`` serves (only
        the manifest is read; file hashes are checked at load). Raises ConvertedModelError
        (its message names `cosyvino convert --format onnx`)."""
        from cosyvino.converted import find_converted_dir, read_manifest

        conv_dir, _ = find_converted_dir(model_dir, cls.name)
        return conv_dir, read_manifest(conv_dir, cls.name)

    @staticmethod
    def _graph_bytes(manifest: dict) -> int:
        return sum(rec.get("size", 0) for rec in manifest.get("files", {}).values()
                   if rec.get("stage"))

    @classmethod
    def inventory(cls, model_dir: str | None) -> dict:
        """{present, dir, bytes[, summary]}: the ONNX dir :meth:`load` would serve (``model_dir``
        itself or its ``onnx/``) and the size of its stage graphs; ``present`` False (and no
        ``summary``) when there is none."""
        if not model_dir:
            return {"present": False}
        try:
            conv_dir, manifest = cls._converted(model_dir)
        except ConvertedModelError:
            return {"present": False}
        return {"present": True, "dir": os.path.abspath(conv_dir),
                "bytes": cls._graph_bytes(manifest), "summary": f"ONNX graphs in {conv_dir}"}

    @classmethod
    def capabilities(cls, model_dir, probe=None) -> Capabilities:
        """Ready when ``model_dir`` is an ONNX converted dir or has one in ``onnx/`` (only the
        manifest is read; file hashes are checked at load). ``relative_speed`` is
        :data:`RELATIVE_SPEED`; ``resident_bytes`` the stored graphs' size."""
        ok, why = cls.is_available()
        if not ok:
            return Capabilities(ready=False, reason=why, thread_safe=True)
        if model_dir is None:
            return Capabilities(ready=False, thread_safe=True, reason=(
                "onnxruntime: no model dir; run `cosyvino convert --format onnx`"))
        try:
            conv_dir, manifest = cls._converted(model_dir)
        except ConvertedModelError as e:  # its message names `cosyvino convert --format onnx`
            return Capabilities(ready=False, thread_safe=True, reason=f"onnxruntime: {e}")
        size = cls._graph_bytes(manifest)
        return Capabilities(ready=True, reason=f"onnxruntime: ONNX graphs in {conv_dir}",
                            load_dir=conv_dir, relative_speed=RELATIVE_SPEED,
                            resident_bytes=size or None,
                            resident_basis="size of the stage .onnx files (fp32 weights)",
                            thread_safe=True, streams=False,
                            pinning=False, precisions=("fp32",), max_llm_batch=MAX_LLM_BATCH)

    @classmethod
    def prepared_dir(cls, model_dir: str) -> str | None:
        """``model_dir`` when it is an ONNX converted dir, else its ``onnx/`` when that holds
        one, else None. Reads only the manifest."""
        try:
            return cls._converted(model_dir)[0]
        except ConvertedModelError:
            return None

    @classmethod
    def conversion_status(cls, model_dir: str, out_dir: str | None = None, *,
                          weights: str = "fp32"):
        """:func:`cosyvino.converted.conversion_status` of ``out_dir`` (default
        ``model_dir/onnx``) against what a fresh export writes: ``weights``, this cosyvino's
        version, the installed onnx version (when onnx is installed) and the LLM layout
        (:data:`LLM_LAYOUT`). Imports onnx when installed.
        """
        from cosyvino.version import __version__
        from cosyvino.converted import conversion_status

        expected: dict = {"weights": weights, "cosyvino_version": __version__}
        if importlib.util.find_spec("onnx") is not None:
            import onnx

            expected["onnx_version"] = onnx.__version__
        expected["llm"] = dict(LLM_LAYOUT)
        return conversion_status(model_dir, out_dir, cls.name, expected)

    @classmethod
    def convert(cls, model_dir: str, out_dir: str | None = None, progress=None, *,
                weights: str = "fp32") -> str:
        """Export the checkpoint in ``model_dir`` with
        :func:`cosyvino.export.onnx.convert_model_dir` into ``out_dir`` (default
        ``model_dir/onnx``, written atomically) and return it. Needs torch and onnx.

        Raises:
            ModelDirError / ConfigError / CheckpointError: bad source dir.
            BackendError: torch or onnx is not installed.
            ValueError: ``weights`` other than fp32.
        """
        if weights not in cls.convert_weights:
            raise ValueError(f"ONNX export stores fp32 weights only, got {weights!r}")
        for pkg in ("torch", "onnx"):
            if importlib.util.find_spec(pkg) is None:
                raise BackendError(f"converting to ONNX needs {pkg} "
                                   "(pip install 'cosyvino[torch,onnxruntime]')")
        from cosyvino.export.onnx import convert_model_dir

        return convert_model_dir(model_dir, out_dir, progress=progress)

    @classmethod
    def conversion_summary(cls, manifest: dict) -> tuple[str, dict]:
        opset = manifest.get("opset")
        return f"ONNX opset {opset}", {"opset": opset, "onnx": manifest.get("onnx_version")}

    runs_onnx = True

    @classmethod
    def onnx_runner(cls, path: str, **options):
        """A runner of the plain ONNX file ``path`` (a model file a checkpoint ships as ONNX,
        e.g. ``campplus.onnx``): ``run(inputs) -> outputs``, inputs by position; CPU provider,
        full graph optimization (as the official frontend). Options: ``num_threads``
        (intra-op threads; None = ORT default).

        Raises:
            ModelDirError: ``path`` is missing or not a readable ONNX model (names it).
            BackendError: onnxruntime is not installed, or a bad option.
        """
        cls.check_onnx_runner_options(options, ONNX_RUNNER_OPTIONS)
        from .onnx_runner import ORTOnnxRunner

        return ORTOnnxRunner(path, **options)

    @classmethod
    def load(cls, model_dir: str, **options) -> Stages:
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        from .stages import load_stages

        return load_stages(model_dir, **options)


@hookimpl
def register_backends(register):
    register(ONNXRuntimeBackend)
