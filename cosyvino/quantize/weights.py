"""Weight-only compression of an IR with ``nncf.compress_weights`` (INT8 / INT4).

INT8 (``INT8_ASYM``): per-output-channel int8 weights with a zero point, data-free.
INT4 (``INT4_ASYM`` / ``INT4_SYM``): group-wise int4 weights (``group_size`` input channels share
a scale), ``ratio`` of the ratio-defining layers in int4 and the rest in the INT8 backup mode;
NNCF keeps the first (embedding-like) and last layers in INT8. With a dataset (captured LLM
inputs, see :mod:`.capture`) AWQ and scale estimation tune scales on real activations.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass

import nncf
import openvino as ov
from nncf.quantization.advanced_parameters import (
    AdvancedCompressionParameters,
    GroupSizeFallbackMode,
)

from ..errors import InputError

log = logging.getLogger("cosyvino.quantize")

INT4_MODES = ("INT4_ASYM", "INT4_SYM")


@dataclass(frozen=True)
class WeightSettings:
    """mode: an ``nncf.CompressWeightsMode`` name (``INT8_ASYM``, ``INT4_ASYM``, ``INT4_SYM``).
    group_size / ratio: INT4 only (group of input channels per scale; share of layers in
    int4). awq / scale_estimation: INT4 data-aware steps, used when a dataset is given."""

    mode: str = "INT8_ASYM"
    group_size: int = 128
    ratio: float = 1.0
    awq: bool = True
    scale_estimation: bool = True

    def __post_init__(self):
        if not hasattr(nncf.CompressWeightsMode, self.mode):
            raise InputError(f"unknown weight compression mode {self.mode!r}")
        if self.mode in INT4_MODES:
            if self.group_size not in (32, 64, 128, 256):
                raise InputError(f"INT4 group_size must be 32, 64, 128 or 256, got "
                                 f"{self.group_size!r}")
            if not 0.0 < self.ratio <= 1.0:
                raise InputError(f"INT4 ratio must be in (0, 1], got {self.ratio!r}")

    @property
    def is_int4(self) -> bool:
        return self.mode in INT4_MODES

    @property
    def precision(self) -> str:
        """Manifest precision label of the compressed IR."""
        return "int4-weights" if self.is_int4 else "int8-weights"

    def describe(self) -> dict:
        d = {"mode": self.mode}
        if self.is_int4:
            d.update(group_size=self.group_size, ratio=self.ratio)
        return d


def _quiet():
    # NNCF logs its bitwidth table to stdout at INFO, which would corrupt `--json` output
    nncf.set_log_level(logging.WARNING)
    return contextlib.redirect_stdout(sys.stderr)


def compress_ir(xml: str, settings: WeightSettings, dataset: list | None = None
                ) -> tuple[ov.Model, dict]:
    """Compress the weights of IR ``xml``. ``dataset``: captured inputs (dicts by input name;
    LLM items carry NNCF's reset-state flag) for INT4 AWQ / scale estimation; ignored for INT8.

    Returns ``(model, info)``; ``info["data_aware"]`` says whether the dataset was used, and
    ``info["data_free_reason"]`` why not. A data-aware failure falls back to data-free
    compression (logged, recorded in ``info``) instead of failing the command.
    """
    mode = getattr(nncf.CompressWeightsMode, settings.mode)
    info = settings.describe()
    if not settings.is_int4:
        with _quiet():
            model = nncf.compress_weights(ov.Core().read_model(xml), mode=mode)
        return model, info | {"data_aware": False, "data_free_reason": "INT8 is data-free"}
    kwargs = {"mode": mode, "group_size": settings.group_size, "ratio": settings.ratio,
              # small attention constants (d_k wide) cannot take the group size
              "advanced_parameters": AdvancedCompressionParameters(
                  group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)}
    if dataset and (settings.awq or settings.scale_estimation):
        try:
            with _quiet():
                model = nncf.compress_weights(
                    ov.Core().read_model(xml), dataset=nncf.Dataset(dataset),
                    subset_size=len(dataset), awq=settings.awq,
                    scale_estimation=settings.scale_estimation, **kwargs)
            return model, info | {"data_aware": True, "awq": settings.awq,
                                  "scale_estimation": settings.scale_estimation,
                                  "dataset_items": len(dataset)}
        except Exception as e:  # noqa: BLE001  NNCF raises many types; data-free still works
            reason = f"data-aware compression failed ({type(e).__name__}: {e})"
            log.warning("%s; falling back to data-free INT4", reason.splitlines()[0])
    else:
        reason = ("awq and scale estimation off" if not (settings.awq or
                                                         settings.scale_estimation)
                  else "no calibration dataset")
    with _quiet():
        model = nncf.compress_weights(ov.Core().read_model(xml), **kwargs)
    return model, info | {"data_aware": False, "data_free_reason": reason.splitlines()[0]}
