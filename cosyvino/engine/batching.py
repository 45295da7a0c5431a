"""Batched LLM decode across requests (issue 17): one :class:`DecodeBatch` per engine runs the
decode steps of every request in it as one backend call. Must not import torch.

A request's LLM lane joins after its own prefill (its session becomes a row of the stages'
:class:`~cosyvino.families.cosyvoice1.stages.LLMBatch`) and stays a row until its segment's
decoding ends or it is cancelled: every row steps at every batch step (a row cannot sit out;
it would leave and lose its cache). Each step, every row's program samples its own token from
its own logp with its own draws, so its tokens do not depend on the other rows; the rows that
end (EOS, max_len, cancelled, failed) leave; the others' embeddings go through one
``LLMBatch.step`` and row ``b``'s logp goes back to its program. Not thread-safe: the
scheduler steps a batch from one worker at a time (under the engine's lock for the lane).
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

from ..errors import SynthesisCancelled
from ..timing import StageTimes

#: event kind of a failed row (the scheduler's ERROR)
_ERROR = "error"


class DecodeBatch:
    """The decode rows of one engine's requests.

    Args:
        engine: the :class:`~cosyvino.engine.Engine` whose stages make the batch
            (``stages.new_llm_batch()``, created at the first join).
        cap: most rows at once (>= 2); the scheduler adds joiners only up to it.

    Attributes:
        steps: batch steps run (one backend call each).
        row_steps: rows advanced in all (``row_steps / steps``: mean occupancy).
        occupancy: rows per step -> number of steps with that many rows.
        max_rows: the most rows one step had.
    """

    def __init__(self, engine, cap: int):
        if cap < 2:
            raise ValueError(f"a decode batch needs a cap of at least 2 rows, got {cap}")
        self.engine = engine
        self.cap = int(cap)
        self._batch = None
        self._rows: dict = {}  # handle -> row id, in join order
        self.steps = 0
        self.row_steps = 0
        self.max_rows = 0
        self.occupancy: collections.Counter = collections.Counter()
        self._stats_lock = threading.Lock()  # stats() may be read from another thread

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def handles(self) -> list:
        """The handles whose sessions are rows now."""
        return list(self._rows)

    def stats(self) -> dict:
        """steps, row_steps, mean_rows (0.0 before the first step), max_rows, rows (now),
        occupancy (rows -> steps, a plain dict). Safe to call from any thread."""
        with self._stats_lock:
            return {"steps": self.steps, "row_steps": self.row_steps,
                    "mean_rows": self.row_steps / self.steps if self.steps else 0.0,
                    "max_rows": self.max_rows, "rows": len(self._rows),
                    "occupancy": dict(sorted(self.occupancy.items()))}

    def step(self, joiners: list, lane: str) -> list[tuple]:
        """One batch step: ``joiners`` (handles whose ``lane`` is decode-ready, at most
        ``cap - len(self)``) join, every row samples, the ending rows leave, the rest advance
        one position together.

        Returns ``(handle, final)`` for each handle that is no longer a row: ``final`` None
        when its segment's decoding ended normally (its program went on to its next segment's
        prefill or to the end of its LLM lane), else ``("error", exception)``
        (:class:`SynthesisCancelled` for a cancelled request). A failing backend step fails
        every row and empties the batch."""
        engine = self.engine
        lock = engine.lane_locks.get(lane, engine.lock)
        if lock is None:
            return self._step(joiners)
        with lock:
            return self._step(joiners)

    def _step(self, joiners: list) -> list[tuple]:
        left: list[tuple] = []
        inputs: dict = {}  # handle -> embedding [1, 1, D]
        for handle in list(self._rows) + list(joiners):
            program = handle.state.program
            if handle.state.cancel.is_set():
                self._drop(handle)
                left.append((handle, (_ERROR, SynthesisCancelled("synthesis cancelled"))))
                continue
            try:
                emb = program.decode_input()
                if emb is None:
                    self._drop(handle)
                    program.decode_leave()
                    left.append((handle, None))
                    continue
                if handle not in self._rows:
                    if self._batch is None:
                        self._batch = self.engine.stages.new_llm_batch()
                    row = self._batch.add(program.decode_session())
                    with self._stats_lock:
                        self._rows[handle] = row
            except BaseException as e:  # this request fails; the other rows go on
                self._drop(handle)
                left.append((handle, (_ERROR, e)))
                continue
            inputs[handle] = emb
        if not self._rows:
            return left
        order = {row: h for h, row in self._rows.items()}
        handles = [order[row] for row in self._batch.rows]
        x = np.concatenate([inputs[h] for h in handles], axis=0)
        start = time.perf_counter()
        try:
            logp = self._batch.step(x)
        except BaseException as e:  # the batch state is unknown: every row fails
            self.close()
            return left + [(h, (_ERROR, e)) for h in handles]
        seconds = time.perf_counter() - start
        n = len(handles)
        with self._stats_lock:
            self.steps += 1
            self.row_steps += n
            self.max_rows = max(self.max_rows, n)
            self.occupancy[n] += 1
        for b, h in enumerate(handles):
            times = StageTimes()
            times.seconds["llm_decode"] += seconds
            times.calls["llm_decode"] += 1
            try:
                h.state.program.decode_accept(logp[b], times)
            except BaseException as e:
                self._drop(h)
                left.append((h, (_ERROR, e)))
        return left

    def _drop(self, handle) -> None:
        """Remove ``handle``'s row (its session comes back reset); no-op for a non-row."""
        with self._stats_lock:
            row = self._rows.pop(handle, None)
        if row is not None:
            self._batch.remove(row)

    def close(self) -> list:
        """Forget every row and the backend batch (a new one is made at the next join);
        returns the handles that were rows. Their sessions are reset when the backend batch
        still can; their programs close them in any case."""
        with self._stats_lock:
            rows, self._rows = self._rows, {}
        batch, self._batch = self._batch, None
        for row in rows.values():
            try:
                batch.remove(row)
            except Exception:  # noqa: BLE001 - a broken batch: the programs close the sessions
                pass
        return list(rows)

