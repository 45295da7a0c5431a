"""Export-time patches of our PyTorch modules for OpenVINO conversion (imports torch).

* :class:`LLMCacheStep` — the KV-cached LLM step with one input/output tensor per layer and
  K/V (``past_key_values.{i}.key`` ... / ``present.{i}.key`` ...), the layout the stateful
  transformation pairs into per-layer states.
* :func:`sdpa_attention` — while active, the LLM's rel-pos attention is written as
  ``F.scaled_dot_product_attention(q + u, k, v, attn_mask=bias)`` with the positional term and
  the causal mask folded into the additive ``bias``. Same math as
  :meth:`RelPositionMultiHeadedAttention.forward` (``(ac + bd) / sqrt(d_k)`` becomes
  ``ac / sqrt(d_k) + bd / sqrt(d_k)``, fp32 rounding only); it converts to an OpenVINO
  ``ScaledDotProductAttention`` fed by the cache ``Concat``, which the CPU plugin fuses with
  the state (stateful SDPA). With the projected position tables as inputs (``pos_projected``,
  what the exported step uses) the positional term is ``(q + v) · pos_keys``; otherwise the
  query-side product ``q_v_h W_pos_h`` is written as one 2-D MatMul over a block-diagonal
  input (:func:`_query_pos_projection`).
* :func:`fused_qkv` — while active, the LLM's q, k and v projections are one ``Linear`` of
  three times the width (the three weight matrices stacked by output channel), split after:
  one FullyConnected node instead of three per layer. Every output channel is the same dot
  product as before (per-output-channel INT8 scales are unchanged too), so the logits are
  bit-identical; measured 0.956x per INT8 decode step (docs/performance.md, issue 16).
"""

from __future__ import annotations

import contextlib
import math
import types

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.torch.llm import LLMExplicitCacheStep, TransformerLM
from cosyvino.families.cosyvoice1.torch.transformer import RelPositionMultiHeadedAttention, _rel_shift


def _query_pos_projection(self: RelPositionMultiHeadedAttention, q_v: torch.Tensor
                          ) -> torch.Tensor:
    """``q_v [B, H, T, d_k] -> [B, H, T, d]``, head ``h`` times its slice of ``W_pos``.

    Same values as ``q_v @ W_pos.reshape(H, d_k, d)`` (the zero blocks add exact zeros), but the
    weight stays the 2-D ``linear_pos`` matrix: a batched MatMul against a 3-D weight is not a
    FullyConnected for the OpenVINO CPU plugin, so after ``nncf.compress_weights`` it kept a
    decompressed f32 copy of that weight and decompressed it on every step (docs/performance.md,
    "Measurements behind code constants").
    """
    h, dk = q_v.shape[1], q_v.shape[3]
    eye = torch.eye(h, dtype=q_v.dtype, device=q_v.device).reshape(h, 1, h, 1)
    # row (b, h, t) holds q_v[b, h, t] in column block h and zeros elsewhere: [B, H, T, H*d_k]
    blocks = eye * q_v.unsqueeze(3)  # [B, H, T, H, d_k]
    blocks = blocks.reshape(q_v.shape[0], h, q_v.shape[2], h * dk)
    # x @ W_pos (its rows are (head, d_k)) as linear(x, W_pos^T): traced to a 2-D constant in
    # the FullyConnected [N, K] layout, which NNCF compresses per output channel
    return F.linear(blocks, self.linear_pos.weight.t())


def _sdpa_forward(self: RelPositionMultiHeadedAttention, x, pos, mask=None, past_k=None,
                  past_v=None, query_side_pos=False, pos_projected=False):
    q, k, v = self.project_qkv(x, past_k, past_v)
    keys = k.shape[2]
    scale = 1.0 / math.sqrt(self.d_k)
    q_u = q + self.pos_bias_u.unsqueeze(1)
    q_v = q + self.pos_bias_v.unsqueeze(1)
    if pos_projected:  # pos: this layer's linear_pos(pe) by head [H, n, d_k]
        raw = torch.matmul(q_v, pos.transpose(-2, -1))
    elif query_side_pos:
        raw = torch.matmul(_query_pos_projection(self, q_v), pos.t())
    else:
        p = self.linear_pos(pos)
        p = p.reshape(p.shape[0], self.h, self.d_k).transpose(0, 1)
        raw = torch.matmul(q_v, p.transpose(-2, -1))
    bias = _rel_shift(raw, keys) * scale  # [B, H, T, P+T]
    if mask is not None:
        bias = bias.masked_fill(~mask.unsqueeze(1), torch.finfo(bias.dtype).min)
    out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias, scale=scale)
    b, _, t, _ = out.shape
    out = out.transpose(1, 2).reshape(b, t, self.h * self.d_k)
    return self.linear_out(out), k, v


