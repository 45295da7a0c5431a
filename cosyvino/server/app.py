"""The HTTP app: OpenAI-compatible ``/v1/audio/speech``, CosyVoice-compatible
``/inference_sft``, health/readiness and Prometheus metrics. See docs/server.md."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import threading
import time
import unicodedata
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CosyvinoError, EmptyTextError, InputError, UnknownSpeakerError
from ..synthesizer import MAX_SPEED, MIN_SPEED
from .cache import ResultCache, cache_key, model_fingerprint
from .config import MAX_INPUT_CHARS, ServerConfig
from .encoding import CONTENT_TYPES, SPEECH_FORMATS, make_encoder, smooth_join
from .metrics import Metrics, MetricsMiddleware
from .pool import Busy, NotReady, SynthesisPool

log = logging.getLogger("cosyvino.server")

#: model ids /v1/models lists besides the model directory's name (OpenAI clients send these)
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


# ---- errors ----------------------------------------------------------------------------------
class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (status, message, type_,
                                                                      param, code)
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _busy(e: Busy) -> APIError:
    return APIError(503, str(e), type_="server_error", code="server_busy",
                    headers={"Retry-After": str(e.retry_after)})


def _not_ready(e: NotReady) -> APIError:
    return APIError(503, str(e), type_="server_error", code="not_ready",
                    headers={"Retry-After": "5"})


def _input_error(e: InputError, text_param: str, voice_param: str) -> APIError:
    if isinstance(e, UnknownSpeakerError):
        return APIError(400, str(e), param=voice_param, code="unknown_voice")
    if isinstance(e, EmptyTextError):
        return APIError(400, str(e), param=text_param, code="empty_input")
    msg = str(e)
    param = "speed" if "speed" in msg else "seed" if "seed" in msg else text_param
    return APIError(400, msg, param=param, code="invalid_value")


# ---- request parsing -------------------------------------------------------------------------
async def _read_body(request: Request, limit: int) -> bytes:
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


def _field(body: dict, name: str, kinds, default=None, *, required: bool = False):
    """``body[name]`` checked against ``kinds`` (bool is never a number); 400 otherwise."""
    if name not in body or body[name] is None:
        if required:
            raise APIError(400, f"missing required parameter '{name}'", param=name,
                           code="missing_required_parameter")
        return default
    value = body[name]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = ("a number" if float in kinds else "an integer" if int in kinds
                else "a string")
        raise APIError(400, f"'{name}' must be {what}, got {type(value).__name__}",
                       param=name, code="invalid_type")
    return value


def normalize_for_key(text: str) -> str:
    """Cache-key text: NFC, whitespace runs collapsed, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


class SpeechParams:
    def __init__(self, text, voice, fmt, speed, seed, stream_format="audio"):
        self.text, self.voice, self.fmt = text, voice, fmt
        self.speed, self.seed, self.stream_format = speed, seed, stream_format


