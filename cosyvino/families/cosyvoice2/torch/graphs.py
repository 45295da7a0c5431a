"""The ``torch_module`` s of the CosyVoice2 graph table (:mod:`..graphs`): thin tensor-in /
tensor-out wrappers of the family's torch parts (LLM :mod:`.llm`, flow :mod:`.flow`, HiFT
:mod:`.hift`), with no data-dependent Python control flow, so one traced graph serves every
call.

What the parts choose with Python flags is a tensor input here:

* the flow encoder's look-ahead (sheet v2 §5.2-5.3): ``context`` (the 3 look-ahead tokens) and
  ``context_scale`` (1: they are look-ahead context, a non-final call; 0: zero padding, a final
  call, whatever ``context`` holds);
* full or chunk attention of the encoder and estimator (sheet v2 §5.2, §5.5): ``chunk``, int64
  [1]: query ``i`` sees keys ``j < (i // chunk + 1) * chunk``; the encoder's up-sampled layers
  use ``chunk * upsample_stride``. :data:`cosyvino.families.cosyvoice2.graphs.FULL_ATTENTION` (larger than any sequence) gives full
  attention, bit-equal to the parts' non-streaming path (an all-true mask hides nothing).

The text / speech embedding wrappers and :func:`chunk_visible` are shared with CosyVoice3
(:mod:`cosyvino.families.cosyvoice23.torch.graphs`,
:mod:`~cosyvino.families.cosyvoice23.torch.chunk_mask`).
Their parity with the parts' own calls (``flow.encode(..., finalize, streaming)``,
``estimator(..., streaming=...)``) is tested in tests/test_cosyvoice2_family.py.
"""

from __future__ import annotations

import torch
from torch import nn

from cosyvino.families.cosyvoice1.torch.transformer import rel_position_table
from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_visible
from cosyvino.families.cosyvoice23.torch.graphs import (
    SpeechEmbeddingGraph,
    TextEmbeddingGraph,
)

Tensor = torch.Tensor

#: upstream ``mask_to_bias``: the additive attention bias of a hidden key (sheet v2 §5.5)
MASK_BIAS = -1.0e10


class SpecialEmbeddingGraph(nn.Module):
    """ids int64 [1, n] (0 = SOS, 1 = TASK) -> rows float32 [1, n, D] (``llm_embedding``)."""

    def __init__(self, llm):
        super().__init__()
        self.table = llm.llm_embedding

    def forward(self, ids: Tensor) -> Tensor:
        return self.table(ids)


class FlowEncoderGraph(nn.Module):
    """Speech tokens (prompt first) -> ``mu`` and the projected speaker (sheet v2 §5.3 steps
    1-4).

    tokens int64 [1, n], context int64 [1, 3], context_scale float32 [1], chunk int64 [1],
    embedding float32 [1, 192] -> (mu float32 [1, 80, 2n], spks float32 [1, 80])."""

    def __init__(self, flow):
        super().__init__()
        self.flow = flow
        enc = flow.encoder
        self.stride = int(enc.cfg.upsample_stride)

    def _stack(self, layers, x: Tensor, chunk: Tensor) -> Tensor:
        t = x.shape[1]
        pos = rel_position_table(t - 1, 2 * t - 1, x.shape[2], dtype=x.dtype, device=x.device)
        mask = chunk_visible(x[0, :, 0], chunk).unsqueeze(0)
        for layer in layers:
            x, _, _ = layer(x, pos, mask)
        return x

    def forward(self, tokens: Tensor, context: Tensor, context_scale: Tensor, chunk: Tensor,
                embedding: Tensor) -> tuple[Tensor, Tensor]:
        flow, enc = self.flow, self.flow.encoder
        x = enc.embed(flow.input_embedding(torch.clamp(tokens, min=0)))
        ctx = enc.embed(flow.input_embedding(torch.clamp(context, min=0)))
        x = enc.pre_lookahead_layer(x, ctx * context_scale.reshape(1, 1, 1))
        x = self._stack(enc.encoders, x, chunk)
        x = enc.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x = self._stack(enc.up_encoders, enc.up_embed(x), chunk * self.stride)
        mu = flow.encoder_proj(enc.after_norm(x)).transpose(1, 2)
        return mu, flow.speaker(embedding)


class EstimatorGraph(nn.Module):
    """The CFM velocity (sheet v2 §5.5, I/O contract §5.7) with the attention chunk as an input:
    x / mu / cond float32 [B, 80, T], mask [B, 1, T], t [B], spks [B, 80], chunk int64 [1] ->
    velocity float32 [B, 80, T]. The parts' ``CausalConditionalDecoder`` with its bias built
    from ``chunk`` instead of its Python ``streaming`` flag."""

    def __init__(self, estimator):
        super().__init__()
        self.est = estimator

    @staticmethod
    def _transformers(blocks, h: Tensor, bias: Tensor) -> Tensor:
        h = h.transpose(1, 2).contiguous()
        for block in blocks:
            h = block(h, bias)
        return h.transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor,
                cond: Tensor, chunk: Tensor) -> Tensor:
        est = self.est
        t_emb = est.time_mlp(est.time_embeddings(t).to(t.dtype))
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
        allowed = chunk_visible(x[0, 0], chunk).unsqueeze(0) & (mask > 0)  # [B, T, T]
        bias = ((1.0 - allowed.to(mask.dtype)) * MASK_BIAS).unsqueeze(1)
        resnet, blocks, down = est.down_blocks[0]
        h = self._transformers(blocks, resnet(h, mask, t_emb), bias)
        skip = h
        h = down(h * mask)
        for resnet, blocks in est.mid_blocks:
            h = self._transformers(blocks, resnet(h, mask, t_emb), bias)
        resnet, blocks, up = est.up_blocks[0]
        h = self._transformers(blocks, resnet(torch.cat([h, skip], dim=1), mask, t_emb), bias)
        h = est.final_block(up(h * mask), mask)
        return est.final_proj(h * mask) * mask


__all__ = ["MASK_BIAS", "EstimatorGraph", "FlowEncoderGraph", "SpecialEmbeddingGraph",
           "SpeechEmbeddingGraph", "TextEmbeddingGraph", "chunk_visible"]
