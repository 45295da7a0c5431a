"""Admission of synthesis requests (queue + 503) in front of the engine's scheduler.

* The running is done by ONE :class:`cosyvino.engine.Scheduler` over the loaded model(s): a
  backend whose stages are thread-safe per call (``Stages.thread_safe``, e.g. torch) is loaded
  ONCE and its engine gets all ``max_sessions`` workers (``Synthesizer(max_parallel=N)``,
  scheduler over ``[engine] * N``); any other backend gets one loaded ``Synthesizer`` per
  worker (scheduler over ``[s.engine for s in synths]``). Each request has its own program and
  LLM session (KV cache), so requests never share decoding state.
* Admission happens on the event loop: at most ``max_sessions`` requests are in the scheduler
  (one slot each) plus ``queue_size`` waiting for a slot; one more raises :class:`Busy` (the
  app answers 503 + Retry-After). Bounding what reaches the scheduler keeps its round-robin
  from spreading the model over every queued request (each would slow down, none would finish
  sooner).
* A :class:`Job` brings a request's chunks from the scheduler's worker threads to the event loop
  (the handle's callback posts them with ``loop.call_soon_threadsafe``). Setting the job's
  ``cancel`` event (client gone, timeout, shutdown) stops the request before its next step; the
  slot is given back when the worker reports the request finished (done, failed, cancelled),
  never earlier, so a cancelled request cannot overlap the next one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from ..engine import RequestHandle, Scheduler
from ..engine.scheduler import CHUNK, DONE
from ..errors import SynthesisCancelled
from ..request import SynthesisRequest

log = logging.getLogger("cosyvino.server")


class Busy(Exception):
    """Queue full (or no slot within the time limit): answer 503 with ``retry_after``."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class SynthesisPool:
    """Loads the model(s), admits requests and runs them on the engine's scheduler.

    Args:
        config: a :class:`~cosyvino.server.config.ServerConfig`.
        synthesizers: already loaded synthesizers to use instead of loading (tests): one shared
            (thread-safe backend) or one per worker.
        metrics: a :class:`~cosyvino.server.metrics.Metrics` (gauges for queue and in-flight).

    Threads: :meth:`enter`, :meth:`leave`, :meth:`acquire` and :meth:`start` run on the event
    loop; :meth:`load` and :meth:`prepare` in any thread; chunk callbacks on the scheduler's
    workers.
    """

    def __init__(self, config, synthesizers=None, metrics=None):
        self.config = config
        self.metrics = metrics
        self.synths: list = list(synthesizers or [])
        self.scheduler: Scheduler | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.draining = False
        self._admitted = 0      # running + waiting (event-loop thread only)
        self._waiting = 0
        self._running = 0       # requests in the scheduler (any thread; guarded by _lock)
        self._jobs: set = set()  # their jobs (guarded by _lock), cancelled on shutdown
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

    def engines(self) -> list:
        """The scheduler's worker list: the shared engine ``max_sessions`` times, or one engine
        per loaded model."""
        if self.shared:
            return [self.synths[0].engine] * self.config.max_sessions
        return [s.engine for s in self.synths]

    def load(self) -> None:
        """Load (unless given), start the scheduler and warm up; sets :attr:`ready`. Blocking;
        run off the loop. A failure is kept in :attr:`load_error` (not raised)."""
        try:
            if not self.synths:
                self.synths = self._load_synthesizers()
            self.scheduler = Scheduler(self.engines(), name="cosyvino-synth")
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
        from ..defaults import ensure_default_model
        from ..synthesizer import Synthesizer

        c = self.config
        n = c.max_sessions
        start = time.perf_counter()
        # `cosyvino serve` without a model dir: the CLI's default path (created once, loudly)
        model_dir = c.model_dir or ensure_default_model()
        first = Synthesizer(model_dir, backend=c.backend, num_threads=c.threads,
                            **c.backend_options)
        if n == 1:
            out = [first]
        elif getattr(first.stages, "thread_safe", False):
            # One model in memory shared by all workers; their steps run in parallel.
            first.set_max_parallel(n)
            out = [first]
        else:
            out = [first] + [Synthesizer(model_dir, backend=c.backend,
                                         num_threads=c.threads, **c.backend_options)
                             for _ in range(n - 1)]
        log.info("loaded %d model instance(s) for %d session(s) on %s in %.1f s", len(out), n,
                 c.backend, time.perf_counter() - start)
        return out

    # ---- validation (any thread) -------------------------------------------------------------
    def prepare(self, request: SynthesisRequest) -> SynthesisRequest:
        """``request`` validated against the loaded model (seed fixed, voice resolved, text
        split), before it takes a place. Blocking (the text frontend); run off the loop.

        Raises:
            InputError and subclasses (EmptyTextError, UnknownSpeakerError): a bad request.
            NotReady: no model loaded.
        """
        state = self.synth.engine.start(request)
        state.program.close()  # validation only: nothing ran, no LLM session was opened
        return state.request

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
        """Wait for a free slot (after :meth:`enter`). False when ``stop`` fired first;
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
    async def start(self, request: SynthesisRequest, cancel: threading.Event) -> "Job":
        """Submit ``request`` to the scheduler, after :meth:`acquire` returned True; returns the
        :class:`Job` to read its chunks from. The slot is released when the scheduler reports
        the request finished.

        A request admitted before draining began still runs (graceful shutdown drains the
        queue too), until :meth:`shutdown` closes the scheduler.

        Raises (the slot released first):
            Busy: the scheduler is closed (shutdown).
            NotReady: no model loaded.
            InputError: ``request`` is bad (not :meth:`prepare` d).
        """
        loop = asyncio.get_running_loop()
        job = Job(loop, cancel)
        with self._lock:
            self._running += 1
            self._jobs.add(job)
        self._gauges()
        scheduler = self.scheduler
        if scheduler is None:  # not loaded (acquire is only reached when ready)
            self._finish(job, ran=False)
            raise NotReady("model is loading; retry shortly")

        def submit() -> RequestHandle:
            return scheduler.submit(request, cancel=cancel,
                                    callback=lambda kind, value: self._on_event(job, kind,
                                                                                value))

        # Off the loop: submit validates and splits the text again (milliseconds for a long
        # text). Chunks may reach the job before this returns; they wait in its queue.
        submitted = loop.run_in_executor(None, submit)
        try:
            handle = await asyncio.shield(submitted)
        except asyncio.CancelledError:
            # We are abandoned, the submit is not: once (if) it is in, the cancel stops it at
            # its first step and its worker gives the slot back; a failed submit gives it here.
            cancel.set()
            submitted.add_done_callback(
                lambda f: self._finish(job, ran=False) if f.cancelled() or f.exception()
                else None)
            raise
        except BaseException as e:
            self._finish(job, ran=False)
            if isinstance(e, RuntimeError) and self.draining:  # scheduler closed under us
                raise Busy("server is shutting down", retry_after=5) from e
            raise
        job.handle = handle
        job.total = handle.total
        return job

    def _on_event(self, job: "Job", kind: str, value) -> None:
        """The handle's callback (a scheduler worker thread): chunk, done or error."""
        if kind == CHUNK:
            job.emit("segment", value)
            return
        if kind == DONE:
            job.emit("end", None)
        elif isinstance(value, SynthesisCancelled):
            if self.metrics is not None:
                self.metrics.stopped_early.inc()
            job.emit("cancelled", None)
        else:
            log.error("synthesis failed", exc_info=value)
            job.emit("error", value)
        self._finish(job)

    def _finish(self, job: "Job", ran: bool = True) -> None:
        """The request left the scheduler (``ran``) or never got in: bookkeeping, then the slot
        goes back on the loop. Any thread; once per job."""
        elapsed = time.perf_counter() - job.started
        with self._lock:
            if ran:  # Retry-After estimates from the time requests really take
                self._avg_job_seconds = 0.8 * self._avg_job_seconds + 0.2 * elapsed
            self._running -= 1
            self._jobs.discard(job)
            running = self._running
        if self.metrics is not None:
            self.metrics.in_flight.set(running)
        try:
            job.loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # loop already closed (shutdown)
            pass
        job.finished.set()

    @property
    def running(self) -> int:
        """Requests in the scheduler (submitted, not finished)."""
        return self._running

    def cancel_all(self) -> None:
        """Cancel every request in the scheduler (each stops before its next step)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel.set()

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new requests, cancel the running ones and stop the scheduler's workers
        (``wait``: until they have stopped)."""
        self.draining = True
        self.cancel_all()
        if self.scheduler is not None:
            self.scheduler.close(wait=wait)


class Job:
    """One request's synthesis, as seen from the event loop.

    Attributes:
        cancel: the request's cancel event (shared with its engine state; set it to stop).
        handle: the scheduler's :class:`~cosyvino.engine.RequestHandle` (after submit).
        total: number of text segments (chunks) to expect.
        finished: set once the request has left the scheduler (slot given back).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        self.loop = loop
        self.cancel = cancel
        self.items: asyncio.Queue = asyncio.Queue()
        self.finished = threading.Event()
        self.handle: RequestHandle | None = None
        self.total = 1
        self.started = time.perf_counter()

    def emit(self, kind: str, value) -> None:
        """Post ``(kind, value)`` to the loop (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel.set()

    async def next(self, timeout: float, stop: asyncio.Event):
        """The next (kind, value): ``("segment", Audio)``, ``("end", None)``,
        ``("cancelled", None)``, ``("error", exc)``; ``("timeout", None)`` or
        ``("stopped", None)`` when ``timeout`` passed or ``stop`` fired first."""
        get = asyncio.ensure_future(self.items.get())
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({get, stopped}, timeout=max(0.0, timeout),
                                     return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if get in done:
            return get.result()
        get.cancel()
        return ("stopped", None) if stopped in done else ("timeout", None)
