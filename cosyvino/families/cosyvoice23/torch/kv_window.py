"""The attention keys/values of finished chunks, kept per layer for incremental chunk-causal
attention (issue 36).

Under a static chunk mask (sheet v2 §5.2 / §5.5) a query in chunk ``c`` sees every key of chunks
``<= c`` (or, with ``left_chunks = n``, of chunks ``c - n .. c``), so once a chunk is finished its
keys/values never change and later chunks only read them. :class:`ChunkKVWindow` holds them for
all layers of one attention stack (they share positions), from absolute key position
:attr:`ChunkKVWindow.start` to the committed boundary :attr:`ChunkKVWindow.end`. Depends on torch
only.
"""

from __future__ import annotations

import torch

from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_window_mask

Tensor = torch.Tensor


class ChunkKVWindow:
    """Committed keys/values ``[batch, heads, end - start, head_dim]`` of ``n_layers`` layers.

    Args:
        n_layers: attention layers of the stack.
        batch, heads, head_dim: the K/V tensor shape (batch 2 for the CFG pair of the
            estimator).
        chunk: the stack's attention chunk (tokens or frames), > 0.
        left_chunks: ``None`` = keep every finished chunk (the official mask); ``n`` = keep only
            the ``n`` chunks before the next query chunk (upstream ``num_left_chunks``), which
            bounds the memory and changes the attention pattern accordingly.
        dtype, device: of the cache tensors.

    One call: :meth:`mask` for the span's queries, every layer attends over
    ``cat(past(i), new K/V)`` and calls :meth:`commit_layer`, then :meth:`advance` once.
    """

    def __init__(self, n_layers: int, batch: int, heads: int, head_dim: int, chunk: int,
                 left_chunks: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None):
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        if left_chunks is not None and left_chunks < 0:
            raise ValueError(f"left_chunks must be >= 0 or None, got {left_chunks}")
        self.chunk = chunk
        self.left_chunks = left_chunks
        self.start = 0
        self.end = 0
        empty = torch.zeros(batch, heads, 0, head_dim, dtype=dtype, device=device)
        self.k: list[Tensor] = [empty] * n_layers
        self.v: list[Tensor] = [empty] * n_layers

    def past(self, layer: int) -> tuple[Tensor, Tensor]:
        """(K, V) of ``layer``: float ``[batch, heads, end - start, head_dim]``."""
        return self.k[layer], self.v[layer]

    def mask(self, n_new: int, device: torch.device | None = None) -> Tensor:
        """bool ``[n_new, end - start + n_new]``: which of the cached + new keys each new query
        (absolute positions ``end ..``) sees (:func:`chunk_window_mask`)."""
        return chunk_window_mask(self.end, n_new, self.start, self.end - self.start + n_new,
                                 self.chunk, self.left_chunks, device)

    def _next_start(self, new_end: int) -> int:
        if self.left_chunks is None:
            return self.start
        return max(self.start, (new_end // self.chunk - self.left_chunks) * self.chunk)

    def commit_layer(self, layer: int, k_all: Tensor, v_all: Tensor, commit: int) -> None:
        """Keep the keys/values ``layer`` needs later from ``k_all``/``v_all`` (float
        ``[batch, heads, end - start + n_new, head_dim]``: past then new): up to the new
        boundary ``end + commit`` (a chunk boundary; the span's remaining keys belong to an
        unfinished chunk and are recomputed by the next call)."""
        new_end = self.end + commit
        lo = self._next_start(new_end) - self.start
        self.k[layer] = k_all[:, :, lo:new_end - self.start]
        self.v[layer] = v_all[:, :, lo:new_end - self.start]

    def advance(self, commit: int) -> None:
        """Move the committed boundary by ``commit`` positions (after every layer committed).

        Raises:
            ValueError: the new boundary is not a multiple of ``chunk``.
        """
        new_end = self.end + commit
        if commit and new_end % self.chunk:
            raise ValueError(f"commit boundary {new_end} is not a multiple of the "
                             f"{self.chunk}-position chunk")
        self.start, self.end = self._next_start(new_end), new_end

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
