"""The streaming response of a synthesis: waits for a slot in the pool, runs the request on the
engine's scheduler and sends each audio chunk as it is ready (raw bytes or OpenAI server-sent
events), and the response of a cache hit.

A stream that must end after its headers went out (timeout, synthesis failure, shutdown) is
*cut* so that the client can tell (docs/server.md, "Streams that are cut"): SSE gets an
``error`` event; every other format's chunked body is aborted without its terminating
zero-length chunk, which HTTP/1.1 clients report as an error (curl exit 18, httpx
``RemoteProtocolError``, requests ``ChunkedEncodingError``). Each cut is logged (one WARNING,
with the request's context; uvicorn's ERROR for the unfinished body is muted,
:class:`~.logs.DeliberateCutFilter`) and counted in
``cosyvino_streams_cut_total{endpoint,reason}``; the cut request's slot is free before the
client sees the cut (:meth:`~.pool.SynthesisPool.detach`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time

import numpy as np
from fastapi.responses import Response
from prometheus_client import Counter
from starlette.concurrency import run_in_threadpool

from ..request import SynthesisRequest
from .encoding import (CONTENT_TYPES, chunk_position, encode_file, make_encoder, smooth_join,
                       wire_rate)
from .errors import APIError, busy_error, not_ready_error, synthesis_error, timeout_error
from .logs import mark_deliberate_cut
from .pool import Busy, NotReady
from .schemas import SpeechParams

log = logging.getLogger("cosyvino.server")

#: why a stream was cut after its headers went out (``reason`` label of the cut counter)
CUT_REASONS = ("timeout", "error", "shutdown", "cancelled")
#: ASGI scope key set to the cut reason, for middleware that labels responses
SCOPE_CUT_KEY = "cosyvino.cut"
#: the response header giving the Hz of the audio in the body (:func:`~.encoding.wire_rate`;
#: what a client of the headerless ``raw`` of the CosyVoice-compatible endpoints needs: 22050
#: for CosyVoice v1, 24000 for CosyVoice2)
SAMPLE_RATE_HEADER = "x-sample-rate"


def streams_cut(metrics):
    """The ``cosyvino_streams_cut_total{endpoint, reason}`` counter of ``metrics`` (its own
    registry): ``metrics.streams_cut`` when :class:`~.metrics.Metrics` defines it, otherwise
    created there on first use."""
    counter = getattr(metrics, "streams_cut", None)
    if counter is None:
        counter = Counter("cosyvino_streams_cut", "Responses cut after their headers went out "
                          "(SSE error event or aborted chunked body)", ["endpoint", "reason"],
                          registry=metrics.registry)
        metrics.streams_cut = counter
    return counter


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


def sse_done(n_tokens: int, stages: dict | None = None) -> bytes:
    """``speech.audio.done`` event with the usage (speech tokens) and, as a cosyvino extension
    OpenAI clients ignore, ``stages``: per-stage ``{"seconds", "calls"}`` of the synthesis
    (summed over its chunks, :class:`cosyvino.timing.StageTimes` names; absent for a cached
    answer)."""
    event = {"type": "speech.audio.done",
             "usage": {"output_tokens": n_tokens, "total_tokens": n_tokens}}
    if stages:
        event["stages"] = stages
    return sse_event(event)


def cached_response(data: bytes, fmt: str, sse: bool, sample_rate: int) -> Response:
    """A cache hit: the whole body at once (one delta event for SSE); ``data`` is a complete
    file (:func:`cache_entry`) of a model at ``sample_rate`` Hz."""
    headers = {"x-cosyvino-cache": "hit", SAMPLE_RATE_HEADER: str(wire_rate(fmt, sample_rate))}
    if not sse:
        return Response(data, media_type=media_type(fmt, False), headers=headers)
    return Response(sse_delta(data) + sse_done(0), media_type="text/event-stream",
                    headers=headers)


def cache_entry(fmt: str, sample_rate: int, encoder, body: bytes, sent: list) -> bytes:
    """What the result cache keeps for a response: a complete file (real lengths in its header,
    docs/server.md "Complete files and streams"), since a hit has the whole audio before it sends.

    Args:
        fmt: the response format; sample_rate: Hz of the float samples.
        encoder: the response's finished encoder; body: the bytes it sent.
        sent: the float32 [S] chunks it was fed, in order.

    Returns ``body`` itself when the response already was a complete file (one chunk, or a
    headerless format), else the complete file of the same samples
    (:func:`~.encoding.encode_file`).
    """
    if encoder.complete:
        return body
    samples = np.concatenate(sent) if sent else np.zeros(0, np.float32)
    return encode_file(fmt, samples, sample_rate)


class SynthesisResponse(Response):
    """Runs one synthesis on the pool and streams it; owns the whole request lifetime.

    Waits for a slot (queue), submits the request to the scheduler, waits for the first
    audio chunk before sending headers (so a failure there is still a proper error status),
    then encodes and sends each chunk as it is ready (joins faded by
    :func:`~.encoding.smooth_join`, positions from :func:`~.encoding.chunk_position`). A
    disconnect, the timeout or a failure ends the wait: the request is detached from the pool
    (:meth:`~.pool.SynthesisPool.detach`: cancelled, its slot free at once, its worker stops
    at its next stage call). A failure after the headers cuts the stream (module
    docstring).

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
        self._headers_sent = False
        self._scope: dict | None = None

    async def __call__(self, scope, receive, send):
        self._scope = scope
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
        except asyncio.CancelledError:
            # the ASGI server cancels requests still open when its graceful shutdown runs out
            # (after our drain): one that sent nothing yet still gets the documented 503
            if not self._headers_sent and not gone.is_set():
                try:
                    await self._send_error(send, busy_error(Busy(
                        "server is shutting down", retry_after=5, reason="draining")))
                except Exception:  # noqa: BLE001 - the connection may be gone already
                    pass
            raise
        finally:
            cancel.set()  # anything still running for us stops now (no-op when finished)
            listener.cancel()

    async def _send_error(self, send, err: APIError):
        self._headers_sent = True
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
                                                         self.params.voice_param,
                                                         dict(self.params.fields)))
            return
        await self._stream(send, job, deadline, gone)

    async def _stream(self, send, job, deadline, gone):
        encoder = make_encoder(self.fmt, self.s.sample_rate)
        progress = _Progress(job.total)
        try:
            await self._pump(send, job, deadline, gone, encoder, progress)
        finally:
            encoder.close()  # a cut stream's encoder (no-op once finished)
            if not job.completed:  # we stop waiting for it: its slot goes back now
                self.s.pool.detach(job)

    async def _start(self, send, media: str) -> None:
        self._headers_sent = True
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", media.encode()),
                                (b"cache-control", b"no-store"),
                                (SAMPLE_RATE_HEADER.encode(),
                                 str(wire_rate(self.fmt, self.s.sample_rate)).encode()),
                                (b"x-cosyvino-cache", b"miss" if self.key else b"off")]})

    async def _pump(self, send, job, deadline, gone, encoder, progress: "_Progress"):
        s = self.s
        metrics = s.metrics
        media = media_type(self.fmt, self.sse, encoder)
        total = job.total
        body = bytearray() if self.key else None
        sent: list = []  # the float chunks fed, while caching (the cache's complete file)
        while True:
            kind, value = await job.next(deadline - time.perf_counter(), gone)
            if kind == "segment":
                audio = value
                seg, index, last_in_segment = chunk_position(audio.stats, progress.segments)
                samples = smooth_join(audio.samples, seg, total, audio.sample_rate,
                                      first=index == 0, last=last_in_segment)
                last = last_in_segment and seg >= total - 1
                try:  # off the loop: mp3/opus/aac/flac encoding, soxr resampling
                    chunk = await run_in_threadpool(encoder.feed, samples, last)
                except Exception as e:  # noqa: BLE001 - an encoder failure ends the stream
                    log.exception("encoding %s failed", self.fmt)
                    kind, value = "error", e
                else:
                    if body is not None:
                        sent.append(samples)
                    progress.add(audio, last_in_segment)
                    if not progress.started:
                        await self._start(send, media)
                        progress.started = True
                    if chunk:
                        if body is not None:
                            body += chunk
                        await send({"type": "http.response.body", "body": self._frame(chunk),
                                    "more_body": True})
                    continue
            if kind == "end":
                try:
                    tail = await run_in_threadpool(encoder.finish)
                except Exception as e:  # noqa: BLE001
                    log.exception("encoding %s failed", self.fmt)
                    kind, value = "error", e
                else:
                    if body is not None:
                        body += tail
                    if not progress.started:
                        await self._start(send, media)
                        progress.started = True
                    final = self._frame(tail)
                    if self.sse:
                        final += sse_done(progress.tokens, progress.stages)
                    await send({"type": "http.response.body", "body": final,
                                "more_body": False})
                    metrics.audio_seconds.inc(progress.audio_seconds)
                    if progress.audio_seconds > 0:
                        metrics.rtf.observe(progress.wall / progress.audio_seconds)
                    if body is not None and s.cache is not None:
                        try:
                            entry = await run_in_threadpool(cache_entry, self.fmt,
                                                            s.sample_rate, encoder,
                                                            bytes(body), sent)
                        except Exception:  # noqa: BLE001 - the response is complete already
                            log.exception("encoding the cached %s file failed", self.fmt)
                        else:
                            await run_in_threadpool(s.cache.put, self.key, entry)
                    return
            await self._fail(send, job, kind, value, gone, progress)
            return

    async def _fail(self, send, job, kind: str, value, gone, progress: "_Progress"):
        """The request ends early: it is told to stop and its slot goes back at once
        (:meth:`~.pool.SynthesisPool.detach`: the client that sees the cut can be answered by
        a free server); before the headers a real error status goes out, after them the
        stream is cut (SSE ``error`` event; other formats: the body is aborted without its
        terminating chunk, and uvicorn's report of that is muted, :mod:`.logs`)."""
        s, metrics = self.s, self.s.metrics
        s.pool.detach(job)
        if kind == "stopped" or gone.is_set():
            metrics.cancelled.labels("disconnect").inc()  # nobody is left to tell
            return
        if kind == "timeout":
            metrics.cancelled.labels("timeout").inc()
            err, reason = timeout_error(s.config.request_timeout), "timeout"
        elif kind == "cancelled":  # stopped by the server, not by the client
            reason = "shutdown" if s.pool.draining else "cancelled"
            err = busy_error(Busy("server is shutting down" if reason == "shutdown"
                                  else "synthesis was cancelled", retry_after=5,
                                  reason="draining" if reason == "shutdown" else "queue_full"))
        else:
            reason = "error"
            err = synthesis_error(value, self.params.text_param, self.params.voice_param,
                                  dict(self.params.fields))
        if not progress.started:
            await self._send_error(send, err)
            return
        self._record_cut(reason, err, progress)
        if self.sse:
            await send({"type": "http.response.body",
                        "body": sse_event({"type": "error", "error": err.body()["error"]}),
                        "more_body": False})
            return
        # else: returning without the final body message makes the server close the
        # connection without the terminating chunk: the client sees an incomplete body. ASGI
        # has no message for that; uvicorn logs it as an ERROR, which this mark mutes
        mark_deliberate_cut(reason)

    def _record_cut(self, reason: str, err, progress: "_Progress") -> None:
        scope = self._scope
        endpoint = scope.get("path", "") if scope is not None else ""
        if scope is not None:
            scope[SCOPE_CUT_KEY] = reason
        streams_cut(self.s.metrics).labels(endpoint, reason).inc()
        self.s.metrics.audio_seconds.inc(progress.audio_seconds)
        # voice conversion has no text: its size is the source recording
        size = f"{len(self.params.text)} characters" if self.params.source_audio is None \
            else f"{len(self.params.source_audio)} bytes of source audio"
        log.warning("stream cut (%s): %s %s, %s, %.2f s of audio sent in %d "
                    "chunk(s), %d/%d segment(s) done, %.1f s after arrival: %s",
                    reason, endpoint, self.fmt + (" sse" if self.sse else ""),
                    size, progress.audio_seconds, progress.chunks,
                    progress.segments, progress.total, time.perf_counter() - self.started,
                    err.message)


class _Progress:
    """What a response has sent so far (for the log of a cut, metrics and SSE usage)."""

    def __init__(self, total: int):
        self.total = total
        self.started = False      # headers sent
        self.chunks = 0
        self.segments = 0         # segments whose last chunk went out
        self.audio_seconds = 0.0
        self.wall = 0.0
        self.tokens = 0
        self.stages: dict[str, dict] = {}  # summed Audio.stats["stages"] of the chunks

    def add(self, audio, last_in_segment: bool) -> None:
        for name, st in (audio.stats.get("stages") or {}).items():
            total = self.stages.setdefault(name, {"seconds": 0.0, "calls": 0})
            total["seconds"] = round(total["seconds"] + float(st.get("seconds", 0.0)), 6)
            total["calls"] += int(st.get("calls", 0))
        self.chunks += 1
        self.segments += int(last_in_segment)
        self.audio_seconds += audio.duration
        self.wall += audio.stats.get("wall_seconds", 0.0)
        self.tokens += int(audio.speech_tokens.size)
