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

import cosyvino
from cosyvino.backends.base import Backend, Capabilities, Stages
from cosyvino.errors import BackendError, ConvertedModelError

#: end-to-end synthesis speed relative to torch fp32 on the same CPU and threads: OpenVINO f32's
#: 1.28x (docs/performance.md) times ORT/OpenVINO f32 measured side by side on the synthetic
#: 300M on a shared 2-core machine (`cosyvino bench`: total 1.21x; same process, 1 thread, CPU
#: time: LLM decode 75 vs 96 ms/token, estimator 1147 vs 1038 ms/call), rounded down
RELATIVE_SPEED = 1.4


class ONNXRuntimeBackend(Backend):
    """ONNX Runtime (CPU execution provider), from ONNX files made by ``cosyvino convert
    --format onnx``."""

    name = "onnxruntime"
    description = ("ONNX Runtime on CPU (run `cosyvino convert --format onnx` first; no torch at "
                   "serving)")

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("onnxruntime") is None:
            return False, "onnxruntime is not installed (pip install 'cosyvino[onnxruntime]')"
        return True, ""

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
        from cosyvino.converted import find_converted_dir, read_manifest

        try:
            conv_dir, _ = find_converted_dir(model_dir, "onnxruntime")
            manifest = read_manifest(conv_dir, "onnxruntime")
        except ConvertedModelError as e:  # its message names `cosyvino convert --format onnx`
            return Capabilities(ready=False, thread_safe=True, reason=f"onnxruntime: {e}")
        size = sum(rec.get("size", 0) for name, rec in manifest.get("files", {}).items()
                   if rec.get("stage"))
        return Capabilities(ready=True, reason=f"onnxruntime: ONNX graphs in {conv_dir}",
                            load_dir=conv_dir, relative_speed=RELATIVE_SPEED,
                            resident_bytes=size or None,
                            resident_basis="size of the stage .onnx files (fp32 weights)",
                            thread_safe=True, streams=False,
                            pinning=False, precisions=("fp32",))

    @classmethod
    def prepare(cls, model_dir: str, out_dir: str | None = None, progress=None) -> str:
        """Return an ONNX dir for the checkpoint in ``model_dir``, converting it when needed.

        ``model_dir`` already an ONNX converted dir: returned as it is. ``out_dir`` None and
        ``model_dir/onnx`` up to date with the checkpoint (manifest and source hashes, see
        :func:`cosyvino.converted.validate_converted_dir`): that dir, nothing is rewritten.
        Otherwise :func:`cosyvino.export.onnx.convert_model_dir` writes ``out_dir`` (default
        ``model_dir/onnx``) atomically and it is returned. Needs torch and onnx to convert.

        Raises:
            ModelDirError / ConfigError / CheckpointError: bad source dir.
            ConvertedModelError: ``model_dir`` is a converted dir of another runtime.
            BackendError: torch or onnx is not installed.
        """
        from cosyvino.converted import (MANIFEST, RUNTIME_SUBDIRS, read_manifest,
                                        validate_converted_dir)

        model_dir = os.fspath(model_dir)
        if os.path.isfile(os.path.join(model_dir, MANIFEST)):
            read_manifest(model_dir, "onnxruntime")  # refuses other runtimes' dirs
            return model_dir
        sub = os.path.join(model_dir, RUNTIME_SUBDIRS["onnxruntime"])
        if out_dir is None and os.path.isfile(os.path.join(sub, MANIFEST)):
            try:
                validate_converted_dir(sub, model_dir, runtime="onnxruntime")
                return sub
            except ConvertedModelError:
                pass  # stale or damaged: convert again below
        for pkg in ("torch", "onnx"):
            if importlib.util.find_spec(pkg) is None:
                raise BackendError(f"converting to ONNX needs {pkg} "
                                   "(pip install 'cosyvino[torch,onnxruntime]')")
        from cosyvino.export.onnx import convert_model_dir

        return convert_model_dir(model_dir, out_dir, progress=progress)

    @classmethod
    def load(cls, model_dir: str, **options) -> Stages:
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        from .stages import ORTStages

        return ORTStages(model_dir, **options)


@cosyvino.hookimpl
def register_backends(register):
    register(ONNXRuntimeBackend)
