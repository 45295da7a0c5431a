"""Static chunk attention masks of the causal (streaming) flow.

Upstream ``cosyvoice/utils/mask.py::subsequent_chunk_mask`` / ``add_optional_chunk_mask`` with a
static chunk and all left chunks (``num_decoding_left_chunks`` -1). Facts: CosyVoice2 sheet §5.2
(encoder: 25 tokens, up-sampled layers: 50 frames) and §5.5 (estimator: 50 frames); chunks are
counted from frame 0 of the sequence (prompt included), never offset. Depends on torch only.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def chunk_mask(length: int, chunk: int, device: torch.device | None = None) -> Tensor:
    """Query ``i`` may see key ``j`` iff ``j < (i // chunk + 1) * chunk``: full attention inside
    the query's chunk and to every earlier chunk.

    Args:
        length: sequence length ``T`` (may be a symbolic size under export).
        chunk: chunk size in frames/tokens, > 0.
    Returns:
        bool ``[T, T]`` (True = visible).
    Raises:
        ValueError: ``chunk <= 0`` (a programming error: 0 means "no chunk mask", handled by
        the callers).
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    i = torch.arange(length, device=device)
    limit = (torch.div(i, chunk, rounding_mode="floor") + 1) * chunk
    return i.unsqueeze(0) < limit.unsqueeze(1)


def chunk_visible(length_of: Tensor, chunk: Tensor) -> Tensor:
    """:func:`chunk_mask` with the chunk as a tensor (a graph input): bool ``[T, T]``, query
    ``i`` sees key ``j`` iff ``j < (i // chunk + 1) * chunk`` (T = ``length_of.shape[0]``, any
    1-D tensor of the sequence's length; ``chunk`` int64 [1]). The positions come from a cumsum
    over ``length_of`` so a traced graph keeps ``T`` symbolic."""
    i = torch.ones_like(length_of, dtype=torch.int64).cumsum(0) - 1  # 0..T-1, stays symbolic
    limit = (torch.div(i, chunk, rounding_mode="floor") + 1) * chunk
    return i.unsqueeze(0) < limit.unsqueeze(1)


def chunk_window_mask(query_start: int, n_query: int, key_start: int, n_key: int, chunk: int,
                      left_chunks: int | None = None, device: torch.device | None = None
                      ) -> Tensor:
    """:func:`chunk_mask` for a window: queries at absolute positions ``query_start ..
    query_start + n_query - 1`` over keys at ``key_start .. key_start + n_key - 1`` (an
    incremental call's new frames over its cached and new keys).

    Query ``i`` may see key ``j`` iff ``j < (i // chunk + 1) * chunk`` and, with
    ``left_chunks = n``, ``j >= (i // chunk - n) * chunk`` (upstream ``subsequent_chunk_mask``
    with ``num_left_chunks = n``; ``None`` = all left chunks, the CosyVoice2 setting, sheet v2
    §5.1). Chunks count from absolute position 0.

    Returns:
        bool ``[n_query, n_key]`` (True = visible).
    Raises:
        ValueError: ``chunk <= 0`` or a negative ``left_chunks`` (programming errors).
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    if left_chunks is not None and left_chunks < 0:
        raise ValueError(f"left_chunks must be >= 0 or None, got {left_chunks}")
    i = torch.arange(query_start, query_start + n_query, device=device)
    j = torch.arange(key_start, key_start + n_key, device=device)
    q_chunk = torch.div(i, chunk, rounding_mode="floor")
    visible = j.unsqueeze(0) < ((q_chunk + 1) * chunk).unsqueeze(1)
    if left_chunks is not None:
        visible &= j.unsqueeze(0) >= ((q_chunk - left_chunks) * chunk).unsqueeze(1)
    return visible
