"""Running a plain ONNX file (not a converted stage) on OpenVINO: what families use for the
model files a checkpoint ships as ONNX (CosyVoice v1: ``campplus.onnx`` and
``speech_tokenizer_v1.onnx``). OpenVINO reads ONNX directly; no conversion, no torch."""

from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np
import openvino as ov

from cosyvino.errors import BackendError, ModelDirError

_PRECISIONS = {"f32", "bf16", "f16"}


class OpenVINOOnnxRunner:
    """One ONNX file compiled for the CPU; :meth:`run` feeds its inputs by position.

    Thread-safe: concurrent calls each take an InferRequest of their own (created on demand).

    Attributes:
        path: the ONNX file.
        input_names: the model's input names, in order (for messages).
    """

    def __init__(self, path: str, *, num_threads: int | None = None,
                 precision: str | None = "f32", properties: dict | None = None):
        if precision is not None and precision not in _PRECISIONS:
            raise BackendError(f"precision must be one of {sorted(_PRECISIONS)}, got "
                               f"{precision!r}")
        if num_threads is not None and (isinstance(num_threads, bool) or int(num_threads) < 1):
            raise BackendError(f"num_threads must be >= 1, got {num_threads!r}")
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ModelDirError(f"{self.path} not found", self.path)
        props: dict = {"PERFORMANCE_HINT": "LATENCY"}
        if precision is not None:  # f32 by default: bf16 would move argmax decisions
            props["INFERENCE_PRECISION_HINT"] = precision
        if num_threads is not None:
            props["INFERENCE_NUM_THREADS"] = int(num_threads)
        props.update(properties or {})
        core = ov.Core()
        try:
            model = core.read_model(self.path)
        except Exception as e:  # OpenVINO raises RuntimeError subclasses with long text
            raise ModelDirError(f"{self.path} is not a readable ONNX model "
                                f"({_first_line(e)})", self.path) from None
        try:
            self.compiled = core.compile_model(model, "CPU", props)
        except Exception as e:
            raise BackendError(f"OpenVINO cannot compile {self.path}: {_first_line(e)}") \
                from None
        self.input_names = [_name(p, i) for i, p in enumerate(self.compiled.inputs)]
        self._n_out = len(self.compiled.outputs)
        self._free = [self.compiled.create_infer_request()]
        self._lock = threading.Lock()

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Inputs in the model's order -> outputs in its order (numpy copies).

        Raises: BackendError (wrong input count, or the runtime failed; names the file)."""
        if len(inputs) != len(self.input_names):
            raise BackendError(f"{os.path.basename(self.path)} takes {len(self.input_names)} "
                               f"inputs ({', '.join(self.input_names)}), got {len(inputs)}")
        with self._lock:
            req = self._free.pop() if self._free else self.compiled.create_infer_request()
        try:
            req.infer([np.ascontiguousarray(a) for a in inputs])
            return [req.get_output_tensor(i).data.copy() for i in range(self._n_out)]
        except Exception as e:
            raise BackendError(f"OpenVINO failed to run {self.path}: {_first_line(e)}") \
                from None
        finally:
            with self._lock:
                self._free.append(req)

    def close(self) -> None:
        """Release the compiled model."""
        self._free.clear()
        self.compiled = None


def _name(port, index: int) -> str:
    try:
        return port.get_any_name()
    except RuntimeError:  # an unnamed input
        return f"input{index}"


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
