"""The CosyVoice2 flow encoder (``UpsampleConformerEncoder`` + ``encoder_proj``) over one span
of tokens at a time, in streaming (chunk-mask) mode, with an explicit state (issue 36).

Sheet v2 §5.2: every part is causal except the pre-lookahead layer's 3 look-ahead tokens and the
attention inside a chunk (25 tokens in ``encoders``, 50 frames in ``up_encoders``, counted from
token 0 of the prompt). So a span ``[B, E)`` whose start ``B`` is a chunk boundary gets the
frames of the whole-sequence call from: the tokens of the span, its look-ahead tokens, and
:class:`EncoderState` (two ``leaky_relu(conv1)`` frames of the pre-lookahead layer, each block's
keys/values of finished chunks, the last 2 tokens before ``B`` for the up-sampling conv).
Batch 1 (the flow's only caller).
"""

from __future__ import annotations

import torch
from torch import nn

from cosyvino.families.cosyvoice1.torch.transformer import rel_position_table
from cosyvino.families.cosyvoice2.torch.flow import CausalMaskedDiffWithXvec
from cosyvino.families.cosyvoice23.torch.causal_conv import conv_with_left
from cosyvino.families.cosyvoice23.torch.kv_window import ChunkKVWindow
from cosyvino.families.cosyvoice23.torch.pre_lookahead import pre_lookahead_span

Tensor = torch.Tensor


class EncoderState:
    """What later spans read of the encoder, up to the committed token boundary.

    Attributes:
        lookahead_left: float ``[1, d, 2]``, ``leaky_relu(conv1)`` of the pre-lookahead layer
            at the 2 tokens before the boundary.
        encoders: :class:`ChunkKVWindow` of ``encoders`` (token positions, chunk
            ``static_chunk_size``).
        up_left: float ``[1, d, 2 * stride]``, the up-sampled frames before the boundary (the
            last 2 tokens' block outputs, each repeated ``stride`` times).
        up_encoders: :class:`ChunkKVWindow` of ``up_encoders`` (frame positions, chunk
            ``static_chunk_size * stride``).
    """

    def __init__(self, flow: CausalMaskedDiffWithXvec, left_chunks: int | None = None):
        enc = flow.encoder
        cfg = enc.cfg
        d, heads = cfg.output_size, cfg.attention_heads
        p = next(flow.parameters())
        kw = {"dtype": p.dtype, "device": p.device}
        self.lookahead_left = torch.zeros(1, enc.pre_lookahead_layer.conv1.out_channels,
                                          enc.pre_lookahead_layer.conv2.kernel_size[0] - 1, **kw)
        self.encoders = ChunkKVWindow(len(enc.encoders), 1, heads, d // heads,
                                      cfg.static_chunk_size, left_chunks, **kw)
        self.up_left = torch.zeros(1, d, enc.up_layer.conv.kernel_size[0] - 1, **kw)
        self.up_encoders = ChunkKVWindow(len(enc.up_encoders), 1, heads, d // heads,
                                         cfg.static_chunk_size * cfg.upsample_stride,
                                         left_chunks, **kw)

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        return (self.encoders.nbytes() + self.up_encoders.nbytes()
                + (self.lookahead_left.numel() + self.up_left.numel())
                * self.up_left.element_size())


def _stack_span(layers: nn.ModuleList, x: Tensor, window: ChunkKVWindow, commit: int,
                d_model: int) -> Tensor:
    """Rel-pos conformer layers over the span's positions ``window.end ..`` with the cached
    keys/values; commits ``commit`` positions."""
    t = x.shape[1]
    p = window.end - window.start
    pos = rel_position_table(p + t - 1, p + 2 * t - 1, d_model, dtype=x.dtype, device=x.device)
    mask = window.mask(t, x.device).unsqueeze(0)  # [1, T, P+T]
    for n, layer in enumerate(layers):
        past_k, past_v = window.past(n)
        x, k, v = layer(x, pos, mask, past_k, past_v)
        window.commit_layer(n, k, v, commit)
    window.advance(commit)
    return x


def encode_span(flow: CausalMaskedDiffWithXvec, state: EncoderState, token: Tensor,
                context_token: Tensor | None, commit: int) -> Tensor:
    """``mu`` of the span's tokens, as the whole-sequence streaming ``flow.encode`` gives them.

    Args:
        flow: the v2 flow (eval mode).
        state: :class:`EncoderState`, at a boundary ``B`` that is a multiple of
            ``static_chunk_size`` tokens; the span holds tokens ``B .. B + T - 1``.
        token: int64 ``[1, T]`` (``T >= 1``), negatives clamped to 0 as upstream.
        context_token: int64 ``[1, pre_lookahead_len]``, the tokens that follow the span (a
            non-final span), or ``None`` at the utterance's end (zero look-ahead).
        commit: tokens of the span that become final (``0 <= commit <= T``; ``B + commit`` a
            chunk boundary): the state moves there. Outputs of the span's last 3 tokens before
            the new boundary depend on ``context_token``, so it must equal the tokens that
            follow (the caller checks).
    Returns:
        float ``[1, stride * T, output_size]`` (time-major, ``encoder_proj`` applied).
    """
    enc = flow.encoder
    cfg = enc.cfg
    stride = cfg.upsample_stride
    x = enc.embed(flow.input_embedding(torch.clamp(token, min=0)))
    ctx = (None if context_token is None
           else enc.embed(flow.input_embedding(torch.clamp(context_token, min=0))))
    x, state.lookahead_left = pre_lookahead_span(enc.pre_lookahead_layer, x, ctx,
                                                 state.lookahead_left, commit)
    x = _stack_span(enc.encoders, x, state.encoders, commit, cfg.output_size)
    up = torch.repeat_interleave(x.transpose(1, 2), stride, dim=2)
    up, state.up_left = conv_with_left(enc.up_layer.conv, up, state.up_left, stride * commit)
    x = enc.up_embed(up.transpose(1, 2))
    x = _stack_span(enc.up_encoders, x, state.up_encoders, stride * commit, cfg.output_size)
    return flow.encoder_proj(enc.after_norm(x))
