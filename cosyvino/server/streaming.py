"""The streaming response of a synthesis: waits for a slot in the pool, runs the request on the
engine's scheduler and sends each segment as it is ready (raw bytes or OpenAI server-sent
events), and the response of a cache hit."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..request import SynthesisRequest
from .encoding import CONTENT_TYPES, make_encoder, smooth_join
from .errors import APIError, busy_error, not_ready_error, synthesis_error, timeout_error
from .pool import Busy, NotReady
from .schemas import SpeechParams


def media_type(fmt: str, sse: bool, encoder=None) -> str:
    """Content-Type of a response in ``fmt`` (``raw``: octet-stream; SSE: event-stream)."""
    if sse:
        return "text/event-stream"
    if fmt == "raw":
        return "application/octet-stream"
    return encoder.media_type if encoder is not None else CONTENT_TYPES[fmt]


def sse_event(event: dict) -> bytes:
    """One server-sent event carrying ``event`` as JSON."""
    return f"data: {json.dumps(event)}\n\n".encode()


def sse_delta(chunk: bytes) -> bytes:
    """``speech.audio.delta`` event with ``chunk`` base64-encoded."""
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()})


def sse_done(n_tokens: int) -> bytes:
    """``speech.audio.done`` event with the usage (speech tokens)."""
    return sse_event({"type": "speech.audio.done",
                      "usage": {"output_tokens": n_tokens, "total_tokens": n_tokens}})


def cached_response(data: bytes, fmt: str, sse: bool) -> Response:
    """A cache hit: the whole body at once (one delta event for SSE)."""
    headers = {"x-cosyvino-cache": "hit"}
    if not sse:
        return Response(data, media_type=media_type(fmt, False), headers=headers)
    return Response(sse_delta(data) + sse_done(0), media_type="text/event-stream",
                    headers=headers)


class SynthesisResponse(Response):
    """Runs one synthesis on the pool and streams it; owns the whole request lifetime.

    Waits for a slot (queue), submits the request to the scheduler, waits for the first
    segment before sending headers (so a failure there is still a proper error status), then
    sends each segment as it is ready. A disconnect or the timeout sets the request's cancel
    event; the scheduler stops it before its next step and the pool frees the slot when the
    worker reports it stopped.

    Args:
        app_state: the app's :class:`~cosyvino.server.routes.AppState` (pool, metrics, config,
            cache).
        request: the validated engine request (:meth:`SynthesisPool.prepare`).
        params: what the client asked for (format, SSE, field names for errors).
        key: the result-cache key (seeded requests with a cache), else None.
        started: ``time.perf_counter()`` at arrival (the timeout counts from there).
    """

    def __init__(self, app_state, request: SynthesisRequest, params: SpeechParams,
                 key: str | None, started: float):
        super().__init__()
        self.s = app_state
        self.request = request
        self.params = params
        self.fmt = params.fmt
        self.sse = params.sse
        self.key = key
        self.started = started
        self.cancel = threading.Event()  # disconnect / timeout / shutdown: stops the request

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
            await self._run(send, gone)
        finally:
            cancel.set()  # anything still running for us stops now (no-op when finished)
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
        return sse_delta(chunk)

    async def _run(self, send, gone):
        pool, metrics = self.s.pool, self.s.metrics
        deadline = self.started + self.s.config.request_timeout
        try:
            if not await pool.acquire(deadline - time.perf_counter(), gone):
                metrics.cancelled.labels("disconnect").inc()
                return
            job = await pool.start(self.request, self.cancel)
        except Busy as e:
            await self._send_error(send, busy_error(e))
            return
        except NotReady as e:
            await self._send_error(send, not_ready_error(e))
            return
        except Exception as e:  # noqa: BLE001 - a submit the scheduler refused
            await self._send_error(send, synthesis_error(e, self.params.text_param,
                                                         self.params.voice_param))
            return
        await self._stream(send, job, deadline, gone)

    async def _stream(self, send, job, deadline, gone):
        s = self.s
        metrics = s.metrics
        encoder = make_encoder(self.fmt, s.sample_rate)
        media = media_type(self.fmt, self.sse, encoder)
        total, index, started = job.total, 0, False
        body = bytearray() if self.key else None
        audio_seconds = wall = 0.0
        n_tokens = 0
        while True:
            kind, value = await job.next(deadline - time.perf_counter(), gone)
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
                    final += sse_done(n_tokens)
                await send({"type": "http.response.body", "body": final, "more_body": False})
                metrics.audio_seconds.inc(audio_seconds)
                if audio_seconds > 0:
                    metrics.rtf.observe(wall / audio_seconds)
                if body is not None and s.cache is not None:
                    await run_in_threadpool(s.cache.put, self.key, bytes(body))
                return
            # failure paths: the request is told to stop; its worker frees the slot
            job.cancel.set()
            if kind in ("stopped", "cancelled"):
                metrics.cancelled.labels("disconnect").inc()
                return
            if kind == "timeout":
                metrics.cancelled.labels("timeout").inc()
                err = timeout_error(s.config.request_timeout)
            else:
                err = synthesis_error(value, self.params.text_param, self.params.voice_param)
            if not started:
                await self._send_error(send, err)
            elif self.sse:
                await send({"type": "http.response.body",
                            "body": sse_event({"type": "error", "error": err.body()["error"]}),
                            "more_body": False})
            # else: headers are out; returning without the final body message makes the
            # server drop the connection, so the client sees a truncated (failed) transfer
            return
