"""Running a plain ONNX file (not a converted stage) on ONNX Runtime: what families use for the
model files a checkpoint ships as ONNX (CosyVoice v1: ``campplus.onnx`` and
``speech_tokenizer_v1.onnx``, run the way the official frontend runs them: CPU provider, full
graph optimization)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import onnxruntime as ort

from cosyvino.errors import BackendError, ModelDirError


class ORTOnnxRunner:
    """One ONNX file in an ``InferenceSession`` (CPU provider); :meth:`run` feeds its inputs by
    position. Thread-safe (ONNX Runtime's ``run`` is).

    Attributes:
        path: the ONNX file.
        input_names: the model's input names, in order.
    """

    def __init__(self, path: str, *, num_threads: int | None = None):
        if num_threads is not None and (isinstance(num_threads, bool) or int(num_threads) < 1):
            raise BackendError(f"num_threads must be >= 1, got {num_threads!r}")
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ModelDirError(f"{self.path} not found", self.path)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        if num_threads is not None:
            so.intra_op_num_threads = int(num_threads)
        try:
            self.session = ort.InferenceSession(self.path, so,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # InvalidProtobuf, Fail, ... (onnxruntime's own classes)
            raise ModelDirError(f"{self.path} is not a readable ONNX model ({e})",
                                self.path) from None
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Inputs in the model's order -> outputs in its order.

        Raises: BackendError (wrong input count, or the runtime failed; names the file)."""
        if len(inputs) != len(self.input_names):
            raise BackendError(f"{os.path.basename(self.path)} takes {len(self.input_names)} "
                               f"inputs ({', '.join(self.input_names)}), got {len(inputs)}")
        try:
            return self.session.run(None, dict(zip(self.input_names, inputs)))
        except Exception as e:
            raise BackendError(f"ONNX Runtime failed to run {self.path}: {e}") from None

    def close(self) -> None:
        """Release the session."""
        self.session = None
