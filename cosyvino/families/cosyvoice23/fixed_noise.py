"""The fixed noise of the CosyVoice2/3 CFM: one table drawn once, sliced per call.

Upstream ``CausalConditionalCFM.__init__`` calls ``set_all_random_seed(0)`` and stores
``rand_noise = torch.randn([1, 80, 15000])``; every inference uses columns ``0 .. T-1`` of it
(T = prompt + generated frames), so frame ``t`` gets the same noise in every call and streaming
chunk. Facts: CosyVoice2 sheet §5.4 (verified equal to ``torch.manual_seed(0);
torch.randn(1, 80, 15000)``), CosyVoice3 sheet (same table). Serving reads the table from the
converted model dir; only :func:`make_cfm_noise_table` (conversion time) needs torch, imported
lazily. Must not import torch at module level.
"""

from __future__ import annotations

import numpy as np

from cosyvino.errors import InputError

#: the seed upstream sets right before drawing the table (``set_all_random_seed(0)``)
CFM_NOISE_SEED = 0
#: the table's shape: [1, mel bins, frames]; 15000 frames = 300 s at 50 frames/s (sheet §5.4)
CFM_NOISE_SHAPE = (1, 80, 15000)


def make_cfm_noise_table() -> np.ndarray:
    """The full table, float32 ``[1, 80, 15000]``: torch's CPU generator seeded with 0, one
    ``randn`` draw of that shape (identical to upstream's global-RNG draw after
    ``torch.manual_seed(0)``; a private generator leaves the caller's global RNG alone).

    Raises:
        ImportError: torch is not installed (conversion-time dependency).
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(CFM_NOISE_SEED)
    return torch.randn(CFM_NOISE_SHAPE, generator=gen, dtype=torch.float32).numpy()


def noise_columns(table: np.ndarray, frames: int) -> np.ndarray:
    """The CFM's initial state for a call over ``frames`` frames: ``table[:, :, :frames]``
    (temperature 1.0), float32 ``[1, 80, frames]``.

    Raises:
        InputError: ``frames`` exceeds the table (upstream does not support inputs longer than
            15000 frames = 300 s, prompt included) or is not positive.
    """
    width = table.shape[-1]
    if frames <= 0 or frames > width:
        raise InputError(f"the flow supports 1..{width} mel frames per call (prompt included; "
                         f"{width / 50:.0f} s), got {frames}")
    return np.ascontiguousarray(table[:, :, :frames], dtype=np.float32)
