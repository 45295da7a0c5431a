"""``cosyvino convert``: official model dir -> OpenVINO IR dir (export side; imports torch and
openvino only when run). Registered in :mod:`cosyvino.cli` with one ``add_command`` line."""

from __future__ import annotations

import os
import sys
import time

import click

from .cli_errors import friendly_errors as _friendly_errors


@click.command("convert")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Official-layout model dir (default: the embedded default model).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output dir [default: MODEL_DIR/openvino].")
@click.option("--weights", type=click.Choice(["fp32", "fp16"]), default="fp32",
              show_default=True, help="Precision of the stored IR weights.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_friendly_errors
def convert(model_dir, out_dir, weights, as_json):
    """Convert a model to OpenVINO IR for `--backend openvino` (needs torch + openvino).

    Writes every stage as an IR (the LLM stateful, KV cache inside), speakers and tables as
    numpy files and a manifest; the result is self-contained for serving without torch.
    The output appears atomically (temp dir + rename).
    """
    import json

    from .converted import read_manifest
    from .defaults import ensure_default_model
    from .errors import BackendError

    try:
        from .export.openvino import convert_model_dir
    except ImportError as e:
        raise BackendError(f"cosyvino convert needs torch and openvino ({e}); "
                           "pip install 'cosyvino[torch,openvino]'") from None
    model_dir = model_dir or ensure_default_model()
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    out = convert_model_dir(model_dir, out_dir, weights=weights, progress=say)
    manifest = read_manifest(out)
    size = sum(v["size"] for v in manifest["files"].values())
    summary = {"out": out, "weights": weights, "openvino": manifest["openvino_version"],
               "files": len(manifest["files"]), "bytes": size}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"wrote {out} ({len(manifest['files'])} files, {size / 1e6:.0f} MB, "
                   f"{weights} weights, OpenVINO {manifest['openvino_version']})")
        click.echo(f"use it: cosyvino synth --backend openvino --model-dir {out} TEXT")
    sys.stdout.flush()
    return os.fspath(out)
