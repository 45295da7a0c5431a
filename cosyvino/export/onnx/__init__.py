"""ONNX export (imports torch and onnx): ``convert_model_dir`` writes the converted directory
described in :mod:`cosyvino.converted` with ``runtime: "onnxruntime"`` (served by the
``onnxruntime`` backend plugin)."""

from .convert import OPSET, RUNTIME, convert_model_dir

__all__ = ["convert_model_dir", "OPSET", "RUNTIME"]
