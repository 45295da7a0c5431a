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
@click.option("--model-dir", type=click.Path(file_okay=False, resolve_path=True), default=None,
              help="Model to plan for (default: the embedded default model dir); written to "
                   "the plan as an absolute path, so `serve --plan` works from any directory.")
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
              help="Forced speech tokens per tuning run (at the model's token rate: 50 = 1 s of "
                   "CosyVoice v1 audio, 2 s of CosyVoice2/3).")
@click.option("--emit", type=click.Choice(["k8s"]), default=None,
              help="Print Kubernetes manifests sized by the plan (ConfigMap, Deployment, "
                   "Service, PodDisruptionBudget, autoscaler; docs/deploy.md). Writes no "
                   "plan file (the ConfigMap holds the pod's plan).")
@click.option("--k8s-image", default="cosyvino:latest", show_default=True,
              help="--emit k8s: container image (deploy/Containerfile).")
@click.option("--k8s-name", default="cosyvino", show_default=True,
              help="--emit k8s: name of the objects (a DNS label).")
@click.option("--k8s-namespace", default=None, help="--emit k8s: namespace of the objects.")
@click.option("--k8s-replicas", type=click.IntRange(min=1), default=2, show_default=True,
              help="--emit k8s: minimum replicas (the fixed count with --k8s-autoscaler "
                   "none).")
@click.option("--k8s-max-replicas", type=click.IntRange(min=1), default=10, show_default=True,
              help="--emit k8s: most replicas the autoscaler may run.")
@click.option("--k8s-autoscaler", type=click.Choice(["keda", "hpa", "none"]), default="keda",
              show_default=True,
              help="--emit k8s: KEDA ScaledObject (Prometheus trigger) or HPA v2 on the Pods "
                   "metric (Prometheus adapter), both on cosyvino_capacity_utilization.")
@click.option("--k8s-target-utilization", type=click.FloatRange(min=0.05, max=4.0),
              default=0.8, show_default=True,
              help="--emit k8s: (running + queued) requests per session the autoscaler keeps "
                   "per pod on average.")
@click.option("--k8s-prometheus", default="http://prometheus-operated.monitoring.svc:9090",
              show_default=True, help="--emit k8s: Prometheus server KEDA queries.")
@click.option("--k8s-static-cpu", is_flag=True,
              help="--emit k8s: the nodes run the kubelet's static CPU manager (exclusive "
                   "cores): the plan may pin threads. Without it pinning is planned off.")
@click.option("--k8s-shutdown-delay", type=click.FloatRange(min=0), default=10.0,
              show_default=True,
              help="--emit k8s: seconds the preStop hook waits before SIGTERM (the pod leaves "
                   "the Service endpoints meanwhile).")
@click.option("--k8s-drain-timeout", type=click.FloatRange(min=0), default=60.0,
              show_default=True,
              help="--emit k8s: seconds running requests get after SIGTERM "
                   "(COSYVINO_DRAIN_TIMEOUT); the grace period is delay + drain + 5 s.")
@click.option("--k8s-model-dir", default="/models/cosyvino", show_default=True,
              help="--emit k8s: the model dir inside the image (the ConfigMap's plan "
                   "serves it).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--backend", default=None, help="Override: backend plugin.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Override: total CPU threads.")
@click.option("--streams", type=click.IntRange(min=1), default=None,
              help="Override: parallel OpenVINO streams.")
@click.option("--pinning/--no-pinning", default=None, help="Override: CPU pinning.")
@click.option("--sessions", type=click.IntRange(min=1), default=None,
              help="Override: max concurrent syntheses of the server.")
@click.option("--llm-batch", type=click.IntRange(min=1), default=None,
              help="Override: LLM decode rows of concurrent requests one batched step "
                   "advances per stream (1 = no batching).")
@click.option("--estimator-batch", type=click.IntRange(min=1), default=None,
              help="Override: concurrent requests whose equal-length flow estimator calls "
                   "run as one call (1 = no batching).")
@click.option("--queue", type=click.IntRange(min=0), default=None,
              help="Override: requests waiting before the server answers 503.")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default=None,
              help="Override: compute precision (OpenVINO).")
@click.option("--shared-host", is_flag=True,
              help="Other heavy processes share these CPUs: no pinning.")
@click.option("--memory-limit", default=None,
              help="Override the memory budget (e.g. 8Gi; G = 10^9 bytes, Gi = 2^30) instead of "
                   "the cgroup/RAM size.")
@_errors
def plan(model_dir, out, no_write, goal, tune, tune_seconds, tune_tokens, emit, k8s_image,
         k8s_name, k8s_namespace, k8s_replicas, k8s_max_replicas, k8s_autoscaler,
         k8s_target_utilization, k8s_prometheus, k8s_static_cpu, k8s_shutdown_delay,
         k8s_drain_timeout, k8s_model_dir, as_json, backend, threads, streams, pinning,
         sessions, llm_batch, estimator_batch, queue, precision, shared_host, memory_limit):
    """Probe this machine and write a deployment plan (threads, streams, backend, precision,
    sessions) that `cosyvino serve` and Synthesizer.auto() follow. See docs/planner.md."""
    from cosyvino.planner import make_plan, probe
    from cosyvino.planner.k8s import K8sOptions, emit_k8s
    from cosyvino.planner.report import format_plan

    k8s = None
    if emit == "k8s":
        k8s = K8sOptions(
            name=k8s_name, namespace=k8s_namespace, image=k8s_image, replicas=k8s_replicas,
            max_replicas=k8s_max_replicas, autoscaler=k8s_autoscaler,
            target_utilization=k8s_target_utilization, prometheus=k8s_prometheus,
            static_cpu=k8s_static_cpu, shutdown_delay=k8s_shutdown_delay,
            drain_timeout=k8s_drain_timeout, model_dir=k8s_model_dir).validated()
        if not k8s_static_cpu:
            # a pod without exclusive cores shares the node's CPUs with other pods (a CFS
            # quota, not cores): plan it as a shared host, i.e. without pinning
            shared_host = True
        # the manifests carry their own plan (ConfigMap); this machine's plan.toml, made for
        # serving here, is not replaced by the pod's
        no_write = True
    if model_dir is None:
        from cosyvino.defaults import default_model_dir
        model_dir = default_model_dir()
    overrides = dict(backend=backend, threads=threads, streams=streams, pinning=pinning,
                     sessions=sessions, queue=queue, precision=precision,
                     shared_host=shared_host, llm_batch=llm_batch,
                     estimator_batch=estimator_batch,
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
    if k8s is not None:
        click.echo(emit_k8s(result, k8s), nl=False)
    elif as_json:
        click.echo(result.to_json())
    else:
        click.echo(format_plan(result))
    if not no_write:
        click.echo(f"wrote {path}", err=emit is not None or as_json)
