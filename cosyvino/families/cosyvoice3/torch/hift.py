"""CosyVoice3 vocoder (``CausalHiFTGenerator`` + ``CausalConvRNNF0Predictor``), in PyTorch.

Upstream: ``cosyvoice/hifigan/generator.py`` (``CausalHiFTGenerator``, ``ResBlock(causal=True)``,
``SourceModuleHnNSF`` / ``SineGen2`` with ``causal=True``), ``cosyvoice/hifigan/f0_predictor.py``
(``CausalConvRNNF0Predictor``); CosyVoice3 architecture sheet §6.

The module layout is v2's (:mod:`cosyvino.families.cosyvoice2.torch.hift`) with every
convolution causal (:mod:`.causal_convs`): ``conv_pre`` looks 4 mel frames ahead, the f0
predictor 3, everything else only looks back. Parameter names equal the official ``hift.pt`` keys
after weight-norm folding; the f0 predictor's parameters are float64, as upstream runs it
("precision is crucial for causal inference"; sheet §6.1).

Inference is three export-friendly stages sharing the generator's parameters (tensors in, tensors
out; ``finalize`` is fixed per stage instance, so each mode exports as its own graph):

- :class:`F0Stage`: mel [B, 80, T] float32 -> f0 [B, T'] float32 (Hz per 20 ms frame), computed
  in float64; T' = T (``finalize``: 3 zero frames of look-ahead) or T − 3 (the last 3 frames are
  look-ahead context only);
- :class:`CausalSourceStage`: f0 [B, T'], fixed noise [B, 480 T', 9] -> source [B, 1, 480 T']
  (the noise is a slice of upstream's fixed table: :mod:`cosyvino.families.cosyvoice3.fixed_tables`);
- :class:`CausalDecodeStage`: mel [B, 80, T'], source -> waveform [B, 480 T'] (``finalize``) or
  [B, 480 (T' − 5)] (not: 4 frames of conv_pre look-ahead and 1 of iSTFT tail held back), at
  24 kHz, in ±audio_limit.

:meth:`CausalHiFTGenerator.inference` chains them as upstream's ``inference(mel, finalize)``:
``480 T`` samples when finalizing, ``480 (T − 8)`` when not (sheet §6.3).
Only this package (and its callers) may import torch.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.errors import CheckpointError, InputError
from cosyvino.families.cosyvoice1.torch.hift import (
    DecodeStage,
    Snake,
    SourceModuleHnNSF,
)
from cosyvino.families.cosyvoice1.weight_norm import (
    fold_weight_norm,
    unfold_weight_norm,
)
from cosyvino.families.cosyvoice3.hift_config import (
    F0_LOOK_RIGHT,
    CausalHiFTConfig,
    read_hift_config,
)
from cosyvino.families.cosyvoice3.torch.causal_convs import (
    CausalConv1d,
    CausalConv1dDownSample,
    CausalConv1dUpsample,
)
from cosyvino.families.cosyvoice23.torch.hift_checkpoint import read_hift_state_dict

__all__ = [
    "CausalConvRNNF0Predictor",
    "CausalDecodeStage",
    "CausalHiFTGenerator",
    "CausalResBlock",
    "CausalSourceStage",
    "F0Stage",
    "hift_checkpoint_shapes",
    "load_hift",
]

_F0_PREFIX = "f0_predictor."


class CausalResBlock(nn.Module):
    """HiFi-GAN residual block with left-causal convolutions (upstream ``ResBlock(causal=True)``):
    for each dilation d, ``x = x + conv2(snake2(conv1_d(snake1(x))))``, conv1 padded
    ``d·(k−1)`` and conv2 ``k−1`` on the left. x: [B, C, L] -> [B, C, L]."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, d)
                                    for d in dilations)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, 1)
                                    for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalConvRNNF0Predictor(nn.Module):
    """F0 predictor (no RNN despite the name): ``condnet.0`` = CausalConv1d(80, C, k4, 'right')
    (3 frames of look-ahead), ``condnet.2/4/6/8`` = CausalConv1d(C, C, k3, 'left'), ELU after
    each, then ``Linear(C -> num_class)`` and ``abs`` (sheet §6.1).

    ``forward(mel [B, 80, T], finalize)`` -> f0 [B, T] (finalize: zero look-ahead) or [B, T − 3]
    (the last 3 frames are the look-ahead context), in the parameters' dtype (float64 in a
    loaded generator)."""

    def __init__(self, num_class: int = 1, in_channels: int = 80, cond_channels: int = 512):
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(in_channels, cond_channels, F0_LOOK_RIGHT + 1,
                                                causal_type="right"), nn.ELU()]
        for _ in range(4):
            layers += [CausalConv1d(cond_channels, cond_channels, 3), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        first = self.condnet[0]
        if finalize:
            x = first(mel)
        else:
            x = first(mel[:, :, :-first.pad], mel[:, :, -first.pad:])
        for layer in list(self.condnet)[1:]:
            x = layer(x)
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class CausalHiFTGenerator(nn.Module):
    """CosyVoice3 HiFT parameters in the official module layout (weight norm folded).

    Args:
        cfg: :class:`~cosyvino.families.cosyvoice3.hift_config.CausalHiFTConfig`.

    Raises:
        TypeError: ``cfg`` is not a :class:`CausalHiFTConfig`.

    The f0 predictor's parameters are float64 (cast with :meth:`f0_to_float64`, done by
    :func:`load_hift`); everything else float32.
    """

    def __init__(self, cfg: CausalHiFTConfig):
        super().__init__()
        if not isinstance(cfg, CausalHiFTConfig):
            raise TypeError(f"CausalHiFTGenerator needs a CausalHiFTConfig, got "
                            f"{type(cfg).__qualname__}")
        self.cfg = cfg
        base, n_fft = cfg.base_channels, cfg.istft_n_fft
        self.m_source = SourceModuleHnNSF(cfg.nb_harmonics)
        self.conv_pre = CausalConv1d(cfg.in_channels, base, cfg.conv_pre_look_right + 1,
                                     causal_type="right")
        self.ups = nn.ModuleList(
            CausalConv1dUpsample(base // 2 ** i, base // 2 ** (i + 1), k, u)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
        # the source meets stage i at the rate of ups.i: downsample by the later stages' rates
        down = np.cumprod([1] + list(cfg.upsample_rates[::-1][:-1]))[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(down, cfg.source_resblock_kernel_sizes,
                                          cfg.source_resblock_dilation_sizes)):
            ch, u = base // 2 ** (i + 1), int(u)
            self.source_downs.append(CausalConv1d(n_fft + 2, ch, 1) if u == 1
                                     else CausalConv1dDownSample(n_fft + 2, ch, 2 * u, u))
            self.source_resblocks.append(CausalResBlock(ch, k, tuple(d)))
        self.resblocks = nn.ModuleList(
            CausalResBlock(base // 2 ** (i + 1), k, tuple(d))
            for i in range(len(self.ups))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = CausalConv1d(base // 2 ** len(self.ups), n_fft + 2, 7)
        self.f0_predictor = CausalConvRNNF0Predictor(cfg.f0_num_class, cfg.f0_in_channels,
                                                     cfg.f0_cond_channels)

    def f0_to_float64(self) -> CausalHiFTGenerator:
        """Cast the f0 predictor to float64 (upstream's ``inference`` does this in place)."""
        self.f0_predictor.to(torch.float64)
        return self

    def weight_normed_parameters(self) -> list[str]:
        """Names of the ``.weight`` parameters stored as weight-norm (g, v) pairs in official
        checkpoints (conv_pre, ups, every resblock conv, conv_post, the f0 condnet convs; not the
        source downsamplers; sheet §6.4)."""
        names = ["conv_pre.weight"] + [f"ups.{i}.weight" for i in range(len(self.ups))]
        for group in ("source_resblocks", "resblocks"):
            for r, block in enumerate(getattr(self, group)):
                for conv in ("convs1", "convs2"):
                    names += [f"{group}.{r}.{conv}.{d}.weight"
                              for d in range(len(getattr(block, conv)))]
        names.append("conv_post.weight")
        names += [f"f0_predictor.condnet.{i}.weight" for i in range(0, 10, 2)]
        return names

    def f0_stage(self, finalize: bool = True) -> F0Stage:
        """:class:`F0Stage` sharing this generator's parameters."""
        return F0Stage(self, finalize)

    def source_stage(self) -> CausalSourceStage:
        """:class:`CausalSourceStage` sharing this generator's parameters."""
        return CausalSourceStage(self)

    def decode_stage(self, finalize: bool = True) -> CausalDecodeStage:
        """:class:`CausalDecodeStage` sharing this generator's parameters."""
        return CausalDecodeStage(self, finalize)

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, sine_waves: torch.Tensor | np.ndarray,
                  finalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Upstream ``inference(speech_feat, finalize)`` (sheet §6.3).

        Args:
            mel: float32 [1, 80, T].
            sine_waves: upstream's fixed noise table ``sine_waves`` [1, N, 9] (or any prefix of
                it with N >= 480 T); rows ``0 .. 480 T' − 1`` are used.
            finalize: False holds back the last 8 frames (sheet §6.3).

        Returns:
            ``(wav [1, 480 T] or [1, 480 (T − 8)], source [1, 1, 480 T'])``, float32.

        Raises:
            InputError: too few frames for the mode, or a table shorter than the source.
        """
        need = 1 if finalize else self.cfg.frames_held_back + 1
        if mel.dim() != 3 or mel.shape[-1] < need:
            raise InputError(f"the vocoder needs a [1, {self.cfg.in_channels}, T] mel with T >= "
                             f"{need} (finalize={finalize}), got {tuple(mel.shape)}")
        f0 = self.f0_stage(finalize)(mel)
        n = self.cfg.hop_length * f0.shape[-1]
        if sine_waves.shape[1] < n:
            raise InputError(f"the fixed noise table has {sine_waves.shape[1]} samples; this "
                             f"mel needs {n} ({n / self.cfg.sampling_rate:.1f} s)")
        noise = torch.as_tensor(np.asarray(sine_waves[:, :n]) if isinstance(sine_waves, np.ndarray)
                                else sine_waves[:, :n], dtype=torch.float32)
        source = self.source_stage()(f0, noise)
        body = mel if finalize else mel[:, :, :-F0_LOOK_RIGHT]
        return self.decode_stage(finalize)(body, source), source


class F0Stage(nn.Module):
    """mel [B, 80, T] float32 -> f0 [B, T] (``finalize``) or [B, T − 3] float32, Hz; the
    predictor runs in float64 on the float64 mel (upstream ``inference``)."""

    def __init__(self, hift: CausalHiFTGenerator, finalize: bool = True):
        super().__init__()
        self.f0_predictor = hift.f0_predictor
        self.finalize = bool(finalize)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        dtype = self.f0_predictor.classifier.weight.dtype
        return self.f0_predictor(mel.to(dtype), self.finalize).to(mel.dtype)


class CausalSourceStage(nn.Module):
    """NSF harmonic source of CosyVoice3 (upstream ``SourceModuleHnNSF`` + ``SineGen2`` with
    ``causal=True``, eval mode; sheet §6.2).

    Inputs (float32):
        f0 [B, T]: Hz per mel frame.
        sine_waves [B, hop·T, H]: rows ``0 .. hop·T − 1`` of upstream's fixed table (uniform
            [0, 1), H = 9; upstream's layout).

    Output: source [B, 1, hop·T] float32 in (-1, 1).

    Steps, in upstream's float32 operation order: per frame k and harmonic n = 1..H,
    ``rad = (f0_k · n / sampling_rate) mod 1`` (upstream forms it per sample and linearly
    interpolates down by 1/hop, reading two equal samples of frame k: the same value; its fixed
    initial phase ``rand_ini`` lands on sample 0, which that interpolation never reads, so it is
    omitted); ``phase = cumsum_k(rad) · 2 · π``; ``hop · phase`` held for the hop samples of each
    frame ('nearest'); sines ``sin(·) · nsf_alpha``; voiced mask ``f0 > nsf_voiced_threshold``
    per sample; ``sines · uv + noise_amp · sine_waves`` with ``noise_amp = uv · nsf_sigma +
    (1 − uv) · nsf_alpha / 3``; merge ``tanh(l_linear(·))`` over the H harmonics.
    """

    def __init__(self, hift: CausalHiFTGenerator):
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

    def _hold(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, C] -> [B, hop·T, C], each frame repeated hop times ('nearest')."""
        b, t, c = x.shape
        return x.unsqueeze(2).expand(b, t, self.hop, c).reshape(b, t * self.hop, c)

    def phase_increments(self, f0: torch.Tensor) -> torch.Tensor:
        """f0 [B, T] -> ``(f0 · n / sampling_rate) mod 1`` [B, T, H], float32 (cycles/sample)."""
        fn = f0.unsqueeze(-1) * self.harmonics
        return torch.remainder(fn / self.sampling_rate, 1.0)

    def excite(self, cycles: torch.Tensor, f0: torch.Tensor,
               sine_waves: torch.Tensor) -> torch.Tensor:
        """The source from the running sum of :meth:`phase_increments` (``cycles`` [B, T, H]
        float32: torch's float32 cumsum, which accumulates in float64 on the CPU and rounds
        each output), f0 [B, T] and the table rows [B, hop·T, H] -> [B, 1, hop·T]."""
        phase = cycles * 2 * math.pi                                    # [B, T, H]
        sines = torch.sin(self._hold(phase * self.hop)) * self.sine_amp  # [B, hop T, H]
        uv = self._hold((f0 > self.voiced_threshold).to(f0.dtype).unsqueeze(-1))  # [B, L, 1]
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        excitation = sines * uv + noise_amp * sine_waves
        return torch.tanh(self.m_source.l_linear(excitation)).transpose(1, 2)

    def forward(self, f0: torch.Tensor, sine_waves: torch.Tensor) -> torch.Tensor:
        cycles = torch.cumsum(self.phase_increments(f0), dim=1)
        return self.excite(cycles, f0, sine_waves)


class CausalDecodeStage(DecodeStage):
    """mel [B, 80, T] + source [B, 1, hop·T] -> waveform float32, clamped to ±audio_limit
    (upstream ``CausalHiFTGenerator.decode(x, s, finalize)``; sheet §6.3).

    ``finalize``: conv_pre sees 4 zero frames of look-ahead; output [B, hop·T]. Otherwise the
    last ``conv_pre_look_right`` frames are conv_pre's look-ahead context only, the source's STFT
    loses the frames beyond them, and the last hop samples (an incomplete iSTFT overlap) are
    dropped: output [B, hop·(T − conv_pre_look_right − 1)].

    The STFT/iSTFT (centred, reflect padding, periodic Hann) and the magnitude/phase handling are
    v1's (:class:`cosyvino.families.cosyvoice1.torch.hift.DecodeStage`), whose buffers this
    stage inherits.
    """

    def __init__(self, hift: CausalHiFTGenerator, finalize: bool = True):
        super().__init__(hift)
        self.finalize = bool(finalize)
        self.look_right = int(hift.cfg.conv_pre_look_right)
        self.stft_frames_per_frame = int(np.prod(hift.cfg.upsample_rates))
        self.samples_per_frame = int(hift.cfg.hop_length)

    def forward(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        s_stft = self._stft(source)
        # lengths written from the mel's size (not negative slice ends), so an exported graph
        # keeps one symbolic length
        n = mel.shape[-1] if self.finalize else mel.shape[-1] - self.look_right
        if self.finalize or self.look_right == 0:
            x = self.conv_pre(mel)
        else:
            x = self.conv_pre(mel.narrow(-1, 0, n), mel.narrow(-1, n, self.look_right))
            s_stft = s_stft.narrow(-1, 0, self.stft_frames_per_frame * n + 1)
        wav = self.generate(x, s_stft)
        if not self.finalize:
            wav = wav.narrow(-1, 0, self.samples_per_frame * (n - 1))
        return torch.clamp(wav, -self.audio_limit, self.audio_limit)

    def generate(self, x: torch.Tensor, s_stft: torch.Tensor) -> torch.Tensor:
        """From ``conv_pre``'s output x [B, 512, n] and the source STFT [B, n_fft + 2,
        120 n + 1]: the upsampling stages, ``conv_post`` and the iSTFT -> [B, 480 n] (not
        clamped)."""
        n_up = len(self.ups)
        for i in range(n_up):
            x = F.leaky_relu(x, self.lrelu_slope)
            x = self.ups[i](x)
            if i == n_up - 1:
                x = torch.cat([x[:, :, 1:2], x], dim=-1)  # ReflectionPad1d((1, 0))
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * self.num_kernels](x)
            for j in range(1, self.num_kernels):
                xs = xs + self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels
        x = F.leaky_relu(x)  # default slope 0.01, as upstream
        x = self.conv_post(x)
        magnitude = torch.clamp(torch.exp(x[:, :self.n_bins]), max=1e2)
        phase = torch.sin(x[:, self.n_bins:])
        spec = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        return self._istft(spec)


def hift_checkpoint_shapes(hift: CausalHiFTGenerator, spelling: str = "parametrizations"
                           ) -> dict[str, tuple[int, ...]]:
    """{key: shape} of an official ``hift.pt`` for ``hift``'s config: the weight-normed convs
    as (g, v) pairs in ``spelling`` (``"parametrizations"``: upstream HEAD, sheet §6.4;
    ``"weight_g"``: older torch)."""
    sd = unfold_weight_norm(hift.state_dict(), hift.weight_normed_parameters(), spelling)
    return {k: tuple(v.shape) for k, v in sd.items()}


def load_hift(model_dir_or_file: str | os.PathLike, cfg: CausalHiFTConfig | None = None
              ) -> CausalHiFTGenerator:
    """Build a :class:`CausalHiFTGenerator` and load an official ``hift.pt`` strictly (eval
    mode, no gradients, f0 predictor in float64).

    Args:
        model_dir_or_file: a model directory (``cosyvoice3.yaml`` + ``hift.pt``) or the
            ``hift.pt`` file itself.
        cfg: the hyperparameters; None reads them from the directory's ``cosyvoice3.yaml``.

    As upstream's load: ``generator.`` is removed from every key; the keys must then be exactly
    the module's, with the weight-norm pairs in one spelling. Values are upcast to float32 before
    the weight norm is folded (upstream's float32 module copies the file's g and v, then computes
    g·v/‖v‖ in float32), and the f0 predictor's pairs to float64 (upstream casts the predictor to
    float64 before it runs, so its g·v/‖v‖ is computed in float64).

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
                         "cosyvoice3.yaml")
    hift = CausalHiFTGenerator(cfg)
    sd = read_hift_state_dict(path, lambda spelling: hift_checkpoint_shapes(hift, spelling),
                              config_name="cosyvoice3.yaml")
    bad = [k for k, v in sd.items() if not torch.is_tensor(v) or not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"{path}: non-float values for {bad[:5]}", path)
    sd = {k: v.to(torch.float64 if k.startswith(_F0_PREFIX) else torch.float32)
          for k, v in sd.items()}
    try:
        sd = fold_weight_norm(sd)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: bad weight-norm pair: {e}", path) from None
    hift.f0_to_float64()
    hift.load_state_dict(sd, strict=True)
    return hift.eval().requires_grad_(False)
