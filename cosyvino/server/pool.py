"""Bounded pool of synthesis sessions: admission (queue + 503), worker threads, cancellation.

* ``max_sessions`` worker threads run syntheses; each request gets its own LLM session (KV
  cache) from the backend, so requests never share decoding state.
* Model memory: a backend whose stages are thread-safe per call (``Stages.thread_safe``, e.g.
  torch) is loaded ONCE and shared by all workers (``Synthesizer(max_parallel=N)``); any other
  backend gets one loaded ``Synthesizer`` per worker.
* Admission happens on the event loop: at most ``max_sessions`` running plus ``queue_size``
  waiting; one more raises :class:`Busy` (the app answers 503 + Retry-After).
* A job streams segments back to the event loop through an ``asyncio.Queue``; setting its
  ``cancel`` event (client gone, timeout, shutdown) stops it at the next speech token, and the
  session slot is released by the worker thread itself when it has really stopped.
"""

from __future__ import annotations

import asyncio
import logging
import queue as thread_queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..errors import SynthesisCancelled

log = logging.getLogger("cosyvino.server")


class Busy(Exception):
    """Queue full (or no slot within the time limit): answer 503 with ``retry_after``."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class SynthesisPool:
    """Loads the model(s) and runs synthesis jobs on a bounded set of worker threads.

    Args:
        config: a :class:`~cosyvino.server.config.ServerConfig`.
        synthesizers: already loaded synthesizers to use instead of loading (tests): one shared
            (thread-safe backend) or one per worker.
        metrics: a :class:`~cosyvino.server.metrics.Metrics` (gauges for queue and in-flight).
    """

    def __init__(self, config, synthesizers=None, metrics=None):
        self.config = config
        self.metrics = metrics
        self.synths: list = list(synthesizers or [])
        self._free: thread_queue.SimpleQueue = thread_queue.SimpleQueue()
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.draining = False
        self._executor = ThreadPoolExecutor(max_workers=config.max_sessions,
                                            thread_name_prefix="cosyvino-synth")
        self._admitted = 0      # running + waiting (event-loop thread only)
        self._waiting = 0
        self._running = 0       # worker threads busy (any thread; guarded by _lock)
        self._lock = threading.Lock()
        self._sem: asyncio.Semaphore | None = None
        self._avg_job_seconds = 2.0

    # ---- loading -----------------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        return len(self.synths) == 1

    @property
    def synth(self):
        """A loaded synthesizer (speakers, sample rate, frontend, validation)."""
        if not self.synths:
            raise NotReady(self.load_error and f"model failed to load: {self.load_error}"
                           or "model is loading")
        return self.synths[0]

    def load(self) -> None:
        """Load (unless given) and warm up; sets :attr:`ready`. Blocking; run off the loop."""
        try:
            if not self.synths:
                self.synths = self._load_synthesizers()
            for s in self.synths:
                self._free.put(s)
            if self.config.warmup:
                start = time.perf_counter()
                s = self.synths[0]
                s.synthesize("Hello.", s.speakers[0], seed=0, num_speech_tokens=4)
                log.info("warm-up synthesis %.2f s", time.perf_counter() - start)
            self.ready.set()
        except BaseException as e:  # noqa: BLE001 - reported by /ready and every request
            self.load_error = e
            log.error("model failed to load: %s", e)

    def _load_synthesizers(self) -> list:
        from ..synthesizer import Synthesizer

        c = self.config
        n = c.max_sessions
        start = time.perf_counter()
        first = Synthesizer(c.model_dir, backend=c.backend, num_threads=c.threads,
                            **c.backend_options)
        if n == 1:
            out = [first]
        elif getattr(first.stages, "thread_safe", False):
            # One model in memory shared by all workers; segments run in parallel.
            first.set_max_parallel(n)
            out = [first]
        else:
            out = [first] + [Synthesizer(c.model_dir, backend=c.backend,
                                         num_threads=c.threads, **c.backend_options)
                             for _ in range(n - 1)]
        log.info("loaded %d model instance(s) for %d session(s) on %s in %.1f s", len(out), n,
                 c.backend, time.perf_counter() - start)
        return out

    # ---- admission (event loop) --------------------------------------------------------------
    def enter(self) -> None:
        """Reserve a place (running or queued) or raise :class:`Busy`/:class:`NotReady`."""
        if self.draining:
            raise Busy("server is shutting down", retry_after=5)
        if not self.ready.is_set():
            raise NotReady(f"model failed to load: {self.load_error}" if self.load_error
                           else "model is loading; retry shortly")
        limit = self.config.max_sessions + self.config.queue_size
        if self._admitted >= limit:
            raise Busy(f"server busy: {self.config.max_sessions} session(s) running and "
                       f"{self.config.queue_size} request(s) queued; retry later",
                       retry_after=self.retry_after())
        self._admitted += 1

    def leave(self) -> None:
        """Give back a place reserved by :meth:`enter` that never got a session."""
        self._admitted -= 1

    def retry_after(self) -> int:
        waves = 1 + self.config.queue_size / max(1, self.config.max_sessions)
        return max(1, min(60, int(round(self._avg_job_seconds * waves))))

    async def acquire(self, timeout: float, stop: asyncio.Event) -> bool:
        """Wait for a free session (after :meth:`enter`). False when ``stop`` fired first;
        raises :class:`Busy` on timeout. Either way the place is then given back."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.config.max_sessions)
        self._waiting += 1
        self._gauges()
        get = asyncio.ensure_future(self._sem.acquire())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({get, stopped}, timeout=max(0.0, timeout),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting -= 1
            stopped.cancel()
            self._gauges()
        if get in done:
            return True
        get.cancel()
        try:
            await get  # it may have completed right as we cancelled it
            self._sem.release()
        except asyncio.CancelledError:
            pass
        self.leave()
        if stopped in done:
            return False
        raise Busy("no session became free within the request timeout",
                   retry_after=self.retry_after())

    def _release(self) -> None:
        self._admitted -= 1
        if self._sem is not None:
            self._sem.release()
        self._gauges()

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self._waiting)
            self.metrics.in_flight.set(self._running)

    # ---- jobs --------------------------------------------------------------------------------
    def start(self, make_stream: Callable, cancel: threading.Event) -> "Job":
        """Run ``make_stream(synthesizer)`` (-> SegmentStream) on a worker, after
        :meth:`acquire` returned True. Returns the :class:`Job` to read segments from."""
        loop = asyncio.get_running_loop()
        job = Job(loop, cancel)
        with self._lock:
            self._running += 1
        self._gauges()
        self._executor.submit(self._run, job, make_stream)
        return job

    def _run(self, job: "Job", make_stream: Callable) -> None:
        start = time.perf_counter()
        synth = self._free.get() if not self.shared else self.synths[0]
        try:
            stream = make_stream(synth)
            job.emit("start", stream.total)
            try:
                for audio in stream:
                    job.emit("segment", audio)
            finally:
                stream.close()
            job.emit("end", None)
        except SynthesisCancelled:
            if self.metrics is not None:
                self.metrics.stopped_early.inc()
            job.emit("cancelled", None)
        except BaseException as e:  # noqa: BLE001 - handed to the request
            log.exception("synthesis failed")
            job.emit("error", e)
        finally:
            if not self.shared:
                self._free.put(synth)
            elapsed = time.perf_counter() - start
            self._avg_job_seconds = 0.8 * self._avg_job_seconds + 0.2 * elapsed
            with self._lock:
                self._running -= 1
            if self.metrics is not None:
                self.metrics.in_flight.set(self._running)
            try:
                job.loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # loop already closed (shutdown)
                pass
            job.finished.set()

    @property
    def running(self) -> int:
        return self._running

    def shutdown(self, wait: bool = True) -> None:
        self.draining = True
        self._executor.shutdown(wait=wait, cancel_futures=True)


class Job:
    """One request's synthesis, as seen from the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        self.loop = loop
        self.cancel = cancel
        self.items: asyncio.Queue = asyncio.Queue()
        self.finished = threading.Event()

    def emit(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel.set()

    async def next(self, timeout: float, stop: asyncio.Event):
        """The next (kind, value); ("timeout", None) or ("stopped", None) otherwise."""
        get = asyncio.ensure_future(self.items.get())
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({get, stopped}, timeout=max(0.0, timeout),
                                     return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if get in done:
            return get.result()
        get.cancel()
        return ("stopped", None) if stopped in done else ("timeout", None)
