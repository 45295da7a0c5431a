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
