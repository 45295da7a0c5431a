"""HiFT vocoder (neural source filter + iSTFTNet) of CosyVoice v1, in PyTorch.

Upstream: ``cosyvoice/hifigan/generator.py`` (``HiFTGenerator``, ``ResBlock``, ``SineGen``,
``SourceModuleHnNSF``), ``cosyvoice/hifigan/f0_predictor.py`` (``ConvRNNF0Predictor``),
``cosyvoice/transformer/activation.py`` (``Snake``); paper: HiFTNet, arXiv:2309.09493.

Parameter names equal the official ``hift.pt`` keys after weight-norm folding
(:func:`cosyvino.families.cosyvoice1.weight_norm.fold_weight_norm`): the weight-normed convolutions here are
plain convolutions with a ``.weight``; :meth:`HiFTGenerator.weight_normed_parameters` names them.

Inference is split into three export-friendly stages that share the generator's parameters
(tensors in, tensors out, no data-dependent Python control flow, randomness passed in):

- :class:`F0Stage`: mel [1, 80, T] -> f0 [1, T] (Hz, one value per mel frame);
- :class:`SourceStage`: f0, initial phases, Gaussian noise -> NSF source [1, 1, 256 T];
- :class:`DecodeStage`: mel, source -> waveform [1, 256 T] (22050 Hz for v1).

STFT and iSTFT are written as ``conv1d`` / ``conv_transpose1d`` with fixed DFT bases (periodic
Hann window, centered frames) so that converters without complex-number support can take them.
All tensors are float32. Only this module (and its callers) may import torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.config import HiFTConfig

__all__ = [
    "HiFTGenerator", "F0Stage", "SourceStage", "DecodeStage", "ConvRNNF0Predictor",
    "SourceModuleHnNSF", "ResBlock", "Snake", "stft_bases",
]


class Snake(nn.Module):
    """Snake activation ``x + 1/(alpha + 1e-9) * sin(alpha x)^2`` with a per-channel, linear-scale
    ``alpha`` [C] (upstream ``Snake(channels, alpha_logscale=False)``). x: [B, C, L]."""

    no_div_by_zero = 1e-9

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + self.no_div_by_zero)) * torch.pow(torch.sin(x * alpha), 2)


def _get_padding(kernel_size: int, dilation: int) -> int:
    """'Same' padding of a stride-1 dilated convolution (upstream ``get_padding``)."""
    return (kernel_size * dilation - dilation) // 2


class ResBlock(nn.Module):
    """HiFi-GAN/BigVGAN residual block: for each dilation d,
    ``x = x + conv2(snake2(conv1_d(snake1(x))))``; all convs C->C, kernel k, 'same' padding,
    weight-normed in official checkpoints. x: [B, C, L] -> [B, C, L]."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, 1, dilation=d,
                      padding=_get_padding(kernel_size, d)) for d in dilations)
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, 1, dilation=1,
                      padding=_get_padding(kernel_size, 1)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class ConvRNNF0Predictor(nn.Module):
    """F0 predictor (no RNN despite the upstream name): 5 x [Conv1d(k3, p1) -> ELU] then a
    per-frame ``Linear(cond -> num_class)`` and ``abs``. mel [B, 80, T] -> f0 [B, T] (Hz).
    ``condnet.{0,2,4,6,8}`` are weight-normed in official checkpoints."""

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers.append(nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels,
                                    kernel_size=3, padding=1))
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))


class SourceModuleHnNSF(nn.Module):
    """Parameter holder of the NSF source module: ``l_linear`` = Linear(nb_harmonics+1 -> 1)
    merging the harmonics (followed by tanh). The sine generation itself has no parameters and
    lives in :class:`SourceStage`."""

    def __init__(self, nb_harmonics: int):
        super().__init__()
        self.l_linear = nn.Linear(nb_harmonics + 1, 1)


