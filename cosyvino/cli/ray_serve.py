"""The ``cosyvino ray-serve`` click command: the ``cosyvino serve`` API on Ray Serve replicas
sized by the plan (:mod:`cosyvino.ray_serve`, docs/ray-serve.md). Registered in
:mod:`cosyvino.cli`."""

from __future__ import annotations

import os
import signal
import sys
import threading

import click

from cosyvino.cli.plan_settings import EXPLICIT
from cosyvino.errors import CosyvinoError

#: options that become replica settings (``ServerConfig`` fields) when given explicitly
_SETTINGS = ("model_dir", "backend", "threads", "max_sessions", "queue_size", "request_timeout",
             "drain_timeout", "api_key", "public_voice_list", "voices_dir", "cache_dir",
             "cache_memory_mb")


@click.command("ray-serve")
@click.option("--plan", "plan_path", envvar="COSYVINO_PLAN", type=click.Path(dir_okay=False),
              default=None,
              help="Plan file from `cosyvino plan`: sizes ONE replica (backend, threads = "
                   "CPUs reserved per replica, sessions, queue). Default: ./plan.toml or "
                   "<model-dir>/plan.toml when one exists. Flags given explicitly override it.")
@click.option("--model-dir", envvar="COSYVINO_MODEL_DIR", type=click.Path(file_okay=False),
              default=None,
              help="Model directory; it must exist at this path on every node. Default: the "
                   "plan's.")
@click.option("--address", envvar="RAY_ADDRESS", default=None,
              help="Ray cluster to join (e.g. auto, ray://head:10001; env RAY_ADDRESS). "
                   "Default: start a local Ray instance.")
@click.option("--host", envvar="COSYVINO_HOST", default="127.0.0.1", show_default=True,
              help="Bind address of Ray's HTTP proxies (applies when this command starts "
                   "Serve; use 0.0.0.0 deliberately).")
@click.option("--port", envvar="COSYVINO_PORT", type=click.IntRange(1, 65535), default=8000,
              show_default=True)
@click.option("--replicas", envvar="COSYVINO_REPLICAS", type=click.IntRange(min=1), default=1,
              show_default=True,
              help="Replicas (with --max-replicas: the autoscaling minimum).")
@click.option("--max-replicas", envvar="COSYVINO_MAX_REPLICAS", type=click.IntRange(min=1),
              default=None,
              help="Autoscale up to this many replicas, aiming at max-sessions ongoing "
                   "requests per replica.")
@click.option("--num-cpus", envvar="COSYVINO_NUM_CPUS", type=click.FloatRange(min=0,
                                                                              min_open=True),
              default=None, help="CPUs Ray reserves per replica. Default: the threads.")
@click.option("--backend", envvar="COSYVINO_BACKEND", default="torch",
              help="Backend plugin. Default: from the plan, else torch.")
@click.option("--threads", envvar="COSYVINO_THREADS", type=click.IntRange(min=1), default=None,
              help="CPU threads per replica. Default: from the plan.")
@click.option("--max-sessions", envvar="COSYVINO_MAX_SESSIONS", type=click.IntRange(min=1),
              default=1, help="Concurrent syntheses per replica. Default: from the plan, "
                              "else 1.")
@click.option("--queue-size", envvar="COSYVINO_QUEUE_SIZE", type=click.IntRange(min=0),
              default=8, help="Requests that may wait in a replica. Default: from the plan, "
                              "else 8.")
@click.option("--timeout", "request_timeout", envvar="COSYVINO_TIMEOUT",
              type=click.FloatRange(min=0.1), default=120.0, show_default=True,
              help="Per-request limit in seconds (as `cosyvino serve`).")
@click.option("--drain-timeout", envvar="COSYVINO_DRAIN_TIMEOUT",
              type=click.FloatRange(min=0), default=None,
              help="Seconds a stopping replica gives its requests. Default: --timeout.")
@click.option("--api-key", envvar="COSYVINO_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (env COSYVINO_API_KEY).")
@click.option("--public-voice-list/--no-public-voice-list", envvar="COSYVINO_PUBLIC_VOICE_LIST",
              default=False,
              help="Answer GET /v1/audio/voices (ids and names only) and GET /v1/audio/models "
                   "without the API key (as `cosyvino serve`). Default: off.")
@click.option("--voices-dir", envvar="COSYVINO_VOICES_DIR", type=click.Path(file_okay=False),
              default=None,
              help="Registered voices (a directory every node sees, e.g. a shared file "
                   "system, so a voice added through one replica is seen by all).")
@click.option("--cache-dir", envvar="COSYVINO_CACHE_DIR", type=click.Path(file_okay=False),
              default=None, help="On-disk result cache per node (default: memory only).")
@click.option("--cache-memory-mb", envvar="COSYVINO_CACHE_MEMORY_MB",
              type=click.FloatRange(min=0), default=64.0, show_default=True,
              help="In-memory result cache per replica (0: off).")
@click.option("--detach", is_flag=True,
              help="Deploy and return; the application keeps running on the cluster "
                   "(`serve shutdown` or `serve status` manage it).")
@click.pass_context
def ray_serve(ctx, plan_path, model_dir, address, host, port, replicas, max_replicas,
              num_cpus, backend, threads, max_sessions, queue_size, request_timeout,
              drain_timeout, api_key, public_voice_list, voices_dir, cache_dir,
              cache_memory_mb, detach):
    """Serve the cosyvino HTTP API on Ray Serve replicas (one model per replica).

    See docs/ray-serve.md.
    """
    try:
        import ray
        from ray import serve

        from cosyvino.ray_serve import APP_NAME, build_app
        from cosyvino.server.config import find_plan
    except ImportError as e:
        click.echo(f"error: Ray Serve is not installed ({e.name}): pip install "
                   "'cosyvino[ray]'", err=True)
        sys.exit(2)
    given = {name: value for name, value in ctx.params.items()
             if name in _SETTINGS and ctx.get_parameter_source(name) in EXPLICIT}
    if plan_path is None:
        plan_path = find_plan(model_dir)
    if plan_path is None:  # no plan: the flags' values (their defaults included)
        given = {"backend": backend, "max_sessions": max_sessions, "queue_size": queue_size,
                 "cache_memory_mb": cache_memory_mb, **given}
    try:
        app = build_app(plan_path, num_replicas=replicas, max_replicas=max_replicas,
                        num_cpus=num_cpus, **given)
    except CosyvinoError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    ray.init(address=address, log_to_driver=False)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/")
    except RuntimeError as e:  # Serve's deploy failure (a replica that cannot start)
        click.echo(f"error: the application failed to deploy: {e}", err=True)
        ray.shutdown()
        sys.exit(1)
    click.echo(f"cosyvino ray-serve: application {APP_NAME!r} ready at http://{host}:{port}/ "
               f"({'plan ' + os.path.abspath(plan_path) if plan_path else 'flags'}; "
               f"{replicas}{'-' + str(max_replicas) if max_replicas else ''} replica(s))",
               err=True)
    if detach:
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    click.echo("cosyvino ray-serve: stopping (replicas drain their requests)", err=True)
    serve.delete(APP_NAME)
    ray.shutdown()
