"""Static INT8 (weights and activations) of the flow estimator, flow encoder and HiFT IRs with
``nncf.quantize`` on captured stage inputs (:mod:`.capture`). Imports openvino and nncf.

Defaults were chosen by measuring mel L1 / LSD against fp32 on held-out texts
(docs/quantization.md, "Static INT8 settings"): ``ModelType.TRANSFORMER`` (attention MatMuls
quantized), NNCF's ``MIXED`` preset (symmetric weights, asymmetric activations), SmoothQuant
off (it raised the estimator's mel error by a third on the synthetic 300M; ``alpha`` turns it
on), and an ignored scope of the small, sensitive layers: the estimator's time-embedding MLP and the
per-block time projections (they act on a [2, C] vector: no speed to gain, all the error of
quantizing ``t``), its first and last convolutions (the raw noise/condition input and the
velocity output), the flow encoder's input projection and ``encoder_proj``, and HiFT's
``conv_pre`` / ``conv_post``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass

import nncf
import openvino as ov
from nncf.quantization.advanced_parameters import (
    AdvancedQuantizationParameters,
    AdvancedSmoothQuantParameters,
)

from ..errors import InputError

#: stage -> regex patterns (NNCF IgnoredScope ``patterns``, matched against node names)
SENSITIVE_NODES = {
    "estimator": [r".*time_mlp.*", r".*\.mlp\.1/.*", r".*down_blocks\.0\.0\.block1\.block\.0/.*",
                  r".*final_proj.*"],
    "flow_encoder": [r".*encoder\.embed\.out\.0/.*", r".*encoder_proj.*",
                     r".*spk_embed_affine_layer.*"],
    "hift_decode": [r".*conv_pre/.*", r".*conv_post/.*"],
    "hift_f0": [r".*condnet\.0/.*", r".*classifier.*"],
}
STATIC_STAGES = tuple(SENSITIVE_NODES)
PRESETS = {"mixed": nncf.QuantizationPreset.MIXED,
           "performance": nncf.QuantizationPreset.PERFORMANCE}


@dataclass(frozen=True)
class StaticSettings:
    """Settings of one static quantization.

    preset: NNCF preset, ``mixed`` (symmetric weights, asymmetric activations) or
        ``performance`` (both symmetric).
    smooth_quant_alpha: SmoothQuant migration strength for MatMuls (0..1); negative disables
        SmoothQuant (NNCF's convention).
    ignore_sensitive: keep :data:`SENSITIVE_NODES` in fp32.
    fast_bias_correction: NNCF's bias correction flavour (True = fast).
    """

    preset: str = "mixed"
    smooth_quant_alpha: float = -1.0
    ignore_sensitive: bool = True
    fast_bias_correction: bool = True

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise InputError(f"unknown static preset {self.preset!r}; known: "
                             f"{', '.join(PRESETS)}")
        if not self.smooth_quant_alpha <= 1.0:  # also rejects NaN
            raise InputError(f"smooth_quant_alpha must be <= 1 (negative disables), got "
                             f"{self.smooth_quant_alpha!r}")

    def describe(self) -> dict:
        return {"preset": self.preset, "smooth_quant_alpha": self.smooth_quant_alpha,
                "ignore_sensitive": self.ignore_sensitive,
                "fast_bias_correction": self.fast_bias_correction}


def _as_named(model: ov.Model, sample) -> dict:
    names = [i.get_any_name() for i in model.inputs]
    if isinstance(sample, dict):
        missing = set(names) - set(sample)
        if missing:
            raise InputError(f"calibration sample lacks inputs {sorted(missing)} "
                             f"(model inputs: {names})")
        return {n: sample[n] for n in names}
    return dict(zip(names, sample))


def unbroadcast_matmul_weights(model: ov.Model) -> int:
    """Rewrite ``MatMul(x, Broadcast(Constant W[1, C, D]))`` as ``MatMul(x, Constant W[C, D])``
    in place; returns how many were rewritten.

    The exported estimator runs its transformer Linear layers as ``bmm`` with the weight
    expanded over the batch (``aten::expand`` -> Broadcast). NNCF does not see a constant
    weight behind the Broadcast, so it would leave the weight unquantized (fp32 file, no int8
    kernel). MatMul broadcasts a 2-D right operand over the batch itself, so the rewrite is
    exact.
    """
    from openvino import opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or node.get_attributes().get("transpose_b"):
            continue
        bcast = node.input_value(1).get_node()
        if bcast.get_type_name() != "Broadcast":
            continue
        const = bcast.input_value(0).get_node()
        if const.get_type_name() != "Constant":
            continue
        w = const.get_data()
        if w.ndim != 3 or w.shape[0] != 1:
            continue
        weight = ops.constant(w.reshape(w.shape[1:]).copy())
        weight.set_friendly_name(const.get_friendly_name() + "/unbroadcast")
        node.input(1).replace_source_output(weight.output(0))
        count += 1
    if count:
        model.validate_nodes_and_infer_types()
    return count


def quantize_static(xml: str, stage: str, samples: list, settings: StaticSettings
                    ) -> ov.Model:
    """Static INT8 of the IR ``xml`` (stage name ``stage``, a key of :data:`SENSITIVE_NODES`)
    calibrated on ``samples`` (dicts keyed by IR input name, or tuples in input order).

    Returns the quantized ``ov.Model`` (FakeQuantize form; the CPU plugin runs it in INT8).
    Raises :class:`InputError` for an unknown stage or no samples.
    """
    if stage not in SENSITIVE_NODES:
        raise InputError(f"no static quantization recipe for stage {stage!r}; known: "
                         f"{', '.join(STATIC_STAGES)}")
    if not samples:
        raise InputError(f"no calibration samples captured for {stage}; raise the capture "
                         "limits or give more texts")
    model = ov.Core().read_model(xml)
    unbroadcast_matmul_weights(model)
    data = [_as_named(model, s) for s in samples]
    ignored = (nncf.IgnoredScope(patterns=SENSITIVE_NODES[stage], validate=False)
               if settings.ignore_sensitive else None)
    advanced = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(
            matmul=settings.smooth_quant_alpha))
    nncf.set_log_level(logging.WARNING)
    # NNCF prints tables/progress on stdout; keep stdout clean for `--json`
    with contextlib.redirect_stdout(sys.stderr):
        return nncf.quantize(model, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                             preset=PRESETS[settings.preset], subset_size=len(data),
                             fast_bias_correction=settings.fast_bias_correction,
                             ignored_scope=ignored, advanced_parameters=advanced)
