"""The CosyVoice2 estimator (``CausalConditionalDecoder``) over one span of frames at a time, in
streaming (chunk-mask) mode, with an explicit state per ODE step (issue 36).

Sheet v2 §5.5: every convolution is causal (k3, left pad 2; the k1 ones are per frame) and the
attention is chunk-causal (50 frames from frame 0), identical at all levels (no resampling). So
the velocity of frames ``[B, E)`` (``B`` a chunk boundary) equals the whole-sequence streaming
call's, given :class:`EstimatorStepState`: each k3 convolution's 2 input frames before ``B`` and
each transformer block's keys/values of the finished chunks. The state belongs to ONE call of the
estimator (one ODE step): the inputs ``x`` of step ``s`` differ per step, so a stream keeps one
state per step. No padding (mask all ones, batch rows = the CFG pair).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cosyvino.families.cosyvoice2.torch.estimator import (
    _MASK_BIAS,
    CausalBlock1D,
    CausalConditionalDecoder,
    CausalResnetBlock1D,
)
from cosyvino.families.cosyvoice23.torch.causal_conv import conv_with_left
from cosyvino.families.cosyvoice23.torch.kv_window import ChunkKVWindow

Tensor = torch.Tensor


def _causal_convs(est: CausalConditionalDecoder) -> list[nn.Conv1d]:
    """Every k > 1 convolution in the order :func:`estimate_span` runs them."""
    convs: list[nn.Conv1d] = []

    def resnet(r: CausalResnetBlock1D) -> None:
        convs.extend([r.block1.block[0], r.block2.block[0]])

    resnet(est.down_blocks[0][0])
    convs.append(est.down_blocks[0][2])
    for r, _ in est.mid_blocks:
        resnet(r)
    resnet(est.up_blocks[0][0])
    convs.append(est.up_blocks[0][2])
    convs.append(est.final_block.block[0])
    return convs


def _blocks(est: CausalConditionalDecoder) -> list[nn.Module]:
    """Every ``BasicTransformerBlock`` in run order."""
    out = list(est.down_blocks[0][1])
    for _, blocks in est.mid_blocks:
        out.extend(blocks)
    return out + list(est.up_blocks[0][1])


class EstimatorStepState:
    """What later spans of ONE ODE step read: ``lefts[i]`` float ``[2, C_in, k - 1]`` (the
    inputs before the boundary of the i-th causal convolution, run order) and ``window`` (the
    keys/values of every transformer block, batch 2, chunk ``static_chunk_size`` frames).

    Args:
        est: the estimator (its shapes).
        left_chunks: see :class:`ChunkKVWindow` (``None`` = all finished chunks, official).
    """

    def __init__(self, est: CausalConditionalDecoder, left_chunks: int | None = None):
        p = next(est.parameters())
        kw = {"dtype": p.dtype, "device": p.device}
        self.lefts = [torch.zeros(2, c.in_channels, c.kernel_size[0] - 1, **kw)
                      for c in _causal_convs(est)]
        cfg = est.cfg
        self.window = ChunkKVWindow(len(_blocks(est)), 2, cfg.num_heads, cfg.attention_head_dim,
                                    cfg.static_chunk_size, left_chunks, **kw)

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        return self.window.nbytes() + sum(t.numel() * t.element_size() for t in self.lefts)


class _Span:
    """One estimator call over a span: walks the state in run order and commits it."""

    def __init__(self, state: EstimatorStepState, n_frames: int, commit: int,
                 device: torch.device):
        self.state, self.commit = state, commit
        self.conv_i = self.block_i = 0
        allowed = state.window.mask(n_frames, device)  # [T, P+T]
        self.bias = ((~allowed).to(torch.float32) * _MASK_BIAS)[None, None]  # [1, 1, T, P+T]

    def conv(self, conv: nn.Conv1d, x: Tensor) -> Tensor:
        i = self.conv_i
        y, self.state.lefts[i] = conv_with_left(conv, x, self.state.lefts[i], self.commit)
        self.conv_i += 1
        return y

    def causal_block(self, block: CausalBlock1D, x: Tensor) -> Tensor:
        y = self.conv(block.block[0], x)
        y = block.block[2](y.transpose(1, 2)).transpose(1, 2)  # LayerNorm over channels
        return block.block[4](y)  # Mish

    def resnet(self, r: CausalResnetBlock1D, x: Tensor, t_emb: Tensor) -> Tensor:
        h = self.causal_block(r.block1, x) + r.mlp(t_emb).unsqueeze(-1)
        return self.causal_block(r.block2, h) + r.res_conv(x)

    def transformers(self, blocks: nn.ModuleList, x: Tensor) -> Tensor:
        h = x.transpose(1, 2)  # [2, T, C]
        for block in blocks:
            h = h + self._attention(block.attn1, block.norm1(h))
            h = h + block.ff(block.norm3(h))
        return h.transpose(1, 2)

    def _attention(self, attn: nn.Module, x: Tensor) -> Tensor:
        b, t, _ = x.shape

        def heads(y: Tensor) -> Tensor:
            return y.reshape(b, t, attn.heads, attn.head_dim).transpose(1, 2)

        window, n = self.state.window, self.block_i
        past_k, past_v = window.past(n)
        q = heads(attn.to_q(x))
        k = torch.cat([past_k, heads(attn.to_k(x))], dim=2)
        v = torch.cat([past_v, heads(attn.to_v(x))], dim=2)
        window.commit_layer(n, k, v, self.commit)
        self.block_i += 1
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(attn.head_dim) + self.bias
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return attn.to_out[0](out.transpose(1, 2).reshape(b, t, attn.heads * attn.head_dim))


def estimate_span(est: CausalConditionalDecoder, state: EstimatorStepState, x: Tensor,
                  mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, commit: int) -> Tensor:
    """Velocity of the span's frames, as the whole-sequence ``est(..., streaming=True)``.

    Args:
        est: the v2 estimator (eval mode).
        state: this ODE step's :class:`EstimatorStepState`, at a boundary ``B`` that is a
            multiple of ``static_chunk_size`` frames; the span holds frames ``B .. B + T - 1``.
        x, mu, cond: float32 ``[2, 80, T]`` (the CFG pair, sheet v2 §5.4); t float32 ``[2]``;
            spks float32 ``[2, 80]``.
        commit: frames of the span that become final (``B + commit`` a chunk boundary, or 0):
            the state moves there.
    Returns:
        float32 ``[2, 80, T]``.
    """
    span = _Span(state, x.shape[-1], commit, x.device)
    t_emb = est.time_mlp(est.time_embeddings(t).to(t.dtype))
    h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
    resnet, blocks, down = est.down_blocks[0]
    h = span.transformers(blocks, span.resnet(resnet, h, t_emb))
    skip = h
    h = span.conv(down, h)
    for resnet, blocks in est.mid_blocks:
        h = span.transformers(blocks, span.resnet(resnet, h, t_emb))
    resnet, blocks, up = est.up_blocks[0]
    h = span.transformers(blocks, span.resnet(resnet, torch.cat([h, skip], dim=1), t_emb))
    h = span.conv(up, h)
    h = span.causal_block(est.final_block, h)
    state.window.advance(commit)
    return est.final_proj(h)


__all__ = ["EstimatorStepState", "estimate_span"]
