"""ESPnet/WeNet rel-pos encoder stacks: the LLM text encoder, the LLM itself, the flow encoder.

Upstream: ``cosyvoice/transformer/{encoder,encoder_layer,attention,embedding,subsampling,
positionwise_feed_forward}.py`` (ConformerEncoder / TransformerEncoder with
``pos_enc_layer_type: rel_pos_espnet``, ``selfattention_layer_type: rel_selfattn``, no macaron
FFN, no conv module). Parameter names equal upstream so official state_dicts load strictly.

Written for export: the KV cache is explicit tensors in and out, every size is read from a
tensor, the only Python branches are on constructor settings or on whether a cache/mask argument
is given (structure, never data). Dropout is omitted (inference only). Depends on torch only.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.config import EncoderConfig

Tensor = torch.Tensor


def rel_position_table(first: int, count: int, d_model: int, *, dtype: torch.dtype = torch.float32,
                       device: Optional[torch.device] = None) -> Tensor:
    """ESPnet relative position vectors for distances ``first, first-1, ..., first-count+1``.

    ``pe(r)[2k] = sin(r*w_k)``, ``pe(r)[2k+1] = cos(r*w_k)``, ``w_k = exp(-2k*ln(10000)/d)``;
    ``r`` may be negative. Computed the same way (float32 products) as upstream
    ``EspnetRelPositionalEncoding.extend_pe`` (``cosyvoice/transformer/embedding.py``), so the
    values are bit-identical to the upstream table, but without its 5000-position limit.

    Returns float ``[count, d_model]``; row ``k`` is ``pe(first - k)``. ``first``/``count`` may be
    symbolic sizes.
    """
    r = first - torch.arange(count, dtype=torch.float32, device=device)  # [count]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
                    * -(math.log(10000.0) / d_model))  # [d/2]
    angle = r.unsqueeze(1) * div.unsqueeze(0)  # [count, d/2]
    pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1)  # [count, d/2, 2]
    return pe.reshape(count, d_model).to(dtype)


def _rel_shift(raw: Tensor, keys: int) -> Tensor:
    """Turn scores over distances into scores over keys.

    ``raw`` is ``[B, H, T, n']`` with column ``k`` holding distance ``r = P+T-1-k``, of which
    the first ``n = P + 2T - 1`` columns are used (``P = keys - T`` cached keys). Returns ``[B, H, T, keys]`` with
    ``out[..., i, j] = raw[..., i, T-1-i+j]``, i.e. distance ``(P+i) - j`` between new query ``i``
    (absolute position ``P+i``) and key ``j``. Same zero-pad/reshape trick as upstream
    ``RelPositionMultiHeadedAttention.rel_shift``, generalised to a cache offset and to any
    ``n' >= n`` columns: with ``n'`` columns, element ``i n' + j + T`` of the padded rows is
    row ``i``, column ``j + T - i`` (``1 <= j + T - i <= n'`` for ``j < keys``), so the extra
    columns of a longer (bucketed, see Encoder.forward_cached) table are never read and need
    no slicing off first: in the exported step the pad and reshapes then change shape once per
    bucket instead of every decode step.
    """
    b, h, t, n = raw.shape  # n >= keys + t - 1 (callers; no check: it would trace as a constant)
    padded = F.pad(raw, (1, 0))  # [B, H, T, n+1]
    flat = padded.reshape(b, h, t * (n + 1))[:, :, t:]  # drop T leading elements -> T*n
    return flat.reshape(b, h, t, n)[:, :, :, :keys]


class RelPositionMultiHeadedAttention(nn.Module):
    """Multi-head self-attention with ESPnet ("new") relative positions (Transformer-XL 3.3).

    ``score(i,j) = [(q_i + u)·k_j + (q_i + v)·W_pos pe(i-j)] / sqrt(d_k)``, ``u = pos_bias_u[h]``,
    ``v = pos_bias_v[h]``. Upstream ``cosyvoice/transformer/attention.py``.
    """

    def __init__(self, n_head: int, n_feat: int, key_bias: bool = True):
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"attention size {n_feat} is not divisible by {n_head} heads")
        self.h = n_head
        self.d_k = n_feat // n_head
        # Registration order as upstream (parameters of this module come first in state_dict).
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_head, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_head, self.d_k))

    def _heads(self, x: Tensor) -> Tensor:
        """[B, T, H*d_k] -> [B, H, T, d_k]."""
        b, t, _ = x.shape
        return x.reshape(b, t, self.h, self.d_k).transpose(1, 2)

    def project_qkv(self, x: Tensor, past_k: Tensor | None = None,
                    past_v: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Heads of q [B, H, T, d_k] and of k, v with the cache prepended [B, H, P+T, d_k]."""
        return self._with_cache(self.linear_q(x), self.linear_k(x), self.linear_v(x),
                                past_k, past_v)

    def _with_cache(self, q: Tensor, k: Tensor, v: Tensor, past_k: Tensor | None,
                    past_v: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Projections ``[B, T, H*d_k]`` -> heads, the cache prepended to k and v."""
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        return q, k, v

    def forward(self, x: Tensor, pos: Tensor, mask: Optional[Tensor] = None,
                past_k: Optional[Tensor] = None, past_v: Optional[Tensor] = None,
                query_side_pos: bool = False, pos_projected: bool = False
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention of ``T`` new positions over ``P`` cached + ``T`` new keys.

        Args:
            x: float ``[B, T, d]`` (already layer-normed).
            pos: float ``[P+2T-1, d]`` relative position vectors for distances
                ``P+T-1 .. -(T-1)`` (:func:`rel_position_table`), shared by all layers.
            mask: bool, broadcastable to ``[B, T, P+T]`` (``[B,1,P+T]`` or ``[B,T,P+T]``);
                False = key not visible. ``None`` = every key visible.
            past_k, past_v: float ``[B, H, P, d_k]`` projected keys/values (biases included) of
                the cached positions, or ``None`` for ``P = 0``.
            query_side_pos: compute the positional term as ``((q+v) W_pos_h) · pe`` instead of
                ``(q+v) · (W_pos pe)``. Same math (fp32 rounding only); far cheaper when
                ``T`` is small and ``P`` large (decoding), far dearer for long ``T``.
            pos_projected: ``pos`` is already this layer's ``linear_pos(pe)`` split by head,
                ``[H, P+2T-1, d_k]`` (positional keys,
                :class:`cosyvino.families.cosyvoice1.positional.PositionalKeys`): the
                positional term is then ``(q+v)·pos`` with no projection here
                (``query_side_pos`` is ignored).

        Returns:
            ``(out [B, T, d], k [B, H, P+T, d_k], v [B, H, P+T, d_k])``; ``k``/``v`` are the
            new cache (upstream keeps K and V concatenated on the last axis instead).
        """
        q, k, v = self.project_qkv(x, past_k, past_v)
        keys = k.shape[2]

        q_u = q + self.pos_bias_u.unsqueeze(1)  # [B, H, T, d_k]
        q_v = q + self.pos_bias_v.unsqueeze(1)
        matrix_ac = torch.matmul(q_u, k.transpose(-2, -1))  # [B, H, T, P+T]
        if query_side_pos and not pos_projected:
            w_pos = self.linear_pos.weight.reshape(self.h, self.d_k, -1)  # [H, d_k, d]
            raw = torch.matmul(torch.matmul(q_v, w_pos), pos.t())  # [B, H, T, n]
        elif pos_projected:
            raw = torch.matmul(q_v, pos.transpose(-2, -1))  # pos [H, n, d_k] -> [B, H, T, n]
        else:
            p = self.linear_pos(pos)  # [n, d]
            p = p.reshape(p.shape[0], self.h, self.d_k).transpose(0, 1)  # [H, n, d_k]
            raw = torch.matmul(q_v, p.transpose(-2, -1))  # [B, H, T, n]
        matrix_bd = _rel_shift(raw, keys)
        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)

        if mask is not None:
            hidden = ~mask.unsqueeze(1)  # [B, 1, T|1, P+T]
            scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
            attn = torch.softmax(scores, dim=-1).masked_fill(hidden, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v)  # [B, H, T, d_k]
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.h * self.d_k)
        return self.linear_out(out), k, v


class PositionwiseFeedForward(nn.Module):
    """``w_2(act(w_1(x)))``; upstream ``cosyvoice/transformer/positionwise_feed_forward.py``."""

    def __init__(self, idim: int, hidden_units: int, activation: nn.Module):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class _EncoderLayerBase(nn.Module):
    """Shared forward of the two layer kinds: ``x += MHA(norm_a(x)); x += FFN(norm_b(x))``."""

    normalize_before: bool

    def _norms(self) -> tuple[nn.LayerNorm, nn.LayerNorm]:
        raise NotImplementedError

    def forward(self, x: Tensor, pos: Tensor, mask: Optional[Tensor] = None,
                past_k: Optional[Tensor] = None, past_v: Optional[Tensor] = None,
                query_side_pos: bool = False, pos_projected: bool = False
                ) -> tuple[Tensor, Tensor, Tensor]:
        """x ``[B, T, d]`` -> ``(x [B, T, d], k, v)``; see :class:`RelPositionMultiHeadedAttention`."""
        norm_att, norm_ff = self._norms()
        residual = x
        if self.normalize_before:
            x = norm_att(x)
        att, k, v = self.self_attn(x, pos, mask, past_k, past_v, query_side_pos,
                                   pos_projected)
        x = residual + att
        if not self.normalize_before:
            x = norm_att(x)
        residual = x
        if self.normalize_before:
            x = norm_ff(x)
        x = residual + self.feed_forward(x)
        if not self.normalize_before:
            x = norm_ff(x)
        return x, k, v


class ConformerEncoderLayer(_EncoderLayerBase):
    """Conformer block without macaron FFN and conv module, SiLU FFN (ff_scale 1.0).

    Upstream ``cosyvoice/transformer/encoder_layer.py::ConformerEncoderLayer``.
    """

    def __init__(self, size: int, heads: int, linear_units: int, *, key_bias: bool = True,
                 normalize_before: bool = True, eps: float = 1e-5):
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(heads, size, key_bias)
        self.feed_forward = PositionwiseFeedForward(size, linear_units, nn.SiLU())
        self.norm_ff = nn.LayerNorm(size, eps=eps)
        self.norm_mha = nn.LayerNorm(size, eps=eps)
        self.normalize_before = normalize_before

    def _norms(self):
        return self.norm_mha, self.norm_ff


class TransformerEncoderLayer(_EncoderLayerBase):
    """Transformer block, ReLU FFN. Upstream ``encoder_layer.py::TransformerEncoderLayer``."""

    def __init__(self, size: int, heads: int, linear_units: int, *, key_bias: bool = True,
                 normalize_before: bool = True, eps: float = 1e-5):
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(heads, size, key_bias)
        self.feed_forward = PositionwiseFeedForward(size, linear_units, nn.ReLU())
        self.norm1 = nn.LayerNorm(size, eps=eps)
        self.norm2 = nn.LayerNorm(size, eps=eps)
        self.normalize_before = normalize_before

    def _norms(self):
        return self.norm1, self.norm2


class LinearInput(nn.Module):
    """``LinearNoSubsampling`` / ``LegacyLinearNoSubsampling`` + ESPnet rel-pos scaling.

    ``out = Sequential(Linear, LayerNorm, Dropout[, ReLU])`` (keys ``out.0``, ``out.1``), then
    ``x * sqrt(d)``; no additive position encoding. Upstream ``cosyvoice/transformer/
    subsampling.py`` and ``embedding.py::EspnetRelPositionalEncoding.forward``.
    """

    def __init__(self, idim: int, odim: int, legacy: bool, eps: float = 1e-5):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(idim, odim), nn.LayerNorm(odim, eps=eps),
                                   nn.Identity()]
        if legacy:
            layers.append(nn.ReLU())
        self.out = nn.Sequential(*layers)
        self.xscale = math.sqrt(odim)

    def forward(self, x: Tensor) -> Tensor:
        """float ``[B, T, idim]`` -> ``[B, T, odim]``."""
        return self.out(x) * self.xscale


