"""The flow-matching estimator: ``ConditionalDecoder``, a 1-D U-Net with transformer blocks.

Upstream: ``cosyvoice/flow/decoder.py`` (``ConditionalDecoder``), built from Matcha-TTS
``matcha/models/components/decoder.py`` (``SinusoidalPosEmb``, ``Block1D``, ``ResnetBlock1D``,
``Downsample1D``, ``TimestepEmbedding``), ``matcha/models/components/transformer.py``
(``BasicTransformerBlock``, diffusers-style self-attention) and the diffusers ``Upsample1D``.

Module and parameter names equal upstream, so the ``decoder.estimator.*`` part of an official
``flow.pt`` (prefix stripped) loads with ``strict=True``.

Export notes: every forward is free of Python branching on tensor values and of data-dependent
shapes; the only shape arithmetic is on ``T`` (stride-2 downsampling gives ``ceil(T/2)``, the
transposed convolution gives ``2*ceil(T/2)``, which is cut back to the skip length), so the
module traces (``torch.jit.trace``) and exports (``torch.export`` with ``Dim("T", min=3)``, odd
or even; at T <= 2 the half-rate length is 1, which torch.export always specialises). Four
spellings differ from upstream only to keep torch.export free of unprovable shape guards, with
the same values: the half-rate mask is a stride-2 width-1 conv instead of ``[:, :, ::2]``, the
skip cut is an ``index_select`` instead of a slice, 3-D linears are ``bmm`` and the transformer
input is made contiguous. Padding is expressed only through ``mask``: convolutions see
``x * mask`` and attention gets an additive key bias ``(1 - mask) * -1e10`` (upstream
``mask_to_bias``; upstream's [T, T] mask also blanks the rows of padded queries, which changes
only padded frames, and those are masked out downstream).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.config import EstimatorConfig
from cosyvino.errors import ConfigError

# Upstream ``mask_to_bias``: additive attention bias for padded keys.
_MASK_BIAS = -1.0e10
# Upstream SinusoidalPosEmb: ``scale=1000`` on t in [0, 1]; base 10000.
_TIME_SCALE = 1000.0
_POS_BASE = 10000.0
# Block1D GroupNorm groups (Matcha ``Block1D(groups=8)``).
_GROUPS = 8


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` for x [B, T, C_in] as a batched matmul: ``F.linear`` on 3-D input flattens
    ``B*T``, and splitting that back makes torch.export add guards it cannot prove for the
    half-rate length ``(T-1)//2 + 1``. Same math (summation order may differ in the last ulp)."""
    w = layer.weight.t().unsqueeze(0).expand(x.shape[0], -1, -1)
    y = torch.bmm(x, w)
    return y if layer.bias is None else y + layer.bias


