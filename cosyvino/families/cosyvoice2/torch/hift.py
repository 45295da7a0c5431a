"""CosyVoice2 vocoder (``HiFTGenerator`` at 24 kHz, NSF source ``SineGen2``), in PyTorch.

Upstream: ``cosyvoice/hifigan/generator.py`` (``HiFTGenerator``, ``SourceModuleHnNSF``,
``SineGen2``; ``sinegen_type '2'``, ``causal=False``); CosyVoice2 architecture sheet §6.

The v2 generator has the v1 module layout (three upsampling stages 8·5·3 instead of 8·8; the
reflection pad after the last stage; source downsamplers of kernel 2u / stride u), so the
parameters, the f0 predictor and the decode path are the v1 ones
(:mod:`cosyvino.families.cosyvoice1.torch.hift`) built from a v2
:class:`~cosyvino.families.cosyvoice2.hift_config.HiFTConfig`. Only the source differs:
:class:`SineGen2SourceStage` integrates the phase at the mel frame rate and interpolates it
linearly to the sample rate.

Inference is three export-friendly stages sharing the generator's parameters (tensors in,
tensors out, randomness passed in):

- :class:`F0Stage`: mel [B, 80, T] -> f0 [B, T] (Hz per 20 ms frame);
- :class:`SineGen2SourceStage`: f0 [B, T], noise [B, H, 480 T] -> source [B, 1, 480 T];
- :class:`DecodeStage`: mel, source -> waveform [B, 480 T] at 24 kHz, in ±audio_limit.

All tensors float32. Only this module (and its callers) may import torch.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.errors import CheckpointError, InputError
from cosyvino.families.cosyvoice1.torch.hift import DecodeStage, F0Stage
from cosyvino.families.cosyvoice1.torch.hift import HiFTGenerator as _V1HiFTGenerator
from cosyvino.families.cosyvoice1.weight_norm import (
    fold_weight_norm,
    unfold_weight_norm,
)
from cosyvino.families.cosyvoice2.hift_config import HiFTConfig, read_hift_config
from cosyvino.families.cosyvoice23.torch.hift_checkpoint import read_hift_state_dict

__all__ = [
    "DecodeStage",
    "F0Stage",
    "HiFTGenerator",
    "SineGen2SourceStage",
    "hift_checkpoint_shapes",
    "load_hift",
]

_PARAMETRIZATION_G = ".parametrizations.weight.original0"


class HiFTGenerator(_V1HiFTGenerator):
    """CosyVoice2 HiFT parameters in the official module layout (weight norm folded).

    Args:
        cfg: v2 vocoder hyperparameters (:class:`HiFTConfig`; its validation guarantees a
            SineGen2 rate and one source branch per upsampling stage).

    Raises:
        TypeError: ``cfg`` is not a v2 :class:`HiFTConfig` (a v1 config would build the v1
            source by mistake).

    ``forward(mel, noise)`` runs the three stages and returns ``(wav, source)``; streaming
    callers that need upstream's ``cache_source`` overwrite the head of the source between
    :meth:`source_stage` and :meth:`decode_stage`.
    """

    def __init__(self, cfg: HiFTConfig):
        if not isinstance(cfg, HiFTConfig):
            raise TypeError(f"CosyVoice2 HiFTGenerator needs a cosyvoice2 HiFTConfig, got "
                            f"{type(cfg).__qualname__}")
        super().__init__(cfg)

    def source_stage(self) -> SineGen2SourceStage:
        """:class:`SineGen2SourceStage` sharing this generator's ``m_source.l_linear``."""
        return SineGen2SourceStage(self)

    def forward(self, mel: torch.Tensor,  # type: ignore[override]  # v2 source: no phase
                noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full vocoder: mel [B, 80, T], noise [B, H, 480 T] (see
        :func:`cosyvino.families.cosyvoice2.nsf.draw_sine_noise`) ->
        ``(wav [B, 480 T], source [B, 1, 480 T])`` (upstream ``inference`` without a cache)."""
        f0 = self.f0_stage()(mel)
        source = self.source_stage()(f0, noise)
        return self.decode_stage()(mel, source), source


class SineGen2SourceStage(nn.Module):
    """NSF harmonic source of CosyVoice2 (upstream ``SourceModuleHnNSF`` with ``SineGen2``,
    non-causal; sheet §6.2).

    Inputs (float32):
        f0 [B, T]: Hz per mel frame (the f0 predictor's output).
        noise [B, H, hop*T]: standard normal, H = nb_harmonics + 1 (upstream draws it as
            [B, hop*T, H]: this is the transpose); scaled here by ``nsf_sigma`` where voiced and
            ``nsf_alpha / 3`` where unvoiced.

    Output: source [B, 1, hop*T] float32 in (-1, 1).

    Steps, as upstream computes them (same float32 operations, so the sines match bit for bit):
    per frame k and harmonic n = 1..H, ``rad = (n f0_k / sampling_rate) mod 1`` (upstream forms
    this per sample and linearly interpolates it down by 1/hop, which reads two equal samples
    of frame k: the same value; its random initial phase lands on sample 0, which that
    interpolation never reads, so it is omitted); ``phase = cumsum_k(rad) · 2π``; linear
    interpolation (align_corners False) of ``hop · phase`` up by ``hop``; sines
    ``sin(phase) · nsf_alpha``; voiced mask ``f0 > nsf_voiced_threshold`` (nearest-upsampled);
    ``sines · uv + amp · noise``; merge ``tanh(l_linear(·))`` over the H harmonics.
    """

    def __init__(self, hift: HiFTGenerator):
        super().__init__()
        cfg = hift.cfg
        self.m_source = hift.m_source
        self.hop = int(cfg.hop_length)
        self.sampling_rate = int(cfg.sampling_rate)
        self.sine_amp = float(cfg.nsf_alpha)
        self.noise_std = float(cfg.nsf_sigma)
        self.voiced_threshold = float(cfg.nsf_voiced_threshold)
        harm = torch.arange(1, cfg.nb_harmonics + 2, dtype=torch.float32).view(1, 1, -1)
        self.register_buffer("harmonics", harm, persistent=False)

    def forward(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        fn = f0.unsqueeze(-1) * self.harmonics                        # [B, T, H]
        rad = torch.remainder(fn / self.sampling_rate, 1.0)
        phase = torch.cumsum(rad, dim=1) * 2 * math.pi                 # [B, T, H]
        phase = F.interpolate(phase.transpose(1, 2) * self.hop, scale_factor=float(self.hop),
                              mode="linear")                           # [B, H, hop T]
        sines = torch.sin(phase) * self.sine_amp
        uv = (f0.unsqueeze(1) > self.voiced_threshold).to(f0.dtype)    # [B, 1, T]
        uv = F.interpolate(uv, scale_factor=float(self.hop), mode="nearest")
        # the operation order of upstream's noise amplitude, for bit-equal float32 results
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        excitation = sines * uv + noise_amp * noise                    # [B, H, hop T]
        merged = torch.tanh(self.m_source.l_linear(excitation.transpose(1, 2)))  # [B, L, 1]
        return merged.transpose(1, 2)


def hift_checkpoint_shapes(hift: HiFTGenerator, spelling: str = "parametrizations"
                           ) -> dict[str, tuple[int, ...]]:
    """{key: shape} of an official ``hift.pt`` for ``hift``'s config: the weight-normed convs
    as (g, v) pairs in ``spelling`` (``"parametrizations"``: upstream HEAD and the released
    CosyVoice2 file, sheet §6.4; ``"weight_g"``: older torch)."""
    sd = unfold_weight_norm(hift.state_dict(), hift.weight_normed_parameters(), spelling)
    return {k: tuple(v.shape) for k, v in sd.items()}


def load_hift(model_dir_or_file: str | os.PathLike, cfg: HiFTConfig | None = None
              ) -> HiFTGenerator:
    """Build a :class:`HiFTGenerator` and load an official ``hift.pt`` strictly (eval mode,
    no gradients).

    Args:
        model_dir_or_file: a model directory (``cosyvoice2.yaml`` + ``hift.pt``) or the
            ``hift.pt`` file itself.
        cfg: the hyperparameters; None reads them from the directory's ``cosyvoice2.yaml``
            (then the first argument must be a directory).

    As upstream's load: the substring ``generator.`` is removed from every key; the keys must
    then be exactly the module's, with the weight-norm pairs in one spelling (sheet §6.4).
    Values are upcast to float32 BEFORE the weight norm is folded (upstream's float32 module
    copies a float16 file's g and v, then computes g·v/‖v‖ in float32; folding in float16 would
    move the waveform by ~1e-1).

    Raises:
        ModelDirError: a missing directory, yaml or file; ConfigError: a bad yaml;
        CheckpointError: unreadable file, missing/unexpected keys or wrong shapes (named).
        InputError: ``cfg`` is None and a file was given.
    """
    path = os.fspath(model_dir_or_file)
    if os.path.isdir(path):
        if cfg is None:
            cfg = read_hift_config(path)
        path = os.path.join(path, "hift.pt")
    elif cfg is None:
        raise InputError(f"load_hift({path!r}) needs cfg, or a model directory with "
                         "cosyvoice2.yaml")
    hift = HiFTGenerator(cfg)
    sd = read_hift_state_dict(path, lambda spelling: hift_checkpoint_shapes(hift, spelling),
                              config_name="cosyvoice2.yaml")
    try:
        sd = fold_weight_norm({k: v.float() for k, v in sd.items()})
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: bad weight-norm pair: {e}", path) from None
    hift.load_state_dict(sd, strict=True)
    return hift.eval().requires_grad_(False)
