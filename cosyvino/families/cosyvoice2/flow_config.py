"""Typed hyperparameters of the CosyVoice2 flow (``CausalMaskedDiffWithXvec``) and their reader.

The values come from the ``flow:`` section of the official ``cosyvoice2.yaml``, parsed inertly by
:func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` (nothing the yaml names is
imported or run). Facts: CosyVoice2 architecture sheet §5.1 (hierarchy and hyperparameters),
§5.2 (encoder), §5.4 (CFM), §5.5 (estimator). Field names follow the upstream constructor
arguments so a reader can map them back to the yaml. Must not import torch.
"""

from __future__ import annotations

import ast
import operator
import os
from dataclasses import dataclass, field
from typing import Any

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import CFMConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged, load_inert_yaml

#: upstream ``UpsampleConformerEncoder`` builds its pre-lookahead layer and ``up_layer`` with 512
#: channels whatever ``output_size`` says (sheet §5.1 / reference README, tiny-c)
HARD_CODED_ENCODER_WIDTH = 512


@dataclass(frozen=True)
class UpsampleEncoderConfig:
    """``UpsampleConformerEncoder`` (upstream ``cosyvoice/transformer/upsample_encoder.py``).

    ``static_chunk_size`` is the token chunk of the streaming attention mask (25); the
    up-sampled layers use ``static_chunk_size * upsample_stride`` (50). ``num_up_blocks`` and
    ``upsample_stride`` are fixed by the upstream code (4 and 2), not by the yaml. Layer norms
    inside the conformer blocks use eps 1e-12 (upstream HEAD), the input embeddings and
    ``after_norm`` 1e-5 (sheet §5.1).
    """

    input_size: int
    output_size: int
    attention_heads: int
    linear_units: int
    num_blocks: int
    static_chunk_size: int
    num_up_blocks: int = 4
    upsample_stride: int = 2
    key_bias: bool = True
    block_norm_eps: float = 1e-12
    norm_eps: float = 1e-5


@dataclass(frozen=True)
class CausalEstimatorConfig:
    """``CausalConditionalDecoder`` (upstream ``cosyvoice/flow/decoder.py``), sheet §5.5.

    One U-Net level (``channels`` has one entry): time MLP width ``4 * channels[0]``,
    attention inner width ``num_heads * attention_head_dim``; ``static_chunk_size`` is the
    streaming attention chunk in frames (50).
    """

    in_channels: int
    out_channels: int
    channels: tuple[int, ...]
    attention_head_dim: int
    n_blocks: int
    num_mid_blocks: int
    num_heads: int
    act_fn: str
    static_chunk_size: int


