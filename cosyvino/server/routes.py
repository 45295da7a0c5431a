"""The HTTP app: OpenAI-compatible ``/v1/audio/speech``, voice management
(``/v1/audio/voices``) and model lists (``/v1/models``, ``/v1/audio/models``), the
CosyVoice-compatible ``/inference_sft``, ``/inference_zero_shot``,
``/inference_cross_lingual``, ``/inference_instruct`` (CosyVoice v1 Instruct models),
``/inference_instruct2`` (CosyVoice2) and ``/inference_vc``, health/readiness and Prometheus
metrics. See docs/server.md (its "CosyVoice2" section for a v2 model).

A synthesis request goes: body -> :mod:`.schemas` (400) -> validation on the loaded model
(:meth:`SynthesisPool.prepare`, 400) -> result cache (seeded requests) -> a place in the pool
(503) -> :class:`.streaming.SynthesisResponse` (slot, scheduler, stream).
"""

from __future__ import annotations

import dataclasses
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

from .. import __version__
from ..errors import CosyvinoError, InputError, UnknownSpeakerError
from .aliases import apply_alias, resolve_aliases
from .cache import ResultCache, cache_key, model_fingerprint, request_inputs_key
from .config import ServerConfig
from .errors import (APIError, busy_error, input_error, not_ready_error, too_long_error,
                     voice_error)
from .logs import RequestIdMiddleware, install_cut_filter
from .metrics import Metrics, MetricsMiddleware
from .pool import Busy, NotReady, SynthesisPool, TooLong
from .schemas import (CrossLingualForm, Instruct2Form, InstructForm, SftForm, SpeechParams,
                      VcForm, VoiceForm, SpeechBody, ZeroShotForm, normalize_for_key,
                      openapi_form_body, openapi_json_body, parse, parse_speech_request)
from .streaming import SynthesisResponse, cached_response
from .text_input import add_stream_input_route

log = logging.getLogger("cosyvino.server")

#: model ids /v1/models lists besides the model directory's name (OpenAI clients send these)
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")

#: the fields of a voice object a request without the API key sees in ``GET
#: /v1/audio/voices`` under ``public_voice_list`` (no transcript, hash or prompt details)
PUBLIC_VOICE_KEYS = ("id", "name", "object", "builtin")


class AppState:
    """What the endpoints share: config, metrics, the pool and the result cache.

    Attributes:
        on_load_failed: called (from the loader thread) with the exception when the model
            fails to load; :mod:`cosyvino.server.runner` sets it to stop the server.
        stopping: set by the runner at SIGTERM: ``/ready`` answers 503 from then on, while
            requests are still served until the drain starts (``--shutdown-delay``).
    """

    def __init__(self, config: ServerConfig, synthesizers=None):
        self.config = config.validate()
        self.metrics = Metrics()
        self.pool = SynthesisPool(config, synthesizers, self.metrics)
        self.cache: ResultCache | None = None
        self.fingerprint = ""
        self.started_at = time.time()
        self.on_load_failed = None
        self.stopping = False
        self.metrics.track_capacity(lambda: self.pool.admitted, self.config.max_sessions)
        self.metrics.track_batching(lambda: [] if self.pool.scheduler is None
                                    else self.pool.scheduler.batch_stats)
        self.metrics.track_first_chunk_hold(lambda: None if self.pool.scheduler is None
                                            else self.pool.scheduler.hold_stats)
        self.metrics.track_estimator_batching(
            lambda: [s.estimator_batch_stats for s in self.pool.synths])
        self.metrics.build_info.labels(__version__, self.config.backend).set(1)

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

    def aliases(self, synth) -> dict[str, str]:
        """The voice alias table for ``synth`` (:mod:`.aliases`: defaults for its built-in
        voices, then ``--voice-alias``)."""
        return resolve_aliases(builtin_voice_names(synth), self.config.voice_aliases)

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
    return (await _multipart_parts(request, raw))[0]


async def _multipart_parts(request: Request, raw: bytes) -> tuple[dict, dict]:
    """(text fields, files: name -> bytes) of a multipart body already read."""
    from starlette.requests import Request as StarletteRequest

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    replay = StarletteRequest(request.scope, receive)
    try:
        form = await replay.form()
    except Exception as e:  # noqa: BLE001 - starlette's MultiPartException and parse errors
        raise APIError(400, f"malformed multipart body: {e}", code="invalid_body") from None
    fields, files = {}, {}
    try:
        for key, value in form.multi_items():
            if isinstance(value, str):
                fields[key] = value
            else:
                files[key] = await value.read()
    finally:
        await form.close()
    return fields, files


