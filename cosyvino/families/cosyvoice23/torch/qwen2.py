"""Our own Qwen2 decoder on ``inputs_embeds`` with an explicit KV cache (CosyVoice2 and 3).

Sheet v2 §4.1 (module tree), §4.2 (block math, transformers 4.51.3 inference), §4.5 (KV cache):
RMSNorm computed in fp32; q/k/v projections with bias, o_proj and the SiLU-gated MLP without;
grouped-query attention (each KV head serves ``heads / kv_heads`` consecutive query heads);
RoPE with θ from ``config.json`` over the whole head in the "rotate half" layout (pairs
(i, i + head_dim/2)), positions counted over the whole sequence (cache included); causal scaled
dot-product attention (1/sqrt(head_dim)); the output is the hidden state AFTER the final norm.
There is no ``lm_head``: CosyVoice never uses Qwen's text head (its speech head is separate).

Submodule names equal transformers' ``Qwen2Model`` (``embed_tokens``, ``layers.{i}.self_attn.
q_proj`` ...), so the official ``llm.model.model.*`` keys map by prefix. The cache is plain tensors
(stacked over layers), so the step traces into a graph with cache inputs and outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice23.qwen2_config import Qwen2Config

Tensor = torch.Tensor


class Qwen2RMSNorm(nn.Module):
    """``w · x / sqrt(mean(x²) + eps)`` over the last axis, in fp32 (sheet v2 §4.2)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """``[..., width]`` -> same shape and dtype."""
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float) -> Tensor:
    """float32 ``[head_dim / 2]``: ``θ^(-2i / head_dim)`` for i = 0 .. head_dim/2 - 1 (sheet v2 §4.2;
    computed like transformers' default RoPE init so the angles round the same way)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta ** exponents)


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last axis split in halves (the HF RoPE layout)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen2Attention(nn.Module):
    """Causal GQA self-attention with RoPE and a KV cache (sheet v2 §4.2)."""

    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.attention_head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                            cfg.num_key_value_heads, hd)
        self.q_proj = nn.Linear(d, cfg.q_width, bias=True)
        self.k_proj = nn.Linear(d, cfg.kv_width, bias=True)
        self.v_proj = nn.Linear(d, cfg.kv_width, bias=True)
        self.o_proj = nn.Linear(cfg.q_width, d, bias=False)

    def repeat_kv(self, kv: Tensor) -> Tensor:
        """``[B, kv_heads, P, hd] -> [B, heads, P, hd]``, query head ``h`` reading KV head
        ``h // group``: the same values as ``repeat_interleave(group, dim=1)``, written as
        transformers' ``repeat_kv`` (unsqueeze, expand, reshape) because that is the grouped
        query pattern OpenVINO's CPU plugin fuses into its stateful attention with the KV
        cache; ``repeat_interleave`` converts to a ``Tile`` it does not match, and then the
        attention is decomposed and the cache copied every step."""
        b, kvh, p, hd = kv.shape
        group = self.num_heads // self.num_kv_heads
        return kv[:, :, None].expand(b, kvh, group, p, hd).reshape(b, kvh * group, p, hd)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, past_k: Tensor, past_v: Tensor,
                mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Attend ``T`` new positions to ``P`` cached ones and themselves.

        Args:
            x: ``[B, T, hidden]``; cos, sin: ``[T, head_dim]`` for the new positions.
            past_k, past_v: ``[B, kv_heads, P, head_dim]`` (keys already rotated).
            mask: bool ``[T, P+T]``, True where a query may attend a key (causal).
        Returns:
            ``([B, T, hidden], present_k, present_v)``, presents ``[B, kv_heads, P+T, head_dim]``.
        """
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_all = torch.cat([past_k, k], dim=2)
        v_all = torch.cat([past_v, v], dim=2)
        # query head h reads KV head h // group (transformers' repeat_kv order)
        keys, values = self.repeat_kv(k_all), self.repeat_kv(v_all)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(out), k_all, v_all


class Qwen2MLP(nn.Module):
    """``down(silu(gate(x)) · up(x))``, no biases (sheet v2 §4.2)."""

    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    """Pre-norm block: ``x += attn(norm(x)); x += mlp(norm(x))`` (sheet v2 §4.2)."""

    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.input_layernorm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Qwen2Attention(cfg)
        self.post_attention_layernorm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Qwen2MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, past_k: Tensor, past_v: Tensor,
                mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, mask)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Qwen2Model(nn.Module):
    """Qwen2 decoder stack: ``embed_tokens`` (text table), ``layers``, final ``norm``.

    :meth:`forward` runs on input embeddings (unscaled, sheet v2 §4.2), not token ids: CosyVoice
    feeds text rows, speech rows and its own SOS/TASK rows. ``rotary_inv_freq`` is a
    non-persistent buffer (not in the state_dict, as upstream's ``rotary_emb.inv_freq``).
    """

    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("rotary_inv_freq",
                             rope_inverse_frequencies(cfg.attention_head_dim, cfg.rope_theta),
                             persistent=False)

    def empty_cache(self, batch: int = 1, dtype: torch.dtype = torch.float32
                    ) -> tuple[Tensor, Tensor]:
        """Empty ``(past_k, past_v)``, each ``[layers, batch, kv_heads, 0, head_dim]``."""
        c = self.cfg
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, 0, c.attention_head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)

    def rope(self, start: Tensor | int, length: int) -> tuple[Tensor, Tensor]:
        """``(cos, sin)``, each float32 ``[length, head_dim]``, for positions start .. start+length-1."""
        pos = torch.arange(length, dtype=torch.float32) + start
        freqs = pos[:, None] * self.rotary_inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, inputs_embeds: Tensor, past_k: Tensor, past_v: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Run ``T`` new positions after ``P`` cached ones (prefill: ``P = 0``; step: ``T = 1``).

        Args:
            inputs_embeds: float32 ``[B, T, hidden]``, ``T >= 1``.
            past_k, past_v: float32 ``[layers, B, kv_heads, P, head_dim]`` (:meth:`empty_cache`
                for ``P = 0``); the new positions are ``P .. P+T-1``.
        Returns:
            ``hidden`` float32 ``[B, T, hidden]`` after the final norm (the input of a
            CosyVoice speech head); ``present_k``, ``present_v`` ``[layers, B, kv_heads, P+T,
            head_dim]``.
        """
        pasts = [(past_k[i], past_v[i]) for i in range(len(self.layers))]
        h, presents = self.forward_layers(inputs_embeds, pasts)
        return (h, torch.stack([k for k, _ in presents]),
                torch.stack([v for _, v in presents]))

    def forward_layers(self, inputs_embeds: Tensor, pasts: list[tuple[Tensor, Tensor]]
                       ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """:meth:`forward` with the cache as one ``(past_k, past_v)`` pair per layer, each
        float32 ``[B, kv_heads, P, head_dim]``; returns ``hidden`` and the per-layer
        ``(present_k, present_v)`` ``[B, kv_heads, P+T, head_dim]``. The layout of an export
        that keeps one state per layer (the OpenVINO stateful step)."""
        t = inputs_embeds.shape[1]
        p = pasts[0][0].shape[2]
        cos, sin = self.rope(p, t)
        # query i (absolute position p+i) sees keys 0 .. p+i
        mask = torch.arange(p + t)[None, :] <= (torch.arange(t)[:, None] + p)
        x = inputs_embeds
        presents = []
        for layer, (pk, pv) in zip(self.layers, pasts):
            x, k, v = layer(x, cos, sin, pk, pv, mask)
            presents.append((k, v))
        return self.norm(x), presents
