"""The scheduler: many requests on one or more engines, stepped by worker threads. Must not
import torch.

Each worker thread belongs to one engine (several workers share an engine whose stages are
thread-safe; a backend that is not gets one engine per worker). A submitted request is started
(validated, split) in the caller's thread, bound to the engine with the fewest active requests
and then stepped by that engine's workers in turn with the engine's other requests, one
:meth:`Engine.step` at a time. Chunks, the end and errors reach the submitter through its
:class:`RequestHandle`; cancelling stops a request before its next step.

With ``llm_batch=N`` (N >= 2, capped at the stages' ``max_llm_batch``) the LLM decode steps of
an engine's concurrent requests run as one batch (:class:`~.batching.DecodeBatch`): a request
whose decode step is ready joins when another request of the engine decodes too (a lone
request keeps its own session steps), stays a row until its segment's decoding ends, and the
batch is one queued item stepped by one worker at a time; the other lanes (v1 audio: the hops
a row's tokens made due, queued after every batch step) keep running on the other workers.

First-chunk priority (``first_chunk_priority=True``, the default): a free worker takes the
oldest queued step of a request that has not delivered its first chunk yet (the decode batch
counts as such while one of its rows has not), and only then the oldest step of the rest. A
request that already streams has audio buffered at its client; one that has not is silent, so
its time to first audio is what a busy server should protect. Order within each class stays
first come, first served; no step changes, so every request's audio is the same either way.

First-chunk hold (``first_chunk_hold=True``, the default): priority only orders the queue,
and with several sessions the steps of streaming requests already running share the cores
with a new request's first hop. With the hold, while a *holder* (a request that has not
delivered its first chunk, submitted less than ``max_hold_s`` ago) has a step running or
queued, the steps of requests that already stream neither start (workers leave them queued)
nor go on: a running one waits at its next stage call
(:meth:`cosyvino.engine.Program.check_cancelled`, e.g. before every estimator call) without
its lane's lock. A holder's decode steps batch only with other holders'. A held step keeps
its thread, so each engine has as many spare threads as workers, which step only while held
steps leave fewer than ``workers`` steps active. So a new request has the cores to itself,
less at most one stage call of each step that was running, for at most ``max_hold_s`` after
it arrived; then everyone shares again. Waiting changes no step, so the audio stays the same.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Callable, Sequence

from ..request import SynthesisRequest
from .batching import DecodeBatch
from .engine import Engine, RequestState

log = logging.getLogger("cosyvino.engine")

#: event kinds a handle's callback receives
CHUNK, DONE, ERROR = "chunk", "done", "error"

#: default time after its submission during which a request waiting for its first chunk holds
#: the steps of streaming requests (s): a lone first chunk takes 0.4-0.7 s on 2 cores
#: (docs/performance.md, "Streamed batch rows and the first-chunk hold"), so this covers it
#: with room, and bounds what one arrival can take from the requests that already play
DEFAULT_MAX_HOLD_S = 2.0

#: longest single wait of a held step (s) before it looks again at its cancel event and at the
#: clock (a finished step of the holder wakes it sooner)
_HOLD_POLL_S = 0.05


class RequestHandle:
    """A submitted request: iterate it for its chunks (:class:`cosyvino.audio.Audio`), or give
    :meth:`Scheduler.submit` a ``callback`` to receive ``(kind, value)`` events from the worker
    thread instead (``"chunk"`` + Audio, ``"done"`` + None, ``"error"`` + the exception,
    :class:`~cosyvino.errors.SynthesisCancelled` after a cancel).

    Attributes:
        total: number of text segments.
        state: the engine's :class:`RequestState` (validated request, seed).
    """

    def __init__(self, state: RequestState, callback: Callable | None = None):
        self.state = state
        self.total = state.total_segments
        self._callback = callback
        self._events: queue.SimpleQueue | None = None if callback else queue.SimpleQueue()
        self._finished = False
        self._error: tuple | None = None  # the first lane's failure (scheduler bookkeeping)
        self.chunks = 0  # chunks delivered so far (first-chunk priority reads it)
        self.submitted = time.monotonic()  # the first-chunk hold's clock

    def cancel(self) -> None:
        """Stop the request before its next step (its LLM session is released by the worker)."""
        self.state.cancel.set()

    def _emit(self, kind: str, value) -> None:
        if self._callback is not None:
            self._callback(kind, value)
        else:
            self._events.put((kind, value))

    def __iter__(self):
        return self

    def __next__(self):
        if self._events is None:
            raise TypeError("this handle delivers its chunks to a callback")
        if self._finished:
            raise StopIteration
        kind, value = self._events.get()
        if kind == CHUNK:
            return value
        self._finished = True
        if kind == ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Cancel (when still running) and stop iterating."""
        self.cancel()
        self._finished = True


