"""The HTTP app: OpenAI-compatible ``/v1/audio/speech``, CosyVoice-compatible
``/inference_sft``, health/readiness and Prometheus metrics. See docs/server.md.

A synthesis request goes: body -> :mod:`.schemas` (400) -> validation on the loaded model
(:meth:`SynthesisPool.prepare`, 400) -> result cache (seeded requests) -> a place in the pool
(503) -> :class:`.streaming.SynthesisResponse` (slot, scheduler, stream).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InputError
from .cache import ResultCache, cache_key, model_fingerprint
from .config import ServerConfig
from .errors import APIError, busy_error, input_error, not_ready_error, too_long_error
from .metrics import Metrics, MetricsMiddleware
from .pool import Busy, NotReady, SynthesisPool, TooLong
from .schemas import SftForm, SpeechParams, normalize_for_key, parse, parse_speech_request
from .streaming import SynthesisResponse, cached_response

log = logging.getLogger("cosyvino.server")

#: model ids /v1/models lists besides the model directory's name (OpenAI clients send these)
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class AppState:
    """What the endpoints share: config, metrics, the pool and the result cache.

    Attributes:
        on_load_failed: called (from the loader thread) with the exception when the model
            fails to load; :mod:`cosyvino.server.runner` sets it to stop the server.
    """

    def __init__(self, config: ServerConfig, synthesizers=None):
        self.config = config.validate()
        self.metrics = Metrics()
        self.pool = SynthesisPool(config, synthesizers, self.metrics)
        self.cache: ResultCache | None = None
        self.fingerprint = ""
        self.started_at = time.time()
        self.on_load_failed = None

    @property
    def sample_rate(self) -> int:
        return self.pool.synth.sample_rate

    def on_loaded(self) -> None:
        c = self.config
        if self.pool.ready.is_set() and (c.cache_dir or c.cache_memory_mb > 0):
            synth = self.pool.synth
            self.fingerprint = model_fingerprint(synth.model_dir, synth.backend_name)
            self.cache = ResultCache(c.cache_dir, memory_bytes=int(c.cache_memory_mb * 2**20),
                                     disk_bytes=int(c.cache_disk_mb * 2**20))

    def synth(self):
        """The loaded synthesizer, or APIError 503 ``not_ready``."""
        try:
            return self.pool.synth
        except NotReady as e:
            raise not_ready_error(e) from None


# ---- request bodies --------------------------------------------------------------------------
async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (APIError 413 beyond; 400 for a bad
    Content-Length)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise APIError(413, f"request body too large ({declared} bytes; limit {limit})",
                               code="body_too_large")
        except ValueError:
            raise APIError(400, "bad Content-Length header") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body too large (over {limit} bytes)",
                           code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


#: deepest JSON nesting a body may have (ours are flat objects; deeper ones are refused
#: before anything walks them recursively)
MAX_JSON_DEPTH = 32


def json_depth(value) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, ``[]`` and ``{}`` are 1); iterative, so
    any depth is measured without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        depth = max(depth, d)
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return depth


def json_body(raw: bytes):
    """Decoded JSON (APIError 400 ``invalid_json`` when malformed or nested deeper than
    :data:`MAX_JSON_DEPTH`)."""
    too_deep = APIError(400, f"JSON body nested too deeply (the limit is {MAX_JSON_DEPTH} "
                        "levels)", code="invalid_json")
    try:
        value = json.loads(raw)
    except RecursionError:  # the decoder's own limit (about 1000 levels)
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise too_deep
    return value


async def sft_fields(request: Request, raw: bytes) -> dict:
    """``/inference_sft``'s fields: the query string, updated by the body (urlencoded form,
    what the official client sends even with GET; multipart; or a JSON object)."""
    fields = dict(request.query_params)
    if not raw:
        return fields
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        fields.update(await _multipart(request, raw))
    elif ctype.startswith("application/json"):
        obj = json_body(raw)
        if not isinstance(obj, dict):
            raise APIError(400, "request body must be a JSON object")
        fields.update(obj)
    else:
        try:
            fields.update(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
        except UnicodeDecodeError:
            raise APIError(400, "form body is not UTF-8") from None
    return fields


async def _multipart(request: Request, raw: bytes) -> dict:
    from starlette.requests import Request as StarletteRequest

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    replay = StarletteRequest(request.scope, receive)
    form = await replay.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


# ---- app -------------------------------------------------------------------------------------
def create_app(config: ServerConfig, synthesizers=None) -> FastAPI:
    """The ASGI app. ``synthesizers``: preloaded ``Synthesizer`` objects (tests; one shared or
    one per session); otherwise the model is loaded in the background at startup (``/ready``
    says when)."""
    state = AppState(config, synthesizers)

    @asynccontextmanager
    async def lifespan(app):
        def load():
            state.pool.load()
            state.on_loaded()
            if state.pool.load_error is not None and state.on_load_failed is not None:
                # a model that cannot load never will: let the process exit (runner) rather
                # than serve 503 not_ready forever to a `until curl .../ready` loop
                state.on_load_failed(state.pool.load_error)

        loader = threading.Thread(target=load, name="cosyvino-load", daemon=True)
        loader.start()
        try:
            yield
        finally:
            # uvicorn has already drained in-flight responses (graceful shutdown) by now;
            # anything left past its timeout is cancelled and the scheduler stopped.
            await run_in_threadpool(state.pool.shutdown, True)

    app = FastAPI(title="cosyvino", version=_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.cosyvino = state
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    _error_handlers(app)

    def check_auth(request: Request) -> None:
        key = config.api_key
        if not key:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else \
            request.headers.get("x-api-key", "")
        if not given or not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def start_synthesis(p: SpeechParams) -> Response:
        """Validate on the model (400), look up the cache, reserve a place (503), return the
        response that runs the synthesis."""
        started = time.perf_counter()
        synth = state.synth()
        n_tokens = config.num_speech_tokens
        try:
            request, segments = await run_in_threadpool(state.pool.validate,
                                                        p.request(n_tokens))
        except InputError as e:
            raise input_error(e, p.text_param, p.voice_param) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        key = None
        if p.seed is not None and state.cache is not None:
            key = cache_key(model=state.fingerprint, text=normalize_for_key(p.text),
                            voice=p.voice, speed=p.speed, format=p.fmt, seed=p.seed,
                            tokens=n_tokens, sampling=repr(synth.config.llm.sampling),
                            hops=p.hop_schedule)
            data = await run_in_threadpool(state.cache.get, key)
            if data is not None:
                state.metrics.cache_hits.inc()
                return cached_response(data, p.fmt, p.sse)
            state.metrics.cache_misses.inc()
        try:
            state.pool.enter(request, segments, started)
        except Busy as e:
            raise busy_error(e) from None
        except TooLong as e:
            raise too_long_error(e, p.text_param) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        return SynthesisResponse(state, request, p, key, started)

    # ---- OpenAI-compatible -------------------------------------------------------------------
    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        check_auth(request)
        body = json_body(await read_body(request, config.max_body_bytes))
        synth = state.synth()
        return await start_synthesis(parse_speech_request(body, synth.speakers[0]))

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        synth = state.synth()
        name = os.path.basename(os.path.normpath(synth.model_dir)) or "cosyvoice"
        created = int(state.started_at)
        return {"object": "list", "data": [
            {"id": mid, "object": "model", "created": created, "owned_by": "cosyvino"}
            for mid in (name, *OPENAI_MODEL_ALIASES)]}

    @app.get("/v1/audio/voices")
    async def voices(request: Request):
        check_auth(request)
        synth = state.synth()
        return {"object": "list", "voices": synth.speakers,
                "data": [{"id": v, "name": v, "object": "voice"} for v in synth.speakers]}

    # ---- CosyVoice-compatible ----------------------------------------------------------------
    @app.api_route("/inference_sft", methods=["GET", "POST"])
    async def inference_sft(request: Request):
        check_auth(request)
        fields = await sft_fields(request, await read_body(request, config.max_body_bytes))
        form = parse(SftForm, fields)
        # no spk_id: the model's first speaker (which needs the model loaded)
        default_voice = state.synth().speakers[0] if form.spk_id is None else ""
        return await start_synthesis(form.params(default_voice))

    # ---- operations --------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        pool = state.pool
        body = {"ready": pool.ready.is_set() and not pool.draining,
                "draining": pool.draining, "backend": config.backend,
                "sessions": config.max_sessions, "queue_size": config.queue_size,
                "in_flight": pool.running, "settings": config.source,
                "admission": pool.estimates()}
        if pool.load_error is not None:
            body["error"] = str(pool.load_error)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if config.metrics_auth:
            check_auth(request)

        return Response(generate_latest(state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error is answered with the OpenAI error body."""

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                 f"http_{exc.status_code}")
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return APIError(400, str(exc)).response()

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        log.exception("unhandled error")
        return APIError(500, f"internal error: {type(exc).__name__}",
                        type_="server_error").response()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("cosyvino")
    except Exception:  # noqa: BLE001
        return "0"