@dataclass(frozen=True)
class CausalFlowConfig:
    """``CausalMaskedDiffWithXvec`` (upstream ``cosyvoice/flow/flow.py``), sheet §5.1.

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
    encoder: UpsampleEncoderConfig
    estimator: CausalEstimatorConfig
    cfm: CFMConfig = field(default_factory=CFMConfig)


# --- reading -------------------------------------------------------------------------------

_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}


def _arith(text: str) -> float | int:
    """Value of a number or a +,-,*,/ expression of numbers (what hyperpyyaml evaluates in a
    ``!ref <a> * <b>`` after substitution, e.g. ``static_chunk_size: !ref <chunk_size> *
    <token_mel_ratio>`` -> ``"25 * 2"``). Nothing else is evaluated. Raises ValueError."""

    def ev(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(text)

    try:
        return ev(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, RecursionError):
        raise ValueError(text) from None


class _Args:
    """Typed access to the arguments of one ``!new:`` node; errors name ``path`` and the key."""

    def __init__(self, node: Any, where: str, path: str, expected_class: str):
        if not isinstance(node, Tagged) or node.kind != "new" or not isinstance(node.args, dict):
            raise ConfigError(f"{path}: '{where}' must be a '!new:' mapping "
                              f"({expected_class})", path)
        if node.class_name != expected_class:
            raise ConfigError(f"{path}: '{where}' is {node.target}; the CosyVoice2 flow needs "
                              f"{expected_class}", path)
        self.args, self.where, self.path = node.args, where, path

    def _key(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str, default: Any = ...) -> Any:
        if key in self.args:
            return self.args[key]
        if default is ...:
            raise ConfigError(f"{self.path}: '{self.where}' lacks required key '{key}'",
                              self.path)
        return default

    def int(self, key: str, default: Any = ...) -> int:
        value = self.get(key, default)
        try:
            number = _arith(value) if isinstance(value, str) else value
            if isinstance(number, bool):  # yaml true/false is not a number
                raise TypeError(value)
            if int(number) != number:
                raise ValueError(value)
            return int(number)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be an integer, got "
                              f"{value!r}", self.path) from None

    def float(self, key: str, default: Any = ...) -> float:
        value = self.get(key, default)
        try:
            number = _arith(value) if isinstance(value, str) else value
            if isinstance(number, bool):  # yaml true/false is not a number
                raise TypeError(value)
            return float(number)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be a number, got "
                              f"{value!r}", self.path) from None

    def positive(self, key: str, default: Any = ...) -> int:
        value = self.int(key, default)
        if value <= 0:
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be positive, got {value}",
                              self.path)
        return value

    def choice(self, key: str, allowed: tuple, default: Any = ...) -> Any:
        value = self.get(key, default)
        if value not in allowed:
            raise ConfigError(f"{self.path}: '{self._key(key)}' is {value!r}; the CosyVoice2 "
                              f"flow supports {', '.join(repr(a) for a in allowed)}", self.path)
        return value


def _encoder(node: Any, flow_input: int, path: str) -> UpsampleEncoderConfig:
    enc = _Args(node, "flow.encoder", path, "UpsampleConformerEncoder")
    # Upstream constructor defaults where the yaml may omit a key; a default the v2 code path
    # does not support (conv2d input, abs/rel_pos encodings, macaron, conv module) fails here.
    enc.choice("input_layer", ("linear",), "conv2d")
    enc.choice("pos_enc_layer_type", ("rel_pos_espnet",), "rel_pos")
    enc.choice("selfattention_layer_type", ("rel_selfattn",), "rel_selfattn")
    enc.choice("normalize_before", (True,), True)
    enc.choice("macaron_style", (False,), True)
    enc.choice("use_cnn_module", (False,), True)
    enc.choice("use_dynamic_chunk", (False,), False)
    input_size = enc.positive("input_size")
    if input_size != flow_input:
        raise ConfigError(f"{path}: 'flow.encoder.input_size' is {input_size} but "
                          f"'flow.input_size' is {flow_input}; they must match", path)
    output_size = enc.positive("output_size", 256)
    if output_size != HARD_CODED_ENCODER_WIDTH:
        raise ConfigError(f"{path}: 'flow.encoder.output_size' is {output_size}; upstream "
                          f"builds the pre-lookahead and up-sampling layers "
                          f"{HARD_CODED_ENCODER_WIDTH} wide, so it must be "
                          f"{HARD_CODED_ENCODER_WIDTH}", path)
    heads = enc.positive("attention_heads", 4)
    if output_size % heads:
        raise ConfigError(f"{path}: 'flow.encoder.attention_heads' ({heads}) must divide "
                          f"'flow.encoder.output_size' ({output_size})", path)
    chunk = enc.int("static_chunk_size", 0)
    if chunk < 0:
        raise ConfigError(f"{path}: 'flow.encoder.static_chunk_size' must be >= 0, got {chunk}",
                          path)
    return UpsampleEncoderConfig(
        input_size=input_size, output_size=output_size, attention_heads=heads,
        linear_units=enc.positive("linear_units", 2048),
        num_blocks=enc.positive("num_blocks", 6), static_chunk_size=chunk,
        key_bias=bool(enc.get("key_bias", True)))


def _estimator(node: Any, path: str) -> CausalEstimatorConfig:
    est = _Args(node, "flow.decoder.estimator", path, "CausalConditionalDecoder")
    raw = est.get("channels", [256, 256])
    try:
        channels = tuple(int(c) for c in raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'flow.decoder.estimator.channels' must be a list of "
                          f"integers, got {raw!r}", path) from None
    if len(channels) != 1 or channels[0] <= 0:
        raise ConfigError(f"{path}: 'flow.decoder.estimator.channels' is {list(channels)}; the "
                          "CosyVoice2 estimator has one U-Net level (e.g. [256])", path)
    chunk = est.int("static_chunk_size", 50)
    if chunk < 0:
        raise ConfigError(f"{path}: 'flow.decoder.estimator.static_chunk_size' must be >= 0, "
                          f"got {chunk}", path)
    return CausalEstimatorConfig(
        in_channels=est.positive("in_channels"), out_channels=est.positive("out_channels"),
        channels=channels, attention_head_dim=est.positive("attention_head_dim", 64),
        n_blocks=est.positive("n_blocks", 1), num_mid_blocks=est.int("num_mid_blocks", 2),
        num_heads=est.positive("num_heads", 4),
        act_fn=est.choice("act_fn", ("gelu", "gelu-approximate"), "snake"),
        static_chunk_size=chunk)


def _cfm(decoder: _Args, path: str) -> CFMConfig:
    params = decoder.get("cfm_params")
    args = params.args if isinstance(params, Tagged) else params
    if isinstance(args, dict) and isinstance(args.get("content"), dict):
        args = args["content"]  # omegaconf.DictConfig(content={...})
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: 'flow.decoder.cfm_params' must be a mapping", path)
    cfm = _Args(Tagged("new", "cfm_params", dict(args)), "flow.decoder.cfm_params", path,
                "cfm_params")
    return CFMConfig(sigma_min=cfm.float("sigma_min", 1e-6),
                     solver=cfm.choice("solver", ("euler",), "euler"),
                     t_scheduler=cfm.choice("t_scheduler", ("cosine",), "cosine"),
                     inference_cfg_rate=cfm.float("inference_cfg_rate", 0.7))


def flow_config_from_data(data: dict, path: str) -> CausalFlowConfig:
    """The ``flow:`` section of :func:`load_inert_yaml` output as a :class:`CausalFlowConfig`.

    Args:
        data: the parsed yaml (top-level mapping).
        path: the file, for error messages.
    Raises:
        ConfigError: no ``flow:`` section, a class other than the CosyVoice2 ones, a missing
            required key or a value this implementation does not support (the message names
            the key, e.g. ``'flow.encoder.pos_enc_layer_type'``).
    """
    if "flow" not in data:
        raise ConfigError(f"{path}: no 'flow:' section; is this a CosyVoice2 cosyvoice2.yaml?",
                          path)
    flow = _Args(data["flow"], "flow", path, "CausalMaskedDiffWithXvec")
    flow.choice("output_type", ("mel",), "mel")
    input_size = flow.positive("input_size", 512)
    decoder = _Args(flow.get("decoder"), "flow.decoder", path, "CausalConditionalCFM")
    estimator = _estimator(decoder.get("estimator"), path)
    output_size = flow.positive("output_size", 80)
    # estimator input = [x, mu, spks, cond], each output_size wide (sheet §5.5)
    if estimator.in_channels != 4 * output_size or estimator.out_channels != output_size:
        raise ConfigError(f"{path}: 'flow.decoder.estimator.in_channels'/'out_channels' are "
                          f"{estimator.in_channels}/{estimator.out_channels}; with "
                          f"'flow.output_size' {output_size} they must be {4 * output_size}/"
                          f"{output_size}", path)
    return CausalFlowConfig(
        input_size=input_size, output_size=output_size,
        spk_embed_dim=flow.positive("spk_embed_dim", 192),
        vocab_size=flow.positive("vocab_size", 4096),
        input_frame_rate=flow.positive("input_frame_rate", 50),
        token_mel_ratio=flow.choice("token_mel_ratio", (2,), 2),
        pre_lookahead_len=flow.positive("pre_lookahead_len", 3),
        encoder=_encoder(flow.get("encoder"), input_size, path),
        estimator=estimator, cfm=_cfm(decoder, path))


def read_flow_config(path: str | os.PathLike) -> CausalFlowConfig:
    """Read the flow hyperparameters of ``cosyvoice2.yaml`` (a file, or a model directory
    holding it).

    Raises:
        ModelDirError: the file is missing or unreadable.
        ConfigError: malformed YAML or flow section (see :func:`flow_config_from_data`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "cosyvoice2.yaml")
    return flow_config_from_data(load_inert_yaml(path), path)
