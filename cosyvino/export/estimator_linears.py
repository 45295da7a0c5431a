"""Export-time patch of the estimator's linears, shared by the ONNX and OpenVINO exports
(imports torch).

:func:`plain_estimator_linears` — while active, the estimator's 3-D linears
(:func:`cosyvino.families.cosyvoice1.torch.estimator._linear`) are traced as ``x @ W^T + b``: one
``MatMul`` with a 2-D constant weight. The eager spelling (``bmm`` with the weight expanded
over the batch, chosen for torch.export's shape guards) traces to ``Expand`` + batched
``MatMul`` on a computed tensor:

* ONNX Runtime can neither constant-fold nor pre-pack it and copied every weight on every call
  (300M estimator at T = 430: ``Expand`` 4.6 % of the time, the un-prepacked MatMuls 54 %);
* the OpenVINO CPU plugin constant-folds the Broadcast, so every weight existed twice in memory
  (+0.8 GB), and NNCF saw no constant weight behind it, so static INT8 left those linears fp32.

Same math; summation order may differ in the last ulp. IRs converted before this patch are
still handled at load (``cosyvino_openvino.memory.fold_weight_broadcasts``) and before
quantization (:func:`cosyvino.quantize.static.unbroadcast_matmul_weights`).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from cosyvino.families.cosyvoice1.torch import estimator as _estimator


def _matmul_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` for x [B, T, C_in] -> [B, T, C_out] as ``x @ W^T (+ b)``."""
    y = torch.matmul(x, layer.weight.t())
    return y if layer.bias is None else y + layer.bias


@contextlib.contextmanager
def plain_estimator_linears():
    """Within the block, the estimator module's ``_linear`` is :func:`_matmul_linear` (the
    module looks the function up at call time, so tracing sees the patched one)."""
    original = _estimator._linear
    _estimator._linear = _matmul_linear
    try:
        yield
    finally:
        _estimator._linear = original
