"""Server settings, and the only coupling to the planner (issue 5): :func:`find_plan` and
:func:`settings_from_plan`. Both work with or without ``cosyvino.planner`` installed."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field

from ..errors import InputError

log = logging.getLogger("cosyvino.server")

MAX_INPUT_CHARS = 4096


@dataclass
class ServerConfig:
    """Everything ``create_app`` needs. CLI flags and a plan file fill it in."""

    model_dir: str | None = None
    backend: str = "torch"
    threads: int | None = None
    #: concurrent synthesis sessions (worker threads; each request has its own LLM session)
    max_sessions: int = 1
    #: requests allowed to wait for a session; one more gets 503 + Retry-After
    queue_size: int = 8
    #: most LLM decode steps of concurrent requests in one backend call (1 = no batching;
    #: :class:`cosyvino.engine.Scheduler` ``llm_batch``)
    llm_batch: int = 1
    #: most concurrent requests whose equal-shape CFM estimator calls run as one backend call
    #: (1 = none; ``Synthesizer(estimator_batch=)``; needs ``max_sessions`` >= 2)
    estimator_batch: int = 1
    #: seconds from arrival to the last byte (queue wait included); then the work is cancelled
    request_timeout: float = 120.0
    api_key: str | None = None
    #: ask for the API key on /metrics too (default: open, like /health and /ready)
    metrics_auth: bool = False
    #: answer ``GET /v1/audio/voices`` (ids and names only) and ``GET /v1/audio/models``
    #: without the API key: Open WebUI fetches both without one (docs/server.md, "Open
    #: WebUI"); everything else still needs the key
    public_voice_list: bool = False
    #: seconds after SIGTERM for admitted requests to finish (None = ``request_timeout``: none
    #: can run longer); then what is left is cancelled and the process exits
    drain_timeout: float | None = None
    #: on-disk cache directory (None = memory only); ``cache_memory_mb`` 0 and no dir = off
    cache_dir: str | None = None
    cache_memory_mb: float = 64.0
    cache_disk_mb: float = 1024.0
    max_body_bytes: int = 1 << 20
    #: body limit of the endpoints that take recordings (``/inference_zero_shot``,
    #: ``_cross_lingual``, ``_vc``, ``POST /v1/audio/voices``): 32 MiB holds two 30 s
    #: recordings (the prompt limit, :data:`cosyvino.prompt_audio.MAX_SECONDS`) as 48 kHz
    #: stereo float WAV (11.5 MB each); every other endpoint keeps ``max_body_bytes``
    max_upload_bytes: int = 32 << 20
    #: where registered voices are kept (None: ``<model_dir>/voices``, the library default)
    voices_dir: str | None = None
    #: force this many speech tokens per segment (benchmarks, tests); None = model decides
    num_speech_tokens: int | None = None
    #: warm-up synthesis before /ready turns true
    warmup: bool = True
    #: seconds between SIGTERM and the drain: /ready is 503 at once, but the listener keeps
    #: serving new requests meanwhile (load balancers / Kubernetes endpoints catch up)
    shutdown_delay: float = 0.0
    #: ``text`` or ``json`` (one object per line; :mod:`cosyvino.server.logs`)
    log_format: str = "text"
    #: origins allowed by CORS (``*`` = any); empty = no CORS headers at all (the default)
    cors_origins: tuple[str, ...] = ()
    #: voice aliases over the defaults (:mod:`cosyvino.server.aliases`): name -> voice
    voice_aliases: dict = field(default_factory=dict)
    backend_options: dict = field(default_factory=dict)
    #: where these settings came from (for logs and /ready)
    source: str = "flags"

    def validate(self) -> "ServerConfig":
        if self.max_sessions < 1:
            raise InputError(f"max sessions must be >= 1, got {self.max_sessions}")
        if isinstance(self.llm_batch, bool) or not isinstance(self.llm_batch, int) or \
                self.llm_batch < 1:
            raise InputError(f"llm batch must be an integer >= 1, got {self.llm_batch!r}")
        if isinstance(self.estimator_batch, bool) or not isinstance(self.estimator_batch, int) \
                or self.estimator_batch < 1:
            raise InputError(f"estimator batch must be an integer >= 1, got "
                             f"{self.estimator_batch!r}")
        if self.queue_size < 0:
            raise InputError(f"queue size must be >= 0, got {self.queue_size}")
        if not self.request_timeout > 0:
            raise InputError(f"request timeout must be > 0, got {self.request_timeout}")
        if self.drain_timeout is not None and not self.drain_timeout >= 0:
            raise InputError(f"drain timeout must be >= 0, got {self.drain_timeout}")
        if not self.shutdown_delay >= 0:
            raise InputError(f"shutdown delay must be >= 0, got {self.shutdown_delay}")
        if self.log_format not in ("text", "json"):
            raise InputError(f"log format must be text or json, got {self.log_format!r}")
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise InputError(f"CORS origin {origin!r} must be '*' or start with http:// "
                                 "or https:// (e.g. https://chat.example.com)")
        if self.max_upload_bytes < self.max_body_bytes:
            raise InputError(f"max upload bytes ({self.max_upload_bytes}) must be at least the "
                             f"body limit ({self.max_body_bytes})")
        if self.metrics_auth and not self.api_key:
            raise InputError("protecting /metrics needs an API key (--api-key or "
                             "COSYVINO_API_KEY)")
        return self

    @property
    def drain_seconds(self) -> float:
        """How long a SIGTERM drain may take at most (``drain_timeout``, else the request
        timeout)."""
        return self.request_timeout if self.drain_timeout is None else self.drain_timeout


#: plan keys we understand (first match wins), searched at the top level and in the tables
#: ``serve``/``server``/``runtime``/``backend`` of the plan
_PLAN_KEYS = {
    "model_dir": ("model_dir",),
    "backend": ("backend", "backend_name"),
    "threads": ("threads", "num_threads"),
    "max_sessions": ("max_sessions", "max_concurrent_sessions", "sessions", "workers"),
    "queue_size": ("queue_size", "queue", "queue_length", "max_queue"),
    "llm_batch": ("llm_batch",),
    "estimator_batch": ("estimator_batch",),
}


def _lookup(plan: dict, names) -> object:
    tables = [plan] + [plan[t] for t in ("serve", "server", "runtime", "backend")
                       if isinstance(plan.get(t), dict)]
    for table in tables:
        for name in names:
            if name in table and not isinstance(table[name], dict):
                return table[name]
    return None


def find_plan(model_dir: str | None = None) -> str | None:
    """The plan file ``serve`` uses when ``--plan`` is not given: the planner's own search
    (``$COSYVINO_PLAN``, ``./plan.toml``, ``<model_dir>/plan.toml``) when it is installed,
    else ``./plan.toml`` if it exists."""
    try:
        from ..planner import find_plan_file  # type: ignore[import-not-found]
    except ImportError:
        return "plan.toml" if os.path.isfile("plan.toml") else None
    found = find_plan_file(model_dir)
    return found if found and os.path.isfile(found) else None


def settings_from_plan(path: str) -> dict:
    """The coupling to the planner (issue 5), in one function: plan file -> config overrides.

    Uses ``cosyvino.planner.load_plan(path)`` when the planner is installed (it validates the
    plan and warns when the machine no longer matches); otherwise reads the TOML/JSON file
    directly. Either way the result is mapped through :data:`_PLAN_KEYS` to ``model_dir``,
    ``backend``, ``threads``, ``max_sessions``, ``queue_size``, ``llm_batch``,
    ``estimator_batch`` and
    ``backend_options`` (the
    plan's ``[backend_options]`` less ``num_threads``, which becomes ``threads``); keys the plan
    lacks are left to the flags.
    """
    if not os.path.isfile(path):
        raise InputError(f"plan file {path!r} not found; run `cosyvino plan --out {path}`")
    try:
        from ..planner import load_plan  # type: ignore[import-not-found]
    except ImportError:
        load_plan = None
    if load_plan is not None:
        plan = load_plan(path)
        if hasattr(plan, "check_machine"):
            for warning in plan.check_machine():
                log.warning("plan %s: %s", path, warning)
        # what the plan said about the served model's accuracy is said again where it is
        # served (a trial user saw it only in `cosyvino plan`'s output)
        for warning in getattr(plan, "warnings", None) or []:
            if "accuracy" in str(warning):
                log.warning("plan %s: %s", path, warning)
        if hasattr(plan, "to_dict"):
            plan = plan.to_dict()
        elif dataclasses.is_dataclass(plan):
            plan = dataclasses.asdict(plan)
        elif not isinstance(plan, dict):
            plan = (plan.to_dict() if hasattr(plan, "to_dict")
                    else {k: v for k, v in vars(plan).items() if not k.startswith("_")})
    else:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            if path.endswith(".json"):
                import json

                plan = json.loads(raw)
            else:
                try:
                    import tomllib
                except ImportError:  # Python 3.10
                    import tomli as tomllib

                plan = tomllib.loads(raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - any parse error is a bad plan file
            raise InputError(f"cannot read plan file {path!r}: {e}") from None
    out = {}
    for key, names in _PLAN_KEYS.items():
        value = _lookup(plan, names)
        if value is None:
            continue
        try:
            out[key] = str(value) if key in ("backend", "model_dir") else int(value)
        except (TypeError, ValueError):
            raise InputError(f"plan file {path!r}: {key} = {value!r} is not valid") from None
    opts = plan.get("backend_options")
    if isinstance(opts, dict):
        opts = dict(opts)
        threads = opts.pop("num_threads", None)  # our ``threads``, not a backend option
        if threads is not None and "threads" not in out:
            out["threads"] = int(threads)
        if opts:
            out["backend_options"] = opts
    return out
