"""``cosyvino bench``: backends side by side on one model, one subprocess per backend
(:mod:`cosyvino.bench`). Registered in :mod:`cosyvino.cli` with one ``add_command`` line."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

import click

from .cli_errors import friendly_errors as _friendly_errors

_PRECISION = {"f32": ("f32", "f32"), "bf16": ("bf16", None), "f16": ("f16", None),
              "u8kv": ("f32", "u8"), "default": (None, None)}


def _split_subdir(spec: str) -> tuple[str, str | None]:
    """``openvino@SUBDIR[:prec]`` -> (``openvino[:prec]``, SUBDIR); else (spec, None)."""
    name, colon, prec = spec.partition(":")
    name, _, sub = name.partition("@")
    if sub and name != "openvino":
        raise click.BadParameter(f"only openvino takes '@SUBDIR' ({spec!r})")
    return name + colon + prec, (sub or None)


def _parse_spec(spec: str) -> tuple[str, dict]:
    """``torch`` | ``openvino`` | ``openvino:bf16`` -> (backend, options)."""
    name, _, prec = spec.partition(":")
    if name == "openvino":
        p, kv = _PRECISION.get(prec or "f32", (None, None))
        if prec and prec not in _PRECISION:
            raise click.BadParameter(f"unknown precision {prec!r} in {spec!r}; use one of "
                                     f"{sorted(_PRECISION)}")
        opts = {"precision": p}
        if kv:
            opts["kv_cache_precision"] = kv
        return name, opts
    if prec:
        raise click.BadParameter(f"backend {name!r} takes no ':precision' ({spec!r})")
    return name, {}


@click.command("bench")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model dir (default: the embedded default model, synthetic 300M).")
@click.option("--backends", default="torch,openvino", show_default=True,
              help="Comma-separated; openvino[:f32|u8kv|bf16|f16|default] picks the inference "
                   "precision (f32 = f32 compute and f32 KV cache; u8kv = f32 compute, u8 KV "
                   "cache; default = the CPU plugin's choice); openvino@SUBDIR loads the IRs "
                   "in MODEL_DIR/SUBDIR (e.g. openvino@openvino-int8-llm from `cosyvino "
                   "quantize`).")
@click.option("--tokens", type=click.IntRange(min=2), default=250, show_default=True,
              help="Forced speech tokens per text (50 = 1 s of audio).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads per backend (default: backend default).")
@click.option("--json-out", default="bench-results.json", show_default=True,
              help="Where to write the full results.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@_friendly_errors
def bench(model_dir, backends, tokens, threads, json_out, as_json):
    """Benchmark backends side by side: per-stage ms, LLM ms/token, estimator ms/call,
    vocoder ms, RTF, first-segment latency, peak RSS, load time, LLM decode roofline."""
    from .bench import TEXTS, markdown, roofline, run_backend_subprocess
    from .defaults import ensure_default_model
    from .models.yaml_config import read_model_config

    model_dir = os.path.abspath(model_dir or ensure_default_model())
    specs = [s.strip() for s in backends.split(",") if s.strip()]
    parsed = [(s, *_parse_spec(_split_subdir(s)[0]), _split_subdir(s)[1]) for s in specs]
    if any(b == "openvino" and not sub for _, b, _, sub in parsed):
        _ensure_converted(model_dir)
    results = []
    for label, backend, opts, sub in parsed:
        click.echo(f"bench: {label} ({len(TEXTS)} texts x {tokens} tokens) ...", err=True)
        t = time.perf_counter()
        r = run_backend_subprocess(backend, os.path.join(model_dir, sub) if sub else model_dir,
                                   tokens, threads, opts)
        r["label"] = label
        results.append(r)
        click.echo(f"bench: {label} done in {time.perf_counter() - t:.0f} s"
                   + (f" (FAILED: {r['error'].splitlines()[-1]})" if "error" in r else ""),
                   err=True)
    config = read_model_config(os.path.join(model_dir, "cosyvoice.yaml"))
    roof = roofline(config, results, tokens) if any("mean" in r for r in results) else None
    table = markdown(results, roof)
    data = {"model_dir": model_dir, "tokens": tokens, "threads": threads,
            "texts": [t[2] for t in TEXTS], "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "results": results, "roofline": roof,
            "markdown": table}
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        click.echo(table)
    failed = [r["label"] for r in results if "error" in r]
    if failed:
        # a benchmark that could not run a backend is not a result: fail the command
        click.echo(f"error: backend(s) failed: {', '.join(failed)}", err=True)
        sys.exit(1)
        if json_out:
            click.echo(f"\nwrote {json_out}")


def _ensure_converted(model_dir: str) -> None:
    from .converted import find_converted_dir
    from .errors import ConvertedModelError

    try:
        find_converted_dir(model_dir)
    except ConvertedModelError:
        click.echo(f"bench: no OpenVINO IRs for {model_dir}; running `cosyvino convert` once",
                   err=True)
        subprocess.run([sys.executable, "-m", "cosyvino.cli", "convert", "--model-dir",
                        model_dir], check=True)
