"""``cosyvino convert``: official model dir -> OpenVINO IR dir or ONNX dir (export side; imports
torch and openvino / onnx only when run). Registered in :mod:`cosyvino.cli` with one
``add_command`` line."""

from __future__ import annotations

import os
import sys
import time

import click

from .cli_errors import friendly_errors as _friendly_errors


@click.command("convert")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Official-layout model dir (default: the embedded default model).")
@click.option("--format", "fmt", type=click.Choice(["openvino", "onnx"]), default="openvino",
              show_default=True,
              help="openvino: IRs for --backend openvino; onnx: ONNX for --backend onnxruntime.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output dir [default: MODEL_DIR/openvino, or MODEL_DIR/onnx for --format "
                   "onnx].")
@click.option("--weights", type=click.Choice(["fp32", "fp16"]), default="fp32",
              show_default=True, help="Precision of the stored weights (fp16: openvino only).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_friendly_errors
def convert(model_dir, fmt, out_dir, weights, as_json):
    """Convert a model for `--backend openvino` (OpenVINO IR; needs torch + openvino) or, with
    `--format onnx`, for `--backend onnxruntime` (ONNX; needs torch + onnx).

    Writes every stage as an IR / ONNX file (the OpenVINO LLM stateful, the ONNX LLM with
    explicit KV-cache inputs and outputs), speakers and tables as numpy files and a manifest;
    the result is self-contained for serving without torch. The output appears atomically
    (temp dir + rename).
    """
    import json

    from .converted import read_manifest
    from .defaults import ensure_default_model
    from .errors import BackendError

    if fmt == "onnx" and weights != "fp32":
        raise click.BadParameter("ONNX export stores fp32 weights only (ONNX Runtime's CPU "
                                 "kernels compute in fp32); drop --weights or use --format "
                                 "openvino", param_hint="--weights")
    try:
        if fmt == "onnx":
            from .export.onnx import convert_model_dir
        else:
            from .export.openvino import convert_model_dir
    except ImportError as e:
        extra = "onnxruntime" if fmt == "onnx" else "openvino"
        raise BackendError(f"cosyvino convert --format {fmt} needs torch and {extra} ({e}); "
                           f"pip install 'cosyvino[torch,{extra}]'") from None
    model_dir = model_dir or ensure_default_model()
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    if fmt == "onnx":
        out = convert_model_dir(model_dir, out_dir, progress=say)
    else:
        out = convert_model_dir(model_dir, out_dir, weights=weights, progress=say)
    manifest = read_manifest(out)
    size = sum(v["size"] for v in manifest["files"].values())
    if fmt == "onnx":
        runtime, backend = f"ONNX opset {manifest['opset']}", "onnxruntime"
        summary = {"out": out, "format": fmt, "weights": weights, "opset": manifest["opset"],
                   "onnx": manifest["onnx_version"], "files": len(manifest["files"]),
                   "bytes": size}
    else:
        runtime, backend = f"OpenVINO {manifest['openvino_version']}", "openvino"
        summary = {"out": out, "format": fmt, "weights": weights,
                   "openvino": manifest["openvino_version"], "files": len(manifest["files"]),
                   "bytes": size}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"wrote {out} ({len(manifest['files'])} files, {size / 1e6:.0f} MB, "
                   f"{weights} weights, {runtime})")
        click.echo(f"use it: cosyvino synth --backend {backend} --model-dir {out} TEXT")
    sys.stdout.flush()
    return os.fspath(out)
