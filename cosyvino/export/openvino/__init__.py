"""OpenVINO export (imports torch and openvino): ``convert_model_dir`` writes the converted
directory described in :mod:`cosyvino.converted`."""

from .convert import WEIGHTS, convert_model_dir

__all__ = ["convert_model_dir", "WEIGHTS"]
