"""The CosyVoice3 flow module tree (``CausalMaskedDiffWithDiT``) and its two torch stages before
the CFM: tokens -> ``mu`` (embedding, pre-lookahead layer, one copy per mel frame) and the
x-vector -> ``spks``.

Upstream ``cosyvoice/flow/flow.py::CausalMaskedDiffWithDiT``; CosyVoice3 sheet §5.1 (tree,
registration order = ``flow.pt`` key order), §5.2 (inference). There is no conformer encoder:
``mu`` is the 80-d token embedding plus the pre-lookahead residual. The CFM solve is the shared
:mod:`cosyvino.families.cosyvoice23.torch.flow_inference`. Batch 1 without padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice3.flow_config import DiTFlowConfig
from cosyvino.families.cosyvoice3.torch.dit import DiT
from cosyvino.families.cosyvoice23.torch.pre_lookahead import PreLookaheadLayer

Tensor = torch.Tensor


class CausalMaskedDiffWithDiT(nn.Module):
    """``input_embedding`` Embedding(vocab, input_size); ``spk_embed_affine_layer``
    Linear(spk_embed_dim, output_size); ``pre_lookahead_layer`` :class:`PreLookaheadLayer`
    (input_size -> channels -> input_size); ``decoder.estimator`` :class:`DiT` (upstream
    ``CausalConditionalCFM`` holds no parameters; its fixed noise is not in ``flow.pt``)."""

    def __init__(self, cfg: DiTFlowConfig):
        super().__init__()
        self.cfg = cfg
        pre = cfg.pre_lookahead
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(pre.in_channels, pre.channels,
                                                     pre.pre_lookahead_len)
        self.decoder = nn.Module()
        self.decoder.estimator = DiT(cfg.estimator)

    def speaker(self, embedding: Tensor) -> Tensor:
        """float32 ``[1, spk_embed_dim]`` x-vector -> ``spks`` float32 ``[1, output_size]`` =
        ``spk_embed_affine_layer(L2-normalize(embedding))`` (``F.normalize`` eps 1e-12,
        sheet §5.2)."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def pre_lookahead(self, token: Tensor, context_token: Tensor | None = None) -> Tensor:
        """Speech tokens (prompt tokens first) -> pre-lookahead output, one row per token
        (sheet §5.2; the golden ``pre_lookahead_out``).

        Args:
            token: int64 ``[1, L]`` ids in ``[0, vocab_size)`` (negatives clamped to 0, as
                upstream).
            context_token: ``None`` for a final call (zero look-ahead at the end), or int64
                ``[1, pre_lookahead_len]``: the look-ahead tokens after ``token`` of a non-final
                call, which produce no rows (a separate input so an export has a plain
                dynamic ``L``).
        Returns:
            float32 ``[1, L, input_size]`` (time-major).
        """
        x = self.input_embedding(torch.clamp(token, min=0))
        context = (None if context_token is None
                   else self.input_embedding(torch.clamp(context_token, min=0)))
        return self.pre_lookahead_layer(x, context)

    def encode(self, token: Tensor, context_token: Tensor | None = None,
               streaming: bool = False) -> Tensor:
        """``mu`` time-major, float32 ``[1, token_mel_ratio * L, input_size]``: each
        :meth:`pre_lookahead` row repeated ``token_mel_ratio`` times (frames 2i and 2i+1 =
        token i). ``streaming`` changes nothing here (no attention before the DiT); it is
        accepted so both flows share one inference path
        (:class:`cosyvino.families.cosyvoice23.torch.flow_inference.CausalFlow`)."""
        del streaming
        h = self.pre_lookahead(token, context_token)
        return h.repeat_interleave(self.cfg.token_mel_ratio, dim=1)
