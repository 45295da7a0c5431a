"""``cosyvino plan``: probe this machine, decide, print the table, write the plan file.

Registered on the main ``cosyvino`` group in :mod:`cosyvino.cli` with one ``add_command`` line.
"""

from __future__ import annotations

import os
import re

import click

from cosyvino.cli.errors import friendly_errors
from cosyvino.planner.rules import GOALS


_errors = friendly_errors


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bytes(text: str) -> int:
    """``"4Gi"``, ``"512M"``, ``"2000000000"`` -> bytes (Kubernetes-style suffixes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", text or "")
    if not m:
        raise click.BadParameter(f"not a memory size: {text!r} (e.g. 4Gi, 512Mi, 2G)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


@click.command("plan")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model to plan for (default: the embedded default model dir).")
@click.option("--out", default="plan.toml", show_default=True,
              help="Plan file to write (TOML; .json writes JSON).")
@click.option("--no-write", is_flag=True, help="Print only; do not write the plan file.")
@click.option("--goal", type=click.Choice(GOALS), default="latency", show_default=True,
              help="latency: fastest single request; throughput: most requests/s.")
@click.option("--tune", is_flag=True, help="Measure 2-6 candidate configs on the real model "
                                           "and keep the best (takes up to --tune-seconds).")
@click.option("--tune-seconds", type=click.FloatRange(min=5), default=120.0,
              show_default=True, help="Time budget of --tune.")
@click.option("--tune-tokens", type=click.IntRange(min=5), default=50, show_default=True,
              help="Forced speech tokens per tuning run (50 = 1 s of audio).")
@click.option("--emit", type=click.Choice(["k8s"]), default=None,
              help="Print Kubernetes container resources/env matching the plan.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--backend", default=None, help="Override: backend plugin.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Override: total CPU threads.")
@click.option("--streams", type=click.IntRange(min=1), default=None,
              help="Override: parallel OpenVINO streams.")
@click.option("--pinning/--no-pinning", default=None, help="Override: CPU pinning.")
@click.option("--sessions", type=click.IntRange(min=1), default=None,
              help="Override: max concurrent syntheses of the server.")
@click.option("--queue", type=click.IntRange(min=0), default=None,
              help="Override: requests waiting before the server answers 503.")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default=None,
              help="Override: compute precision (OpenVINO).")
@click.option("--shared-host", is_flag=True,
              help="Other heavy processes share these CPUs: no pinning.")
@click.option("--memory-limit", default=None,
              help="Override the memory budget (e.g. 8Gi) instead of the cgroup/RAM size.")
@_errors
def plan(model_dir, out, no_write, goal, tune, tune_seconds, tune_tokens, emit, as_json,
         backend, threads, streams, pinning, sessions, queue, precision, shared_host,
         memory_limit):
    """Probe this machine and write a deployment plan (threads, streams, backend, precision,
    sessions) that `cosyvino serve` and Synthesizer.auto() follow. See docs/planner.md."""
    from cosyvino.planner import make_plan, probe
    from cosyvino.planner.report import emit_k8s, format_plan

    if model_dir is None:
        from cosyvino.defaults import default_model_dir
        model_dir = default_model_dir()
    overrides = dict(backend=backend, threads=threads, streams=streams, pinning=pinning,
                     sessions=sessions, queue=queue, precision=precision,
                     shared_host=shared_host,
                     memory_limit=parse_bytes(memory_limit) if memory_limit else None)
    p = probe(model_dir=model_dir)
    result = make_plan(p, model_dir=model_dir, goal=goal, **overrides)
    if tune:
        from cosyvino.planner.tune import apply_tuning
        from cosyvino.planner.tune import tune as run_tune

        if not p.model.get("exists") and not p.model.get("converted_dir"):
            from cosyvino.defaults import ensure_default_model
            ensure_default_model(model_dir)
        from cosyvino.synthesizer import Synthesizer

        tuning = run_tune(result, p, model_dir, synthesizer=Synthesizer, seconds=tune_seconds,
                          tokens=tune_tokens, say=lambda m: click.echo(m, err=True))
        result = apply_tuning(result, p, model_dir, tuning,
                              **{k: v for k, v in overrides.items() if v is not None})
    if not no_write:
        path = out
        if out.endswith(".json"):
            with open(out, "w", encoding="utf-8") as f:
                f.write(result.to_json() + "\n")
            result.path = os.path.abspath(out)
        else:
            path = result.save(out)
    if emit == "k8s":
        click.echo(emit_k8s(result), nl=False)
    elif as_json:
        click.echo(result.to_json())
    else:
        click.echo(format_plan(result))
    if not no_write:
        click.echo(f"wrote {path}", err=emit is not None or as_json)
