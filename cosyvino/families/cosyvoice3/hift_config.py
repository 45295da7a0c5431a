"""Hyperparameters of the CosyVoice3 vocoder (``CausalHiFTGenerator``) and their reader.

The v3 vocoder has CosyVoice2's hyperparameters (24 kHz, 8·5·3 upsampling, SineGen2 source;
CosyVoice3 architecture sheet §6.1) plus the look-ahead of ``conv_pre``
(``conv_pre_look_right``, 4 mel frames) and the f0 predictor's fixed look-ahead of 3 frames
(upstream hard-codes its first kernel to 4). :class:`CausalHiFTConfig` extends the v2
:class:`~cosyvino.families.cosyvoice2.hift_config.HiFTConfig` (whose checks it keeps).

:func:`hift_config_from_data` reads the ``hift:`` section of an official ``cosyvoice3.yaml`` from
:func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` data (nothing it names is imported
or run). Must not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml
from cosyvino.families.cosyvoice2.hift_config import HiFTConfig
from cosyvino.families.cosyvoice23.yaml_sections import YamlSection

__all__ = ["F0_LOOK_RIGHT", "FIXED_TABLE_HARMONICS", "CausalHiFTConfig",
           "hift_config_from_data", "read_hift_config"]

#: mel frames the f0 predictor looks ahead: upstream's ``condnet.0`` is a kernel-4 'right'
#: causal conv, padding ``int((k - 1) / 2) * 2 + (k + 1) % 2 = 3`` (sheet §6.1)
F0_LOOK_RIGHT = 3
#: harmonics + 1 of upstream's fixed NSF tables (``torch.rand(1, 300 * 24000, 9)``, hard-coded
#: whatever the config says; sheet §6.2)
FIXED_TABLE_HARMONICS = 9


@dataclass(frozen=True)
class CausalHiFTConfig(HiFTConfig):
    """``CausalHiFTGenerator`` hyperparameters (upstream ``cosyvoice/hifigan/generator.py``);
    defaults are the full-size Fun-CosyVoice3-0.5B values (sheet §6.1).

    Fields as :class:`~cosyvino.families.cosyvoice2.hift_config.HiFTConfig`, plus
    :attr:`conv_pre_look_right`: mel frames ``conv_pre`` (kernel ``conv_pre_look_right + 1``)
    reads beyond the frame it produces.
    """

    conv_pre_look_right: int = 4

    def __post_init__(self) -> None:
        """Checks what the causal layout and the fixed NSF tables need.

        Raises:
            ConfigError: as the v2 config; a negative ``conv_pre_look_right``; or
                ``nb_harmonics + 1`` other than 9 (upstream's fixed tables have 9 columns, so
                any other value fails in upstream's source).
        """
        super().__post_init__()
        if self.conv_pre_look_right < 0:
            raise ConfigError(f"hift.conv_pre_look_right must be >= 0, got "
                              f"{self.conv_pre_look_right}")
        if self.nb_harmonics + 1 != FIXED_TABLE_HARMONICS:
            raise ConfigError(f"hift.nb_harmonics must be {FIXED_TABLE_HARMONICS - 1}: the "
                              f"causal NSF source adds fixed noise tables of "
                              f"{FIXED_TABLE_HARMONICS} columns (got {self.nb_harmonics})")

    @property
    def frames_held_back(self) -> int:
        """Mel frames at the end of a non-final call that produce no samples yet: the f0
        look-ahead (3), conv_pre's (4) and one frame of the iSTFT tail (sheet §6.3): 8."""
        return F0_LOOK_RIGHT + self.conv_pre_look_right + 1

    def output_samples(self, n_frames: int, finalize: bool) -> int:
        """Samples a decode of ``n_frames`` mel frames returns: ``hop_length`` × the frames, less
        :attr:`frames_held_back` when not finalizing (sheet §6.3; 0 when that is negative)."""
        held = 0 if finalize else self.frames_held_back
        return self.hop_length * max(0, n_frames - held)


def hift_config_from_data(data: dict, path: str) -> CausalHiFTConfig:
    """The vocoder hyperparameters from inert ``cosyvoice3.yaml`` data.

    Args:
        data: :func:`load_inert_yaml` output (refs resolved, tags inert).
        path: the yaml's path, for error messages.

    Missing keys take upstream's ``CausalHiFTGenerator`` / ``CausalConvRNNF0Predictor`` defaults
    where those match the released model, else the full-size v3 values (:class:`CausalHiFTConfig`
    defaults; upstream's own defaults are v1-era stage lists and 22050 Hz).

    Raises:
        ConfigError: no ``hift:`` section, a class other than ``CausalHiFTGenerator`` (e.g. v2's
            ``HiFTGenerator``) or an f0 predictor other than ``CausalConvRNNF0Predictor``, a
            malformed value, or a combination :class:`CausalHiFTConfig` rejects.
    """
    if not isinstance(data, dict) or "hift" not in data:
        raise ConfigError(f"{path}: no 'hift: !new:...CausalHiFTGenerator' section", path)
    hift = YamlSection(data["hift"], "hift", path)
    hift.expect_class(("CausalHiFTGenerator",),
                      {"HiFTGenerator": "the non-causal CosyVoice v1/v2 vocoder"})
    f0 = hift.sub("f0_predictor")
    f0.expect_class(("CausalConvRNNF0Predictor",),
                    {"ConvRNNF0Predictor": "the non-causal v1/v2 f0 predictor"})
    istft = hift.get("istft_params", {"n_fft": 16, "hop_len": 4})
    if not isinstance(istft, dict):
        raise ConfigError(f"{path}: 'hift.istft_params' must be a mapping", path)
    d = CausalHiFTConfig.__dataclass_fields__

    def rows(key: str) -> tuple[tuple[int, ...], ...]:
        value = hift.get(key, d[key].default)
        try:
            return tuple(tuple(int(x) for x in row) for row in value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: 'hift.{key}' must be a list of integer lists",
                              path) from None

    def istft_int(key: str, default: int) -> int:
        try:
            return int(istft.get(key, default))
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: 'hift.istft_params.{key}' must be an integer",
                              path) from None

    try:
        return CausalHiFTConfig(
            in_channels=hift.num("in_channels", 80),
            base_channels=hift.num("base_channels", 512),
            nb_harmonics=hift.num("nb_harmonics", 8),
            sampling_rate=hift.num("sampling_rate", 24000),
            nsf_alpha=hift.num("nsf_alpha", 0.1, float),
            nsf_sigma=hift.num("nsf_sigma", 0.003, float),
            nsf_voiced_threshold=hift.num("nsf_voiced_threshold", 10, float),
            upsample_rates=hift.ints("upsample_rates", d["upsample_rates"].default),
            upsample_kernel_sizes=hift.ints("upsample_kernel_sizes",
                                            d["upsample_kernel_sizes"].default),
            istft_n_fft=istft_int("n_fft", 16),
            istft_hop_len=istft_int("hop_len", 4),
            resblock_kernel_sizes=hift.ints("resblock_kernel_sizes",
                                            d["resblock_kernel_sizes"].default),
            resblock_dilation_sizes=rows("resblock_dilation_sizes"),
            source_resblock_kernel_sizes=hift.ints("source_resblock_kernel_sizes",
                                                   d["source_resblock_kernel_sizes"].default),
            source_resblock_dilation_sizes=rows("source_resblock_dilation_sizes"),
            lrelu_slope=hift.num("lrelu_slope", 0.1, float),
            audio_limit=hift.num("audio_limit", 0.99, float),
            conv_pre_look_right=hift.num("conv_pre_look_right", 4),
            f0_num_class=f0.num("num_class", 1),
            f0_in_channels=f0.num("in_channels", 80),
            f0_cond_channels=f0.num("cond_channels", 512),
        )
    except ConfigError as e:
        if e.path is not None:
            raise
        raise ConfigError(f"{path}: {e}", path) from None


def read_hift_config(path: str | os.PathLike) -> CausalHiFTConfig:
    """:func:`hift_config_from_data` of ``cosyvoice3.yaml`` (a file, or a model directory
    holding it).

    Raises:
        ModelDirError: the file is missing or unreadable.
        ConfigError: as :func:`hift_config_from_data`, or invalid YAML.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "cosyvoice3.yaml")
    return hift_config_from_data(load_inert_yaml(path), path)
