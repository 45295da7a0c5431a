"""Load-time rewrite of HiFT's Snake ``sin(y)^2`` for stages the CPU plugin runs in bf16.
Must not import torch.

HiFT's resblocks apply the Snake activation ``x + sin(alpha x)^2 / alpha`` (upstream
``cosyvoice/transformer/activation.py``) 44 times per decode. The OpenVINO CPU plugin (2026.4)
has only a reference kernel for ``Sin``, in f32: in a bf16 vocoder every Snake costs a scalar
``sin`` pass plus two reorders between bf16 and f32, a large share of the bf16 decode
(docs/performance.md, "Measurements behind code constants"). :func:`polynomial_sin_squares` replaces every ``Power(Sin(y), 2)`` with a polynomial the
plugin runs in its jit eltwise kernels:

* range reduction: ``sin^2`` has period pi, so ``r = y - k*pi`` with ``k = round(y / pi)``,
  ``|r| <= pi/2``; ``k*pi`` is subtracted in two parts (pi's float32 value, then the rest;
  Cody-Waite) so the reduction adds no error for ``|y|`` in the thousands;
* ``sin(r)`` by its Taylor series to ``r^11`` (truncation error below 6e-8 on ``|r| <= pi/2``),
  then squared.

Max abs error vs ``sin(y)^2`` in float32: 1.8e-6 for ``|y| <= 60`` (tested). Faster in bf16
at the same SNR; not used for f32 stages, where the plugin does not fuse the polynomial's ops
(same page).
"""

from __future__ import annotations

import math

import numpy as np
from openvino import opset13

#: float32(pi) and the remainder pi - float32(pi) (Cody-Waite reduction constants)
_PI_HI = float(np.float32(math.pi))
_PI_LO = math.pi - _PI_HI
#: Taylor coefficients of sin(r)/r - 1 in powers of r^2: -1/3!, 1/5!, -1/7!, 1/9!, -1/11!
_SIN_TAYLOR = (-1 / 6, 1 / 120, -1 / 5040, 1 / 362880, -1 / 39916800)


def _const(value: float):
    return opset13.constant(np.float32(value))


def sin_squared(y):
    """OpenVINO ops computing ``sin(y)^2`` for an f32 output ``y`` (any shape)."""
    k = opset13.round(opset13.multiply(y, _const(1 / math.pi)), "half_to_even")
    r = opset13.subtract(opset13.subtract(y, opset13.multiply(k, _const(_PI_HI))),
                         opset13.multiply(k, _const(_PI_LO)))
    r2 = opset13.multiply(r, r)
    poly = _const(_SIN_TAYLOR[-1])
    for c in reversed(_SIN_TAYLOR[:-1]):
        poly = opset13.add(opset13.multiply(poly, r2), _const(c))
    sin_r = opset13.add(r, opset13.multiply(opset13.multiply(r, r2), poly))
    return opset13.multiply(sin_r, sin_r)


def _is_square(power) -> bool:
    exponent = power.input(1).get_source_output().get_node()
    if exponent.get_type_name() == "Convert":  # IRs saved with fp16 constants
        exponent = exponent.input(0).get_source_output().get_node()
    if exponent.get_type_name() != "Constant":
        return False
    data = np.asarray(exponent.get_data())
    return data.size == 1 and float(data.reshape(-1)[0]) == 2.0


def polynomial_sin_squares(model) -> int:
    """Replace every f32 ``Power(Sin(y), 2)`` in ``model`` with :func:`sin_squared` of ``y``, in
    place. Other ``Sin`` nodes (e.g. the source module's phases) are left alone. Returns the
    number replaced."""
    replaced = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Power" or not _is_square(op):
            continue
        sin = op.input(0).get_source_output().get_node()
        if sin.get_type_name() != "Sin" or sin.get_output_element_type(0).get_type_name() != "f32":
            continue
        if len(sin.output(0).get_target_inputs()) != 1:  # sin(y) itself used elsewhere
            continue
        square = sin_squared(sin.input(0).get_source_output())
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(square.output(0))
        replaced += 1
    if replaced:
        model.validate_nodes_and_infer_types()
    return replaced
