"""``quantize_model_dir``: fp32 converted dir -> quantized converted dir (atomic)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import nncf
import openvino as ov

from .. import __version__
from ..converted import (
    FORMAT,
    MANIFEST,
    STAGES,
    file_record,
    find_converted_dir,
    sha256_file,
    validate_converted_dir,
    write_manifest,
)
from ..errors import InputError
from .accuracy import format_table, llm_teacher_forced_report, report_is_finite
from ..fileutil import replace_dir

Progress = Callable[[str], None]

#: preset -> {stage: (nncf mode name, manifest precision)}; stages not listed are copied
PRESETS = {
    "int8-llm-only": {"llm": ("INT8_ASYM", "int8-weights")},
}
DEFAULT_SUBDIR = {"int8-llm-only": "openvino-int8-llm"}


class QuantizeGuardError(RuntimeError):
    """An accuracy guard (``max_kl``) was exceeded; nothing was written."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def _compress(xml: str, mode: str) -> ov.Model:
    model = ov.Core().read_model(xml)
    # NNCF logs its bitwidth table to stdout at INFO, which would corrupt `--json` output
    # (and its progress bar too: sent to stderr)
    nncf.set_log_level(logging.WARNING)
    with contextlib.redirect_stdout(sys.stderr):
        return nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode))


def quantize_model_dir(model_dir: str, out_dir: str | None = None, *,
                       preset: str = "int8-llm-only", eval_texts: Sequence | None = None,
                       eval_tokens: int = 20, max_kl: float | None = None,
                       num_threads: int | None = None, progress: Progress | None = None,
                       overwrite: bool = True) -> tuple[str, dict]:
    """Quantize the converted dir found at ``model_dir`` (a converted dir, or a model dir with
    ``openvino/``) into ``out_dir`` (default: next to the fp32 IRs, ``openvino-int8-llm``).

    With ``eval_texts`` the LLM is scored against fp32 (:func:`llm_teacher_forced_report`)
    before the output appears; ``max_kl`` (mean KL over all positions) makes an exceeded or
    non-finite result raise :class:`QuantizeGuardError` with nothing written.
    Returns ``(out_dir, summary)``.
    """
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    say = progress or (lambda msg: None)
    src_dir, source_dir = find_converted_dir(os.fspath(model_dir))
    src_dir = os.path.abspath(src_dir)
    say(f"validating {src_dir}")
    src = validate_converted_dir(src_dir, source_dir)
    weights = src.get("weights")
    if weights != "fp32":
        raise InputError(f"{src_dir} holds {weights!r} IRs; quantize an fp32 conversion "
                         "(`cosyvino convert --weights fp32`)")
    if src.get("quantization"):
        raise InputError(f"{src_dir} is already quantized")
    out_dir = os.path.abspath(out_dir or os.path.join(os.path.dirname(src_dir),
                                                      DEFAULT_SUBDIR[preset]))
    if out_dir == src_dir:
        raise InputError("the output dir must differ from the fp32 converted dir")
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    start = time.perf_counter()
    plan = PRESETS[preset]
    try:
        files = {}
        stage_stats = {}
        for stage, (mode, precision) in plan.items():
            stem = STAGES[stage]
            say(f"compressing {stage} weights ({mode})")
            t = time.perf_counter()
            model = _compress(os.path.join(src_dir, stem + ".xml"), mode)
            model.set_rt_info(precision, ["cosyvino", "weights"])
            # keep the uncompressed constants (norms, biases) fp32 like the source IR
            ov.save_model(model, os.path.join(tmp, stem + ".xml"), compress_to_fp16=False)
            del model
            for ext in (".xml", ".bin"):
                files[stem + ext] = file_record(os.path.join(tmp, stem + ext), stage=stage,
                                                precision=precision)
            stage_stats[stage] = {
                "mode": mode, "seconds": time.perf_counter() - t,
                "fp32_bin_bytes": src["files"][stem + ".bin"]["size"],
                "bin_bytes": files[stem + ".bin"]["size"]}
            stage_stats[stage]["size_ratio"] = (stage_stats[stage]["bin_bytes"]
                                                / stage_stats[stage]["fp32_bin_bytes"])
            say(f"{stage}: {stage_stats[stage]['fp32_bin_bytes'] / 1e6:.1f} MB -> "
                f"{stage_stats[stage]['bin_bytes'] / 1e6:.1f} MB "
                f"({stage_stats[stage]['seconds']:.1f} s)")
        for name, rec in src["files"].items():
            if name in files:
                continue
            shutil.copyfile(os.path.join(src_dir, name), os.path.join(tmp, name))
            files[name] = dict(rec)
        quant = {"preset": preset, "nncf_version": nncf.__version__,
                 "source_converted_dir": src_dir,
                 "source_manifest_sha256": sha256_file(os.path.join(src_dir, MANIFEST)),
                 "stages": stage_stats}
        report = None
        if eval_texts:
            say(f"accuracy: {len(eval_texts)} texts x {eval_tokens} forced tokens")
            report = llm_teacher_forced_report(src_dir, os.path.join(tmp, STAGES["llm"] + ".xml"),
                                               eval_texts, eval_tokens, num_threads)
            say("accuracy (LLM, quantized vs fp32):\n" + format_table(report))
            quant["accuracy"] = {k: v for k, v in report.items() if k != "per_text"}
            if max_kl is not None and (not report_is_finite(report)
                                       or report["mean_kl"] > max_kl):
                raise QuantizeGuardError(
                    f"LLM mean KL {report['mean_kl']:.3g} exceeds --max-kl {max_kl:g}; "
                    "nothing written", report)
        elif max_kl is not None:
            raise InputError("max_kl needs eval_texts")
        write_manifest(tmp, {k: v for k, v in src.items() if k != "checksum"} | {
            "format": FORMAT,
            "cosyvino_version": __version__,
            "openvino_version": ov.get_version(),
            "files": files,
            "quantization": quant,
        })
        validate_converted_dir(tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = time.perf_counter() - start
    say(f"done in {total:.1f} s: {out_dir}")
    return out_dir, {"out": out_dir, "preset": preset, "seconds": total, "stages": stage_stats,
                     "accuracy": report}
