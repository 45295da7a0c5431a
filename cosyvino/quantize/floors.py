"""Accuracy floors of the static INT8 stages (``cosyvino quantize``): per report variant, the
lowest mean waveform SNR vs fp32, measured on the machine quantize runs on, at which the INT8
stage is written; below it the fp32 IR is written instead. No openvino / nncf (the CLI parses
``--snr-floor`` with it before loading them). docs/quantization.md, "Per machine: the record
and the accuracy floors"."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .accuracy import STAGE_GROUP

#: Accuracy floors (dB) of the static INT8 stages, by audio-report variant (the stage alone
#: quantized, everything else fp32; mean waveform SNR vs fp32 over the evaluation texts, on
#: the machine quantize runs on). A stage below its floor is written fp32 instead (unless
#: ``keep_below_floor``); docs/quantization.md, "Per machine".
SNR_FLOORS_DB = {
    # issue 16's target for a served INT8 estimator ("INT8 estimator SNR vs fp32 >= 45 dB on
    # every machine kind where INT8 is served"): 51.5-51.9 dB measured with VNNI/AMX on the
    # synthetic 300M, 38.5 dB on an AVX2-only Zen 3 (no dot products) with the same IRs, 38.9
    # dB with the ISA capped to AVX2 or to AVX-512 without VNNI
    "estimator": 45.0,
    # the same target: its error flows through the same ODE as the estimator's; measured
    # 72.7 dB on the synthetic 300M, so the floor catches broken kernels or calibration only
    "flow_encoder": 45.0,
    # `--hift int8` is an explicit opt-in measured at 29.4 dB (synthetic 300M, AVX-512
    # VNNI); 25 dB leaves that through and refuses a machine whose int8 kernels lose more,
    # as the estimator's lost 13 dB on AVX2
    "vocoder": 25.0,
}


#: the report variants that have a floor (``--snr-floor STAGE=DB``)
FLOOR_STAGES = tuple(SNR_FLOORS_DB)


def floor_verdicts(static_stages: Sequence[str], audio: dict | None, floors: dict,
                    keep: bool, roles: dict | None = None) -> dict:
    """variant -> {stages, floor_db, snr_db, min_snr_db, verdict} for every report variant
    (:data:`SNR_FLOORS_DB` key) holding a static INT8 stage. ``verdict``: ``pass``,
    ``refused`` (below the floor or not finite: the stages are written fp32), ``kept``
    (below, but ``keep``), ``unmeasured`` (no audio report). ``roles``: graph name -> role
    (:data:`cosyvino.families.ROLES`) of the source table; None: each stage is named after
    its role (v1)."""
    out: dict = {}
    for stage in static_stages:
        group = STAGE_GROUP.get((roles or {}).get(stage, stage))
        if group in floors:
            rec = out.setdefault(group, {"stages": [], "floor_db": floors[group]})
            rec["stages"].append(stage)
    for group, rec in out.items():
        sc = (audio or {}).get("scopes", {}).get(group)
        if sc is None:
            rec["verdict"] = "unmeasured"
            continue
        rec["snr_db"], rec["min_snr_db"] = sc["mean_snr_db"], sc["min_snr_db"]
        ok = math.isfinite(sc["mean_snr_db"]) and sc["mean_snr_db"] >= rec["floor_db"]
        rec["verdict"] = "pass" if ok else ("kept" if keep else "refused")
    return out


def describe_floor(group: str, rec: dict) -> str:
    """One line about a floor verdict of :func:`floor_verdicts` (the CLI prints it)."""
    stages = "/".join(rec["stages"])
    if rec["verdict"] == "unmeasured":
        return (f"{stages}: INT8 kept, accuracy floor {rec['floor_db']:g} dB not checked (no "
                "audio report: --eval-per-language 0; run again without it to check)")
    snr = f"{group} SNR {rec['snr_db']:.1f} dB vs fp32 (floor {rec['floor_db']:g} dB)"
    return {"pass": f"{stages}: INT8, {snr}",
            "refused": f"{stages}: written fp32, INT8 refused: {snr} on this machine "
                       "(--keep-below-floor keeps it, --snr-floor changes the floor)",
            "kept": f"{stages}: INT8 kept BELOW its floor (--keep-below-floor): {snr}"
            }[rec["verdict"]]
