"""The ``torch_module`` s of the CosyVoice3 graph table (:mod:`..graphs`) that are not shared with
CosyVoice2: thin tensor-in / tensor-out wrappers of the v3 parts (flow :mod:`.flow`, DiT
:mod:`.dit`, causal HiFT :mod:`.hift`) with no data-dependent Python control flow, so one
traced graph serves every call.

What the parts choose with Python flags is a tensor input here:

* the pre-lookahead layer's look-ahead (sheet v3 §5.2): ``context`` (the 3 look-ahead tokens)
  and ``context_scale`` (1: look-ahead context of a non-final call; 0: zero padding, a final
  call);
* the DiT's full or chunk attention (sheet v3 §5.3): ``chunk`` int64 [1], query ``i`` sees keys
  ``j < (i // chunk + 1) * chunk``;
  :data:`~cosyvino.families.cosyvoice23.graph_specs.FULL_ATTENTION`
  gives full attention;
* the vocoder's ``finalize`` (sheet v3 §6.3): the decode graph takes ``conv_pre``'s 4 look-ahead
  frames as ``context`` (zeros when finalizing, what upstream pads) and keeps the source STFT up
  to the body's frames; the f0 graph always runs with zero look-ahead, and a non-final call
  drops its last 3 values (they are the only ones the look-ahead frames change, the later layers
  being left-causal). The caller drops a non-final decode's last 480 samples (the iSTFT tail).

The f0 predictor runs in float64 as upstream's (sheet v3 §6.1). ONNX Runtime has no float64
convolution kernel, so while exporting to ONNX the f0 graph traces a float32 copy of the
predictor instead (:class:`F0Graph`). Parity with the parts' own calls is tested in
tests/test_cosyvoice3_family.py.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from cosyvino.families.cosyvoice23.torch.chunk_mask import chunk_visible

Tensor = torch.Tensor


class FlowEncoderGraph(nn.Module):
    """Speech tokens (prompt first) -> ``mu`` and the projected speaker (sheet v3 §5.2).

    tokens int64 [1, n], context int64 [1, 3], context_scale float32 [1], embedding float32
    [1, 192] -> (mu float32 [1, 80, 2n] channel-major, spks float32 [1, 80])."""

    def __init__(self, flow):
        super().__init__()
        self.flow = flow
        self.ratio = int(flow.cfg.token_mel_ratio)

    def forward(self, tokens: Tensor, context: Tensor, context_scale: Tensor,
                embedding: Tensor) -> tuple[Tensor, Tensor]:
        flow = self.flow
        x = flow.input_embedding(torch.clamp(tokens, min=0))
        ctx = flow.input_embedding(torch.clamp(context, min=0)) * context_scale.reshape(1, 1, 1)
        h = flow.pre_lookahead_layer(x, ctx)
        mu = h.repeat_interleave(self.ratio, dim=1).transpose(1, 2)
        return mu, flow.speaker(embedding)


class EstimatorGraph(nn.Module):
    """The DiT velocity (sheet v3 §5.3, I/O §5.5) with the attention chunk as an input:
    x / mu / cond float32 [B, 80, T], mask [B, 1, T], t [B], spks [B, 80], chunk int64 [1] ->
    velocity float32 [B, 80, T]. :class:`~.dit.DiT` with its mask built from ``chunk`` and its
    rotary positions from a cumsum over the frames (so ``T`` stays symbolic when traced)."""

    def __init__(self, dit):
        super().__init__()
        self.dit = dit

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor,
                cond: Tensor, chunk: Tensor) -> Tensor:
        dit = self.dit
        t_emb = dit.time_embed(t)
        h = dit.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        inv_freq = dit.rotary_embed.inv_freq
        pos = torch.ones_like(x[0, 0], dtype=inv_freq.dtype).cumsum(0) - 1  # 0..T-1
        angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0)  # [T, d/2]
        # each frequency twice in a row (RotaryEmbedding's repeat_interleave, written as a
        # stack: the ONNX exporter's repeat_interleave fails on a symbolic T)
        angles = torch.stack((angles, angles), dim=-1).flatten(-2)
        allowed = chunk_visible(x[0, 0], chunk) & (mask > 0).unsqueeze(1)  # [B, 1, T, T]
        frame_mask = mask.transpose(1, 2)
        for block in dit.transformer_blocks:
            h = block(h, t_emb, allowed, frame_mask, angles)
        return dit.proj_out(dit.norm_out(h, t_emb)).transpose(1, 2)


class F0Graph(nn.Module):
    """mel float32 [1, 80, T] -> f0 float32 [1, T] (Hz; zero look-ahead at the end, upstream's
    ``finalize``), computed in float64 (sheet v3 §6.1); under ONNX export by a float32 copy of
    the predictor (module docstring)."""

    def __init__(self, hift):
        super().__init__()
        self.f0_predictor = hift.f0_predictor
        self.f0_predictor_f32 = copy.deepcopy(hift.f0_predictor).float()

    def forward(self, mel: Tensor) -> Tensor:
        if torch.onnx.is_in_onnx_export():
            return self.f0_predictor_f32(mel, True)
        dtype = self.f0_predictor.classifier.weight.dtype
        return self.f0_predictor(mel.to(dtype), True).to(mel.dtype)


class DecodeGraph(nn.Module):
    """mel float32 [1, 80, n] (the frames that produce audio), context [1, 80, 4] (``conv_pre``'s
    look-ahead: the next 4 frames of a non-final call, zeros when finalizing), source [1, 1, S]
    (S >= 480 n: the NSF source of the call's f0 frames) -> wav float32 [1, 480 n] in ±0.99
    (sheet v3 §6.3; a non-final caller drops the last 480 samples)."""

    def __init__(self, hift):
        super().__init__()
        self.stage = hift.decode_stage(True)

    def forward(self, mel: Tensor, context: Tensor, source: Tensor) -> Tensor:
        st = self.stage
        n = mel.shape[-1]
        # a slice, not ``narrow``: OpenVINO's TorchScript frontend makes narrow's traced length
        # a rank-0 Slice stop, which its shape inference rejects
        s_stft = st._stft(source)[..., :st.stft_frames_per_frame * n + 1]
        wav = st.generate(st.conv_pre(mel, context), s_stft)
        return torch.clamp(wav, -st.audio_limit, st.audio_limit)


__all__ = ["DecodeGraph", "EstimatorGraph", "F0Graph", "FlowEncoderGraph"]
