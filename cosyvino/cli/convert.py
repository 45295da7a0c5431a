"""``cosyvino convert``: official model dir -> the converted dir a backend serves (OpenVINO IR,
ONNX, or a third-party backend's format). The format is owned by the backend whose
``convert_format`` it is; that backend decides whether an existing conversion is current
(:meth:`cosyvino.backends.Backend.conversion_status`) and converts
(:meth:`~cosyvino.backends.Backend.prepare`). Imports torch and the runtime only when run.
Registered in :mod:`cosyvino.cli` with one ``add_command`` line."""

from __future__ import annotations

import os
import sys
import time

import click

from cosyvino.cli.errors import friendly_errors as _friendly_errors

#: ``--format`` when none is given (listed first in ``--help``)
DEFAULT_FORMAT = "openvino"


def format_backends() -> dict[str, type]:
    """``cosyvino convert --format`` value -> the registered backend class that owns it
    (its ``convert_format``), the default format first, then by name."""
    from cosyvino.plugins import backend_classes

    owners: dict[str, type] = {}
    for name, cls in sorted(backend_classes().items()):
        fmt = getattr(cls, "convert_format", "")
        if fmt:
            owners.setdefault(fmt, cls)
    return dict(sorted(owners.items(), key=lambda kv: (kv[0] != DEFAULT_FORMAT, kv[0])))


def convert_command(fmt: str) -> str:
    """The ``cosyvino convert`` command line that writes format ``fmt``."""
    return "cosyvino convert" + ("" if fmt == DEFAULT_FORMAT else f" --format {fmt}")


class _FormatChoice(click.Choice):
    """The formats of the registered backends, looked up when the command runs (plugins are
    not loaded to build the command line)."""

    def __init__(self):
        self.case_sensitive = True

    @property
    def choices(self):
        return tuple(format_backends())


@click.command("convert")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Official-layout model dir (default: the embedded default model).")
@click.option("--format", "fmt", type=_FormatChoice(), default=DEFAULT_FORMAT,
              show_default=True,
              help="openvino: IRs for --backend openvino; onnx: ONNX for --backend onnxruntime "
                   "(or the format of an installed backend plugin).")
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

    from cosyvino.converted import read_manifest
    from cosyvino.defaults import ensure_default_model

    backend = format_backends()[fmt]
    if weights not in backend.convert_weights:
        others = [f for f, cls in format_backends().items() if weights in cls.convert_weights]
        raise click.BadParameter(
            f"--format {fmt} stores {'/'.join(backend.convert_weights)} weights only; drop "
            "--weights"
            + (f" or use --format {others[0]}" if others else ""), param_hint="--weights")
    model_dir = model_dir or ensure_default_model()
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    status = backend.conversion_status(model_dir, out_dir, weights=weights)
    kept = bool(status[0] and status[1]) and not force
    if kept:
        out = status[1]
        say(f"{out} is up to date ({status[2]}); kept (--force converts again)")
    else:
        out = backend.prepare(model_dir, out_dir, say, force=True, weights=weights)
    manifest = read_manifest(out)
    size = sum(v["size"] for v in manifest["files"].values())
    runtime, fields = backend.conversion_summary(manifest)
    summary = {"out": out, "format": fmt, "weights": weights, **fields,
               "files": len(manifest["files"]), "bytes": size}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"{'kept' if kept else 'wrote'} {out} ({len(manifest['files'])} files, "
                   f"{size / 1e6:.0f} MB, {weights} weights, {runtime})")
        click.echo(f"use it: cosyvino synth --backend {backend.name} --model-dir {out} TEXT")
    sys.stdout.flush()
    return os.fspath(out)


def up_to_date_conversion(model_dir: str, out_dir: str, backend: str, weights: str
                          ) -> str | None:
    """Why ``out_dir`` can be kept (a one-line reason), or None when it must be (re)written:
    ``backend``'s :meth:`~cosyvino.backends.Backend.conversion_status`, the rule ``cosyvino
    convert`` applies."""
    from cosyvino.plugins import get_backend

    current, _, reason = get_backend(backend).conversion_status(model_dir, out_dir,
                                                                weights=weights)
    return reason if current else None