class SinusoidalPosEmb(nn.Module):
    """Sinusoidal embedding of the flow time ``t`` (Matcha ``SinusoidalPosEmb``).

    ``freq_i = exp(-i * ln(10000) / (half - 1))``, ``arg = (1000 * t) * freq_i``,
    output ``[sin(arg), cos(arg)]``. t float32 [B] -> float32 [B, dim]. No parameters.
    """

    def __init__(self, dim: int):
        super().__init__()
        if dim % 2 != 0:
            raise ConfigError(f"SinusoidalPosEmb needs an even dim, got {dim}")
        self.dim = dim
        self.log_step = math.log(_POS_BASE) / (dim // 2 - 1)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # Computed per call as upstream does (no buffer: nothing to miss when a module is built
        # on the meta device and loaded with assign=True). Same float32 arithmetic as upstream.
        freqs = torch.exp(torch.arange(self.dim // 2, device=t.device).float() * -self.log_step)
        arg = (_TIME_SCALE * t).unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat((arg.sin(), arg.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    """``linear_1 -> SiLU -> linear_2`` (diffusers/Matcha ``TimestepEmbedding``).

    [B, in_channels] -> [B, time_embed_dim].
    """

    def __init__(self, in_channels: int, time_embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(sample)))


class Block1D(nn.Module):
    """``Mish(GroupNorm(8)(Conv1d k3 p1 (x * mask))) * mask``; keys ``block.0`` (conv),
    ``block.1`` (GroupNorm). x [B, dim, T], mask [B, 1, T] -> [B, dim_out, T]."""

    def __init__(self, dim: int, dim_out: int, groups: int = _GROUPS):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(dim, dim_out, 3, padding=1),
            nn.GroupNorm(groups, dim_out),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(x * mask) * mask


class ResnetBlock1D(nn.Module):
    """Matcha ``ResnetBlock1D``: ``block2(block1(x) + mlp(t_emb)) + res_conv(x * mask)``.

    ``mlp`` = [Mish, Linear(time_emb_dim, dim_out)] (key ``mlp.1``), broadcast over time.
    x [B, dim, T], mask [B, 1, T], t_emb [B, time_emb_dim] -> [B, dim_out, T].
    """

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int, groups: int = _GROUPS):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = Block1D(dim, dim_out, groups)
        self.block2 = Block1D(dim_out, dim_out, groups)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask)
        h = h + self.mlp(t_emb).unsqueeze(-1)
        h = self.block2(h, mask)
        return h + self.res_conv(x * mask)


class Downsample1D(nn.Module):
    """``Conv1d(dim, dim, k3, stride 2, p1)`` under key ``conv``; T -> ceil(T/2)."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample1D(nn.Module):
    """diffusers ``Upsample1D(use_conv_transpose=True)``: ``ConvTranspose1d(dim, dim, k4, s2, p1)``
    under key ``conv``; T -> 2T."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Attention(nn.Module):
    """diffusers ``Attention`` as used by the estimator: self-attention, ``to_q/to_k/to_v``
    without bias, ``to_out.0`` Linear with bias (``to_out.1`` is a no-op Dropout),
    scale ``head_dim ** -0.5``. x [B, T, dim], bias [B, 1, 1, T] additive -> [B, T, dim]."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.head_dim = head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q = self._split(_linear(x, self.to_q))
        k = self._split(_linear(x, self.to_k))
        v = self._split(_linear(x, self.to_v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim ** -0.5) + bias
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.heads * self.head_dim)
        return _linear(out, self.to_out[0])


class GELU(nn.Module):
    """diffusers ``GELU`` projection: ``gelu(proj(x))`` with the exact (erf) GELU, or the tanh
    approximation for ``act_fn='gelu-approximate'``. Key ``proj``."""

    def __init__(self, dim_in: int, dim_out: int, approximate: str = "none"):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(_linear(x, self.proj), approximate=self.approximate)


class FeedForward(nn.Module):
    """diffusers ``FeedForward``: ``net`` = [GELU(dim -> 4 dim), Dropout, Linear(4 dim -> dim)]."""

    def __init__(self, dim: int, approximate: str = "none", mult: int = 4):
        super().__init__()
        inner = dim * mult
        self.net = nn.ModuleList([GELU(dim, inner, approximate), nn.Dropout(0.0),
                                  nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(self.net[0](x), self.net[2])


class BasicTransformerBlock(nn.Module):
    """Matcha ``BasicTransformerBlock`` (layer_norm type, self-attention only, no cross-attn):
    ``x += attn1(norm1(x)); x += ff(norm3(x))``. LayerNorm eps 1e-5.
    x [B, T, dim] time-major, bias [B, 1, 1, T] -> [B, T, dim]."""

    def __init__(self, dim: int, heads: int, head_dim: int, approximate: str = "none"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, approximate)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), bias)
        return x + self.ff(self.norm3(x))


def _downsample_mask(mask: torch.Tensor) -> torch.Tensor:
    """``mask[:, :, ::2]`` (upstream) written as a stride-2 width-1 convolution with weight 1
    (exact), whose output length ``(T - 1) // 2 + 1`` is the same symbolic expression as the
    stride-2 conv's; with a slice torch.export cannot prove the two lengths equal for a dynamic
    ``T``. mask [B, 1, T] -> [B, 1, ceil(T/2)]."""
    return F.conv1d(mask, torch.ones(1, 1, 1, dtype=mask.dtype, device=mask.device), stride=2)


def _transformers(blocks: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Run transformer blocks on channel-major x [B, C, T] with padding mask [B, 1, T]."""
    bias = ((1.0 - mask) * _MASK_BIAS).unsqueeze(1)  # [B, 1, 1, T]
    h = x.transpose(1, 2).contiguous()  # contiguous: no stride-order guards under export
    for block in blocks:
        h = block(h, bias)
    return h.transpose(1, 2)


class ConditionalDecoder(nn.Module):
    """The CFM velocity estimator (upstream ``ConditionalDecoder``).

    Structure for ``channels = (c0, c1, ...)``: ``down_blocks[i]`` = ModuleList[ResnetBlock1D,
    ModuleList[n_blocks x BasicTransformerBlock], Downsample1D (stride-2, key ``.conv``) or, for
    the last level, a plain Conv1d k3]; ``mid_blocks[j]`` = ModuleList[ResnetBlock1D,
    ModuleList[transformers]]; ``up_blocks[i]`` = ModuleList[ResnetBlock1D(2 c -> c),
    ModuleList[transformers], Upsample1D (ConvTranspose1d k4 s2, key ``.conv``) or, for the last
    level, a plain Conv1d k3]; then ``final_block`` (Block1D) and ``final_proj`` (Conv1d k1).
    Time MLP width = 4 * channels[0]; attention inner width = num_heads * attention_head_dim.
    """

    def __init__(self, cfg: EstimatorConfig):
        super().__init__()
        if cfg.act_fn == "gelu":
            approximate = "none"
        elif cfg.act_fn == "gelu-approximate":
            approximate = "tanh"
        else:
            raise ConfigError(f"estimator act_fn {cfg.act_fn!r} is not supported "
                              "(expected 'gelu' or 'gelu-approximate')")
        channels = tuple(cfg.channels)
        self.in_channels = cfg.in_channels
        self.out_channels = cfg.out_channels
        time_embed_dim = channels[0] * 4
        self.time_embeddings = SinusoidalPosEmb(cfg.in_channels)
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_embed_dim)

        def transformers(dim: int) -> nn.ModuleList:
            return nn.ModuleList([
                BasicTransformerBlock(dim, cfg.num_heads, cfg.attention_head_dim, approximate)
                for _ in range(cfg.n_blocks)])

        self.down_blocks = nn.ModuleList()
        self.mid_blocks = nn.ModuleList()
        self.up_blocks = nn.ModuleList()

        out_ch = cfg.in_channels
        for i, ch in enumerate(channels):
            in_ch, out_ch = out_ch, ch
            is_last = i == len(channels) - 1
            down = (nn.Conv1d(out_ch, out_ch, 3, padding=1) if is_last
                    else Downsample1D(out_ch))
            self.down_blocks.append(nn.ModuleList([
                ResnetBlock1D(in_ch, out_ch, time_embed_dim), transformers(out_ch), down]))

        for _ in range(cfg.num_mid_blocks):
            self.mid_blocks.append(nn.ModuleList([
                ResnetBlock1D(channels[-1], channels[-1], time_embed_dim),
                transformers(channels[-1])]))

        up_channels = channels[::-1] + (channels[0],)
        for i in range(len(up_channels) - 1):
            in_ch, out_ch = up_channels[i] * 2, up_channels[i + 1]
            is_last = i == len(up_channels) - 2
            up = nn.Conv1d(out_ch, out_ch, 3, padding=1) if is_last else Upsample1D(out_ch)
            self.up_blocks.append(nn.ModuleList([
                ResnetBlock1D(in_ch, out_ch, time_embed_dim), transformers(out_ch), up]))

        self.final_block = Block1D(up_channels[-1], up_channels[-1])
        self.final_proj = nn.Conv1d(up_channels[-1], cfg.out_channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                spks: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Velocity of the flow.

        Args:
            x: ODE state, float32 [B, 80, T].
            mask: float32 [B, 1, T], 1 for valid frames.
            mu: length-regulated encoder output, float32 [B, 80, T].
            t: flow time, float32 [B].
            spks: projected speaker embedding, float32 [B, 80].
            cond: prompt mel (zeros past the prompt), float32 [B, 80, T].

        Returns:
            velocity, float32 [B, 80, T] (zero where mask is 0).
        """
        t_emb = self.time_mlp(self.time_embeddings(t).to(t.dtype))
        spks_t = spks.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        h = torch.cat([x, mu, spks_t, cond], dim=1)

        # Upstream appends mask[:, :, ::2] after every down block and then drops the last one;
        # here the dropped one is never built (its slice would only add export guards).
        masks = [mask]
        hiddens = []
        n_down = len(self.down_blocks)
        for i, (resnet, blocks, down) in enumerate(self.down_blocks):
            mask_down = masks[-1]
            h = resnet(h, mask_down, t_emb)
            h = _transformers(blocks, h, mask_down)
            hiddens.append(h)
            h = down(h * mask_down)
            if i < n_down - 1:
                masks.append(_downsample_mask(mask_down))
        mask_mid = masks[-1]

        for resnet, blocks in self.mid_blocks:
            h = resnet(h, mask_mid, t_emb)
            h = _transformers(blocks, h, mask_mid)

        mask_up = mask
        for resnet, blocks, up in self.up_blocks:
            mask_up = masks.pop()
            skip = hiddens.pop()
            # h[:, :, :len(skip)] as a gather: the transposed conv gives 2*ceil(T/2) frames and a
            # slice would make torch.export specialise on the parity of T.
            keep = torch.arange(skip.shape[-1], device=h.device)
            h = torch.cat([h.index_select(2, keep), skip], dim=1)
            h = resnet(h, mask_up, t_emb)
            h = _transformers(blocks, h, mask_up)
            h = up(h * mask_up)

        h = self.final_block(h, mask_up)
        return self.final_proj(h * mask_up) * mask
