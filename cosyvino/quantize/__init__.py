"""Post-training quantization of converted OpenVINO dirs (``cosyvino quantize``; export side).

Imports openvino and nncf; never torch itself (but ``import nncf`` imports torch when it is
installed, for its backend detection; serving the output needs neither nncf nor torch).

* :mod:`.capture`: run the fp32 pipeline over calibration texts, record real stage inputs;
* :mod:`.graph_capture` / :mod:`.graph_accuracy`: the same capture and report for a family
  whose stages run on a graph runner (CosyVoice2), by graph role at the runner;
* :mod:`.weights`: weight-only INT8 / INT4 (``nncf.compress_weights``) of the LLM and text
  encoder;
* :mod:`.static`: static INT8 (``nncf.quantize``, transformer model type, SmoothQuant, ignored
  scope) of the flow encoder, estimator and, on request, HiFT;
* :mod:`.accuracy` / :mod:`.metrics`: quantized vs fp32 on held-out texts (LLM teacher-forced
  top-1 and KL; mel L1, log-spectral distance, waveform SNR per stage and end to end);
* :mod:`.calibration`: the calibration text set (``calib/``; imports none of the above);
* :mod:`.model_dir`: presets, the atomic output dir with its own manifest, the guards;
* :mod:`.floors`: the per-stage SNR floors below which a static INT8 stage is written fp32;
* :mod:`.machine`: the record of the CPU (model, ISA flags, kind) the report was measured on
  (imports none of openvino / nncf / torch, like :mod:`.floors`).

The output is itself a converted dir (same layout; manifest records each IR's precision and the
source manifest's sha256 under ``quantization``), so the OpenVINO backend loads it as is.
"""

import importlib

#: public name -> submodule; imported on first use, so ``cosyvino.quantize.calibration`` (the
#: calibration text set, no openvino/nncf/torch) can be imported without them
_EXPORTS = {
    "audio_report": "accuracy", "llm_teacher_forced_report": "accuracy",
    "Capture": "capture", "CaptureLimits": "capture", "capture_calibration": "capture",
    "DEFAULT_SUBDIR": "model_dir", "PRESETS": "model_dir", "Guards": "model_dir",
    "QuantizeGuardError": "model_dir", "quantize_model_dir": "model_dir",
    "StaticSettings": "static", "WeightSettings": "weights",
    "SNR_FLOORS_DB": "floors", "machine_record": "machine",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = [
    "DEFAULT_SUBDIR",
    "PRESETS",
    "Capture",
    "CaptureLimits",
    "Guards",
    "QuantizeGuardError",
    "SNR_FLOORS_DB",
    "StaticSettings",
    "WeightSettings",
    "audio_report",
    "capture_calibration",
    "llm_teacher_forced_report",
    "machine_record",
    "quantize_model_dir",
]