_LAYERS = {"conformer": ConformerEncoderLayer, "transformer": TransformerEncoderLayer}
_INPUT_LAYERS = {"linear": False, "linear_legacy": True}


class Encoder(nn.Module):
    """Rel-pos encoder stack (upstream ``ConformerEncoder`` / ``TransformerEncoder``).

    Submodules ``embed``, ``after_norm``, ``encoders.{i}`` give the official state_dict keys.
    Attention pattern from ``cfg.static_chunk_size``: 0 = full (padding mask only), c > 0 = chunk
    mask (query ``i`` sees keys ``j < (i//c + 1)*c``; c = 1 is causal), AND-ed with padding.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if cfg.layer_type not in _LAYERS:
            raise ValueError(f"unknown encoder layer_type {cfg.layer_type!r}; "
                             f"expected one of {sorted(_LAYERS)}")
        if cfg.input_layer not in _INPUT_LAYERS:
            raise ValueError(f"unsupported encoder input_layer {cfg.input_layer!r}; "
                             f"expected one of {sorted(_INPUT_LAYERS)}")
        self.cfg = cfg
        d = cfg.output_size
        self.embed = LinearInput(cfg.input_size, d, _INPUT_LAYERS[cfg.input_layer],
                                 eps=cfg.layer_norm_eps)
        self.normalize_before = cfg.normalize_before
        self.after_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        layer_cls = _LAYERS[cfg.layer_type]
        self.encoders = nn.ModuleList([
            layer_cls(d, cfg.attention_heads, cfg.linear_units, key_bias=cfg.key_bias,
                      normalize_before=cfg.normalize_before, eps=cfg.layer_norm_eps)
            for _ in range(cfg.num_blocks)])

    @property
    def num_heads(self) -> int:
        return self.cfg.attention_heads

    @property
    def head_dim(self) -> int:
        return self.cfg.output_size // self.cfg.attention_heads

    def _finish(self, x: Tensor) -> Tensor:
        return self.after_norm(x) if self.normalize_before else x

    def forward(self, xs: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """Encode a whole sequence.

        Args:
            xs: float ``[B, T, input_size]``.
            mask: bool ``[B, 1, T]`` (True = valid frame), or ``None`` = no padding.
        Returns:
            float ``[B, T, output_size]`` (padded frames hold unspecified values, as upstream).
        """
        t = xs.shape[1]
        x = self.embed(xs)
        pos = rel_position_table(t - 1, 2 * t - 1, self.cfg.output_size, dtype=x.dtype,
                                 device=x.device)
        c = self.cfg.static_chunk_size
        if c > 0:
            i = torch.arange(t, device=xs.device)
            chunk = i.unsqueeze(0) < (torch.div(i, c, rounding_mode="floor") + 1).unsqueeze(1) * c
            att_mask = chunk.unsqueeze(0)  # [1, T, T]
            if mask is not None:
                att_mask = att_mask & mask
        else:
            att_mask = mask
        for layer in self.encoders:
            x, _, _ = layer(x, pos, att_mask)
        return self._finish(x)

    def forward_cached(self, xs: Tensor, past_k: Sequence[Tensor], past_v: Sequence[Tensor],
                       query_side_pos: bool = False, pos_bucket: int = 1,
                       key_mask: Optional[Tensor] = None,
                       pos_keys: Optional[Sequence[Tensor]] = None,
                       pos_offset: Optional[Tensor] = None
                       ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Causal step over new positions ``P .. P+T-1`` with an explicit KV cache.

        New positions see every cached position and, among themselves, causally. Equals
        :meth:`forward` of the concatenated sequence for ``static_chunk_size`` 1 (upstream
        ``BaseEncoder.forward_chunk`` with ``required_cache_size=-1`` and a lower-triangular
        ``att_mask``, as ``TransformerLM.inference`` calls it).

        Batches of ``B`` rows with different real cache lengths ``P_b`` are LEFT-padded to the
        common ``P``: row ``b``'s real keys are its last ``P_b`` cached positions, ``key_mask``
        hides the ``P - P_b`` padded ones. One relative-position table then serves every row:
        new query ``i`` sits at padded position ``P+i`` and real key ``j`` at padded position
        ``j``, whose true distance ``(P_b+i) - (j-(P-P_b)) = P+i-j`` is the padded one. Masked
        keys get exactly zero attention weight, so a row's output equals its unbatched output
        up to fp32 rounding.

        Args:
            xs: float ``[B, T, input_size]`` (``T >= 1``).
            past_k, past_v: per layer float ``[B, H, P, d_k]`` (``P`` may be 0).
            key_mask: ``[B, P+T]`` (bool, or float with 1 = real key and 0 = padding), or
                ``None`` = every key real.
            query_side_pos: see :class:`RelPositionMultiHeadedAttention`.
            pos_bucket: build the relative position table for a multiple of this many
                distances (the extra rows are sliced off the scores; same values). An exported
                graph then sees a new table length only every ``pos_bucket`` decode steps: the
                OpenVINO CPU plugin keeps a compiled kernel and buffers (~1 MB) for every
                distinct MatMul shape it runs, which grew the LLM's memory with every token.
        Returns:
            ``(ys [B, T, output_size], present_k, present_v)``, present per layer
            ``[B, H, P+T, d_k]``.
        """
        t = xs.shape[1]
        p = past_k[0].shape[2]
        x = self.embed(xs)
        count = p + 2 * t - 1
        if pos_bucket > 1:
            count = (count + pos_bucket - 1) // pos_bucket * pos_bucket
        if pos_keys is None:
            pos = rel_position_table(p + t - 1, count, self.cfg.output_size, dtype=x.dtype,
                                     device=x.device)
        else:
            if pos_offset is None:
                raise ValueError("pos_keys need a pos_offset")
            start = pos_offset.reshape(())
            windows = [keys[:, start:start + count] for keys in pos_keys]
        i = torch.arange(t, device=xs.device)
        j = torch.arange(p + t, device=xs.device)
        att_mask = (j.unsqueeze(0) <= (i + p).unsqueeze(1)).unsqueeze(0)  # [1, T, P+T]
        if key_mask is not None:
            att_mask = att_mask & (key_mask != 0).unsqueeze(1)  # [B, T, P+T]
        present_k: list[Tensor] = []
        present_v: list[Tensor] = []
        for n, layer in enumerate(self.encoders):
            if pos_keys is not None:
                x, k, v = layer(x, windows[n], att_mask, past_k[n], past_v[n],
                                pos_projected=True)
            else:
                x, k, v = layer(x, pos, att_mask, past_k[n], past_v[n], query_side_pos)
            present_k.append(k)
            present_v.append(v)
        return self._finish(x), present_k, present_v

    def empty_cache(self, dtype: torch.dtype = torch.float32,
                    device: Optional[torch.device] = None) -> tuple[list[Tensor], list[Tensor]]:
        """Per-layer empty caches ``[1, H, 0, d_k]`` for :meth:`forward_cached`."""
        shape = (1, self.num_heads, 0, self.head_dim)
        n = len(self.encoders)
        return ([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
                [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)])
