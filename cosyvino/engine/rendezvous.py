"""Concurrent calls of one stage function, combined into one batched call (issue 17 item 2).
Must not import torch.

The CFM estimator is called ``n_timesteps`` times per flow hop with arrays of one shape
(CosyVoice v1: batch 2 = the conditional and the unconditional row). Two requests whose hops
have the same frame count can share one call of batch 4: on 2 cores that costs 0.72-0.77x the
time of their two calls running at once from two threads, and 0.77-0.90x of the two calls one
after the other (docs/performance.md, "Batched estimator calls across requests"). The rows are
independent in the estimator (per-row time embedding and GroupNorm over each row's own
frames), so equal shapes need no padding and no mask: a request's rows come out the same
alone or batched.

A :class:`CallRendezvous` is shared by the requests on one loaded model. A request enters it
for the length of its ODE loop (:meth:`CallRendezvous.member`, keyed by the call's shapes) and
makes its calls through the function the context gives; a call waits until every member of its
key has a call pending (or ``cap`` calls are), or, when a member is late, until ``window_s``
has passed (while another call of the key runs, a call waits for it to return: its callers
come straight back), then the first caller among them runs the function once on the arrays
concatenated along axis 0 and every caller gets its own rows back. A lone member never waits.
Members in lockstep (each waits for the shared call) pair up at every step.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Callable, Hashable, Iterator

import numpy as np

#: default longest wait of a call for company (s): well above the host work between two
#: estimator calls of one ODE loop (an Euler update, < 1 ms) and well below one call (> 50 ms
#: on 2 cores at the shortest hop), so a member that is late only by that host work is met
#: and one that is not coming costs at most this much
DEFAULT_WINDOW_S = 0.02


class _Call:
    __slots__ = ("args", "rows", "result", "error", "done", "arrived")

    def __init__(self, args: tuple):
        self.args = args
        self.rows = int(np.shape(args[0])[0])
        self.result = None
        self.error: BaseException | None = None
        self.done = False
        self.arrived = time.monotonic()


class CallRendezvous:
    """Batches concurrent calls of ``fn`` that have equal shapes.

    Args:
        fn: ``fn(*arrays) -> array``; every argument and the result have the batch on axis 0,
            and the result's rows belong to the argument rows of the same index (CosyVoice v1:
            ``Stages.estimate``, batch 2 per request).
        cap: most callers one call combines (>= 2; the backend's ``max_estimator_batch``).
        window_s: longest a call waits for the other members of its key (seconds, >= 0).

    Thread-safe. Errors: an exception of the combined call reaches every caller in it.
    """

    def __init__(self, fn: Callable[..., np.ndarray], cap: int,
                 window_s: float = DEFAULT_WINDOW_S):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
            raise ValueError(f"a call rendezvous needs a cap of at least 2 callers, got {cap!r}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        self.fn = fn
        self.cap = cap
        self.window_s = float(window_s)
        self._cond = threading.Condition()
        self._members: collections.Counter = collections.Counter()
        self._pending: dict[Hashable, list[_Call]] = collections.defaultdict(list)
        self._running: collections.Counter = collections.Counter()  # key -> calls running
        self._returned: dict[Hashable, float] = {}  # key -> when its last call returned
        self.calls = 0          # calls of fn
        self.member_calls = 0   # caller calls served (member_calls / calls: mean occupancy)
        self.occupancy: collections.Counter = collections.Counter()  # callers -> calls

    def stats(self) -> dict:
        """calls (of the function), member_calls (callers served), mean_members (0.0 before
        the first call), max_members, members (inside :meth:`member` now), occupancy
        (callers per call -> calls, a plain dict). Safe from any thread."""
        with self._cond:
            return {"calls": self.calls, "member_calls": self.member_calls,
                    "mean_members": self.member_calls / self.calls if self.calls else 0.0,
                    "max_members": max(self.occupancy, default=0),
                    "members": sum(self._members.values()),
                    "occupancy": dict(sorted(self.occupancy.items()))}

    @contextlib.contextmanager
    def member(self, key: Hashable) -> Iterator[Callable[..., np.ndarray]]:
        """Be a member of ``key`` (e.g. the call's shapes) for the ``with`` block and yield the
        function to call ``fn`` through; calls with another key do not combine with these."""
        with self._cond:
            self._members[key] += 1
        try:
            yield lambda *args: self._call(key, args)
        finally:
            with self._cond:
                self._members[key] -= 1
                if not self._members[key]:
                    del self._members[key]
                    self._returned.pop(key, None)
                self._cond.notify_all()  # a waiting call may now have every member it needs

    def _call(self, key: Hashable, args: tuple) -> np.ndarray:
        me = _Call(args)
        with self._cond:
            self._pending[key].append(me)
            self._cond.notify_all()
            while not me.done:
                batch, wait = self._batch_to_lead(key, me)
                if batch is not None:
                    break
                self._cond.wait(timeout=wait)
            else:
                return self._outcome(me)
        self._lead(key, batch)
        return self._outcome(me)

    def _batch_to_lead(self, key: Hashable, me: _Call) -> tuple[list[_Call] | None, float | None]:
        """``(calls, None)``: the calls ``me`` runs now (taken off the pending list); or
        ``(None, timeout)``: wait that long (None: until notified). Condition held.

        ``me`` leads once every member of its key has a call pending (up to ``cap``), or
        ``window_s`` after it arrived, except while another call of the key runs: its callers
        come back with their next call as soon as it returns (members in lockstep), so ``me``
        waits for them instead of running beside it (two calls at once share the cores worse
        than one batched call, docs/performance.md); the window then counts from that
        return."""
        group = self._pending[key]
        first = group[:self.cap]
        if me not in first:
            return None, None  # the leader of the first `cap` calls wakes the rest
        expected = min(self.cap, max(1, self._members.get(key, 0)))
        if len(first) < expected:
            if self._running.get(key):
                return None, None
            deadline = max(me.arrived, self._returned.get(key, 0.0)) + self.window_s
            left = deadline - time.monotonic()
            if left > 0:
                return None, left
        del group[:len(first)]
        if not group:
            del self._pending[key]
        self._running[key] += 1
        return first, None

    def _lead(self, key: Hashable, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                outs = [self.fn(*batch[0].args)]
            else:
                joined = [np.concatenate(parts, axis=0) for parts in zip(*(c.args for c in batch))]
                out = self.fn(*joined)
                bounds = np.cumsum([c.rows for c in batch])[:-1]
                # copies: a backend may reuse its output buffer at the leader's next call
                outs = [np.array(o) for o in np.split(np.asarray(out), bounds, axis=0)]
        except BaseException as e:  # every caller of this call gets the failure
            outs, error = [None] * len(batch), e
        else:
            error = None
        with self._cond:
            for c, o in zip(batch, outs):
                c.result, c.error, c.done = o, error, True
            self._running[key] -= 1
            if not self._running[key]:
                del self._running[key]
            self._returned[key] = time.monotonic()
            self.calls += 1
            self.member_calls += len(batch)
            self.occupancy[len(batch)] += 1
            self._cond.notify_all()

    @staticmethod
    def _outcome(call: _Call) -> np.ndarray:
        if call.error is not None:
            raise call.error
        return call.result