def parse_speech_request(body, default_voice: str) -> SpeechParams:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    _field(body, "model", str)  # any model id is accepted: one model per server
    text = _field(body, "input", str, required=True)
    if len(text) > MAX_INPUT_CHARS:
        raise APIError(400, f"'input' is {len(text)} characters; the limit is "
                       f"{MAX_INPUT_CHARS}", param="input", code="string_above_max_length")
    voice = _field(body, "voice", str, default_voice)
    fmt = _field(body, "response_format", str, "mp3")
    if fmt not in SPEECH_FORMATS:
        raise APIError(400, f"unsupported response_format {fmt!r}; choose one of "
                       f"{', '.join(SPEECH_FORMATS)}", param="response_format",
                       code="invalid_value")
    speed = _field(body, "speed", (int, float), 1.0)
    if not (MIN_SPEED <= float(speed) <= MAX_SPEED):
        raise APIError(400, f"'speed' must be between {MIN_SPEED} and {MAX_SPEED}, got "
                       f"{speed}", param="speed", code="invalid_value")
    stream_format = _field(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise APIError(400, f"unsupported stream_format {stream_format!r}; choose audio or "
                       "sse", param="stream_format", code="invalid_value")
    _field(body, "instructions", str)  # accepted for compatibility; SFT models ignore it
    seed = _field(body, "seed", int)
    if seed is not None and seed < 0:
        raise APIError(400, f"'seed' must be a non-negative integer, got {seed}",
                       param="seed", code="invalid_value")
    return SpeechParams(text, voice, fmt, float(speed), seed, stream_format)


# ---- the streaming response ------------------------------------------------------------------
class SynthesisResponse(Response):
    """Runs one synthesis on the pool and streams it; owns the whole request lifetime.

    Waits for a session (queue), waits for the first segment before sending headers (so a
    failure there is still a proper error status), then sends each segment as it is ready.
    A disconnect or the timeout sets the job's cancel event; the worker stops at the next
    speech token and frees its session.
    """

    def __init__(self, app_state, make_stream, cancel: threading.Event, fmt: str, sse: bool,
                 key: str | None, started: float):
        super().__init__()
        self.s = app_state
        self.make_stream = make_stream
        self.cancel = cancel
        self.fmt = fmt
        self.sse = sse
        self.key = key
        self.started = started

    async def __call__(self, scope, receive, send):
        cancel = self.cancel
        gone = asyncio.Event()

        async def listen():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    cancel.set()
                    gone.set()
                    return

        listener = asyncio.ensure_future(listen())
        try:
            await self._run(send, cancel, gone)
        finally:
            if not cancel.is_set():
                cancel.set()  # anything still running for us stops now
            listener.cancel()

    async def _send_error(self, send, err: APIError):
        body = json.dumps(err.body()).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _frame(self, chunk: bytes) -> bytes:
        if not self.sse or not chunk:
            return chunk
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
        return f"data: {json.dumps(event)}\n\n".encode()

    async def _run(self, send, cancel, gone):
        s = self.s
        pool, metrics = s.pool, s.metrics
        deadline = self.started + s.config.request_timeout
        try:
            if not await pool.acquire(deadline - time.perf_counter(), gone):
                metrics.cancelled.labels("disconnect").inc()
                return
        except Busy as e:
            await self._send_error(send, _busy(e))
            return
        job = pool.start(self.make_stream, cancel)
        s.jobs.add(job)
        try:
            await self._stream(send, job, deadline, gone)
        finally:
            s.jobs.discard(job)

    async def _stream(self, send, job, deadline, gone):
        s = self.s
        metrics = s.metrics
        encoder = make_encoder(self.fmt, s.sample_rate)
        media = "text/event-stream" if self.sse else (
            "application/octet-stream" if self.fmt == "raw" else encoder.media_type)
        total, index, started = 1, 0, False
        body = bytearray() if self.key else None
        audio_seconds = wall = 0.0
        n_tokens = 0
        while True:
            kind, value = await job.next(deadline - time.perf_counter(), gone)
            if kind == "start":
                total = value
                continue
            if kind == "segment":
                audio = value
                audio_seconds += audio.duration
                wall += audio.stats.get("wall_seconds", 0.0)
                n_tokens += int(audio.speech_tokens.size)
                samples = smooth_join(audio.samples, index, total, audio.sample_rate)
                index += 1
                chunk = encoder.feed(samples, last=index >= total)
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", media.encode()),
                                            (b"cache-control", b"no-store"),
                                            (b"x-cosyvino-cache", b"miss" if self.key
                                             else b"off")]})
                    started = True
                if chunk:
                    if body is not None:
                        body += chunk
                    await send({"type": "http.response.body", "body": self._frame(chunk),
                                "more_body": True})
                continue
            if kind == "end":
                tail = await run_in_threadpool(encoder.finish)  # mp3/flac/opus: off the loop
                if body is not None:
                    body += tail
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", media.encode())]})
                final = self._frame(tail)
                if self.sse:
                    usage = {"output_tokens": n_tokens, "total_tokens": n_tokens}
                    final += ("data: " + json.dumps({"type": "speech.audio.done",
                                                     "usage": usage}) + "\n\n").encode()
                await send({"type": "http.response.body", "body": final, "more_body": False})
                metrics.audio_seconds.inc(audio_seconds)
                if audio_seconds > 0:
                    metrics.rtf.observe(wall / audio_seconds)
                if body is not None and s.cache is not None:
                    await run_in_threadpool(s.cache.put, self.key, bytes(body))
                return
            # failure paths: the job is told to stop; its worker frees the session
            job.cancel.set()
            if kind in ("stopped", "cancelled"):
                metrics.cancelled.labels("disconnect").inc()
                return
            if kind == "timeout":
                metrics.cancelled.labels("timeout").inc()
                err = APIError(504, f"synthesis did not finish within "
                               f"{s.config.request_timeout:g} s", type_="server_error",
                               code="timeout")
            else:
                e = value
                err = (_input_error(e, "input", "voice") if isinstance(e, InputError) else
                       APIError(500, f"synthesis failed: {e}", type_="server_error",
                                code="synthesis_failed"))
            if not started:
                await self._send_error(send, err)
            elif self.sse:
                event = {"type": "error", "error": err.body()["error"]}
                await send({"type": "http.response.body",
                            "body": f"data: {json.dumps(event)}\n\n".encode(),
                            "more_body": False})
            # else: headers are out; returning without the final body message makes the
            # server drop the connection, so the client sees a truncated (failed) transfer
            return


