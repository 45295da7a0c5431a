"""Post-training quantization of converted OpenVINO dirs (``cosyvino quantize``; export side).

Imports openvino and nncf; never torch itself (but ``import nncf`` imports torch when it is
installed, for its backend detection; serving the output needs neither nncf nor torch). First slice: preset ``int8-llm-only`` = NNCF
weight-only INT8 (``nncf.compress_weights``, its default asymmetric per-channel INT8 mode) of the
stateful LLM IR; every other file is copied unchanged. The output is itself a converted dir
(same layout, own manifest: the LLM files recorded with precision ``int8-weights``, the source
manifest's sha256 under ``quantization``), so the OpenVINO backend loads it as is.
"""

from .accuracy import llm_teacher_forced_report
from .weights import PRESETS, QuantizeGuardError, quantize_model_dir

__all__ = ["PRESETS", "QuantizeGuardError", "llm_teacher_forced_report", "quantize_model_dir"]
