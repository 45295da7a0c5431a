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
    properties          dict of extra raw OpenVINO properties for every stage
"""

from __future__ import annotations

import importlib.util

import cosyvino
from cosyvino.backends.base import Backend, Stages
from cosyvino.errors import BackendError


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
    def load(cls, model_dir: str, **options) -> Stages:
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        from .stages import OpenVINOStages

        return OpenVINOStages(model_dir, **options)


@cosyvino.hookimpl
def register_backends(register):
    register(OpenVINOBackend)