# ---- app -------------------------------------------------------------------------------------
class AppState:
    def __init__(self, config: ServerConfig, synthesizers=None):
        self.config = config.validate()
        self.metrics = Metrics()
        self.pool = SynthesisPool(config, synthesizers, self.metrics)
        self.cache: ResultCache | None = None
        self.fingerprint = ""
        self.jobs: set = set()
        self.started_at = time.time()
        #: called (from the loader thread) with the exception when the model fails to load;
        #: :mod:`cosyvino.server.runner` sets it to stop the server
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


def create_app(config: ServerConfig, synthesizers=None) -> FastAPI:
    """The ASGI app. ``synthesizers``: preloaded ``Synthesizer`` objects (tests); otherwise
    the model is loaded in the background at startup (``/ready`` says when)."""
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
            # anything left past its timeout is cancelled.
            state.pool.draining = True
            for job in list(state.jobs):
                job.cancel.set()
            await run_in_threadpool(state.pool.shutdown, True)

    app = FastAPI(title="cosyvino", version=_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.cosyvino = state
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return APIError(exc.status_code, str(exc.detail),
                        code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, f"http_{exc.status_code}")).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return APIError(400, str(exc)).response()

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        log.exception("unhandled error")
        return APIError(500, f"internal error: {type(exc).__name__}",
                        type_="server_error").response()

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

    def pool_synth():
        try:
            return state.pool.synth
        except NotReady as e:
            raise _not_ready(e) from None

    async def start_synthesis(text, voice, speed, seed, fmt, sse, text_param, voice_param):
        """Validate (400), look up the cache, reserve a place (503), return the response."""
        started = time.perf_counter()
        synth = pool_synth()
        n_tokens = config.num_speech_tokens
        cancel = threading.Event()  # set on disconnect/timeout/shutdown: stops the worker
        try:
            pre = await run_in_threadpool(synth.stream, text, voice, speed=speed, seed=seed,
                                          num_speech_tokens=n_tokens, cancel=cancel)
        except InputError as e:
            raise _input_error(e, text_param, voice_param) from None
        key = None
        if seed is not None and state.cache is not None:
            key = cache_key(model=state.fingerprint, text=normalize_for_key(text), voice=voice,
                            speed=speed, format=fmt, seed=seed, tokens=n_tokens,
                            sampling=repr(synth.config.llm.sampling))
            data = await run_in_threadpool(state.cache.get, key)
            if data is not None:
                state.metrics.cache_hits.inc()
                return _cached_response(data, fmt, sse)
            state.metrics.cache_misses.inc()
        try:
            state.pool.enter()
        except Busy as e:
            raise _busy(e) from None
        except NotReady as e:
            raise _not_ready(e) from None
        used = []

        def make_stream(worker_synth):
            if worker_synth is synth and not used:
                used.append(True)
                return pre
            return worker_synth.stream(text, voice, speed=speed, seed=seed,
                                       num_speech_tokens=n_tokens, cancel=cancel)

        return SynthesisResponse(state, make_stream, cancel, fmt, sse, key, started)

    # ---- OpenAI-compatible -------------------------------------------------------------------
    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        check_auth(request)
        raw = await _read_body(request, config.max_body_bytes)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"malformed JSON body: {e}", code="invalid_json") from None
        synth = pool_synth()
        p = parse_speech_request(body, synth.speakers[0])
        return await start_synthesis(p.text, p.voice, p.speed, p.seed, p.fmt,
                                     p.stream_format == "sse", "input", "voice")

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        synth = pool_synth()
        import os

        name = os.path.basename(os.path.normpath(synth.model_dir)) or "cosyvoice"
        created = int(state.started_at)
        return {"object": "list", "data": [
            {"id": mid, "object": "model", "created": created, "owned_by": "cosyvino"}
            for mid in (name, *OPENAI_MODEL_ALIASES)]}

    @app.get("/v1/audio/voices")
    async def voices(request: Request):
        check_auth(request)
        synth = pool_synth()
        return {"object": "list", "voices": synth.speakers,
                "data": [{"id": v, "name": v, "object": "voice"} for v in synth.speakers]}

    # ---- CosyVoice-compatible ----------------------------------------------------------------
    @app.api_route("/inference_sft", methods=["GET", "POST"])
    async def inference_sft(request: Request):
        check_auth(request)
        params = dict(request.query_params)
        raw = await _read_body(request, config.max_body_bytes)
        ctype = request.headers.get("content-type", "")
        if raw:
            if ctype.startswith("multipart/form-data"):
                form = await _multipart(request, raw)
                params.update(form)
            elif ctype.startswith("application/json"):
                try:
                    obj = json.loads(raw)
                except ValueError as e:
                    raise APIError(400, f"malformed JSON body: {e}",
                                   code="invalid_json") from None
                if not isinstance(obj, dict):
                    raise APIError(400, "request body must be a JSON object")
                params.update({k: v for k, v in obj.items()})
            else:  # application/x-www-form-urlencoded (what the official client sends)
                try:
                    params.update(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
                except UnicodeDecodeError:
                    raise APIError(400, "form body is not UTF-8") from None
        text = params.get("tts_text")
        if text is None:
            raise APIError(400, "missing required parameter 'tts_text'", param="tts_text",
                           code="missing_required_parameter")
        if not isinstance(text, str):
            raise APIError(400, "'tts_text' must be a string", param="tts_text",
                           code="invalid_type")
        if len(text) > MAX_INPUT_CHARS:
            raise APIError(400, f"'tts_text' is {len(text)} characters; the limit is "
                           f"{MAX_INPUT_CHARS}", param="tts_text",
                           code="string_above_max_length")
        synth = pool_synth()
        voice = params.get("spk_id", synth.speakers[0])
        speed = _number(params.get("speed", 1.0), "speed")
        seed = params.get("seed")
        if seed is not None:
            try:
                seed = int(seed)
            except (TypeError, ValueError):
                raise APIError(400, "'seed' must be a non-negative integer", param="seed",
                               code="invalid_type") from None
        return await start_synthesis(text, str(voice), speed, seed, "raw", False, "tts_text",
                                     "spk_id")

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
                "in_flight": pool.running, "settings": config.source}
        if pool.load_error is not None:
            body["error"] = str(pool.load_error)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics")
    async def metrics_endpoint():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return app


