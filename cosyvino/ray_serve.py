"""Ray Serve deployment of cosyvino: the HTTP API of ``cosyvino serve`` on several replicas,
on one machine or on a Ray cluster (docs/ray-serve.md).

Each replica is one ``cosyvino serve`` app without its uvicorn: it loads the model once
(:class:`cosyvino.Synthesizer`), runs :func:`cosyvino.server.routes.create_app` on it (the same
routes, request models, encoders, errors, admission pool, cache and metrics as one server) and
adds the header ``x-cosyvino-replica`` (the Serve replica id) to every response. Ray's HTTP
proxy spreads requests over the replicas; a Serve handle reaches the same code through
:meth:`CosyvinoDeployment.synthesize` (``-> bytes``).

The plan (``cosyvino plan``) sizes one replica:

* backend, backend options and CPU threads (``backend_options["num_threads"]``) as in
  ``cosyvino serve --plan``; ``ray_actor_options["num_cpus"]`` = those threads, so Ray places
  replicas where that many CPUs are free;
* ``max_sessions`` / ``queue_size`` -> the replica's pool, and Serve's
  ``max_ongoing_requests`` = their sum (Ray never sends a replica more than its pool admits);
* CPU pinning is turned off: Ray places replicas by CPU count, not by core set, so two
  replicas on one node would pin the same cores.

Replicas: a fixed ``num_replicas``, or Serve autoscaling between ``num_replicas`` and
``max_replicas`` aiming at ``max_sessions`` ongoing requests per replica (the capacity
``cosyvino_capacity_utilization`` = 1 of one server).

Entry points: :func:`build_app` (Python: ``serve.run(build_app(...))``), :func:`app_builder`
(``serve run cosyvino.ray_serve:app_builder plan=plan.toml num_replicas=2``) and
``cosyvino ray-serve`` (:mod:`cosyvino.cli.ray_serve`). Imports ``ray``; nothing in the core
imports this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from contextlib import asynccontextmanager

from ray import serve

from .errors import CosyvinoError, InputError
from .server.config import ServerConfig

log = logging.getLogger("cosyvino.ray_serve")

#: Serve deployment name (``serve status``; replica actors are ``SERVE_REPLICA::APP#cosyvino#ID``)
DEPLOYMENT_NAME = "cosyvino"
#: Serve application name :func:`build_app` users normally run it under
APP_NAME = "cosyvino"
#: response header naming the replica that answered (its Serve replica id)
REPLICA_HEADER = "x-cosyvino-replica"
#: seconds a replica waits, after loading, for its scheduler and warm-up before it fails
READY_TIMEOUT_S = 600.0


class SpeechError(CosyvinoError):
    """A handle call (:meth:`CosyvinoDeployment.synthesize`) that the API refused: the HTTP
    error of the same request.

    Attributes:
        status: HTTP status (400 bad request, 503 busy / not ready, 500 synthesis failure).
        code: the API's error code (``invalid_value``, ``unknown_voice``, ``server_busy``...)
            or None.
        param: the request field at fault, or None.
    """

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param

    def __reduce__(self):  # crosses process boundaries (Ray pickles it back to the caller)
        return (type(self), (self.status, str(self), self.code, self.param))


# ---- plan -> replica settings ----------------------------------------------------------------
def replica_config(plan=None, **settings) -> ServerConfig:
    """The :class:`~cosyvino.server.config.ServerConfig` of one replica.

    Args:
        plan: a :class:`cosyvino.planner.Plan`, a plan file path, or None (settings only).
        **settings: ``ServerConfig`` fields (``model_dir``, ``backend``, ``threads``,
            ``max_sessions``, ``queue_size``, ``request_timeout``, ``cache_dir``,
            ``cache_memory_mb``, ``voices_dir``, ``api_key``...); each one given overrides the
            plan. ``backend`` given without ``backend_options`` drops the plan's backend
            options (they belong to the plan's backend), as ``cosyvino serve`` does.

    Returns a validated config; ``cpu_pinning`` in the backend options is set to False.

    Raises:
        PlanError: unreadable plan file. InputError: an unknown setting or a bad value.
    """
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(ServerConfig)})
    if unknown:
        raise InputError(f"unknown replica setting(s): {', '.join(unknown)}")
    values: dict = {}
    plan = _load_plan(plan)
    if plan is not None:
        options = dict(plan.backend_options)
        threads = options.pop("num_threads", None) or plan.total_threads
        values = {"backend": plan.backend, "threads": int(threads),
                  "max_sessions": int(plan.max_sessions), "queue_size": int(plan.queue_size),
                  "backend_options": options, "source": f"plan {plan.path or '(object)'}"}
        if plan.model_dir:
            values["model_dir"] = plan.model_dir
        if "backend" in settings and "backend_options" not in settings \
                and settings["backend"] != plan.backend:
            values["backend_options"] = {}
    values.update(settings)
    options = dict(values.get("backend_options") or {})
    if "cpu_pinning" in options:  # Ray places replicas by CPU count, never by core set
        options["cpu_pinning"] = False
    values["backend_options"] = options
    return ServerConfig(**values).validate()


def _load_plan(plan):
    if plan is None:
        return None
    if isinstance(plan, (str, os.PathLike)):
        from .planner import load_plan

        return load_plan(os.fspath(plan))
    return plan


def deployment_options(config: ServerConfig, *, num_replicas: int = 1,
                       max_replicas: int | None = None, num_cpus: float | None = None) -> dict:
    """Serve ``Deployment.options`` for replicas of ``config``.

    Args:
        num_replicas: replicas (>= 1); with ``max_replicas``, the autoscaling minimum.
        max_replicas: None: a fixed ``num_replicas``; else Serve autoscales up to it, aiming at
            ``config.max_sessions`` ongoing requests per replica.
        num_cpus: CPUs Ray reserves per replica (None: ``config.threads``, else 1).

    Raises:
        InputError: bad counts.
    """
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise InputError(f"num_replicas must be a positive integer, got {num_replicas!r}")
    if max_replicas is not None and (isinstance(max_replicas, bool)
                                     or not isinstance(max_replicas, int)
                                     or max_replicas < num_replicas):
        raise InputError(f"max_replicas must be an integer >= num_replicas ({num_replicas}), "
                         f"got {max_replicas!r}")
    cpus = float(num_cpus if num_cpus is not None else (config.threads or 1))
    if not cpus > 0:
        raise InputError(f"num_cpus must be > 0, got {num_cpus!r}")
    opts = {
        "ray_actor_options": {"num_cpus": cpus},
        # the replica's pool admits max_sessions running + queue_size waiting (its 503 beyond)
        "max_ongoing_requests": config.max_sessions + config.queue_size,
        # admitted requests get the server's drain time when a replica is stopped
        "graceful_shutdown_timeout_s": float(config.drain_seconds),
    }
    if max_replicas is None:
        opts["num_replicas"] = num_replicas
    else:
        opts["autoscaling_config"] = {"min_replicas": num_replicas,
                                      "max_replicas": max_replicas,
                                      "target_ongoing_requests": config.max_sessions}
    return opts


# ---- the deployment --------------------------------------------------------------------------
class _ReplicaHeader:
    """ASGI middleware: adds ``x-cosyvino-replica: ID`` to every HTTP response."""

    def __init__(self, app, replica: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def _load_synthesizers(config: ServerConfig) -> list:
    """The replica's model, loaded as ``cosyvino serve`` loads it
    (:func:`cosyvino.server.pool.load_synthesizers`)."""
    from .server.pool import load_synthesizers

    if not config.model_dir:
        raise InputError("a Ray replica needs a model dir (the plan's, or model_dir=...): "
                         "it must exist at that path on every node")
    return load_synthesizers(config, config.model_dir)


def _wait_until_ready(app, state) -> None:
    """Make the app's lifespan startup end only when the pool is ready (scheduler started,
    warm-up done), so Serve routes no request to a replica that would answer 503
    ``not_ready``; a failure there fails the replica."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        async with inner(a) as value:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not state.pool.ready.is_set():
                if state.pool.load_error is not None:
                    raise state.pool.load_error
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replica not ready after {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(0.02)
            yield value

    app.router.lifespan_context = lifespan


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress()
class CosyvinoDeployment:
    """One replica: the ``cosyvino serve`` HTTP API on a model loaded in this Ray actor.

    Args:
        config: the replica's settings (:func:`replica_config`).
        plan: the :class:`cosyvino.planner.Plan` they came from, or None; each replica checks
            it against its own node (:meth:`~cosyvino.planner.Plan.check_machine`) and logs
            the differences.

    Raises (replica start; Serve retries, then marks the deployment failed):
        ModelDirError / ConfigError / CheckpointError / BackendError: as
        :class:`cosyvino.Synthesizer`.
    """

    def __init__(self, config: ServerConfig, plan=None):
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        if plan is not None:
            for warning in plan.check_machine():
                log.warning("plan %s on this node: %s", plan.path or "", warning)
        start = time.perf_counter()
        self._config = config
        self._synths = _load_synthesizers(config)
        self._state = None
        log.info("replica %s: %s on %s loaded in %.1f s (%d session(s), %s threads)",
                 self.replica_id, config.model_dir, config.backend,
                 time.perf_counter() - start, config.max_sessions, config.threads or "default")

    def __serve_build_asgi_app__(self):
        from .server.routes import create_app

        app = create_app(self._config, self._synths)
        self._state = app.state.cosyvino
        _wait_until_ready(app, self._state)
        app.add_middleware(_ReplicaHeader, replica=self.replica_id)
        return app

    def check_health(self) -> None:
        """Serve's periodic health check: fails when the model failed to load (or warm up),
        so Serve replaces the replica."""
        state = self._state
        if state is not None and state.pool.load_error is not None:
            raise RuntimeError(f"model failed to load: {state.pool.load_error}")

    async def synthesize(self, text: str, voice: str | None = None, **options) -> bytes:
        """The handle API: the bytes ``POST /v1/audio/speech`` answers for ``{"input": text,
        "voice": voice, **options}`` (OpenAI fields: ``response_format`` (default ``mp3``),
        ``speed``, ``seed``, ``instructions``, ``hop_schedule``), run through this replica's
        own app (same validation, admission, cache and encoders, so the same bytes).

        Raises:
            SpeechError: the API refused the request (its status, code, param and message).
        """
        import httpx

        body = {"input": text, **({} if voice is None else {"voice": voice}), **options}
        headers = ({"authorization": f"Bearer {self._config.api_key}"}
                   if self._config.api_key else {})
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            response = await client.post("/v1/audio/speech", json=body, headers=headers,
                                         timeout=self._config.request_timeout + 5)
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                err = {"message": response.text}
            raise SpeechError(response.status_code, str(err.get("message")),
                              err.get("code"), err.get("param"))
        return response.content


def build_app(plan=None, *, num_replicas: int = 1, max_replicas: int | None = None,
              num_cpus: float | None = None, ray_options: dict | None = None, **settings):
    """The Serve application (``serve.run(build_app(...), name=APP_NAME, route_prefix="/")``).

    Args:
        plan / **settings: as :func:`replica_config` (the model dir must exist at the same
            path on every node that runs a replica).
        num_replicas / max_replicas / num_cpus: as :func:`deployment_options`.
        ray_options: more ``Deployment.options`` (e.g. ``health_check_period_s``,
            ``max_queued_requests``), applied last.

    Raises:
        PlanError, InputError: as :func:`replica_config` / :func:`deployment_options`.
    """
    plan = _load_plan(plan)
    config = replica_config(plan, **settings)
    options = deployment_options(config, num_replicas=num_replicas, max_replicas=max_replicas,
                                 num_cpus=num_cpus)
    options.update(ray_options or {})
    return CosyvinoDeployment.options(**options).bind(config, plan)


def app_builder(args: dict):
    """``serve run cosyvino.ray_serve:app_builder plan=plan.toml num_replicas=2 ...``: the
    arguments are :func:`build_app`'s, as strings (``num_replicas``, ``max_replicas``,
    ``threads``, ``max_sessions``, ``queue_size``: integers; ``num_cpus``,
    ``request_timeout``, ``cache_memory_mb``: numbers).

    Raises:
        InputError: a value that is not a number where one is needed; as :func:`build_app`.
    """
    kinds = {"num_replicas": int, "max_replicas": int, "threads": int, "max_sessions": int,
             "queue_size": int, "num_cpus": float, "request_timeout": float,
             "drain_timeout": float, "cache_memory_mb": float, "cache_disk_mb": float}
    kwargs = dict(args)
    for key, kind in kinds.items():
        if key in kwargs and isinstance(kwargs[key], str):
            try:
                kwargs[key] = kind(kwargs[key])
            except ValueError:
                raise InputError(f"{key} must be {'an integer' if kind is int else 'a number'}"
                                 f", got {kwargs[key]!r}") from None
    return build_app(kwargs.pop("plan", None), **kwargs)


__all__ = ["APP_NAME", "CosyvinoDeployment", "DEPLOYMENT_NAME", "REPLICA_HEADER", "SpeechError",
           "app_builder", "build_app", "deployment_options", "replica_config"]
