"""The ``cosyvino serve`` click command (registered in :mod:`cosyvino.cli`)."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys

import click

from cosyvino.errors import CosyvinoError

def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cosyvino", "results")


def _split_list(values) -> tuple[str, ...]:
    """A repeatable option's values, each also split at commas (how its environment variable
    lists several: ``a,b``); empty items dropped."""
    return tuple(item.strip() for value in values or () for item in value.split(",")
                 if item.strip())


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--plan", "plan_path", envvar="COSYVINO_PLAN",
              type=click.Path(dir_okay=False), default=None,
              help="Plan file from `cosyvino plan` (default: $COSYVINO_PLAN, ./plan.toml or "
                   "<model-dir>/plan.toml when one exists). Flags given explicitly override "
                   "it.")
@click.option("--model-dir", envvar="COSYVINO_MODEL_DIR",
              type=click.Path(file_okay=False), default=None,
              help="Model directory. Default: from the plan, else the embedded default "
                   "model.")
@click.option("--host", envvar="COSYVINO_HOST", default="127.0.0.1", show_default=True,
              help="Bind address (loopback by default; use 0.0.0.0 deliberately).")
@click.option("--port", envvar="COSYVINO_PORT",
              type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="COSYVINO_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (env COSYVINO_API_KEY).")
@click.option("--metrics-auth/--no-metrics-auth", envvar="COSYVINO_METRICS_AUTH",
              default=False,
              help="Require the API key on /metrics too (env COSYVINO_METRICS_AUTH=1; needs "
                   "--api-key). Default: /metrics, /health and /ready are open.")
@click.option("--public-voice-list/--no-public-voice-list", envvar="COSYVINO_PUBLIC_VOICE_LIST",
              default=False,
              help="Answer GET /v1/audio/voices (ids and names only) and GET /v1/audio/models "
                   "without the API key: Open WebUI fetches both without one and otherwise "
                   "falls back to OpenAI's voice names (env COSYVINO_PUBLIC_VOICE_LIST=1). "
                   "Default: off; speech and voice changes always need the key.")
@click.option("--backend", envvar="COSYVINO_BACKEND", default="torch",
              help="Backend plugin. Default: from the plan, else torch.")
@click.option("--threads", envvar="COSYVINO_THREADS", type=click.IntRange(min=1), default=None,
              help="CPU threads of the backend (torch: for the whole process, shared by all "
                   "sessions; a backend that loads one model for each session: for each "
                   "model). Default: from the plan, else the backend's default.")
@click.option("--max-sessions", envvar="COSYVINO_MAX_SESSIONS",
              type=click.IntRange(min=1), default=1,
              help="Concurrent synthesis sessions. Default: from the plan, else 1.")
@click.option("--llm-batch", envvar="COSYVINO_LLM_BATCH", type=click.IntRange(min=1),
              default=1,
              help="Most LLM decode steps of concurrent requests one backend call runs "
                   "(continuous batching; needs --max-sessions >= 2; capped by the "
                   "backend). 1 = off. Default: from the plan, else 1.")
@click.option("--estimator-batch", envvar="COSYVINO_ESTIMATOR_BATCH",
              type=click.IntRange(min=1), default=1,
              help="Most concurrent requests whose flow estimator calls of equal length one "
                   "backend call runs (needs --max-sessions >= 2; capped by the backend). "
                   "1 = off. Default: from the plan, else 1.")
@click.option("--first-chunk-hold/--no-first-chunk-hold", envvar="COSYVINO_FIRST_CHUNK_HOLD",
              default=None,
              help="While a new request makes its first chunk, the steps of requests that "
                   "already stream wait (at most 2 s per arrival; matters with --max-sessions "
                   ">= 2; docs/architecture.md, 'First-chunk hold'). Default: from the plan, "
                   "else on.")
@click.option("--queue-size", envvar="COSYVINO_QUEUE_SIZE", type=click.IntRange(min=0), default=8,
              help="Requests that may wait for a session; more get 503 + Retry-After. "
                   "Default: from the plan, else 8.")
@click.option("--timeout", "request_timeout", envvar="COSYVINO_TIMEOUT",
              type=click.FloatRange(min=0.1), default=120.0,
              show_default=True,
              help="Per-request limit in seconds, arrival to last byte (queue wait included); "
                   "requests estimated not to make it are refused up front.")
@click.option("--drain-timeout", envvar="COSYVINO_DRAIN_TIMEOUT",
              type=click.FloatRange(min=0), default=None,
              help="On SIGTERM, seconds admitted requests get to finish before they are "
                   "cancelled and the process exits. Default: --timeout.")
@click.option("--cache-dir", envvar="COSYVINO_CACHE_DIR",
              type=click.Path(file_okay=False), default=None,
              help="On-disk result cache (default: ~/.cache/cosyvino/results).")
@click.option("--no-cache", envvar="COSYVINO_NO_CACHE",
              is_flag=True, help="Disable the result cache.")
@click.option("--cache-memory-mb", envvar="COSYVINO_CACHE_MEMORY_MB",
              type=click.FloatRange(min=0), default=64.0,
              show_default=True)
@click.option("--cache-disk-mb", envvar="COSYVINO_CACHE_DISK_MB",
              type=click.FloatRange(min=0), default=1024.0,
              show_default=True)
@click.option("--voices-dir", envvar="COSYVINO_VOICES_DIR",
              type=click.Path(file_okay=False), default=None,
              help="Where registered voices are kept (default: MODEL_DIR/voices; give a "
                   "writable dir when the model dir is read-only).")
@click.option("--max-upload-mb", envvar="COSYVINO_MAX_UPLOAD_MB",
              type=click.FloatRange(min=1), default=32.0, show_default=True,
              help="Body limit of the endpoints that take recordings (zero-shot, "
                   "cross-lingual, vc, POST /v1/audio/voices); 413 beyond it.")
@click.option("--num-speech-tokens", envvar="COSYVINO_NUM_SPEECH_TOKENS",
              type=click.IntRange(min=1), default=None, hidden=True,
              help="Force this many speech tokens per segment (benchmarks/tests).")
@click.option("--no-warmup", envvar="COSYVINO_NO_WARMUP", is_flag=True, hidden=True)
@click.option("--log-level", envvar="COSYVINO_LOG_LEVEL",
              type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--log-format", envvar="COSYVINO_LOG_FORMAT", type=click.Choice(["text", "json"]),
              default="text", show_default=True,
              help="json: one JSON object per line (ts, level, logger, message, request_id; "
                   "access lines add method, path, status, duration_ms).")
@click.option("--shutdown-delay", envvar="COSYVINO_SHUTDOWN_DELAY",
              type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="On SIGTERM, seconds /ready answers 503 while everything else is still "
                   "served (load balancers catch up), before the drain starts.")
@click.option("--cors-origin", "cors_origins", envvar="COSYVINO_CORS_ORIGINS", multiple=True,
              callback=lambda ctx, param, value: _split_list(value),
              help="Allow browser pages of this origin (e.g. https://chat.example.com, or *) "
                   "to call the API (CORS); repeatable; env: comma separated. Default: off.")
@click.option("--voice-alias", "voice_aliases", envvar="COSYVINO_VOICE_ALIASES", multiple=True,
              callback=lambda ctx, param, value: _split_list(value),
              help="NAME=VOICE: requests naming voice NAME (e.g. an OpenAI voice, alloy) get "
                   "VOICE; repeatable; env: comma separated. Adds to / replaces the default "
                   "table (docs/server.md, 'Voice aliases').")
@click.pass_context
def serve(ctx, plan_path, model_dir, host, port, api_key, metrics_auth, public_voice_list,
          backend, threads,
          max_sessions, llm_batch, estimator_batch, first_chunk_hold, queue_size, request_timeout, drain_timeout, cache_dir, no_cache,
          cache_memory_mb, cache_disk_mb, voices_dir, max_upload_mb, num_speech_tokens,
          no_warmup, log_level, log_format, shutdown_delay, cors_origins, voice_aliases):
    """Serve speech over HTTP: OpenAI /v1/audio/speech and CosyVoice /inference_sft.

    Every option can also be set by an environment variable, COSYVINO_ + the option's name
    (e.g. COSYVINO_MAX_SESSIONS=2, COSYVINO_NO_CACHE=1; the repeatable --cors-origin and
    --voice-alias: COSYVINO_CORS_ORIGINS, COSYVINO_VOICE_ALIASES, comma separated); a flag wins
    over its variable, and either wins over the plan. See docs/server.md for every endpoint
    with curl examples.
    """
    try:
        from cosyvino.server.config import ServerConfig
        from cosyvino.server.runner import ModelLoadFailed, run
    except ImportError as e:  # the server extra is missing
        click.echo(f"error: the server needs extra packages ({e.name}): "
                   "pip install 'cosyvino[server]'", err=True)
        sys.exit(2)
    from cosyvino.cli.plan_settings import EXPLICIT, merge_plan
    from cosyvino.server.aliases import parse_aliases
    from cosyvino.server.logs import configure_logging

    if log_format == "json":  # every line on stderr is a JSON object, these first ones too
        configure_logging("json", log_level)

    def say(level: str, message: str) -> None:
        if log_format == "json":
            getattr(logging.getLogger("cosyvino.cli"), level)(message)
        else:
            click.echo(message if level == "info" else f"{level}: {message}", err=True)

    try:
        settings, source, notes = merge_plan(
            ctx, {"model_dir": model_dir, "backend": backend, "threads": threads,
                  "max_sessions": max_sessions, "queue_size": queue_size,
                  "llm_batch": llm_batch, "estimator_batch": estimator_batch}, plan_path)
        for note in notes:
            say("warning", note)
        config = ServerConfig(
            request_timeout=request_timeout, api_key=api_key or None,
            metrics_auth=metrics_auth, public_voice_list=public_voice_list,
            drain_timeout=drain_timeout,
            cache_dir=None if no_cache else (cache_dir or _default_cache_dir()),
            cache_memory_mb=0.0 if no_cache else cache_memory_mb, cache_disk_mb=cache_disk_mb,
            voices_dir=voices_dir, max_upload_bytes=int(max_upload_mb * (1 << 20)),
            num_speech_tokens=num_speech_tokens, warmup=not no_warmup, source=source,
            shutdown_delay=shutdown_delay, log_format=log_format, cors_origins=cors_origins,
            voice_aliases=parse_aliases(voice_aliases), **settings).validate()
    except CosyvinoError as e:
        say("error", str(e))
        sys.exit(2)
    if first_chunk_hold is not None:  # the flag wins over the plan's backend option
        config.backend_options = {**config.backend_options, "first_chunk_hold": first_chunk_hold}
    given = {k for k in ("llm_batch", "max_sessions")
             if ctx.get_parameter_source(k) in EXPLICIT}
    if source.startswith("plan") and given == {"llm_batch"}:
        say("warning", f"--llm-batch {config.llm_batch} with the plan's {config.max_sessions} "
            "session(s), which the plan sized for its own batch (sessions = streams x "
            "llm_batch); pass --max-sessions too, or re-plan with `cosyvino plan --llm-batch "
            f"{config.llm_batch}`")
    for key, value in (("llm_batch", config.llm_batch),
                       ("estimator_batch", config.estimator_batch)):
        if value > 1 and config.max_sessions < 2:
            flag = "--" + key.replace("_", "-")
            named = (f"{flag} {value}" if ctx.get_parameter_source(key) in EXPLICIT
                     else f"{key.replace('_', ' ')} {value} (from the plan)")
            say("warning", f"{named} has no effect with {config.max_sessions} session: "
                "batching needs concurrent requests (--max-sessions >= 2)")
    if config.public_voice_list and not config.api_key:
        say("warning", "--public-voice-list has no effect without --api-key: every endpoint "
            "is open already")
    if not _is_loopback(host) and not config.api_key:
        say("warning", f"listening on {host} without --api-key: anyone who can reach this "
            "port can use the server")
    say("info", f"cosyvino serve: http://{host}:{port} backend={config.backend} "
        f"sessions={config.max_sessions} llm_batch={config.llm_batch} "
        f"estimator_batch={config.estimator_batch} "
        f"first_chunk_hold={config.backend_options.get('first_chunk_hold', True)} "
        f"queue={config.queue_size} threads={config.threads or 'default'} ({source})")
    try:
        run(config, host, port, log_level=log_level)
    except ModelLoadFailed as e:
        say("error", str(e))
        sys.exit(2 if isinstance(e.__cause__, CosyvinoError) else 1)