def _number(value, name) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise APIError(400, f"'{name}' must be a number, got {value!r}", param=name,
                       code="invalid_type") from None
    if not (MIN_SPEED <= out <= MAX_SPEED):
        raise APIError(400, f"'{name}' must be between {MIN_SPEED} and {MAX_SPEED}, got "
                       f"{value}", param=name, code="invalid_value")
    return out


async def _multipart(request: Request, raw: bytes) -> dict:
    from starlette.requests import Request as StarletteRequest

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    replay = StarletteRequest(request.scope, receive)
    form = await replay.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _cached_response(data: bytes, fmt: str, sse: bool) -> Response:
    headers = {"x-cosyvino-cache": "hit"}
    if not sse:
        media = "application/octet-stream" if fmt == "raw" else CONTENT_TYPES[fmt]
        return Response(data, media_type=media, headers=headers)
    delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
    done = {"type": "speech.audio.done", "usage": {"output_tokens": 0, "total_tokens": 0}}
    body = f"data: {json.dumps(delta)}\n\ndata: {json.dumps(done)}\n\n".encode()
    return Response(body, media_type="text/event-stream", headers=headers)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("cosyvino")
    except Exception:  # noqa: BLE001
        return "0"


__all__ = ["create_app", "APIError", "CosyvinoError"]