async def upload_fields(request: Request, raw: bytes) -> tuple[dict, dict]:
    """The fields and uploaded files of a CosyVoice-compatible endpoint that takes recordings:
    the query string, updated by the body's fields (multipart, what the official client
    sends; or urlencoded / JSON, which carry no files). Returns (fields, files: name ->
    bytes)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data") and raw:
        fields, files = await _multipart_parts(request, raw)
        return {**dict(request.query_params), **fields}, files
    return await sft_fields(request, raw), {}


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

    app = FastAPI(title="cosyvino", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None,
                  description="OpenAI-compatible and CosyVoice-compatible speech synthesis "
                  "(docs/server.md)")
    app.state.cosyvino = state
    # outermost last: request id (and the access line) around everything, CORS preflights
    # answered before any route (no auth on a preflight), metrics around the routes
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["X-Request-ID", "Retry-After", "X-Sample-Rate"])
    app.add_middleware(RequestIdMiddleware)
    install_cut_filter()  # a deliberate cut is our WARNING, not uvicorn's ERROR (.logs)
    _error_handlers(app)

    def has_key(request: Request) -> bool:
        """Whether the request may use the API: no key configured, or the right one sent
        (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``)."""
        key = config.api_key
        if not key:
            return True
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else \
            request.headers.get("x-api-key", "")
        return bool(given) and hmac.compare_digest(given.encode(), key.encode())

    def check_auth(request: Request) -> None:
        if not has_key(request):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def precheck(p: SpeechParams, started: float) -> None:
        """A request that carries a recording is judged by admission on a cheap size before
        its recordings go through the prompt models (tens of seconds on a loaded machine): a
        refusal (503, 400 input_too_long) comes at once (issue 33). Voice conversion: the
        source recording's duration from its header; text-to-speech: the text's length. A
        recording whose header states no length is judged after validation only."""
        if p.source_audio is None and p.prompt_audio is None:
            return  # validation is the text frontend alone (milliseconds)
        pool = state.pool
        if p.source_audio is not None:
            from ..prompt_audio import header_seconds

            seconds = await run_in_threadpool(header_seconds, p.source_audio)
            if seconds is None:
                return
            kind = "vc"
        else:
            seconds = pool.rough_speech_seconds(p.text, config.num_speech_tokens)
            kind = "prompt"
        try:
            pool.check(kind, seconds, started)
        except Busy as e:
            raise busy_error(e) from None
        except TooLong as e:
            raise too_long_error(e, p.text_param, p.field("source_audio")) from None
        except NotReady as e:
            raise not_ready_error(e) from None

    async def start_synthesis(p: SpeechParams) -> Response:
        """Validate on the model (400), look up the cache, reserve a place (503), return the
        response that runs the synthesis."""
        started = time.perf_counter()
        synth = state.synth()
        n_tokens = config.num_speech_tokens
        if p.seed is None or state.cache is None:  # (a seeded one may be a cache hit)
            await precheck(p, started)
        try:
            request, segments = await run_in_threadpool(state.pool.validate,
                                                        p.request(n_tokens))
        except InputError as e:
            # the recording the request gave, for a prompt-models error
            recording = "prompt_audio" if p.prompt_audio is not None else "source_audio"
            raise input_error(e, p.text_param, p.voice_param, dict(p.fields),
                              recording) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        except CosyvinoError as e:  # a stored voice that failed its checks, prompt models
            raise _server_side_error(e, p.voice_param) from None
        key = None
        if p.seed is not None and state.cache is not None:
            # the voice by what it feeds the model (a re-registered name is another voice)
            # and the mode inputs of the validated request (prompt bundle, source tokens)
            key = cache_key(model=state.fingerprint, text=normalize_for_key(p.text),
                            speed=p.speed, format=p.fmt, seed=p.seed,
                            tokens=n_tokens, sampling=repr(synth.config.llm.sampling),
                            hops=p.hop_schedule, steps=p.n_timesteps,
                            **request_inputs_key(request))
            data = await run_in_threadpool(state.cache.get, key)
            if data is not None:
                state.metrics.cache_hits.inc()
                return cached_response(data, p.fmt, p.sse, synth.sample_rate)
            state.metrics.cache_misses.inc()
        try:
            state.pool.enter(request, segments, started)
        except Busy as e:
            raise busy_error(e) from None
        except TooLong as e:
            raise too_long_error(e, p.text_param, p.field("source_audio")) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        return SynthesisResponse(state, request, p, key, started)

    def check_key(key) -> bool:
        """Whether ``key`` (from a WebSocket start message) is the API key (or none is set)."""
        if not config.api_key:
            return True
        return isinstance(key, str) and bool(key) and hmac.compare_digest(
            key.encode(), config.api_key.encode())

    add_stream_input_route(app, state, has_key, check_key, default_voice, instruction_mode)

    # ---- OpenAI-compatible -------------------------------------------------------------------
    @app.post("/v1/audio/speech", openapi_extra=openapi_json_body(SpeechBody))
    async def speech(request: Request):
        check_auth(request)
        body = json_body(await read_body(request, config.max_body_bytes))
        synth = state.synth()
        p = parse_speech_request(body, None)
        mode = None
        if p.instruction is not None:
            # the model's mode that takes an instruction (v1 Instruct: instruct; CosyVoice2:
            # instruct2); never silently ignored on a model without one
            mode = instruction_mode(synth)
            if mode is None:
                raise APIError(400, "'instructions' needs a model with a mode that follows "
                               "instructions (an Instruct model, e.g. CosyVoice-300M-Instruct: "
                               "'instruct'; CosyVoice2: 'instruct2'); this model's modes: "
                               f"{', '.join(synth.modes)}", param="instructions",
                               code="unsupported_mode")
            p = dataclasses.replace(p, mode=mode.name)
        if p.voice is None:
            p = dataclasses.replace(p, voice=default_voice(synth, mode))
        aliases = state.aliases(synth)
        if p.voice in aliases:  # an OpenAI voice name, unless the model has that voice
            voice = apply_alias(p.voice, await run_in_threadpool(lambda: synth.voices),
                                aliases)
            p = dataclasses.replace(p, voice=voice)
        return await start_synthesis(p)

    def model_objects() -> list[dict]:
        """The model objects of ``/v1/models`` and ``/v1/audio/models``: the model
        directory's name and :data:`OPENAI_MODEL_ALIASES`, all naming the loaded model."""
        synth = state.synth()
        name = os.path.basename(os.path.normpath(synth.model_dir)) or "cosyvoice"
        created = int(state.started_at)
        # cosyvino extensions (OpenAI clients ignore them): "modes", what this checkpoint can
        # do (sft, zero_shot, ...); "instruction_mode", the one `instructions` selects (None:
        # none); "family" and "sample_rate" (Hz of wav/flac/mp3/aac and of the raw PCM of
        # the CosyVoice-compatible endpoints). Every id names the same loaded model.
        mode = instruction_mode(synth)
        info = {"modes": synth.modes, "instruction_mode": mode and mode.name,
                "family": synth.family.name, "sample_rate": synth.sample_rate,
                # text in over /v1/audio/speech/stream-input (CosyVoice2's bistream input)
                "text_in": bool(getattr(synth.family, "text_in", False))}
        return [{"id": mid, "object": "model", "created": created, "owned_by": "cosyvino",
                 **info} for mid in (name, *OPENAI_MODEL_ALIASES)]

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        return {"object": "list", "data": model_objects()}

    @app.get("/v1/audio/models")
    async def audio_models(request: Request):
        # what Open WebUI asks a custom TTS base URL for (GET {base}/audio/models, reading
        # models[].id, without an API key): public with --public-voice-list, as the voices
        if not config.public_voice_list:
            check_auth(request)
        objects = model_objects()
        return {"object": "list", "models": objects, "data": objects}

    @app.get("/v1/audio/voices")
    async def voices(request: Request):
        full = has_key(request)
        if not full and not config.public_voice_list:
            check_auth(request)
        synth = state.synth()
        objects = await run_in_threadpool(_voice_objects, synth)
        if not full:  # the public list: names only, never a registered voice's transcript
            objects = [{k: v[k] for k in PUBLIC_VOICE_KEYS} for v in objects]
        # Open WebUI reads voices[].id / .name; OpenAI-style clients data[].id
        return {"object": "list", "voices": objects, "data": objects,
                "aliases": state.aliases(synth)}

    @app.post("/v1/audio/voices", openapi_extra=openapi_form_body(
        VoiceForm, files=("file",), required_files=("file",)))
    async def add_voice(request: Request):
        check_auth(request)
        fields, files = await upload_fields(
            request, await read_body(request, config.max_upload_bytes))
        form = parse(VoiceForm, fields)
        data = files.get("file")
        if data is None:
            raise APIError(400, "missing required file 'file' (the prompt recording; send a "
                           "multipart/form-data body with 'name', 'file' and optionally "
                           "'text', its transcript)", param="file",
                           code="missing_required_parameter")
        synth = state.synth()
        try:
            await run_in_threadpool(lambda: synth.add_voice(form.name, data, form.text,
                                                            overwrite=form.overwrite))
            return await run_in_threadpool(_voice_object, synth, form.name)
        except CosyvinoError as e:
            raise voice_error(e) from None

    @app.get("/v1/audio/voices/{voice_id}")
    async def get_voice(voice_id: str, request: Request):
        check_auth(request)
        synth = state.synth()
        try:
            return await run_in_threadpool(_voice_object, synth, voice_id)
        except UnknownSpeakerError as e:
            raise APIError(404, str(e), param="voice_id", code="voice_not_found") from None
        except CosyvinoError as e:
            raise voice_error(e, name_param="voice_id") from None

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str, request: Request):
        check_auth(request)
        synth = state.synth()
        if voice_id in synth.speakers:
            raise APIError(400, f"{voice_id!r} is a built-in speaker of the model; only "
                           "registered voices can be deleted", param="voice_id",
                           code="builtin_voice")
        try:
            await run_in_threadpool(synth.remove_voice, voice_id)
        except CosyvinoError as e:
            raise voice_error(e, name_param="voice_id") from None
        return {"id": voice_id, "object": "voice", "deleted": True}

    # ---- CosyVoice-compatible ----------------------------------------------------------------
    async def inference_sft(request: Request):
        check_auth(request)
        fields = await sft_fields(request, await read_body(request, config.max_body_bytes))
        form = parse(SftForm, fields)
        # no spk_id: the model's first speaker (which needs the model loaded)
        synth = state.synth()
        default_voice = (synth.speakers[0] if synth.speakers else None) \
            if form.spk_id is None else ""
        return await start_synthesis(form.params(default_voice))

    _get_and_post(app, "/inference_sft", inference_sft, openapi_form_body(SftForm))

    def cosyvoice_mode_endpoint(path: str, form_cls, uploads: tuple[str, ...],
                                required: tuple[str, ...] | None = None):
        """One of the official server's prompt / instruct endpoints (GET or POST; fields from
        the query string and the body, files as multipart uploads; ``required``: the uploads
        the OpenAPI schema marks required, default all)."""

        async def endpoint(request: Request):
            check_auth(request)
            limit = config.max_upload_bytes if uploads else config.max_body_bytes
            fields, files = await upload_fields(request, await read_body(request, limit))
            form = parse(form_cls, fields)
            synth = state.synth()  # 503 while loading, before anything else is read
            p = form.params(files)
            check_mode(synth, p.mode, path)
            return await start_synthesis(p)

        endpoint.__name__ = path.strip("/")
        _get_and_post(app, path, endpoint, openapi_form_body(
            form_cls, files=uploads, required_files=uploads if required is None else required))

    # the voice: prompt_wav, or spk_id naming a voice with a prompt (registered, spk2info.pt)
    cosyvoice_mode_endpoint("/inference_zero_shot", ZeroShotForm, ("prompt_wav",))
    cosyvoice_mode_endpoint("/inference_cross_lingual", CrossLingualForm, ("prompt_wav",),
                            required=())
    cosyvoice_mode_endpoint("/inference_instruct", InstructForm, ())
    # CosyVoice2's instruction mode (the official v2 server's fields; spk_id: a voice instead)
    cosyvoice_mode_endpoint("/inference_instruct2", Instruct2Form, ("prompt_wav",),
                            required=())
    # the voice: prompt_wav, or spk_id naming a registered voice (checked by VcForm)
    cosyvoice_mode_endpoint("/inference_vc", VcForm, ("source_wav", "prompt_wav"),
                            required=("source_wav",))

    # ---- operations --------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        pool = state.pool
        draining = pool.draining or state.stopping
        body = {"ready": pool.ready.is_set() and not draining,
                "draining": draining, "version": __version__, "backend": config.backend,
                "sessions": config.max_sessions, "llm_batch": config.llm_batch,
                "estimator_batch": pool.estimator_batch,
                "queue_size": config.queue_size,
                "in_flight": pool.running, "stopping": pool.stopping,
                "settings": config.source,
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

    from .webpage import add_web_routes

    add_web_routes(app, state, config)
    return app


def _get_and_post(app: FastAPI, path: str, endpoint, body_schema: dict) -> None:
    """Route a CosyVoice-compatible endpoint for POST (its form in the OpenAPI schema) and GET
    (the official client sends its form with GET; the same fields, also from the query
    string), each with its own operation id."""
    name = endpoint.__name__
    app.add_api_route(path, endpoint, methods=["POST"], operation_id=f"{name}_post",
                      openapi_extra=body_schema)
    app.add_api_route(path, endpoint, methods=["GET"], operation_id=f"{name}_get",
                      description="The same fields as POST, in the query string or a form "
                      "body (what the official CosyVoice client sends).")


# ---- the model's modes and voices ------------------------------------------------------------
def instruction_mode(synth):
    """The mode of ``synth``'s model that takes an instruction
    (:attr:`cosyvino.families.base.Mode.needs_instruction`: CosyVoice v1 Instruct models
    ``instruct``, CosyVoice2 ``instruct2``), or None when it offers none."""
    for mode in synth.engine.modes.values():
        if mode.needs_instruction:
            return mode
    return None


def builtin_voice_names(synth) -> list[str]:
    """The model's own voices: built-in SFT speakers, then the prompt voices its family ships
    (CosyVoice2: the zero-shot bundles of ``spk2info.pt``), in the order voices are listed."""
    return [name for name, voice in synth.voices.items() if voice.builtin]


def default_voice(synth, mode) -> str | None:
    """The voice of a ``/v1/audio/speech`` request that names none: the model's first
    built-in speaker; for a ``mode`` that needs a prompt voice (CosyVoice2 ``instruct2``) its
    first built-in voice with a prompt; None when it has no such voice (the request then
    needs one, and says so)."""
    voices = synth.voices
    if mode is not None and mode.needs_prompt_audio:
        return next((n for n in builtin_voice_names(synth) if voices[n].has_prompt), None)
    return synth.speakers[0] if synth.speakers else None


def check_mode(synth, mode: str | None, endpoint: str) -> None:
    """APIError 400 ``unsupported_mode`` when ``synth``'s model does not offer ``mode`` (the
    mode ``endpoint`` runs): names the mode, why (the family's reason, or that the family has
    no such mode) and, for an instruction endpoint, the one the model has."""
    if mode is None or mode in synth.modes:
        return
    family = synth.family
    why = family.mode_unavailable_reason(synth.model_dir, synth.stages, mode) \
        if mode in family.modes else f"the {family.name} family has no mode {mode!r}"
    hint = ""
    other = instruction_mode(synth)
    if other is not None and mode in ("instruct", "instruct2"):
        hint = f"; this model takes instructions in mode {other.name!r} " \
               f"(/inference_{other.name}, or 'instructions' of /v1/audio/speech)"
    raise APIError(400, f"mode {mode!r} is not supported by this model "
                   f"({why or 'not offered by this model'}){hint}; supported: "
                   f"{', '.join(synth.modes)}", code="unsupported_mode")


def _voice_object(synth, name: str) -> dict:
    """The voice object of ``/v1/audio/voices``: ``id`` (what ``voice`` takes), ``name``,
    ``object`` ``"voice"``, ``builtin``; for a registered voice ``prompt_text``,
    ``prompt_seconds``, ``prompt_tokens``, ``created``, ``sha256``; for a built-in voice with a
    prompt (CosyVoice2 ``spk2info.pt``) ``has_prompt``, ``prompt_text``, ``prompt_seconds``,
    ``prompt_tokens``. Raises as :meth:`Synthesizer.voice_info`."""
    info = synth.voice_info(name)
    if not info.get("builtin"):
        keys = ("builtin", "prompt_text", "prompt_seconds", "prompt_tokens", "created",
                "sha256")
    elif info.get("has_prompt"):
        keys = ("builtin", "has_prompt", "prompt_text", "prompt_seconds", "prompt_tokens")
    else:
        keys = ("builtin",)
    return {"id": name, "name": name, "object": "voice", **{k: info.get(k) for k in keys}}


def _voice_objects(synth) -> list[dict]:
    """Every voice a request may name: built-in speakers, then registered voices (sorted);
    a stored voice whose file fails its checks is left out (the store logs it)."""
    out = []
    for name in synth.voices:
        try:
            out.append(_voice_object(synth, name))
        except CosyvinoError:
            continue
    return out


def _server_side_error(e: CosyvinoError, voice_param: str) -> APIError:
    """A validation failure that is not the request's fault as such: a stored voice whose
    file is unusable (400 ``corrupt_voice``: register it again) or the prompt models failing
    (500)."""
    from ..voice_store import CorruptVoiceError

    if isinstance(e, CorruptVoiceError):
        return APIError(400, str(e), param=voice_param, code="corrupt_voice")
    return APIError(500, f"synthesis failed: {e}", type_="server_error",
                    code="synthesis_failed")


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
