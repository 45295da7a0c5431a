"""``/v1/audio/speech/stream-input``: text in over a WebSocket, audio out as it is made (a voice
agent's chat LLM replying token by token; docs/server.md, "Text in over a WebSocket").

Protocol (client -> server, JSON text messages):

1. the start message: ``{"model", "voice", "response_format", "options": {...}}`` (``options``:
   ``speed``, ``seed``, ``hop_schedule``, ``n_timesteps``, ``instructions``, as the fields of
   ``POST /v1/audio/speech``; ``api_key`` may be given here by clients that cannot send
   headers, e.g. browsers);
2. ``{"text": "..."}`` pieces (cut anywhere), ``{"flush": true}`` ends the current utterance
   (a sentence: its rest is spoken now), ``{"close": true}`` ends the text; ``text`` and
   ``flush`` / ``close`` may share one message (the text goes first).

Server -> client: ``{"type": "started", "sample_rate", "response_format", "seed"}``, then binary
frames of encoded audio (the ``response_format`` byte stream, cut at chunk boundaries) and JSON
events: ``utterance_done`` (``utterance``: index, after its last audio frame),
``utterance_dropped`` (a flush with nothing speakable), finally ``done`` (``audio_seconds``,
``utterances``, ``speech_tokens``, ``stages``) and a normal close (1000). A failure is one
``error`` event (``{"type": "error", "status", "error": {"message", "type", "param",
"code"}}``: the status and body of the HTTP error the same problem gets) and a close with code
``4000 + status`` (4400 bad input, 4401 no or wrong API key, 4503 busy, 4504 timeout, 4500
synthesis failed).

Limits, as HTTP: the API key (``--api-key``: ``Authorization: Bearer`` / ``X-API-Key`` headers
or the start message's ``api_key``), admission (a place in the pool, 503 when full),
``--timeout`` from the start message to ``done`` (a client that never flushes or closes gets
``timeout``), at most ``MAX_INPUT_CHARS`` characters of text per connection, the same metrics
(``cosyvino_requests{endpoint,status}``, first-audio and duration histograms, audio seconds,
RTF, cancellations). Backpressure: while more than ``max_pending_tokens`` text tokens wait for
the LLM the server stops reading the socket (the client's sends block in its TCP window). A
disconnect cancels the synthesis (it stops within one stage call; the place is given back).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time

from fastapi import WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from ..errors import CosyvinoError, InputError, SynthesisCancelled
from ..text_stream import TextStream
from .config import MAX_INPUT_CHARS
from .encoding import make_encoder
from .errors import (APIError, busy_error, input_error, not_ready_error, synthesis_error,
                     timeout_error, too_long_error)
from .pool import Busy, NotReady, TooLong
from .schemas import SpeechBody, parse

log = logging.getLogger("cosyvino.server")

PATH = "/v1/audio/speech/stream-input"
#: the options of the start message (the other fields of ``POST /v1/audio/speech``)
OPTIONS = ("speed", "seed", "hop_schedule", "n_timesteps", "instructions")
#: the keys of a text message
MESSAGE_KEYS = frozenset({"text", "flush", "close"})
#: the default response format (headerless: each binary frame plays on its own)
DEFAULT_FORMAT = "pcm"
#: text tokens waiting for the LLM before the server stops reading the socket
MAX_PENDING_TOKENS = 256


def close_code(err: APIError) -> int:
    """The WebSocket close code of an error: 4000 + its HTTP status."""
    return 4000 + int(err.status)


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def start_params(message, has_header_key, check_key):
    """The start message -> ``(SpeechBody, api_key_ok)``. Raises APIError 400 (not a JSON
    object, unknown keys, a bad option) or 401 (no / wrong key)."""
    if not isinstance(message, dict):
        raise _bad("the first message must be a JSON object {model, voice, response_format, "
                   "options}", code="invalid_body")
    unknown = sorted(set(message) - {"model", "voice", "response_format", "options",
                                     "api_key"})
    if unknown:
        raise _bad(f"unknown field(s) in the start message: {', '.join(unknown)}",
                   param=unknown[0], code="unknown_parameter")
    options = message.get("options") or {}
    if not isinstance(options, dict):
        raise _bad("'options' must be a JSON object", param="options", code="invalid_type")
    extra = sorted(set(options) - set(OPTIONS))
    if extra:
        raise _bad(f"unknown option(s): {', '.join(extra)}; options are {', '.join(OPTIONS)}",
                   param=extra[0], code="unknown_parameter")
    if not has_header_key and not check_key(message.get("api_key")):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY' or "
                       "'api_key' in the start message)", code="invalid_api_key")
    body = {"input": "", "model": message.get("model"), "voice": message.get("voice"),
            "response_format": message.get("response_format") or DEFAULT_FORMAT, **options}
    return parse(SpeechBody, body)


def add_stream_input_route(app, state, has_key, check_key, default_voice, instruction_mode):
    """Register the WebSocket endpoint on ``app`` (see the module docstring). ``has_key``:
    whether a connection's headers carry the API key; ``check_key(key)``: whether a key given
    in the start message is right; ``default_voice(synth, mode)`` / ``instruction_mode(synth)``
    as in :mod:`.routes`."""

    @app.websocket(PATH)
    async def stream_input(ws: WebSocket):
        await ws.accept()
        session = _Session(state, ws, default_voice, instruction_mode)
        await session.run(has_key(ws), check_key)


class _Session:
    """One connection: start, feed, send, end."""

    def __init__(self, state, ws: WebSocket, default_voice, instruction_mode):
        self.s = state
        self.ws = ws
        self.default_voice = default_voice
        self.instruction_mode = instruction_mode
        self.started = time.perf_counter()
        self.deadline = self.started + state.config.request_timeout
        self.status = None  # the HTTP status the outcome is counted as
        self.first_audio = None
        self.stream: TextStream | None = None
        self.job = None
        self.gone = asyncio.Event()
        self.chars = 0

    # ---- outcome ----------------------------------------------------------------------------
    def _count(self) -> None:
        m = self.s.metrics
        status = str(self.status) if self.status else "aborted"
        m.requests.labels(PATH, status).inc()
        m.latency.labels(PATH).observe(time.perf_counter() - self.started)
        if self.first_audio is not None:
            m.first_byte.labels(PATH).observe(self.first_audio)

    async def _error(self, err: APIError) -> None:
        self.status = err.status
        try:
            await self.ws.send_json({"type": "error", "status": err.status,
                                     "error": err.body()["error"]})
            await self.ws.close(code=close_code(err), reason=err.code or "")
        except Exception:  # noqa: BLE001 - the client is gone already
            pass

    async def _receive_json(self, timeout: float):
        """The next message as JSON; APIError 400 for binary / non-JSON, 504 on timeout;
        WebSocketDisconnect when the client left."""
        try:
            msg = await asyncio.wait_for(self.ws.receive(), max(0.0, timeout))
        except asyncio.TimeoutError:
            raise timeout_error(self.s.config.request_timeout) from None
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        if msg.get("text") is None:
            raise _bad("messages must be JSON text, not binary", code="invalid_body")
        try:
            return json.loads(msg["text"])
        except ValueError as e:
            raise _bad(f"a message is not valid JSON: {e}", code="invalid_body") from None

    # ---- the connection ---------------------------------------------------------------------
    async def run(self, header_key: bool, check_key) -> None:
        try:
            try:
                body = start_params(await self._receive_json(self.deadline - time.perf_counter()),
                                    header_key, check_key)
                await self._start(body)
            except APIError as err:
                await self._error(err)
                return
            except WebSocketDisconnect:
                return
            sender = asyncio.ensure_future(self._send_audio())
            reader = asyncio.ensure_future(self._read_text())
            try:
                await self._until_done(sender, reader)
            finally:
                reader.cancel()
                sender.cancel()
                if self.stream is not None:
                    self.stream.cancel()  # no-op when finished
        finally:
            self._count()

    async def _start(self, body) -> None:
        s = self.s
        synth = s.synth()
        p = body.params(None)
        mode = None
        if p.instruction is not None:
            mode = self.instruction_mode(synth)
            if mode is None:
                raise _bad("'instructions' needs a model with a mode that follows "
                           "instructions; this model's modes: " + ", ".join(synth.modes),
                           param="instructions", code="unsupported_mode")
            p = dataclasses.replace(p, mode=mode.name)
        if p.voice is None:
            p = dataclasses.replace(p, voice=self.default_voice(synth, mode))
        if not getattr(synth.family, "text_in", False):
            raise _bad(f"this model ({synth.family.name}) takes no streamed text; text in needs "
                       "a CosyVoice2/3 model", code="unsupported_model")
        request = dataclasses.replace(p.request(None), text_stream=True)
        try:
            request, _ = await run_in_threadpool(s.pool.validate, request)
        except InputError as e:
            raise input_error(e, "text", "voice", dict(p.fields)) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        except CosyvinoError as e:
            raise synthesis_error(e, "text", "voice") from None
        try:
            s.pool.enter(request, 1, self.started)
        except Busy as e:
            raise busy_error(e) from None
        except TooLong as e:
            raise too_long_error(e, "text", None) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        cancel = threading.Event()
        if not await s.pool.acquire(self.deadline - time.perf_counter(), self.gone):
            raise WebSocketDisconnect(1001)
        try:
            self.job = await s.pool.start(request, cancel)
        except Busy as e:
            raise busy_error(e) from None
        except NotReady as e:
            raise not_ready_error(e) from None
        except Exception as e:  # noqa: BLE001 - a submit the scheduler refused
            raise synthesis_error(e, "text", "voice") from None
        self.stream = TextStream(self.job.handle, max_pending_tokens=MAX_PENDING_TOKENS)
        self.fmt = p.fmt
        await self.ws.send_json({"type": "started", "sample_rate": synth.sample_rate,
                                 "response_format": p.fmt, "seed": request.seed})

    async def _read_text(self) -> None:
        """Client messages -> the text stream, until ``close``. Raises APIError (bad message)
        or WebSocketDisconnect."""
        stream = self.stream
        while True:
            msg = await self._receive_json(self.deadline - time.perf_counter())
            if not isinstance(msg, dict) or not msg or set(msg) - MESSAGE_KEYS:
                raise _bad('text messages are {"text": str}, {"flush": true} or '
                           '{"close": true}', code="invalid_body")
            text = msg.get("text")
            if text is not None:
                if not isinstance(text, str):
                    raise _bad("'text' must be a string", param="text", code="invalid_type")
                self.chars += len(text)
                if self.chars > MAX_INPUT_CHARS:
                    raise _bad(f"more than {MAX_INPUT_CHARS} characters of text on one "
                               "connection", param="text", code="input_too_long")
                try:  # off the loop: blocks while the LLM is behind (backpressure)
                    await run_in_threadpool(stream.send, text,
                                            max(0.0, self.deadline - time.perf_counter()))
                except TimeoutError:
                    raise timeout_error(self.s.config.request_timeout) from None
            for key in ("flush", "close"):
                if key in msg and not isinstance(msg[key], bool):
                    raise _bad(f"'{key}' must be true or false", param=key,
                               code="invalid_type")
            if msg.get("close"):
                await run_in_threadpool(stream.close)
                return
            if msg.get("flush"):
                if not await run_in_threadpool(stream.flush):
                    await self.ws.send_json({"type": "utterance_dropped",
                                             "reason": "nothing speakable"})

    async def _watch_disconnect(self) -> None:
        """After ``close``: only a disconnect (or a stray message) is read."""
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))

    async def _until_done(self, sender, reader) -> None:
        s = self.s
        watcher = None
        try:
            while True:
                waiting = {sender, reader} if watcher is None else {sender, watcher}
                done, _ = await asyncio.wait(waiting, timeout=max(0.0, self.deadline
                                                                  - time.perf_counter()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    s.metrics.cancelled.labels("timeout").inc()
                    await self._error(timeout_error(s.config.request_timeout))
                    return
                if reader in done and watcher is None:
                    exc = reader.exception()
                    if exc is None:  # closed by the client: watch for a disconnect
                        watcher = asyncio.ensure_future(self._watch_disconnect())
                        continue
                    await self._failed(exc)
                    return
                if watcher is not None and watcher in done:
                    await self._failed(watcher.exception())
                    return
                if sender in done:
                    exc = sender.exception()
                    if exc is not None:
                        await self._failed(exc)
                    return
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _failed(self, exc) -> None:
        self.stream.cancel()
        m = self.s.metrics
        if isinstance(exc, WebSocketDisconnect):
            self.gone.set()
            m.cancelled.labels("disconnect").inc()
            return
        if isinstance(exc, APIError):
            if exc.code == "timeout":
                m.cancelled.labels("timeout").inc()
            await self._error(exc)
            return
        log.error("stream-input failed", exc_info=exc)
        await self._error(synthesis_error(exc, "text", "voice"))

    async def _send_audio(self) -> None:
        """Job events -> binary frames and JSON events; the ``done`` event and close at the
        end. Raises APIError for a failed synthesis."""
        s, job = self.s, self.job
        encoder = make_encoder(self.fmt, s.sample_rate)
        audio_seconds, tokens, utterances = 0.0, 0, 0
        stages: dict = {}
        try:
            while True:
                kind, value = await job.next(self.deadline - time.perf_counter(), self.gone)
                if kind == "segment":
                    chunk = await run_in_threadpool(encoder.feed, value.samples, False)
                    if chunk:
                        await self.ws.send_bytes(chunk)
                    if self.first_audio is None:
                        self.first_audio = time.perf_counter() - self.started
                    audio_seconds += value.duration
                    tokens += int(value.speech_tokens.size)
                    for name, st in (value.stats.get("stages") or {}).items():
                        total = stages.setdefault(name, {"seconds": 0.0, "calls": 0})
                        total["seconds"] = round(total["seconds"] + st.get("seconds", 0.0), 6)
                        total["calls"] += int(st.get("calls", 0))
                    if value.stats.get("is_last_in_segment"):
                        await self.ws.send_json({"type": "utterance_done",
                                                 "utterance": int(value.stats["segment"])})
                        utterances += 1
                    continue
                if kind == "end":
                    tail = await run_in_threadpool(encoder.finish)
                    if tail:
                        await self.ws.send_bytes(tail)
                    s.metrics.audio_seconds.inc(audio_seconds)
                    if audio_seconds > 0:
                        s.metrics.rtf.observe((time.perf_counter() - self.started)
                                              / audio_seconds)
                    self.status = 200
                    await self.ws.send_json({"type": "done", "audio_seconds":
                                             round(audio_seconds, 4), "utterances": utterances,
                                             "speech_tokens": tokens, "stages": stages})
                    await self.ws.close(code=1000)
                    return
                if kind == "timeout":
                    raise timeout_error(s.config.request_timeout)
                if kind == "stopped":
                    raise WebSocketDisconnect(1001)
                if kind == "cancelled":
                    raise WebSocketDisconnect(1001) if self.gone.is_set() else busy_error(
                        Busy("synthesis was cancelled", retry_after=5))
                if isinstance(value, SynthesisCancelled):
                    raise WebSocketDisconnect(1001)
                raise synthesis_error(value, "text", "voice")
        finally:
            encoder.close()