@contextlib.contextmanager
def _patch_attentions(module: nn.Module, patch):
    """Within the block, every rel-pos attention ``m`` under ``module`` has the attributes
    ``patch(m)`` returns (a dict) set on it; they are deleted afterwards."""
    patched = [(m, patch(m)) for m in module.modules()
               if isinstance(m, RelPositionMultiHeadedAttention)]
    for m, attrs in patched:
        for name, value in attrs.items():
            setattr(m, name, value)
    try:
        yield
    finally:
        for m, attrs in patched:
            for name in attrs:
                delattr(m, name)


def sdpa_attention(module: nn.Module):
    """Context manager: within the block, every rel-pos attention under ``module`` uses the
    SDPA formulation."""
    return _patch_attentions(module, lambda m: {"forward": types.MethodType(_sdpa_forward, m)})


def _fused_project_qkv(self: RelPositionMultiHeadedAttention, x, past_k=None, past_v=None):
    """:meth:`RelPositionMultiHeadedAttention.project_qkv` through ``self.linear_qkv``."""
    q, k, v = self.linear_qkv(x).split(self.h * self.d_k, dim=-1)
    return self._with_cache(q, k, v, past_k, past_v)


def _stacked_qkv(att: RelPositionMultiHeadedAttention) -> nn.Linear:
    """``Linear(d, 3d)`` whose output channels are ``linear_q``'s, ``linear_k``'s, then
    ``linear_v``'s (a key projection without bias gets zero biases: ``+ 0.0`` is exact)."""
    q, k, v = att.linear_q, att.linear_k, att.linear_v
    fused = nn.Linear(q.in_features, q.out_features + k.out_features + v.out_features,
                      dtype=q.weight.dtype, device=q.weight.device)
    k_bias = k.bias if k.bias is not None else torch.zeros_like(q.bias)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        fused.bias.copy_(torch.cat([q.bias, k_bias, v.bias]))
    fused.requires_grad_(False)
    return fused


def fused_qkv(module: nn.Module):
    """Context manager: within the block, every rel-pos attention under ``module`` projects
    q, k and v with one stacked ``linear_qkv`` (:func:`_stacked_qkv`); the module and its
    ``state_dict`` are as before afterwards. Why: the decode step is a chain of ~30 small
    nodes per layer, each paying the CPU plugin's per-node dispatch, and one FullyConnected of
    3d outputs streams its weights faster than three of d."""
    return _patch_attentions(module, lambda m: {
        "linear_qkv": _stacked_qkv(m),
        "project_qkv": types.MethodType(_fused_project_qkv, m)})


#: Relative position table length granularity of the exported LLM step (the rows the host
#: passes as ``pos_keys``, :class:`cosyvino.families.cosyvoice1.positional.PositionalKeys`):
#: with the exact length (a new MatMul shape every decode step) the CPU plugin keeps a kernel
#: and buffers per step (docs/performance.md, "Measurements behind code constants").
POS_BUCKET = 64

#: Manifest fields (``llm``) of this exporter's LLM layout; a dir whose fields differ was
#: written by an older exporter and ``cosyvino convert`` rewrites it. ``attention_mask``: the
#: step takes a key mask and a batch dimension (batched decode of left-padded rows);
#: ``positional``: the projected relative-position tables are inputs (``pos_keys.{l}``);
#: ``qkv``: one stacked q/k/v projection per layer (:func:`fused_qkv`; the step's inputs and
#: outputs are unchanged, so older dirs still load: the field only makes `cosyvino convert`
#: redo them).
LLM_LAYOUT = {"pos_bucket": POS_BUCKET, "positional": "keys_input", "attention_mask": "batch",
              "qkv": "fused"}


class LLMCacheStep(LLMExplicitCacheStep):
    """The table's ``llm`` step (:class:`cosyvino.families.cosyvoice1.torch.llm.
    LLMExplicitCacheStep`: ``(inputs_embeds, attention_mask, pos_offset, pos_keys.{l}...,
    past...) -> (logp, present...)``) as the OpenVINO exporter traces it, inside
    :func:`sdpa_attention` and :func:`fused_qkv`, slicing windows of :data:`POS_BUCKET` rows."""

    def __init__(self, lm: TransformerLM):
        super().__init__(lm, pos_bucket=POS_BUCKET)
