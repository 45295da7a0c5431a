"""Hyperparameters of the CosyVoice2 vocoder (``HiFTGenerator`` at 24 kHz) and their reader.

The v2 vocoder is the v1 ``HiFTGenerator`` module layout with three upsampling stages (8·5·3)
and the ``SineGen2`` NSF source, which upstream selects whenever ``sampling_rate`` is not 22050
(CosyVoice2 architecture sheet §6.1, §6.2). :class:`HiFTConfig` therefore extends the v1
dataclass (so the v1 torch modules accept it) with the full-size v2 defaults of sheet §6.1.

:func:`hift_config_from_data` reads the ``hift:`` section of an official ``cosyvoice2.yaml`` from
:func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` data (the yaml is parsed inertly:
nothing it names is imported or run). Must not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import HiFTConfig as _V1HiFTConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged, load_inert_yaml

__all__ = ["V1_SAMPLING_RATE", "HiFTConfig", "hift_config_from_data", "read_hift_config"]

#: upstream picks the original ``SineGen`` at exactly this rate and ``SineGen2`` otherwise
#: (``HiFTGenerator.__init__``: ``sinegen_type='1' if sampling_rate == 22050 else '2'``)
V1_SAMPLING_RATE = 22050


@dataclass(frozen=True)
class HiFTConfig(_V1HiFTConfig):
    """``HiFTGenerator`` hyperparameters of CosyVoice2 (upstream ``cosyvoice/hifigan/
    generator.py``); defaults are the full-size CosyVoice2-0.5B values (sheet §6.1).

    Field meanings as in :class:`cosyvino.families.cosyvoice1.config.HiFTConfig`;
    :attr:`hop_length` is 480 output samples per mel frame at the defaults (8·5·3 × iSTFT hop 4).
    """

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3

    def __post_init__(self) -> None:
        """Checks what the module layout needs.

        Raises:
            ConfigError: a 22050 Hz rate (that is the v1 ``SineGen`` source, not SineGen2), or
                per-stage lists whose lengths disagree (upstream ``zip``s them and would silently
                drop stages), or non-positive sizes.
        """
        if self.sampling_rate == V1_SAMPLING_RATE:
            raise ConfigError("hift.sampling_rate 22050 selects upstream's v1 SineGen source; "
                              "the CosyVoice2 vocoder uses SineGen2 (24000 Hz)")
        n_up = len(self.upsample_rates)
        lists = {"upsample_kernel_sizes": self.upsample_kernel_sizes,
                 "source_resblock_kernel_sizes": self.source_resblock_kernel_sizes,
                 "source_resblock_dilation_sizes": self.source_resblock_dilation_sizes}
        for name, value in lists.items():
            if len(value) != n_up:
                raise ConfigError(f"hift.{name} has {len(value)} entries, expected one per "
                                  f"upsampling stage ({n_up}, from upsample_rates)")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ConfigError("hift.resblock_kernel_sizes and resblock_dilation_sizes differ "
                              "in length")
        sizes = (self.in_channels, self.base_channels, self.sampling_rate, self.istft_n_fft,
                 self.istft_hop_len, *self.upsample_rates)
        if n_up == 0 or min(sizes) <= 0 or self.nb_harmonics < 0:
            raise ConfigError("hift sizes must be positive (channels, rates, iSTFT sizes)")
        if self.base_channels % 2 ** n_up:
            raise ConfigError(f"hift.base_channels {self.base_channels} must be divisible by "
                              f"2^{n_up} (each upsampling stage halves the channels)")


def _num(args: dict, key: str, default: Any, kind, where: str, path: str):
    value = args.get(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: '{where}.{key}' must be a number, got {value!r}",
                          path) from None


def _int_tuple(value: Any, name: str, path: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'hift.{name}' must be a list of integers", path) from None


def _int_rows(value: Any, name: str, path: str) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(int(x) for x in row) for row in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'hift.{name}' must be a list of integer lists",
                          path) from None


def hift_config_from_data(data: dict, path: str) -> HiFTConfig:
    """The vocoder hyperparameters from inert ``cosyvoice2.yaml`` data.

    Args:
        data: :func:`load_inert_yaml` output (refs resolved, tags inert).
        path: the yaml's path, for error messages.

    Missing keys take upstream's constructor defaults where upstream has them (``HiFTGenerator``
    and ``ConvRNNF0Predictor`` signatures), except the stage lists, whose full-size v2 values
    (:class:`HiFTConfig` defaults) differ from upstream's v1-era defaults.

    Raises:
        ConfigError: no ``hift:`` section, a class other than ``HiFTGenerator`` (e.g. v3's
            ``CausalHiFTGenerator``) or an f0 predictor other than ``ConvRNNF0Predictor``, a
            malformed value, or a combination :class:`HiFTConfig` rejects.
    """
    node = data.get("hift")
    if not isinstance(node, Tagged) or not isinstance(node.args, dict):
        raise ConfigError(f"{path}: no 'hift: !new:...HiFTGenerator' section", path)
    if node.class_name != "HiFTGenerator":
        raise ConfigError(f"{path}: hift is {node.target}; the CosyVoice2 vocoder is "
                          "HiFTGenerator (CausalHiFTGenerator is CosyVoice3's)", path)
    a = node.args
    f0 = a.get("f0_predictor")
    if not isinstance(f0, Tagged) or f0.class_name != "ConvRNNF0Predictor":
        got = f0.target if isinstance(f0, Tagged) else f0
        raise ConfigError(f"{path}: hift.f0_predictor is {got!r}; expected "
                          "!new:...ConvRNNF0Predictor", path)
    f0_args = f0.args if isinstance(f0.args, dict) else {}
    istft = a.get("istft_params", {"n_fft": 16, "hop_len": 4})
    if not isinstance(istft, dict):
        raise ConfigError(f"{path}: 'hift.istft_params' must be a mapping", path)
    d = HiFTConfig.__dataclass_fields__
    try:
        return _build(a, f0_args, istft, d, path)
    except ConfigError as e:
        if e.path is not None:
            raise
        raise ConfigError(f"{path}: {e}", path) from None


def _build(a: dict, f0_args: dict, istft: dict, d: dict, path: str) -> HiFTConfig:
    return HiFTConfig(
        in_channels=_num(a, "in_channels", 80, int, "hift", path),
        base_channels=_num(a, "base_channels", 512, int, "hift", path),
        nb_harmonics=_num(a, "nb_harmonics", 8, int, "hift", path),
        sampling_rate=_num(a, "sampling_rate", 24000, int, "hift", path),
        nsf_alpha=_num(a, "nsf_alpha", 0.1, float, "hift", path),
        nsf_sigma=_num(a, "nsf_sigma", 0.003, float, "hift", path),
        nsf_voiced_threshold=_num(a, "nsf_voiced_threshold", 10, float, "hift", path),
        upsample_rates=_int_tuple(a.get("upsample_rates", d["upsample_rates"].default),
                                  "upsample_rates", path),
        upsample_kernel_sizes=_int_tuple(
            a.get("upsample_kernel_sizes", d["upsample_kernel_sizes"].default),
            "upsample_kernel_sizes", path),
        istft_n_fft=_num(istft, "n_fft", 16, int, "hift.istft_params", path),
        istft_hop_len=_num(istft, "hop_len", 4, int, "hift.istft_params", path),
        resblock_kernel_sizes=_int_tuple(
            a.get("resblock_kernel_sizes", d["resblock_kernel_sizes"].default),
            "resblock_kernel_sizes", path),
        resblock_dilation_sizes=_int_rows(
            a.get("resblock_dilation_sizes", d["resblock_dilation_sizes"].default),
            "resblock_dilation_sizes", path),
        source_resblock_kernel_sizes=_int_tuple(
            a.get("source_resblock_kernel_sizes", d["source_resblock_kernel_sizes"].default),
            "source_resblock_kernel_sizes", path),
        source_resblock_dilation_sizes=_int_rows(
            a.get("source_resblock_dilation_sizes",
                  d["source_resblock_dilation_sizes"].default),
            "source_resblock_dilation_sizes", path),
        lrelu_slope=_num(a, "lrelu_slope", 0.1, float, "hift", path),
        audio_limit=_num(a, "audio_limit", 0.99, float, "hift", path),
        f0_num_class=_num(f0_args, "num_class", 1, int, "hift.f0_predictor", path),
        f0_in_channels=_num(f0_args, "in_channels", 80, int, "hift.f0_predictor", path),
        f0_cond_channels=_num(f0_args, "cond_channels", 512, int, "hift.f0_predictor", path),
    )


def read_hift_config(path: str | os.PathLike) -> HiFTConfig:
    """:func:`hift_config_from_data` of ``cosyvoice2.yaml`` (a file, or a model directory
    holding it).

    Raises:
        ModelDirError: the file is missing or unreadable.
        ConfigError: as :func:`hift_config_from_data`, or invalid YAML.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "cosyvoice2.yaml")
    return hift_config_from_data(load_inert_yaml(path), path)