class _BatchItem:
    """The ready-queue entry of a group's decode batch (in place of a handle)."""

    def cancel(self) -> None:
        pass


class _Group:
    """One engine, its workers and its runnable ``(handle, lane)`` items (round-robin)."""

    def __init__(self, engine: Engine, llm_batch: int = 1):
        self.engine = engine
        self.ready: collections.deque = collections.deque()
        self.busy: set = set()  # (handle, lane) queued or being stepped (or a batch row)
        self.running: dict = {}  # handle -> lanes being stepped now
        self.active = 0
        # the stages are asked only when batching is wanted (engines of tests and plugins
        # may have none)
        cap = 1 if int(llm_batch) < 2 else min(
            int(llm_batch), int(getattr(getattr(engine, "stages", None), "max_llm_batch", 1)))
        self.batch = DecodeBatch(engine, cap) if cap >= 2 else None
        self.joining: list = []  # handles waiting to join the batch at its next step
        self.batch_item = _BatchItem()
        self.batch_queued = False  # the batch item is queued or being stepped
        self.workers = 0  # worker threads of this engine
        self.stepping = 0  # workers inside a step (held ones too)
        self.held = 0  # steps waiting out a first-chunk hold now
        self.holds = 0  # waits of held steps so far
        self.held_seconds = 0.0  # their total time


class _StepHold:
    """The first-chunk hold of one step of a streaming request (:class:`Engine.step`'s
    ``hold``)."""

    def __init__(self, scheduler: "Scheduler", group: _Group, handle: RequestHandle):
        self.scheduler, self.group, self.handle = scheduler, group, handle

    def needed(self) -> bool:
        s = self.scheduler
        if not s.first_chunk_hold or s._closed:
            return False
        with s._cond:
            return s._holder_busy(self.group, self.handle)

    def wait(self) -> None:
        s, group = self.scheduler, self.group
        cancel = self.handle.state.cancel
        with s._cond:
            start = time.monotonic()
            group.held += 1
            s._cond.notify_all()  # a spare thread may take this step's place
            try:
                while (s.first_chunk_hold and not s._closed and not cancel.is_set()
                       and s._holder_busy(group, self.handle)):
                    s._cond.wait(_HOLD_POLL_S)
            finally:
                group.held -= 1
                group.holds += 1
                group.held_seconds += time.monotonic() - start


