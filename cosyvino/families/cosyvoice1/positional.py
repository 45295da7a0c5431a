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

#: distances projected per extension of the tables beyond what a step needs (amortises the
#: numpy projection, ~7.5 GFLOP per 256 distances for the 300M LLM's 14 layers)
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

    The tables are head-major ``[H, cap, d_k]`` (what the step's MatMul reads without a
    transpose) and a step gets the whole tables plus the row offset of its window
    (``pos_offset``): a head-major window is not a contiguous slice, and copying it out every
    step would cost more than the projection it saves. Row ``anchor - r`` holds distance
    ``r``; only rows of distances already projected are ever read.

    Growing writes the new distances into rows no window has used yet, in place: an
    extension projects only the new distances (one GEMM for all layers), and the tables are
    reallocated (existing rows copied once, capacity doubled) only when the new distances fall
    outside them. Rows inside a window handed out never change; arrays handed out stay valid
    (a reallocation leaves them to their holders). Before (a new concatenated copy of every
    table per extension) an extension at ~1000 distances cost ~0.5 s mid-decode
    (docs/performance.md, "Zen 4, second stop").

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
        self.layers, self.d_model, self.heads = w.shape[0], w.shape[1], int(heads)
        # [L*d, d]: every layer's W_pos stacked (a view, no copy); pe @ this.T projects all
        # layers in one GEMM (BLAS reads the transpose in place)
        self._w_all = w.reshape(-1, self.d_model)
        self.bucket = max(1, int(bucket))
        # (anchor, hi, lo, tables): distances hi, hi-1, ..., lo projected, distance r in row
        # anchor - r; one tuple, so a reader never sees a window and tables of different
        # extensions
        self._state: tuple[int, int, int, list[np.ndarray]] = (0, -1, 0, [])
        self._lock = threading.Lock()

    def count(self, past: int, new: int) -> int:
        """Rows a step over ``past`` cached and ``new`` positions takes: ``past + 2 new - 1``
        rounded up to :attr:`bucket`."""
        n = past + 2 * new - 1
        return -(-n // self.bucket) * self.bucket

    def _project_into(self, tables: list[np.ndarray], anchor: int, first: int,
                      count: int) -> None:
        """Write distances ``first, first-1, ..., first-count+1`` into rows
        ``anchor-first ..`` of every table."""
        proj = sinusoid_rows(first, count, self.d_model) @ self._w_all.T  # [count, L*d]
        dk = self.d_model // self.heads
        row = anchor - first
        for i, t in enumerate(tables):
            block = proj[:, i * self.d_model:(i + 1) * self.d_model]
            t[:, row:row + count] = block.reshape(count, self.heads, dk).transpose(1, 0, 2)

    def _extend(self, first: int, last: int) -> None:
        anchor, hi, lo, tables = self._state
        empty = not tables
        new_hi = first + GROWTH - 1 if empty or first > hi else hi  # decode: GROWTH more
        new_lo = last if empty or last < lo else lo
        cap = tables[0].shape[1] if tables else 0
        if empty or new_hi > anchor or anchor - new_lo >= cap:
            # room for as many distances again above, and a bucket below
            new_anchor = new_hi + max(GROWTH, new_hi - new_lo)
            new_cap = new_anchor - new_lo + 1 + self.bucket
            dk = self.d_model // self.heads
            grown = [np.zeros((self.heads, new_cap, dk), np.float32)
                     for _ in range(self.layers)]
            if not empty:  # copy the projected rows once
                src, dst = anchor - hi, new_anchor - hi
                for g, t in zip(grown, tables):
                    g[:, dst:dst + hi - lo + 1] = t[:, src:src + hi - lo + 1]
            anchor, tables = new_anchor, grown
        if empty:
            self._project_into(tables, anchor, new_hi, new_hi - new_lo + 1)
        else:
            if new_hi > hi:
                self._project_into(tables, anchor, new_hi, new_hi - hi)
            if new_lo < lo:
                self._project_into(tables, anchor, lo - 1, lo - new_lo)
        self._state = (anchor, new_hi, new_lo, tables)

    def rows(self, past: int, new: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(pos_offset, tables)``, the ``pos_offset`` int64 ``[1]`` and ``pos_keys.{l}``
        inputs of a step over ``past`` cached (padded) and ``new`` positions: per layer
        float32 ``[H, cap, d_k]`` (shared: do not write) whose row ``pos_offset + k`` is
        ``W_pos pe(past + new - 1 - k)`` by head, for ``k < count(past, new)``. Raises
        ValueError for ``past < 0`` or ``new < 1``."""
        if past < 0 or new < 1:
            raise ValueError(f"need past >= 0 and new >= 1, got past={past}, new={new}")
        first = past + new - 1
        count = self.count(past, new)
        last = first - count + 1
        anchor, hi, lo, tables = self._state
        if not tables or first > hi or last < lo:
            with self._lock:
                anchor, hi, lo, tables = self._state
                if not tables or first > hi or last < lo:
                    self._extend(first, last)
                anchor, hi, lo, tables = self._state
        return np.array([anchor - first], np.int64), tables
