"""The LLM's positional keys on the host: per layer ``linear_pos(pe(r))`` for the relative
distances ``r`` a step needs, computed once per distance instead of in every decode step.

The ESPnet rel-pos attention adds ``(q_i + v) · W_pos pe(i - j)`` to every score
(:class:`cosyvino.families.cosyvoice1.torch.transformer.RelPositionMultiHeadedAttention`).
``W_pos pe(r)`` does not depend on the input, so the exported ``llm`` graph takes it as one input
per layer (``pos_keys.{l}``) instead of building the sinusoid table and projecting it (or the
query) every step: that cost ~30 % of a decode step (docs/performance.md, "LLM positional
keys"). Must import neither torch nor a runtime.
"""

from __future__ import annotations

import math
import threading

import numpy as np

#: distances added per extension of the table beyond what a step needs (amortises the numpy
#: projection, ~4 GFLOP per 256 distances for the 300M LLM)
GROWTH = 256


def sinusoid_rows(first: int, count: int, d_model: int) -> np.ndarray:
    """ESPnet relative position vectors for distances ``first, first-1, ..., first-count+1``:
    float32 ``[count, d_model]``, ``pe(r)[2k] = sin(r w_k)``, ``pe(r)[2k+1] = cos(r w_k)``,
    ``w_k = exp(-2k ln(10000) / d)``, float32 products as upstream
    ``EspnetRelPositionalEncoding.extend_pe`` (``cosyvoice/transformer/embedding.py``) and
    :func:`cosyvino.families.cosyvoice1.torch.transformer.rel_position_table` (last-ulp
    differences of the sine/cosine libraries aside)."""
    r = np.float32(first) - np.arange(count, dtype=np.float32)
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float32)
                 * np.float32(-(math.log(10000.0) / d_model)))
    angle = r[:, None] * div[None, :]
    out = np.empty((count, d_model), np.float32)
    out[:, 0::2] = np.sin(angle)
    out[:, 1::2] = np.cos(angle)
    return out


class PositionalKeys:
    """Per-layer positional keys ``pe(r) @ W_pos_l^T`` by head, for a window of distances
    grown on demand, shared by every session and batch of one loaded model (thread-safe).

    The tables are head-major ``[H, N, d_k]`` (what the step's MatMul reads without a
    transpose) and a step gets the whole table plus the row offset of its window
    (``pos_offset``): a head-major window is not a contiguous slice, and copying it out every
    step would cost more than the projection it saves.

    Args:
        weights: float32 ``[L, d, d]``, layer ``l``'s ``linear_pos.weight`` (``llm_tables.npz``
            ``pos_weight``).
        heads: attention heads ``H`` (``d = H * d_k``).
        bucket: the ``pos_bucket`` of the converted LLM (1 = exact): a step slices
            :meth:`count` rows, so the tables always hold that many from the offset.
    """

    def __init__(self, weights: np.ndarray, heads: int, bucket: int = 1):
        w = np.asarray(weights, np.float32)
        if w.ndim != 3 or w.shape[1] != w.shape[2] or w.shape[1] % heads:
            raise ValueError(f"positional weights must be [layers, d, d] with d divisible by "
                             f"{heads} heads, got {w.shape}")
        self._w_t = [np.ascontiguousarray(w[i].T) for i in range(w.shape[0])]
        self.layers, self.d_model, self.heads = w.shape[0], w.shape[1], int(heads)
        self.bucket = max(1, int(bucket))
        # (hi, lo, tables): distances hi, hi-1, ..., lo, row 0 = hi; one tuple, so a reader
        # never sees a window and tables of different extensions
        self._window: tuple[int, int, list[np.ndarray]] = (-1, 0, [])
        self._lock = threading.Lock()

    def count(self, past: int, new: int) -> int:
        """Rows a step over ``past`` cached and ``new`` positions takes: ``past + 2 new - 1``
        rounded up to :attr:`bucket`."""
        n = past + 2 * new - 1
        return -(-n // self.bucket) * self.bucket

    def _project(self, first: int, count: int) -> list[np.ndarray]:
        pe = sinusoid_rows(first, count, self.d_model)
        dk = self.d_model // self.heads
        return [(pe @ w_t).reshape(count, self.heads, dk).transpose(1, 0, 2)
                for w_t in self._w_t]

    def _extend(self, hi: int, lo: int) -> None:
        old_hi, old_lo, tables = self._window
        new_hi = hi + GROWTH if not tables or hi > old_hi else old_hi
        new_lo = lo - GROWTH if not tables or lo < old_lo else old_lo
        if not tables:
            parts = [[t] for t in self._project(new_hi, new_hi - new_lo + 1)]
        else:
            parts = [[t] for t in tables]
            if new_hi > old_hi:
                for p, t in zip(parts, self._project(new_hi, new_hi - old_hi)):
                    p.insert(0, t)
            if new_lo < old_lo:
                for p, t in zip(parts, self._project(old_lo - 1, old_lo - new_lo)):
                    p.append(t)
        tables = [np.ascontiguousarray(np.concatenate(p, axis=1)) for p in parts]
        self._window = (new_hi, new_lo, tables)

    def rows(self, past: int, new: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(pos_offset, tables)``, the ``pos_offset`` int64 ``[1]`` and ``pos_keys.{l}``
        inputs of a step over ``past`` cached (padded) and ``new`` positions: per layer
        float32 ``[H, N, d_k]`` (shared: do not write) whose row ``pos_offset + k`` is
        ``W_pos pe(past + new - 1 - k)`` by head, for ``k < count(past, new)``. Raises
        ValueError for ``past < 0`` or ``new < 1``."""
        if past < 0 or new < 1:
            raise ValueError(f"need past >= 0 and new >= 1, got past={past}, new={new}")
        first = past + new - 1
        count = self.count(past, new)
        last = first - count + 1
        hi, lo, tables = self._window
        if not tables or first > hi or last < lo:
            with self._lock:
                hi, lo, tables = self._window
                if not tables or first > hi or last < lo:
                    self._extend(first, last)
                hi, lo, tables = self._window
        return np.array([hi - first], np.int64), tables