class Scheduler:
    """Worker threads stepping submitted requests.

    Args:
        engines: one entry per worker thread; the same :class:`Engine` object may appear
            several times (its workers then share its requests: stages must be thread-safe
            and the engine's lock must admit that many steps).
        name: worker thread name prefix.
        lane_workers: extra worker threads per engine that step the other lanes of a request
            (v1: the ``audio`` lane while the ``llm`` lane decodes), so the stages of one
            request overlap; None = one per extra lane when the engine has ``lane_locks``
            (lanes may run at once), else 0.
        llm_batch: most LLM decode rows of concurrent requests one backend call advances per
            engine (capped at the stages' ``max_llm_batch``); 1 (default) or a cap below 2 =
            every request decodes in its own session, one step at a time.
        first_chunk_priority: steps of requests that have not delivered a chunk yet go first
            (module docstring); False = strictly first come, first served. Also an attribute
            that may be changed while requests run (the next pick reads it).
        first_chunk_hold: steps of streaming requests wait while a new request's first chunk
            is being made (module docstring); False = they share the cores with it. Also an
            attribute that may be changed while requests run.
        max_hold_s: seconds after its submission during which a request waiting for its
            first chunk holds the others (> 0).

    Raises:
        ValueError: no engines, ``llm_batch`` is not a positive integer, a flag is not a
            bool, or ``max_hold_s`` is not a positive number.
    """

    def __init__(self, engines: Sequence[Engine], *, name: str = "cosyvino-engine",
                 lane_workers: int | None = None, llm_batch: int = 1,
                 first_chunk_priority: bool = True, first_chunk_hold: bool = True,
                 max_hold_s: float = DEFAULT_MAX_HOLD_S):
        if not engines:
            raise ValueError("a scheduler needs at least one engine")
        if isinstance(llm_batch, bool) or not isinstance(llm_batch, int) or llm_batch < 1:
            raise ValueError(f"llm_batch must be a positive integer, got {llm_batch!r}")
        for flag, value in (("first_chunk_priority", first_chunk_priority),
                            ("first_chunk_hold", first_chunk_hold)):
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be True or False, got {value!r}")
        if isinstance(max_hold_s, bool) or not isinstance(max_hold_s, (int, float)) \
                or not max_hold_s > 0:
            raise ValueError(f"max_hold_s must be a positive number of seconds, got "
                             f"{max_hold_s!r}")
        self._cond = threading.Condition()
        self._groups: dict[int, _Group] = {}
        for e in engines:
            self._groups.setdefault(id(e), _Group(e, llm_batch))
        self._closed = False
        self.first_chunk_priority = bool(first_chunk_priority)
        self.first_chunk_hold = bool(first_chunk_hold)
        self.max_hold_s = float(max_hold_s)
        self._threads = []
        workers = list(engines)
        for g in self._groups.values():
            extra = lane_workers
            if extra is None:
                extra = max(0, len(g.engine.lane_locks) - 1)
            workers += [g.engine] * extra
        for e in workers:
            self._groups[id(e)].workers += 1
        # Spare threads: a held step keeps its thread, so each group has as many again, which
        # take items only while held steps leave its active steps below ``workers`` (without
        # holds they never run a step).
        for i, e in enumerate(workers + workers):
            t = threading.Thread(target=self._work, args=(self._groups[id(e)],),
                                 name=f"{name}-{i}" if i < len(workers)
                                 else f"{name}-spare-{i - len(workers)}", daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def engines(self) -> list[Engine]:
        return [g.engine for g in self._groups.values()]

    @property
    def active(self) -> int:
        """Requests submitted and not finished."""
        with self._cond:
            return sum(g.active for g in self._groups.values())

    @property
    def batch_stats(self) -> list[dict | None]:
        """Per engine (the order of :attr:`engines`): its decode batch's
        :meth:`~.batching.DecodeBatch.stats` (steps, row_steps, mean_rows, max_rows, rows,
        occupancy), None when that engine does not batch."""
        with self._cond:
            return [None if g.batch is None else g.batch.stats() for g in self._groups.values()]

    @property
    def hold_stats(self) -> dict:
        """First-chunk hold so far, all engines: ``holds`` (waits of steps that were running
        when a new request arrived: they paused at a stage call or before they started),
        ``held_seconds`` (their total, s), ``held_now`` (steps waiting now). Steps that a
        hold kept from starting stay queued and are not counted."""
        with self._cond:
            groups = self._groups.values()
            return {"holds": sum(g.holds for g in groups),
                    "held_seconds": sum(g.held_seconds for g in groups),
                    "held_now": sum(g.held for g in groups)}

    def submit(self, request: SynthesisRequest, *, cancel: threading.Event | None = None,
               callback: Callable | None = None) -> RequestHandle:
        """Start ``request`` and queue it for the workers.

        Raises:
            InputError and subclasses: a bad request (raised here, before anything runs).
            RuntimeError: the scheduler is closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("scheduler is closed")
            group = min(self._groups.values(), key=lambda g: g.active)
            group.active += 1
        try:
            state = group.engine.start(request, cancel)
        except BaseException:
            with self._cond:
                group.active -= 1
            raise
        handle = RequestHandle(state, callback)
        set_waker = getattr(state.program, "set_waker", None)
        if set_waker is not None:  # a program fed while it runs (text in) wakes its lanes
            set_waker(lambda: self._wake(group, handle))
        with self._cond:
            group.running[handle] = set()
            self._queue_ready(group, handle)
            self._cond.notify_all()
        return handle

    def _wake(self, group: _Group, handle: RequestHandle) -> None:
        """New input reached ``handle``'s program (text in): queue the lanes it made ready."""
        with self._cond:
            if handle in group.running and handle._error is None:
                self._queue_ready(group, handle)
                self._cond.notify_all()

    @staticmethod
    def _queue_ready(group: _Group, handle: RequestHandle) -> None:
        """Queue the lanes of ``handle`` that can run and are neither queued nor running
        (call with the condition held)."""
        for lane in handle.state.program.ready_lanes():
            if (handle, lane) not in group.busy:
                group.busy.add((handle, lane))
                group.ready.append((handle, lane))

    def _work(self, group: _Group) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed and not group.ready:
                        return
                    picked = None
                    if group.ready and group.stepping - group.held < group.workers:
                        picked = self._next_ready(group)
                    if picked is not None:
                        break
                    # an item held back for a first chunk becomes pickable when the hold
                    # ends, possibly by the clock alone: look again after a while
                    self._cond.wait(_HOLD_POLL_S if group.ready and self.first_chunk_hold
                                    else None)
                handle, lane = picked
                group.stepping += 1
                if handle is group.batch_item:
                    joiners = group.joining[:max(0, group.batch.cap - len(group.batch))]
                    del group.joining[:len(joiners)]
                    if self._closed:
                        for h in group.batch.handles + joiners + group.joining:
                            h.cancel()
                elif self._closed:
                    handle.cancel()  # closing: in-flight requests stop at their next step
                if handle is not group.batch_item:
                    if handle not in group.running:  # finished (failed) while this was queued
                        group.busy.discard((handle, lane))
                        group.stepping -= 1
                        continue
                    group.running[handle].add(lane)
                    if self._joins_batch(group, handle, lane):
                        # stays busy in this lane until it leaves the batch
                        group.joining.append(handle)
                        self._queue_batch(group, lane)
                        group.stepping -= 1
                        continue
            if handle is group.batch_item:
                self._batch_step(group, lane, joiners)
                continue
            hold = _StepHold(self, group, handle) if handle.chunks else None
            final = self._step(group.engine, handle, lane, hold)
            with self._cond:
                group.stepping -= 1
                final = self._after_step(group, handle, lane, final)
                if self.first_chunk_hold or group.held:
                    self._cond.notify_all()  # held steps and held-back items look again
            if final is not None:
                self._finish(handle, final)

    def _next_ready(self, group: _Group) -> tuple | None:
        """Take the next ``(handle, lane)`` from ``group.ready`` (condition held, queue not
        empty): the oldest entry still waiting for its first chunk under first-chunk priority
        (see the module docstring), else the oldest entry. While a first-chunk hold is on,
        only entries with a request still waiting for its first chunk are taken (the others
        would be held as soon as they start): None when there is none."""
        holding = self.first_chunk_hold and not self._closed and self._holder_busy(group)
        if self.first_chunk_priority or holding:
            for i, (h, lane) in enumerate(group.ready):
                if any(r.chunks == 0 for r in self._requests_of(group, h)):
                    del group.ready[i]
                    return h, lane
            if holding:
                return None
        return group.ready.popleft()

    @staticmethod
    def _requests_of(group: _Group, item) -> list:
        """The requests a ready item steps: the decode batch's rows and joiners, or itself."""
        return (group.batch.handles + group.joining) if item is group.batch_item else [item]

    def _holder_busy(self, group: _Group, held: RequestHandle | None = None) -> bool:
        """Whether a request other than ``held`` that waits for its first chunk, submitted
        less than ``max_hold_s`` ago and not cancelled (a holder), has a step running (a
        decode-batch row counts) or queued (condition held)."""
        since = time.monotonic() - self.max_hold_s

        def holder(h) -> bool:
            return h is not held and self._holds(h, since)

        if any(lanes and holder(h) for h, lanes in group.running.items()):
            return True
        return any(holder(r) for item, _ in group.ready for r in self._requests_of(group, item))

    def _holds(self, handle: RequestHandle, since: float | None = None) -> bool:
        """Whether ``handle`` holds the others now (first-chunk hold on, no chunk yet,
        submitted after ``since``, default ``max_hold_s`` ago, not cancelled)."""
        if since is None:
            since = time.monotonic() - self.max_hold_s
        return (self.first_chunk_hold and not handle.chunks and handle.submitted > since
                and not handle.state.cancel.is_set())

    def _joins_batch(self, group: _Group, handle: RequestHandle, lane: str) -> bool:
        """Whether ``handle``'s ``lane`` step goes into the group's decode batch: batching is
        on, the step is a decode step, and another request decodes (a row, a joiner, or a
        decode-ready lane): a lone request keeps its own session. A request holding the
        others for its first chunk batches only with requests doing the same: the rows of
        streaming requests are held meanwhile, and it decodes alone at a 1-row step's cost
        rather than at theirs (condition held)."""
        if group.batch is None or handle.state.cancel.is_set():
            return False
        if not handle.state.program.decode_ready(lane):
            return False
        if len(group.batch) + len(group.joining) >= group.batch.cap:
            return False  # the batch is full: this one steps its own session meanwhile
        members = group.batch.handles + group.joining
        since = time.monotonic() - self.max_hold_s
        holding = self._holds(handle, since)
        if holding and any(not self._holds(h, since) for h in members):
            return False
        if members:
            return True
        return any(h is not handle and (not holding or self._holds(h, since))
                   and h.state.program.decode_ready(lane) for h in group.running)

    def _queue_batch(self, group: _Group, lane: str) -> None:
        """Queue the batch item unless it is queued or running (condition held)."""
        if not group.batch_queued:
            group.batch_queued = True
            group.ready.append((group.batch_item, lane))
            self._cond.notify_all()

    def _batch_step(self, group: _Group, lane: str, joiners: list) -> None:
        """Run one step of the group's decode batch (this worker only) and do the bookkeeping
        of the requests that left it; queue the other lanes the step made ready for the rows
        that stay (a streamed row's due hops run while it decodes on)."""
        try:
            left = group.batch.step(joiners, lane)
        except BaseException as e:  # not expected (the batch reports per row): fail them all
            left = [(h, (ERROR, e)) for h in group.batch.close() + joiners]
        finished = []
        with self._cond:
            for h, final in left:
                final = self._after_step(group, h, lane, final)
                if final is not None:
                    finished.append((h, final))
            for h in group.batch.handles:
                if h._error is None and h in group.running:
                    self._queue_ready(group, h)  # its llm lane stays busy as a row
            group.batch_queued = False
            group.stepping -= 1
            if len(group.batch) or group.joining:
                self._queue_batch(group, lane)
            self._cond.notify_all()
        for h, final in finished:
            self._finish(h, final)

    def _after_step(self, group: _Group, handle: RequestHandle, lane: str,
                    final: tuple | None) -> tuple | None:
        """The bookkeeping after ``handle``'s ``lane`` step (condition held): queue its ready
        lanes; returns its final event when the request has finished (the caller then calls
        :meth:`_finish` without the condition), else None."""
        group.busy.discard((handle, lane))
        lanes = group.running.get(handle)
        if lanes is None:
            return None  # another lane already finished this request
        lanes.discard(lane)
        if final is not None and final[0] == ERROR and handle._error is None:
            handle._error = final
            handle.cancel()  # a lane still inside a step stops at its next check
        if handle._error is None and final is None and not handle.state.done:
            self._queue_ready(group, handle)
            if lanes or any(h is handle for h, _ in group.busy):
                self._cond.notify_all()
                return None
            if getattr(handle.state.program, "awaits_input", False):
                return None  # waits for text (text in): its feeder's _wake queues it
            # nothing runs or can run, yet the program is not done: fail, never hang
            final = (ERROR, RuntimeError("no lane of this request can run "
                                         "(program stalled)"))
        if lanes:
            return None  # the last lane to leave its step reports
        final = handle._error or final or (DONE, None)
        del group.running[handle]
        group.active -= 1
        return final

    @staticmethod
    def _finish(handle: RequestHandle, final: tuple) -> None:
        handle.state.program.close()
        # after the request stopped counting as active, so a submitter reacting to the end
        # sees this engine free
        handle._emit(*final)

    @staticmethod
    def _step(engine: Engine, handle: RequestHandle, lane: str,
              hold: _StepHold | None = None) -> tuple | None:
        """One step of ``handle``'s request in ``lane`` (waiting out ``hold``); its final
        event when it has finished (done, failed, cancelled), else None."""
        try:
            chunks = engine.step(handle.state, lane, hold=hold)
        except BaseException as e:  # delivered to the submitter, who decides how to report it
            return (ERROR, e)
        for chunk in chunks:
            handle.chunks += 1
            handle._emit(CHUNK, chunk)
        if handle.state.done:
            return (DONE, None)
        return None

    def close(self, wait: bool = True) -> None:
        """Cancel every request still queued or running, then stop the workers."""
        with self._cond:
            self._closed = True
            for g in self._groups.values():
                for h, _ in g.ready:
                    h.cancel()
            self._cond.notify_all()
        if wait:
            for t in self._threads:
                t.join()
