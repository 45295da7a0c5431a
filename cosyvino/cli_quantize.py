"""``cosyvino quantize``: fp32 converted dir -> NNCF-quantized converted dir (export side;
imports openvino and nncf only when run). Registered in :mod:`cosyvino.cli` with one
``add_command`` line."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from .cli_errors import friendly_errors as _friendly_errors
from .errors import ModelDirError


@click.command("quantize")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model dir with openvino/ IRs, or a converted dir (default: the embedded "
                   "default model).")
@click.option("--preset", type=click.Choice(["int8-llm-only"]), default="int8-llm-only",
              show_default=True,
              help="int8-llm-only: NNCF weight-only INT8 (asymmetric) of the LLM; other IRs "
                   "copied unchanged.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output dir [default: next to the fp32 IRs, openvino-int8-llm].")
@click.option("--eval-per-language", type=click.IntRange(min=0), default=2, show_default=True,
              help="Held-out calibration texts per language for the accuracy report "
                   "(0 = skip the report).")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=20, show_default=True,
              help="Forced speech tokens per text in the accuracy report.")
@click.option("--calib", type=click.Path(exists=True), default=None,
              help="Calibration texts file or dir (default: the shipped calib/ set).")
@click.option("--max-kl", type=click.FloatRange(min=0), default=None,
              help="Fail (exit 1, nothing written) when the LLM's mean KL vs fp32 exceeds this.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for the accuracy report.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_friendly_errors
def quantize(model_dir, preset, out_dir, eval_per_language, eval_tokens, calib, max_kl,
             threads, as_json):
    """Quantize converted OpenVINO IRs with NNCF (needs openvino + nncf; no torch).

    The output is a converted dir with its own manifest (use it with
    `--backend openvino --model-dir OUT`); it appears atomically. The accuracy report compares
    the LLM with fp32 on held-out calibration texts (teacher-forced top-1 agreement and KL).
    """
    from .defaults import ensure_default_model
    from .errors import BackendError

    try:
        from .quantize import QuantizeGuardError, quantize_model_dir
    except ImportError as e:
        raise BackendError(f"cosyvino quantize needs openvino and nncf ({e}); "
                           "pip install 'cosyvino[openvino,nncf]'") from None
    from .calibration import load_calibration_set

    model_dir = model_dir or ensure_default_model()
    if max_kl is not None and max_kl != max_kl:  # NaN would silently disable the guard
        raise click.BadParameter("--max-kl must be a number, not NaN")
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    if max_kl is not None and eval_per_language == 0:
        raise click.BadParameter("--max-kl needs the accuracy report (--eval-per-language > 0)")
    texts = (load_calibration_set(calib, split="evaluation",
                                  limit_per_language=eval_per_language)
             if eval_per_language else None)
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    try:
        out, summary = quantize_model_dir(model_dir, out_dir, preset=preset, eval_texts=texts,
                                          eval_tokens=eval_tokens, max_kl=max_kl,
                                          num_threads=threads, progress=say)
    except QuantizeGuardError as e:
        if as_json:
            click.echo(json.dumps({"error": str(e), "accuracy": e.report}, indent=2,
                                  ensure_ascii=False))
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        for stage, s in summary["stages"].items():
            click.echo(f"{stage}: {s['mode']} {s['fp32_bin_bytes'] / 1e6:.1f} MB -> "
                       f"{s['bin_bytes'] / 1e6:.1f} MB ({s['size_ratio']:.0%})")
        acc = summary["accuracy"]
        if acc:
            click.echo(f"LLM vs fp32: top-1 agreement {acc['top1_agreement']:.3f}, mean KL "
                       f"{acc['mean_kl']:.2e}, max KL {acc['max_kl']:.2e} "
                       f"({acc['positions']} positions)")
        click.echo(f"wrote {out} in {summary['seconds']:.1f} s")
        click.echo(f"use it: cosyvino synth --backend openvino --model-dir {out} TEXT")
    return out
