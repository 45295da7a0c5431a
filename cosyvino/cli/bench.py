"""``cosyvino bench``: backends side by side on one model, one subprocess per backend
(:mod:`cosyvino.bench`). Registered in :mod:`cosyvino.cli` with one ``add_command`` line."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import subprocess
import sys
import time

import click

from cosyvino.cli.errors import friendly_errors as _friendly_errors


def _backend_class(name: str):
    """The registered backend class ``name``, or None (the worker then reports it unknown)."""
    from cosyvino.plugins import backend_classes

    return backend_classes().get(name)


def _converts(name: str) -> bool:
    """``name`` serves a converted dir (its backend owns a ``cosyvino convert`` format)."""
    return bool(getattr(_backend_class(name), "convert_format", ""))


def default_backends() -> str:
    """Every registered backend whose runtime is installed, the reference backend(s) first
    (the table's speed-up baseline), then by name."""
    from cosyvino.plugins import backend_classes

    classes = {n: c for n, c in backend_classes().items() if _installed(c)}
    return ",".join(sorted(classes, key=lambda n: (not getattr(classes[n], "reference", False),
                                                   n)))


def _installed(cls) -> bool:
    """Whether ``cls``'s runtime is importable here (``cosyvino backends`` "available")."""
    try:
        return bool(cls.is_available()[0])
    except Exception:  # noqa: BLE001 - a broken plugin is left out of the default list
        return False


def _split_subdir(spec: str) -> tuple[str, str | None]:
    """``NAME@SUBDIR[:preset]`` (NAME a backend serving a converted dir, e.g. openvino,
    onnxruntime) -> (spec without it, SUBDIR); else (spec, None)."""
    name, colon, prec = spec.partition(":")
    name, _, sub = name.partition("@")
    if sub and not _converts(name):
        from cosyvino.plugins import backend_classes

        owners = sorted(n for n, c in backend_classes().items()
                        if getattr(c, "convert_format", ""))
        raise click.BadParameter(f"only {' and '.join(owners) or 'converting backends'} take "
                                 f"'@SUBDIR' ({spec!r})")
    return name + colon + prec, (sub or None)


def _parse_spec(spec: str) -> tuple[str, dict]:
    """``torch`` | ``openvino`` | ``openvino:bf16`` | ``onnxruntime[:iobinding]`` ->
    (backend, options): the backend's ``option_presets`` (the ``""`` one for a bare name)."""
    name, _, preset = spec.partition(":")
    presets = getattr(_backend_class(name), "option_presets", None) or {}
    if not presets:
        if preset:
            raise click.BadParameter(f"backend {name!r} takes no ':precision' ({spec!r})")
        return name, {}
    if preset not in presets:
        raise click.BadParameter(f"unknown {name} preset {preset!r} in {spec!r}; use one of "
                                 f"{sorted(p for p in presets if p)}")
    return name, copy.deepcopy(presets[preset])


@click.command("bench")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model dir (default: the embedded default model, synthetic 300M).")
@click.option("--backends", default=None,
              help="Comma-separated [default: every installed backend, the reference backend "
                   "(torch) first]; openvino[:f32|u8kv|bf16|f16|vocbf16|served|default] picks "
                   "the inference precision (f32 = f32 compute and f32 KV cache; u8kv = f32 "
                   "compute, u8 KV cache; vocbf16 = f32 with the HiFT vocoder in bf16; served "
                   "= u8kv with HiFT and the estimator's non-int8 ops in bf16, what `cosyvino "
                   "plan` serves for an INT8 dir on a bf16 CPU; default = the CPU plugin's "
                   "choice); "
                   "openvino@SUBDIR[:PREC] loads "
                   "the IRs in MODEL_DIR/SUBDIR with that precision (e.g. "
                   "openvino@openvino-int8:default from `cosyvino quantize`); "
                   "onnxruntime[:iobinding] serves MODEL_DIR/onnx (iobinding: the "
                   "LLM decode loop through IO binding); plan = exactly what `cosyvino "
                   "plan` would serve on this machine (backend, model dir, precision, "
                   "threads, options; planned now, nothing written). A missing OpenVINO / "
                   "ONNX dir is converted once first.")
@click.option("--tokens", type=click.IntRange(min=2), default=250, show_default=True,
              help="Forced speech tokens per text (50 = 1 s of audio).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads per backend (default: backend default).")
@click.option("--json-out", default="bench-results.json", show_default=True,
              help="Where to write the full results.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option("--stream-runs", type=click.IntRange(min=0), default=3, show_default=True,
              help="Streamed runs per text and hop schedule (first-chunk p50/p95, streaming "
                   "RTF, underrun); 0 skips the streaming rows.")
@click.option("--prompt-wav", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Recording for the voice-cloning rows, looped or cut to 5 s (default: "
                   "examples/zero_shot_prompt.wav of a source checkout, else a speech-like "
                   "stand-in; the cost depends on the length only).")
@click.option("--prompt-runs", type=click.IntRange(min=0), default=3, show_default=True,
              help="Runs per voice-cloning row (models with prompt models); 0 skips them.")
@click.option("--ode-steps", default="", metavar="N,N,...",
              help="Also synthesize the first text with these CFM step counts "
                   "(n_timesteps, e.g. 5,3): total, RTF, estimator time and the log-mel "
                   "distance to the model's own step count, per backend.")
@click.option("--neighbour", is_flag=True,
              help="Run every backend twice: quiet, then with a busy-loop process pinned "
                   "to one CPU (a noisy neighbour), and print the slowdown.")
@_friendly_errors
def bench(model_dir, backends, tokens, threads, json_out, as_json, stream_runs, prompt_wav,
          prompt_runs, ode_steps, neighbour):
    """Benchmark backends side by side: per-stage ms, LLM ms/token, estimator ms/call,
    vocoder ms, RTF, first-segment latency, peak RSS, load time, LLM decode roofline; and,
    streamed, first-chunk latency p50/p95, streaming RTF and underrun per hop schedule; and,
    on a model with prompt models, a 5 s prompt's processing cost (intake, embedding, speech
    tokens, mel) and a zero-shot request with the prompt vs a registered voice.

    \b
    LLM roofline: bytes read per token (weights + mean KV cache, at each column's
      precision) / the best copy bandwidth (read + written) sampled during the run with
      the backends' thread count; "measured / roofline" is how far decoding is from it.
    Estimator G ops/s: 2 x multiply-adds per call / time per call, beside the peak of its
      precision (fp32 FMA, or int8 dot products for a static INT8 estimator) at the nominal
      clock: boost clocks run above it.
    A warning line says when other processes loaded the CPUs as the bench started."""
    from cosyvino.bench import TEXTS, markdown, roofline, run_backend_subprocess
    from cosyvino.bench_extras import (busy_neighbour, kernels_line, neighbour_markdown,
                                       ode_markdown)
    from cosyvino.defaults import ensure_default_model
    from cosyvino.families import detect_family

    model_dir = os.path.abspath(model_dir or ensure_default_model())
    steps = _parse_steps(ode_steps)
    busy = _busy_host_warning()
    if busy:
        click.echo(busy, err=True)
    specs = [s.strip() for s in (backends or default_backends()).split(",") if s.strip()]
    plan = _served_plan(model_dir) if "plan" in specs else None
    parsed = []
    for s in specs:
        if s == "plan":  # (label, backend, options, model dir, threads)
            opts = dict(plan.backend_options)
            parsed.append((s, plan.backend, opts, plan.model_dir, opts.pop("num_threads", None)))
            continue
        spec, sub = _split_subdir(s)
        parsed.append((s, *_parse_spec(spec), os.path.join(model_dir, sub) if sub else None,
                       threads))
    missing = {b: _ensure_converted(model_dir, b) for _, b, _, d, _ in parsed
               if _converts(b) and d is None}
    runs = [(label + suffix, row) for label, *row in parsed
            for suffix in (("", " +neighbour") if neighbour else ("",))]
    results = []
    for label, (backend, opts, run_dir, run_threads) in runs:
        if missing.get(backend):
            results.append({"backend": backend, "label": label, "error": missing[backend]})
            continue
        click.echo(f"bench: {label} ({len(TEXTS)} texts x {tokens} tokens) ...", err=True)
        t = time.perf_counter()
        with (busy_neighbour() if label.endswith(" +neighbour") else _nothing()):
            r = run_backend_subprocess(backend, run_dir or model_dir, tokens, run_threads, opts,
                                       stream_runs=stream_runs, prompt_wav=prompt_wav,
                                       prompt_runs=prompt_runs, ode_steps=steps)
        r["label"] = label
        results.append(r)
        click.echo(f"bench: {label} done in {time.perf_counter() - t:.0f} s"
                   + (f" (FAILED: {r['error'].splitlines()[-1]})" if "error" in r else ""),
                   err=True)
    roof = est = None
    if any("mean" in r for r in results):
        # the family's own sizes: its decode profile prices the roofline, its estimator the
        # G ops/s rows (no family's file or layer names here)
        family = detect_family(model_dir)
        config = family.read_config(model_dir)
        profile = family.decode_profile(config)
        if profile is not None:
            roof = roofline(config, results, tokens, profile=profile)
    from cosyvino.planner.topology import probe_topology

    probe = probe_topology()
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                                "amx_int8") if f in set(getattr(probe, "flags", ()) or ()))
    cpu = f"{probe.cpu_model or platform.machine()} ({isa or 'no AVX2'}), {os.cpu_count()} CPUs"
    if any("mean" in r for r in results):
        est = _estimator_peak(family, config, tokens, probe, results)
    head = [f"CPU: {cpu}"] + ([busy] if busy else [])
    if plan is not None:
        head.append(f"plan = {plan.backend} on {plan.model_dir}, options "
                    f"{json.dumps(plan.backend_options, sort_keys=True)}")
    kernels = kernels_line(results)
    if kernels:
        head.append(kernels)
    table = ("\n".join(head) + "\n\n" + markdown(results, roof, est) + ode_markdown(results)
             + neighbour_markdown(results))
    data = {"model_dir": model_dir, "tokens": tokens, "threads": threads,
            "texts": [t[2] for t in TEXTS], "cpu": cpu, "estimator": est,
            "plan": None if plan is None else {"backend": plan.backend,
                                               "model_dir": plan.model_dir,
                                               "backend_options": plan.backend_options},
            "cpu_count": os.cpu_count(), "results": results, "roofline": roof,
            "busy_host_warning": busy,
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
    """Make sure ``model_dir`` has what ``backend`` serves (its ``prepared_dir``), running
    `cosyvino convert --format FORMAT` (its ``convert_format``) once when it is missing.
    Returns None when it is there, else an error line for the table (the command then exits 1
    like for any failed backend)."""
    from cosyvino.bench import module_subprocess_env
    from cosyvino.cli.convert import DEFAULT_FORMAT, convert_command

    cls = _backend_class(backend)
    if cls.prepared_dir(model_dir) is not None:
        return None
    fmt = cls.convert_format
    args = [] if fmt == DEFAULT_FORMAT else ["--format", fmt]
    cmd = convert_command(fmt)
    click.echo(f"bench: no {backend} model for {model_dir}; running `{cmd}` once", err=True)
    # the child's stdout goes to our fd 2 (live progress): stdout carries the table / --json
    out = subprocess.run([sys.executable, "-m", "cosyvino.cli", "convert", *args,
                          "--model-dir", model_dir], stdout=2, env=module_subprocess_env())
    if out.returncode != 0:
        return (f"no converted model for {backend} in {model_dir} and `{cmd} --model-dir "
                f"{model_dir}` failed with status {out.returncode}")
    if cls.prepared_dir(model_dir) is None:
        return (f"`{cmd} --model-dir {model_dir}` left no {backend} model there")
    return None


@contextlib.contextmanager
def _nothing():
    yield


def _parse_steps(text: str) -> list[int]:
    """``"5,3"`` -> [5, 3]; BadParameter for anything but integers in the request's range."""
    from cosyvino.request import MAX_TIMESTEPS, MIN_TIMESTEPS

    steps = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or not MIN_TIMESTEPS <= int(part) <= MAX_TIMESTEPS:
            raise click.BadParameter(f"--ode-steps takes integers in [{MIN_TIMESTEPS}, "
                                     f"{MAX_TIMESTEPS}], got {part!r}")
        steps.append(int(part))
    return steps


def _served_plan(model_dir: str):
    """What `cosyvino plan` would serve for ``model_dir`` here (planned now, not written)."""
    from cosyvino.planner import make_plan, probe

    return make_plan(probe(model_dir=model_dir), model_dir=model_dir)


def _busy_host_warning() -> str | None:
    """A warning when other processes load the CPUs as the bench starts (the planner's
    :func:`cosyvino.planner.rules.host_busy`: the 1-minute load average and, where the probe
    sampled it, the load right now); checked before the first column, whose own load would
    count afterwards. None on a quiet host."""
    from cosyvino.planner.rules import host_busy
    from cosyvino.planner.topology import probe_topology

    p = probe_topology()
    if not host_busy(p):
        return None
    return (f"warning: load average {p.loadavg_1m:g} on {len(p.online_cpus)} online CPUs as "
            "the bench started: other processes are busy here, so every time and bandwidth "
            "sample below includes their load (compare columns of one run, not runs)")


def _estimator_peak(family, config, tokens: int, probe, results) -> dict | None:
    """FLOP of one estimator call at the bench's token count (the family's
    :meth:`~cosyvino.families.base.ModelFamily.estimator_cost`: its frames per token and its
    estimator; torch needed to count them) and, per backend column, the peak of the threads it
    ran with for its estimator's precision (:func:`cosyvino.bench_extras.estimator_peak`: int8
    dot products for a static INT8 estimator, the fp32 FMA peak otherwise). None when the
    family does not count it."""
    from cosyvino.bench_extras import cpu_clock_mhz, cpuinfo_field, estimator_peak

    cost = family.estimator_cost(config, tokens)
    if cost is None:
        return None
    frames, gflop = cost
    used = [r.get("threads") for r in results if "mean" in r]
    cores = max([t for t in used if t] or [os.cpu_count() or 1])
    flags, vendor = getattr(probe, "flags", ()), cpuinfo_field("vendor_id") or ""
    mhz = cpu_clock_mhz()
    peaks = {}
    for r in results:
        if "mean" in r:
            gops, label = estimator_peak(r.get("estimator_weights"), flags, vendor, mhz, cores)
            peaks[r["label"]] = {"gops": gops, "peak": label}
    return {"frames": frames, "gflop_per_call": gflop, "peaks": peaks}
