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
    stage_precision     dict stage -> "f32" | "bf16" | "f16": that stage's compute precision
                        instead of ``precision`` (e.g. {"hift_decode": "bf16", "hift_f0":
                        "bf16"} with an INT8 dir: f32 where int8 weights are fastest, bf16
                        in the vocoder); such stages skip the blob cache
    release_weight_pages  True (default): after compiling (and after each stage's first call,
                        when the CPU plugin repacks weights) drop the page-cache pages of the
                        mapped IR .bin files from this process's RSS (madvise DONTNEED) — the
                        plugin keeps its own repacked copies, so the mapped originals only
                        doubled resident memory (fp32 300M: peak RSS 4.8 -> 2.5 GB)
    release_intermediate_memory  True (default): when a stage starts while nothing else runs,
                        free the intermediate buffers of the stages that ran before it
                        (CompiledModel.release_memory + malloc_trim), so a segment holds one
                        stage's activations at a time instead of all of them; False keeps them
"""

from __future__ import annotations

import importlib.util
import os

import cosyvino
from cosyvino.backends.base import Backend, Capabilities, Stages
from cosyvino.errors import BackendError

#: end-to-end synthesis speed relative to torch fp32 on the same CPU and threads, measured side
#: by side on the synthetic 300M (docs/performance.md): f32 1.28x, bf16 compute 1.83x, INT8-weight
#: LLM (`cosyvino quantize`) ~2.4x
SPEED_F32, SPEED_BF16 = 1.3, 1.8
#: quantized dir name -> speed vs torch (OpenVINO f32 1.3x times the measured int8/int4 gains)
SPEED_QUANTIZED = {"openvino-int8": 2.2, "openvino-int8-llm": 1.9, "openvino-int4-llm": 2.0}
#: resident bytes per byte of IR weights once OpenVINO has compiled the models (measured on the
#: synthetic 300M: 3.1 GB resident after load for 1.75 GB of .bin files — the CPU plugin keeps
#: repacked weight copies next to the mapped originals)
OPENVINO_RESIDENT_FACTOR = 1.8
#: the same for a ``cosyvino quantize --preset int8`` dir: its 0.50 GB of .bin files held
#: ~1.0 GB once compiled and warmed up (synthetic 300M; static INT8 stages keep more than their
#: file size, docs/performance.md "INT8")
OPENVINO_QUANTIZED_RESIDENT_FACTOR = 2.0


class OpenVINOBackend(Backend):
    """OpenVINO runtime on CPU, from IRs made by ``cosyvino convert``."""

    name = "openvino"
    description = "OpenVINO IR on CPU (run `cosyvino convert` first; no torch at serving)"

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("openvino") is None:
            return False, "openvino is not installed (pip install 'cosyvino[openvino]')"
        return True, ""

    @classmethod
    def prepare(cls, model_dir: str, out_dir: str | None = None, progress=None) -> str:
        """Convert the checkpoint in ``model_dir`` to IRs in ``out_dir`` (default
        ``model_dir/openvino``) with :func:`cosyvino.export.openvino.convert_model_dir` (fp32
        weights, written atomically) and return ``out_dir``. A ``model_dir`` that already is a
        converted dir (``manifest.json`` inside) is returned as it is. Needs torch and openvino.

        Raises:
            ModelDirError / ConfigError / CheckpointError: bad source dir.
            BackendError: torch or openvino is not installed.
        """
        if os.path.isfile(os.path.join(model_dir, "manifest.json")):
            return model_dir
        for pkg, extra in (("openvino", "openvino"), ("torch", "torch")):
            if importlib.util.find_spec(pkg) is None:
                raise BackendError(f"converting to OpenVINO IR needs {pkg} "
                                   f"(pip install 'cosyvino[{extra}]')")
        from cosyvino.export.openvino import convert_model_dir

        return convert_model_dir(model_dir, out_dir, progress=progress)

    @classmethod
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Ready when converted IRs are found (``openvino/``, the ``openvino-<preset>/`` dirs
        of ``cosyvino quantize``, or ``model_dir`` itself; by manifest, see
        :func:`cosyvino.planner.inventory.model_inventory`); a quantized dir is served when
        present. Imports no openvino."""
        from cosyvino.planner.inventory import inventory_for

        inv = inventory_for(model_dir, probe)
        ov = inv.get("openvino", {})
        where = model_dir or "the model dir"
        precisions = ["fp32"]
        if probe is not None and probe.bf16:
            precisions.append("bf16")
        if probe is not None and (probe.vnni or probe.amx):
            precisions.append("int8")
        common = dict(thread_safe=True, streams=True, pinning=True,
                      precisions=tuple(precisions))
        if not ov.get("present"):
            return Capabilities(ready=False, reason=f"no converted IRs at {where}/openvino/"
                                "manifest.json (run `cosyvino convert` to enable OpenVINO)",
                                relative_speed=SPEED_F32, **common)
        dirs = ov.get("dirs") or ["openvino"]
        qdir = ov.get("quantized_dir")
        if qdir:
            speed, load_dir = SPEED_QUANTIZED.get(os.path.basename(qdir), 1.9), qdir
            what = f"quantized IRs in {qdir} (`cosyvino quantize`)"
        else:
            speed = SPEED_BF16 if "bf16" in precisions else SPEED_F32
            load_dir = (model_dir if dirs[0] in ("openvino", ".")
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
            **common)

    @classmethod
    def load(cls, model_dir: str, **options) -> Stages:
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        from .stages import OpenVINOStages

        return OpenVINOStages(model_dir, **options)


@cosyvino.hookimpl
def register_backends(register):
    register(OpenVINOBackend)
