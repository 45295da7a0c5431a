"""``cosyvino convert``: official model dir -> OpenVINO IR dir or ONNX dir (export side; imports
torch and openvino / onnx only when run). Registered in :mod:`cosyvino.cli` with one
``add_command`` line."""

from __future__ import annotations

import os
import sys
import time

import click

from cosyvino.cli.errors import friendly_errors as _friendly_errors


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
@click.option("--force", is_flag=True,
              help="Convert even when OUT already holds an up-to-date conversion.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_friendly_errors
def convert(model_dir, fmt, out_dir, weights, force, as_json):
    """Convert a model for `--backend openvino` (OpenVINO IR; needs torch + openvino) or, with
    `--format onnx`, for `--backend onnxruntime` (ONNX; needs torch + onnx).

    Writes every stage as an IR / ONNX file (the OpenVINO LLM stateful, the ONNX LLM with
    explicit KV-cache inputs and outputs), speakers and tables as numpy files and a manifest;
    the result is self-contained for serving without torch. The output appears atomically
    (temp dir + rename).
    """
    import json

    from cosyvino.converted import RUNTIME_SUBDIRS, read_manifest
    from cosyvino.defaults import ensure_default_model
    from cosyvino.errors import BackendError

    if fmt == "onnx" and weights != "fp32":
        raise click.BadParameter("ONNX export stores fp32 weights only (ONNX Runtime's CPU "
                                 "kernels compute in fp32); drop --weights or use --format "
                                 "openvino", param_hint="--weights")
    try:
        if fmt == "onnx":
            from cosyvino.export.onnx import convert_model_dir
        else:
            from cosyvino.export.openvino import convert_model_dir
    except ImportError as e:
        extra = "onnxruntime" if fmt == "onnx" else "openvino"
        raise BackendError(f"cosyvino convert --format {fmt} needs torch and {extra} ({e}); "
                           f"pip install 'cosyvino[torch,{extra}]'") from None
    model_dir = model_dir or ensure_default_model()
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    runtime = "onnxruntime" if fmt == "onnx" else "openvino"
    target = out_dir or os.path.join(model_dir, RUNTIME_SUBDIRS[runtime])
    kept = None if force else up_to_date_conversion(model_dir, target, runtime, weights)
    if kept:
        out = target
        say(f"{target} is up to date ({kept}); kept (--force converts again)")
    elif fmt == "onnx":
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
        click.echo(f"{'kept' if kept else 'wrote'} {out} ({len(manifest['files'])} files, "
                   f"{size / 1e6:.0f} MB, {weights} weights, {runtime})")
        click.echo(f"use it: cosyvino synth --backend {backend} --model-dir {out} TEXT")
    sys.stdout.flush()
    return os.fspath(out)


def _runtime_version(runtime: str) -> tuple[str, str]:
    """(manifest key, installed version) of the package that writes ``runtime``'s files."""
    if runtime == "onnxruntime":
        import onnx
        return "onnx_version", onnx.__version__
    import openvino
    return "openvino_version", openvino.get_version()


def _llm_layout(runtime: str) -> dict:
    """The LLM export-layout manifest fields a fresh conversion for ``runtime`` records (a dir
    with other values was written by an older exporter and is not up to date)."""
    if runtime == "openvino":
        from cosyvino.export.openvino.model_patcher import LLM_LAYOUT
        return LLM_LAYOUT
    return {"pos_bucket": 1}


def up_to_date_conversion(model_dir: str, out_dir: str, runtime: str, weights: str
                          ) -> str | None:
    """Why ``out_dir`` can be kept (a one-line reason), or None when it must be (re)written:
    missing, invalid (:func:`cosyvino.converted.validate_converted_dir` against ``model_dir``'s
    source files), other weights, written by another cosyvino / runtime version, or with
    another LLM export layout (``llm.pos_bucket``, ``llm.query_pos_projection``)."""
    from cosyvino import __version__
    from cosyvino.converted import MANIFEST, validate_converted_dir
    from cosyvino.errors import CosyvinoError

    if not os.path.isfile(os.path.join(out_dir, MANIFEST)):
        return None
    try:
        manifest = validate_converted_dir(out_dir, model_dir, runtime=runtime)
    except CosyvinoError:
        return None
    key, version = _runtime_version(runtime)
    if (manifest.get("weights", "fp32") != weights or manifest.get(key) != version
            or manifest.get("cosyvino_version") != __version__
            or any(manifest.get("llm", {}).get(k, 1 if k == "pos_bucket" else None) != v
                   for k, v in _llm_layout(runtime).items())):
        return None
    return f"same source files, {weights} weights, cosyvino {__version__}, {key} {version}"
