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

from cosyvino.cli.errors import friendly_errors as _friendly_errors

_PRECISION = {"f32": ("f32", "f32"), "bf16": ("bf16", None), "f16": ("f16", None),
              "u8kv": ("f32", "u8"), "default": (None, None), "vocbf16": ("f32", "f32"),
              "served": ("f32", "u8")}
#: precision modes that also move some stages off the common precision (``stage_precision``)
_STAGE_PRECISION = {"vocbf16": {"hift_f0": "bf16", "hift_decode": "bf16"},
                    "served": {"hift_f0": "bf16", "hift_decode": "bf16", "estimator": "bf16"}}


#: backends that serve a converted dir: backend -> (manifest runtime, `cosyvino convert` args)
_CONVERTED = {"openvino": ("openvino", []), "onnxruntime": ("onnxruntime", ["--format", "onnx"])}
#: ``onnxruntime:VARIANT`` -> backend options
_ORT_VARIANTS = {"run": {}, "iobinding": {"io_binding": True}}


def _split_subdir(spec: str) -> tuple[str, str | None]:
    """``openvino@SUBDIR[:prec]`` / ``onnxruntime@SUBDIR`` -> (spec without it, SUBDIR); else
    (spec, None)."""
    name, colon, prec = spec.partition(":")
    name, _, sub = name.partition("@")
    if sub and name not in _CONVERTED:
        raise click.BadParameter(f"only {' and '.join(_CONVERTED)} take '@SUBDIR' ({spec!r})")
    return name + colon + prec, (sub or None)


def _parse_spec(spec: str) -> tuple[str, dict]:
    """``torch`` | ``openvino`` | ``openvino:bf16`` | ``onnxruntime[:iobinding]`` ->
    (backend, options)."""
    name, _, prec = spec.partition(":")
    if name == "openvino":
        p, kv = _PRECISION.get(prec or "f32", (None, None))
        if prec and prec not in _PRECISION:
            raise click.BadParameter(f"unknown precision {prec!r} in {spec!r}; use one of "
                                     f"{sorted(_PRECISION)}")
        opts = {"precision": p}
        if kv:
            opts["kv_cache_precision"] = kv
        if prec in _STAGE_PRECISION:
            opts["stage_precision"] = dict(_STAGE_PRECISION[prec])
        return name, opts
    if name == "onnxruntime":
        if prec and prec not in _ORT_VARIANTS:
            raise click.BadParameter(f"unknown onnxruntime variant {prec!r} in {spec!r}; use "
                                     f"one of {sorted(_ORT_VARIANTS)}")
        return name, dict(_ORT_VARIANTS[prec or "run"])
    if prec:
        raise click.BadParameter(f"backend {name!r} takes no ':precision' ({spec!r})")
    return name, {}


@click.command("bench")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model dir (default: the embedded default model, synthetic 300M).")
@click.option("--backends", default="torch,openvino,onnxruntime", show_default=True,
              help="Comma-separated; openvino[:f32|u8kv|bf16|f16|vocbf16|served|default] picks "
                   "the inference precision (f32 = f32 compute and f32 KV cache; u8kv = f32 "
                   "compute, u8 KV cache; vocbf16 = f32 with the HiFT vocoder in bf16; served "
                   "= u8kv with HiFT and the estimator's non-int8 ops in bf16, what `cosyvino "
                   "plan` serves for an INT8 dir on a bf16 CPU; default = the CPU plugin's "
                   "choice); "
                   "openvino@SUBDIR[:PREC] loads "
                   "the IRs in MODEL_DIR/SUBDIR with that precision (e.g. "
                   "openvino@openvino-int8:default from `cosyvino quantize`); "
                   "onnxruntime[:iobinding] serves MODEL_DIR/onnx (iobinding: the "
                   "LLM decode loop through IO binding). A missing OpenVINO / ONNX dir is "
                   "converted once first.")
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
    from cosyvino.bench import TEXTS, markdown, roofline, run_backend_subprocess
    from cosyvino.defaults import ensure_default_model
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    model_dir = os.path.abspath(model_dir or ensure_default_model())
    specs = [s.strip() for s in backends.split(",") if s.strip()]
    parsed = [(s, *_parse_spec(_split_subdir(s)[0]), _split_subdir(s)[1]) for s in specs]
    missing = {b: _ensure_converted(model_dir, b) for _, b, _, sub in parsed
               if b in _CONVERTED and not sub}
    results = []
    for label, backend, opts, sub in parsed:
        if missing.get(backend):
            results.append({"backend": backend, "label": label, "error": missing[backend]})
            continue
        click.echo(f"bench: {label} ({len(TEXTS)} texts x {tokens} tokens) ...", err=True)
        t = time.perf_counter()
        r = run_backend_subprocess(backend, os.path.join(model_dir, sub) if sub else model_dir,
                                   tokens, threads, opts)
        r["label"] = label
        results.append(r)
        click.echo(f"bench: {label} done in {time.perf_counter() - t:.0f} s"
                   + (f" (FAILED: {r['error'].splitlines()[-1]})" if "error" in r else ""),
                   err=True)
    roof = None
    if any("mean" in r for r in results):
        roof = roofline(read_model_config(os.path.join(model_dir, "cosyvoice.yaml")), results,
                        tokens)
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
        click.echo(f"wrote {json_out}", err=True)


def _ensure_converted(model_dir: str, backend: str) -> str | None:
    """Make sure ``model_dir`` has ``backend``'s converted dir, running `cosyvino convert` once
    when it is missing. Returns None when it is there, else an error line for the table (the
    command then exits 1 like for any failed backend)."""
    from cosyvino.bench import module_subprocess_env
    from cosyvino.converted import find_converted_dir
    from cosyvino.errors import ConvertedModelError

    runtime, args = _CONVERTED[backend]
    try:
        find_converted_dir(model_dir, runtime)
        return None
    except ConvertedModelError:
        pass
    cmd = " ".join(["cosyvino convert", *args])
    click.echo(f"bench: no {backend} model for {model_dir}; running `{cmd}` once", err=True)
    # the child's stdout goes to our fd 2 (live progress): stdout carries the table / --json
    out = subprocess.run([sys.executable, "-m", "cosyvino.cli", "convert", *args,
                          "--model-dir", model_dir], stdout=2, env=module_subprocess_env())
    if out.returncode != 0:
        return (f"no converted model for {backend} in {model_dir} and `{cmd} --model-dir "
                f"{model_dir}` failed with status {out.returncode}")
    try:
        find_converted_dir(model_dir, runtime)
    except ConvertedModelError as e:
        return str(e)
    return None