def _hann_periodic(n_fft: int) -> np.ndarray:
    """Periodic Hann window (scipy ``get_window("hann", n, fftbins=True)``), float64 [n_fft]."""
    n = np.arange(n_fft, dtype=np.float64)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / n_fft)


def stft_bases(n_fft: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Conv kernels for a one-sided STFT / iSTFT with a periodic Hann window of length n_fft.

    Returns float32 ``(analysis, synthesis, window_sq)``:

    - ``analysis`` [2F, 1, n_fft] (F = n_fft//2 + 1): rows 0..F-1 = w[n] cos(2 pi k n / N),
      rows F..2F-1 = -w[n] sin(2 pi k n / N); ``conv1d`` of a signal with it gives the real and
      imaginary parts of ``torch.stft`` (unnormalized).
    - ``synthesis`` [2F, 1, n_fft]: windowed inverse real DFT (``irfft`` with 1/N scaling, the
      imaginary parts of the DC and Nyquist bins ignored) times w[n]; ``conv_transpose1d`` of
      [real; imag] frames with it is the overlap-add of ``torch.istft`` before normalisation.
    - ``window_sq`` [1, 1, n_fft]: w[n]^2, whose overlap-add is the iSTFT normaliser.
    """
    n_bins = n_fft // 2 + 1
    w = _hann_periodic(n_fft)
    n = np.arange(n_fft, dtype=np.float64)[None, :]
    k = np.arange(n_bins, dtype=np.float64)[:, None]
    ang = 2.0 * np.pi * ((k * n) % n_fft) / n_fft
    cos, sin = np.cos(ang), np.sin(ang)
    sin[0, :] = 0.0
    if n_fft % 2 == 0:
        sin[-1, :] = 0.0
    analysis = np.concatenate([w * cos, -w * sin], axis=0)
    scale = np.full((n_bins, 1), 2.0)
    scale[0] = 1.0
    if n_fft % 2 == 0:
        scale[-1] = 1.0
    synthesis = np.concatenate([scale * cos, -scale * sin], axis=0) * w / n_fft
    to_t = lambda a: torch.from_numpy(a.astype(np.float32)).unsqueeze(1)  # noqa: E731
    return to_t(analysis), to_t(synthesis), to_t((w * w)[None, :])


class HiFTGenerator(nn.Module):
    """HiFT vocoder parameters in the official module layout (weight norm folded).

    Args:
        cfg: vocoder hyperparameters (:class:`cosyvino.config.HiFTConfig`).

    ``forward(mel, phase, noise)`` runs the three stages and returns ``(wav, source)``; the
    stages themselves come from :meth:`f0_stage`, :meth:`source_stage`, :meth:`decode_stage`.
    """

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.cfg = cfg
        base = cfg.base_channels
        n_fft = cfg.istft_n_fft
        self.m_source = SourceModuleHnNSF(cfg.nb_harmonics)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(base // 2 ** i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
        # Source downsampling to each fusion point: cumulative rates of the later upsamplers.
        down_rates = [1] + list(cfg.upsample_rates[::-1][:-1])
        cum = np.cumprod(down_rates)[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes,
                                          cfg.source_resblock_dilation_sizes)):
            ch = base // 2 ** (i + 1)
            u = int(u)
            if u == 1:
                self.source_downs.append(nn.Conv1d(n_fft + 2, ch, 1, 1))
            else:
                self.source_downs.append(nn.Conv1d(n_fft + 2, ch, u * 2, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(ch, k, tuple(d)))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, k, tuple(d)))
        self.conv_post = nn.Conv1d(ch, n_fft + 2, 7, 1, padding=3)
        self.f0_predictor = ConvRNNF0Predictor(cfg.f0_num_class, cfg.f0_in_channels,
                                               cfg.f0_cond_channels)

    def weight_normed_parameters(self) -> list[str]:
        """Names of the ``.weight`` parameters stored as weight-norm (g, v) pairs in official
        checkpoints (upstream wraps these convolutions in ``weight_norm``)."""
        names = ["conv_pre.weight"]
        names += [f"ups.{i}.weight" for i in range(len(self.ups))]
        for group in ("source_resblocks", "resblocks"):
            for r, block in enumerate(getattr(self, group)):
                for conv in ("convs1", "convs2"):
                    names += [f"{group}.{r}.{conv}.{d}.weight"
                              for d in range(len(getattr(block, conv)))]
        names.append("conv_post.weight")
        names += [f"f0_predictor.condnet.{i}.weight" for i in range(0, 10, 2)]
        return names

    def f0_stage(self) -> "F0Stage":
        """:class:`F0Stage` sharing this generator's parameters."""
        return F0Stage(self)

    def source_stage(self) -> "SourceStage":
        """:class:`SourceStage` sharing this generator's parameters."""
        return SourceStage(self)

    def decode_stage(self) -> "DecodeStage":
        """:class:`DecodeStage` sharing this generator's parameters."""
        return DecodeStage(self)

    def forward(self, mel: torch.Tensor, phase: torch.Tensor,
                noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full vocoder: mel [1, 80, T] -> ``(wav [1, 256T], source [1, 1, 256T])``.

        ``phase`` [1, H] and ``noise`` [1, H, 256T] (H = nb_harmonics + 1) as for
        :class:`SourceStage` (see :func:`cosyvino.families.cosyvoice1.nsf.draw_source_noise`). Streaming callers that
        need upstream's ``cache_source`` overwrite the head of the source between the stages.
        """
        f0 = self.f0_stage()(mel)
        source = self.source_stage()(f0, phase, noise)
        return self.decode_stage()(mel, source), source


class F0Stage(nn.Module):
    """mel [B, 80, T] float32 (log-mel, 22050 Hz / 256 hop frames) -> f0 [B, T] float32 (Hz)."""

    def __init__(self, hift: HiFTGenerator):
        super().__init__()
        self.f0_predictor = hift.f0_predictor

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.f0_predictor(mel)


class SourceStage(nn.Module):
    """NSF harmonic source (upstream ``SourceModuleHnNSF`` with the original ``SineGen``).

    Inputs (float32):
        f0 [B, T]: Hz per mel frame.
        phase [B, H]: initial phase per harmonic, radians, H = nb_harmonics + 1; upstream draws
            U(-pi, pi) with column 0 (the fundamental) set to 0 — the caller must supply that
            (this stage adds ``phase`` as given).
        noise [B, H, hop*T]: standard normal (scaled here by nsf_sigma where voiced and
            nsf_alpha/3 where unvoiced).

    Output: source [B, 1, hop*T] float32 in (-1, 1).

    Steps: f0 repeated ``hop`` times (nearest upsampling); per harmonic n = 1..H the phase
    increment f0 n / sampling_rate is cumsum'd over time (float32, as upstream), taken mod 1 and
    scaled by 2 pi; sines ``nsf_alpha * sin(theta + phase)``; voiced mask ``f0 > threshold``;
    ``sines * uv + amp * noise``; merge ``tanh(l_linear(.))``.
    """

    def __init__(self, hift: HiFTGenerator):
        super().__init__()
        cfg = hift.cfg
        self.m_source = hift.m_source
        self.hop = cfg.hop_length
        self.sampling_rate = float(cfg.sampling_rate)
        self.sine_amp = float(cfg.nsf_alpha)
        self.noise_std = float(cfg.nsf_sigma)
        self.voiced_threshold = float(cfg.nsf_voiced_threshold)
        harm = torch.arange(1, cfg.nb_harmonics + 2, dtype=torch.float32).view(1, -1, 1)
        self.register_buffer("harmonics", harm, persistent=False)

    def forward(self, f0: torch.Tensor, phase: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        f0_up = F.interpolate(f0.unsqueeze(1), scale_factor=float(self.hop), mode="nearest")
        incr = f0_up * self.harmonics / self.sampling_rate              # [B, H, L]
        theta = (2.0 * math.pi) * torch.remainder(torch.cumsum(incr, dim=-1), 1.0)
        sines = self.sine_amp * torch.sin(theta + phase.unsqueeze(-1))
        uv = (f0_up > self.voiced_threshold).to(f0_up.dtype)            # [B, 1, L]
        noise_amp = uv * self.noise_std + (1.0 - uv) * (self.sine_amp / 3.0)
        sines = sines * uv + noise_amp * noise
        merged = torch.tanh(self.m_source.l_linear(sines.transpose(1, 2)))  # [B, L, 1]
        return merged.transpose(1, 2)


class DecodeStage(nn.Module):
    """mel [B, 80, T] + source [B, 1, hop*T] -> waveform [B, hop*T] float32, clamped to
    +-audio_limit (upstream ``HiFTGenerator.decode``; fact sheet 6.4)."""

    def __init__(self, hift: HiFTGenerator):
        super().__init__()
        cfg = hift.cfg
        self.conv_pre = hift.conv_pre
        self.ups = hift.ups
        self.source_downs = hift.source_downs
        self.source_resblocks = hift.source_resblocks
        self.resblocks = hift.resblocks
        self.conv_post = hift.conv_post
        self.lrelu_slope = float(cfg.lrelu_slope)
        self.audio_limit = float(cfg.audio_limit)
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.n_fft = cfg.istft_n_fft
        self.hop = cfg.istft_hop_len
        self.n_bins = self.n_fft // 2 + 1
        analysis, synthesis, window_sq = stft_bases(self.n_fft)
        self.register_buffer("stft_analysis", analysis, persistent=False)
        self.register_buffer("stft_synthesis", synthesis, persistent=False)
        self.register_buffer("window_sq", window_sq, persistent=False)

    def _stft(self, s: torch.Tensor) -> torch.Tensor:
        """s [B, 1, L] -> [B, 2F, L/hop + 1] = cat(real, imag) of the centered STFT
        (reflect padding n_fft/2, like ``torch.stft(center=True)``)."""
        pad = self.n_fft // 2
        s = F.pad(s, (pad, pad), mode="reflect")
        return F.conv1d(s, self.stft_analysis, stride=self.hop)

    def _istft(self, spec: torch.Tensor) -> torch.Tensor:
        """spec [B, 2F, N] = cat(real, imag) -> [B, hop*(N-1)], like ``torch.istft(center=True)``."""
        frames = F.conv_transpose1d(spec, self.stft_synthesis, stride=self.hop)
        env = F.conv_transpose1d(torch.ones_like(spec[:1, :1]), self.window_sq, stride=self.hop)
        pad = self.n_fft // 2
        return (frames / env)[:, 0, pad:-pad]

    def forward(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        s_stft = self._stft(source)
        x = self.conv_pre(mel)
        n_up = len(self.ups)
        for i in range(n_up):
            x = F.leaky_relu(x, self.lrelu_slope)
            x = self.ups[i](x)
            if i == n_up - 1:
                x = torch.cat([x[:, :, 1:2], x], dim=-1)  # ReflectionPad1d((1, 0))
            si = self.source_resblocks[i](self.source_downs[i](s_stft))
            x = x + si
            xs = self.resblocks[i * self.num_kernels](x)
            for j in range(1, self.num_kernels):
                xs = xs + self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels
        x = F.leaky_relu(x)  # default slope 0.01, as upstream
        x = self.conv_post(x)
        magnitude = torch.clamp(torch.exp(x[:, :self.n_bins]), max=1e2)
        phase = torch.sin(x[:, self.n_bins:])
        spec = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        wav = self._istft(spec)
        return torch.clamp(wav, -self.audio_limit, self.audio_limit)
