"""Flow token encoder stage: speech tokens + x-vector -> per-token mel-space features.

Upstream ``cosyvoice/flow/flow.py::MaskedDiffWithXvec.inference`` steps 1-3 (architecture sheet
5.2), batch 1 without padding. The caller concatenates prompt and generated tokens beforehand.
Depends on torch and :mod:`.flow` only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.torch.flow import Flow

Tensor = torch.Tensor


class FlowEncoderStage(nn.Module):
    """``(token, embedding) -> (h, spks)``; holds a reference to a :class:`Flow`."""

    def __init__(self, flow: Flow):
        super().__init__()
        self.flow = flow

    def forward(self, token: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """Encode tokens and project the speaker embedding.

        Args:
            token: int64 ``[1, N]`` speech tokens (negative ids are clamped to 0, as upstream).
            embedding: float32 ``[1, spk_embed_dim]`` x-vector.
        Returns:
            ``h`` float32 ``[1, N, output_size]`` = ``encoder_proj(encoder(input_embedding(
            clamp(token, min=0))))``; ``spks`` float32 ``[1, output_size]`` =
            ``spk_embed_affine_layer(L2-normalize(embedding))``.
        """
        f = self.flow
        x = f.input_embedding(torch.clamp(token, min=0))
        h = f.encoder_proj(f.encoder(x))
        spks = f.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        return h, spks
