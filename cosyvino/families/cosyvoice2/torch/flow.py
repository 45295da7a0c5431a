"""The CosyVoice2 flow module tree (``CausalMaskedDiffWithXvec``) and its two torch stages:
tokens -> ``mu`` (embedding, encoder, ``encoder_proj``) and the x-vector -> ``spks``.

Upstream ``cosyvoice/flow/flow.py::CausalMaskedDiffWithXvec``; CosyVoice2 sheet §5.1 (tree,
registration order = ``flow.pt`` key order), §5.3 (inference steps 1-4). The CFM solve is in
:mod:`cosyvino.families.cosyvoice2.torch.flow_inference`. Batch 1 without padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice2.flow_config import CausalFlowConfig
from cosyvino.families.cosyvoice2.torch.estimator import CausalConditionalDecoder
from cosyvino.families.cosyvoice2.torch.upsample_encoder import UpsampleConformerEncoder

Tensor = torch.Tensor


class CausalMaskedDiffWithXvec(nn.Module):
    """``input_embedding`` Embedding(vocab, input_size); ``spk_embed_affine_layer``
    Linear(spk_embed_dim, output_size); ``encoder`` :class:`UpsampleConformerEncoder`;
    ``encoder_proj`` Linear(encoder width, output_size); ``decoder.estimator``
    :class:`CausalConditionalDecoder` (upstream ``CausalConditionalCFM`` holds no parameters;
    its fixed noise is not in ``flow.pt``)."""

    def __init__(self, cfg: CausalFlowConfig):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.encoder, cfg.pre_lookahead_len)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = nn.Module()
        self.decoder.estimator = CausalConditionalDecoder(cfg.estimator)

    def speaker(self, embedding: Tensor) -> Tensor:
        """float32 ``[1, spk_embed_dim]`` x-vector -> ``spks`` float32 ``[1, output_size]`` =
        ``spk_embed_affine_layer(L2-normalize(embedding))`` (``F.normalize`` eps 1e-12,
        sheet §5.3 step 1)."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def encode(self, token: Tensor, context_token: Tensor | None = None,
               streaming: bool = False) -> Tensor:
        """Speech tokens (prompt tokens first) -> ``encoder_proj`` output (sheet §5.3 steps 2-4).

        Args:
            token: int64 ``[1, L]`` ids in ``[0, vocab_size)`` (negatives clamped to 0, as
                upstream).
            context_token: ``None`` for a final call (zero look-ahead at the end), or int64
                ``[1, pre_lookahead_len]``: the look-ahead tokens after ``token`` of a non-final
                call, which produce no frames. A separate input rather than a slice of
                ``token``, so an exported graph has a plain dynamic ``L`` (a derived ``N - 3``
                makes torch.export guard on the rel-pos reshapes).
            streaming: chunk attention masks (sheet §5.2) instead of full attention.
        Returns:
            float32 ``[1, token_mel_ratio * L, output_size]`` (time-major).
        """
        x = self.input_embedding(torch.clamp(token, min=0))
        context = (None if context_token is None
                   else self.input_embedding(torch.clamp(context_token, min=0)))
        return self.encoder_proj(self.encoder(x, context, streaming))
