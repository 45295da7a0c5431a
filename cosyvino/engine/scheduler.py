"""The scheduler: many requests on one or more engines, stepped by worker threads. Must not
import torch.

Each worker thread belongs to one engine (several workers share an engine whose stages are
thread-safe; a backend that is not gets one engine per worker). A submitted request is started
(validated, split) in the caller's thread, bound to the engine with the fewest active requests
and then stepped by that engine's workers in turn with the engine's other requests, one
:meth:`Engine.step` at a time: this is where batching the steps of several requests will live
(batch size 1 for now). Chunks, the end and errors reach the submitter through its
:class:`RequestHandle`; cancelling stops a request before its next step.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from typing import Callable, Sequence

from ..request import SynthesisRequest
from .engine import Engine, RequestState

log = logging.getLogger("cosyvino.engine")

#: event kinds a handle's callback receives
CHUNK, DONE, ERROR = "chunk", "done", "error"


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


class _Group:
    """One engine, its workers and its runnable ``(handle, lane)`` items (round-robin)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.ready: collections.deque = collections.deque()
        self.busy: set = set()  # (handle, lane) queued or being stepped
        self.running: dict = {}  # handle -> lanes being stepped now
        self.active = 0


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
    """

    def __init__(self, engines: Sequence[Engine], *, name: str = "cosyvino-engine",
                 lane_workers: int | None = None):
        if not engines:
            raise ValueError("a scheduler needs at least one engine")
        self._cond = threading.Condition()
        self._groups: dict[int, _Group] = {}
        for e in engines:
            self._groups.setdefault(id(e), _Group(e))
        self._closed = False
        self._threads = []
        workers = list(engines)
        for g in self._groups.values():
            extra = lane_workers
            if extra is None:
                extra = max(0, len(g.engine.lane_locks) - 1)
            workers += [g.engine] * extra
        for i, e in enumerate(workers):
            t = threading.Thread(target=self._work, args=(self._groups[id(e)],),
                                 name=f"{name}-{i}", daemon=True)
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
        with self._cond:
            group.running[handle] = set()
            self._queue_ready(group, handle)
            self._cond.notify_all()
        return handle

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
                while not group.ready and not self._closed:
                    self._cond.wait()
                if self._closed and not group.ready:
                    return
                handle, lane = group.ready.popleft()
                if self._closed:
                    handle.cancel()  # closing: in-flight requests stop at their next step
                if handle not in group.running:  # finished (failed) while this was queued
                    group.busy.discard((handle, lane))
                    continue
                group.running[handle].add(lane)
            final = self._step(group.engine, handle, lane)
            with self._cond:
                group.busy.discard((handle, lane))
                lanes = group.running.get(handle)
                if lanes is None:
                    continue  # another lane already finished this request
                lanes.discard(lane)
                if final is not None and final[0] == ERROR and handle._error is None:
                    handle._error = final
                    handle.cancel()  # a lane still inside a step stops at its next check
                if handle._error is None and final is None and not handle.state.done:
                    self._queue_ready(group, handle)
                    if lanes or any(h is handle for h, _ in group.busy):
                        self._cond.notify_all()
                        continue
                    # nothing runs or can run, yet the program is not done: fail, never hang
                    final = (ERROR, RuntimeError("no lane of this request can run "
                                                 "(program stalled)"))
                if lanes:
                    continue  # the last lane to leave its step reports
                final = handle._error or final or (DONE, None)
                del group.running[handle]
                group.active -= 1
            handle.state.program.close()
            # after the request stopped counting as active, so a submitter reacting to the end
            # sees this engine free
            handle._emit(*final)

    @staticmethod
    def _step(engine: Engine, handle: RequestHandle, lane: str) -> tuple | None:
        """One step of ``handle``'s request in ``lane``; its final event when it has finished
        (done, failed, cancelled), else None."""
        try:
            chunks = engine.step(handle.state, lane)
        except BaseException as e:  # delivered to the submitter, who decides how to report it
            return (ERROR, e)
        for chunk in chunks:
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
