"""Typed hyperparameters of the CosyVoice3 flow (``CausalMaskedDiffWithDiT``) and their reader.

The values come from the ``flow:`` section of the official ``cosyvoice3.yaml``, parsed inertly by
:func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` (nothing the yaml names is
imported or run). Facts: CosyVoice3 architecture sheet §5.1 (hierarchy, hyperparameters),
§5.2 (pre-lookahead layer), §5.3 (DiT), §5.4 (the v2 CFM, unchanged). Field names follow the
upstream constructor arguments so a reader can map them back to the yaml. Must not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import CFMConfig
from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml
from cosyvino.families.cosyvoice23.fixed_noise import CFM_NOISE_SHAPE
from cosyvino.families.cosyvoice23.flow_yaml import FlowArgs, cfm_config

CONFIG_NAME = "cosyvoice3.yaml"
_FAMILY = "CosyVoice3"


@dataclass(frozen=True)
class PreLookaheadConfig:
    """``PreLookaheadLayer`` at flow level (sheet §5.2): ``in_channels`` (80) -> ``channels``
    (1024 at full size) -> ``in_channels``; output frame ``i`` sees tokens ``i ..
    i + pre_lookahead_len``."""

    in_channels: int
    channels: int
    pre_lookahead_len: int


@dataclass(frozen=True)
class DiTConfig:
    """``DiT`` (upstream ``cosyvoice/flow/DiT/dit.py``), sheet §5.3.

    ``dim`` model width (1024), ``depth`` blocks (22), ``heads`` × ``dim_head`` attention
    (16 × 64); feed-forward width ``int(dim * ff_mult)`` (2048); input projection width
    ``2 * mel_dim + mu_dim + spk_dim`` (320); ``static_chunk_size`` frames per attention chunk
    when streaming (50). Fixed by the upstream code, not by the yaml: the sinusoidal time
    embedding width 256, the position convs (kernel 31, 16 groups) and the rotary width
    ``dim_head`` (only the first ``dim_head`` features of q/k, i.e. head 0, are rotated).
    """

    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: float
    mel_dim: int
    mu_dim: int
    spk_dim: int
    static_chunk_size: int
    freq_embed_dim: int = 256
    conv_pos_kernel: int = 31
    conv_pos_groups: int = 16

    @property
    def inner_dim(self) -> int:
        """q/k/v width ``heads * dim_head`` (1024 at full size)."""
        return self.heads * self.dim_head

    @property
    def ff_inner(self) -> int:
        """Feed-forward hidden width ``int(dim * ff_mult)`` (2048 at full size)."""
        return int(self.dim * self.ff_mult)

    @property
    def input_width(self) -> int:
        """Input projection width: ``[x, cond, mu, spks]`` concatenated (320)."""
        return 2 * self.mel_dim + self.mu_dim + self.spk_dim


@dataclass(frozen=True)
class DiTFlowConfig:
    """``CausalMaskedDiffWithDiT`` (upstream ``cosyvoice/flow/flow.py``), sheet §5.1.

    ``token_mel_ratio`` mel frames per token (2); the last ``pre_lookahead_len`` tokens of a
    non-final call are look-ahead context only (3). ``cfm.n_timesteps`` is the inference step
    count upstream passes (10; not a yaml value).
    """

    input_size: int
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    token_mel_ratio: int
    pre_lookahead_len: int
    pre_lookahead: PreLookaheadConfig
    estimator: DiTConfig
    cfm: CFMConfig = field(default_factory=CFMConfig)


def _args(node: Any, where: str, path: str, expected_class: str) -> FlowArgs:
    return FlowArgs(node, where, path, expected_class, _FAMILY)


def _mismatch(path: str, key: str, value, other_key: str, other) -> ConfigError:
    return ConfigError(f"{path}: '{key}' is {value} but '{other_key}' is {other}; they must "
                       "match", path)


def _pre_lookahead(node: Any, flow_input: int, lookahead: int, path: str) -> PreLookaheadConfig:
    where = "flow.pre_lookahead_layer"
    pre = _args(node, where, path, "PreLookaheadLayer")
    cfg = PreLookaheadConfig(in_channels=pre.positive("in_channels"),
                             channels=pre.positive("channels"),
                             pre_lookahead_len=pre.positive("pre_lookahead_len"))
    if cfg.in_channels != flow_input:
        raise _mismatch(path, f"{where}.in_channels", cfg.in_channels, "flow.input_size",
                        flow_input)
    if cfg.pre_lookahead_len != lookahead:
        # upstream cuts the flow's count of context tokens and pads the layer's own count
        raise _mismatch(path, f"{where}.pre_lookahead_len", cfg.pre_lookahead_len,
                        "flow.pre_lookahead_len", lookahead)
    return cfg


def _estimator(node: Any, path: str) -> DiTConfig:
    where = "flow.decoder.estimator"
    est = _args(node, where, path, "DiT")
    est.choice("long_skip_connection", (False,), False)
    mel_dim = est.positive("mel_dim", 80)
    spk = est.get("spk_dim", None)
    if spk is None:
        raise ConfigError(f"{path}: '{where}' lacks 'spk_dim'; the CosyVoice3 flow conditions "
                          "the DiT on the speaker (spk_dim = flow.output_size)", path)
    chunk = est.int("static_chunk_size", 50)
    if chunk < 0:
        raise ConfigError(f"{path}: '{where}.static_chunk_size' must be >= 0, got {chunk}", path)
    ff_mult = est.float("ff_mult", 4)
    mu_dim = mel_dim if est.get("mu_dim", None) is None else est.positive("mu_dim")
    cfg = DiTConfig(dim=est.positive("dim"), depth=est.positive("depth", 8),
                    heads=est.positive("heads", 8), dim_head=est.positive("dim_head", 64),
                    ff_mult=ff_mult, mel_dim=mel_dim,
                    mu_dim=mu_dim, spk_dim=est.positive("spk_dim"),
                    static_chunk_size=chunk)
    if cfg.ff_inner <= 0:
        raise ConfigError(f"{path}: '{where}.ff_mult' must be positive, got {ff_mult}", path)
    if cfg.dim % cfg.conv_pos_groups:
        raise ConfigError(f"{path}: '{where}.dim' is {cfg.dim}; the position convolutions "
                          f"have {cfg.conv_pos_groups} groups, so it must be a multiple of "
                          f"{cfg.conv_pos_groups}", path)
    if cfg.dim_head % 2:
        raise ConfigError(f"{path}: '{where}.dim_head' is {cfg.dim_head}; rotary embedding "
                          "rotates feature pairs, so it must be even", path)
    return cfg


def flow_config_from_data(data: dict, path: str) -> DiTFlowConfig:
    """The ``flow:`` section of :func:`load_inert_yaml` output as a :class:`DiTFlowConfig`.

    Args:
        data: the parsed yaml (top-level mapping).
        path: the file, for error messages.
    Raises:
        ConfigError: no ``flow:`` section, a class other than the CosyVoice3 ones, a missing
            required key, sizes that do not fit together, or a value this implementation does
            not support (the message names the key, e.g. ``'flow.decoder.estimator.dim'``).
    """
    if "flow" not in data:
        raise ConfigError(f"{path}: no 'flow:' section; is this a CosyVoice3 {CONFIG_NAME}?",
                          path)
    flow = _args(data["flow"], "flow", path, "CausalMaskedDiffWithDiT")
    flow.choice("output_type", ("mel",), "mel")
    input_size = flow.positive("input_size")
    output_size = flow.positive("output_size")
    if output_size != CFM_NOISE_SHAPE[1]:
        raise ConfigError(f"{path}: 'flow.output_size' is {output_size}; the fixed CFM noise has "
                          f"{CFM_NOISE_SHAPE[1]} mel bins (sheet §5.4)", path)
    lookahead = flow.positive("pre_lookahead_len", 3)
    decoder = _args(flow.get("decoder"), "flow.decoder", path, "CausalConditionalCFM")
    estimator = _estimator(decoder.get("estimator"), path)
    est = "flow.decoder.estimator"
    # the DiT's inputs: x and cond are mels, mu the pre-lookahead output, spks the affine
    # speaker projection (sheet §5.2-§5.3)
    for key, value, other_key, other in (
            (f"{est}.mel_dim", estimator.mel_dim, "flow.output_size", output_size),
            (f"{est}.mu_dim", estimator.mu_dim, "flow.input_size", input_size),
            (f"{est}.spk_dim", estimator.spk_dim, "flow.output_size", output_size)):
        if value != other:
            raise _mismatch(path, key, value, other_key, other)
    return DiTFlowConfig(
        input_size=input_size, output_size=output_size,
        spk_embed_dim=flow.positive("spk_embed_dim", 192),
        vocab_size=flow.positive("vocab_size"),
        input_frame_rate=flow.positive("input_frame_rate", 25),
        token_mel_ratio=flow.choice("token_mel_ratio", (2,), 2),
        pre_lookahead_len=lookahead,
        pre_lookahead=_pre_lookahead(flow.get("pre_lookahead_layer"), input_size, lookahead,
                                     path),
        estimator=estimator, cfm=cfm_config(decoder))


def read_flow_config(path: str | os.PathLike) -> DiTFlowConfig:
    """Read the flow hyperparameters of ``cosyvoice3.yaml`` (a file, or a model directory
    holding it).

    Raises:
        ModelDirError: the file is missing or unreadable.
        ConfigError: malformed YAML or flow section (see :func:`flow_config_from_data`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_NAME)
    return flow_config_from_data(load_inert_yaml(path), path)


#: Fun-CosyVoice3-0.5B-2512's flow (sheet §5.1; the recipe yaml's values)
FUN_COSYVOICE3_0_5B = DiTFlowConfig(
    input_size=80, output_size=80, spk_embed_dim=192, vocab_size=6561, input_frame_rate=25,
    token_mel_ratio=2, pre_lookahead_len=3,
    pre_lookahead=PreLookaheadConfig(in_channels=80, channels=1024, pre_lookahead_len=3),
    estimator=DiTConfig(dim=1024, depth=22, heads=16, dim_head=64, ff_mult=2, mel_dim=80,
                        mu_dim=80, spk_dim=80, static_chunk_size=50))
