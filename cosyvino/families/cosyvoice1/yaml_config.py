"""Read the official hyperpyyaml ``cosyvoice.yaml`` without importing or running anything it names.

The official file uses hyperpyyaml tags: ``!new:pkg.Class`` (instantiate), ``!name:pkg.func``
(partial), ``!apply:pkg.func`` (call at load time, e.g. ``random.seed``) and ``!ref <key>``
(reference). Loading it with hyperpyyaml would import ``cosyvoice``, ``whisper``, ``matcha`` and
run ``torch.manual_seed``; we parse it as plain YAML with inert constructors instead and only
read the hyperparameters of ``llm``, ``flow`` and ``hift`` into :mod:`cosyvino.config` objects.
Must not import torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import yaml

from cosyvino.families.cosyvoice1.config import (
    CFMConfig,
    EncoderConfig,
    EstimatorConfig,
    FlowConfig,
    HiFTConfig,
    LLMConfig,
    MelConfig,
    ModelConfig,
    SamplingConfig,
)
from cosyvino.errors import ConfigError, ModelDirError


@dataclass
class Tagged:
    """An inert stand-in for a ``!new:`` / ``!name:`` / ``!apply:`` node."""

    kind: str  # "new" | "name" | "apply"
    target: str  # dotted path as written, never imported
    args: Any  # mapping, sequence or None

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 1)[-1]


@dataclass
class Ref:
    """A ``!ref <key>`` node (resolved after loading)."""

    expr: str


class _InertLoader(yaml.SafeLoader):
    """SafeLoader that turns hyperpyyaml tags into :class:`Tagged` / :class:`Ref` data."""


def _tagged(kind: str):
    def construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tagged:
        if isinstance(node, yaml.MappingNode):
            args = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            args = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_scalar(node)
            args = value if value != "" else None
        return Tagged(kind, suffix, args)

    return construct


for _kind in ("new", "name", "apply"):
    _InertLoader.add_multi_constructor(f"!{_kind}:", _tagged(_kind))
_InertLoader.add_constructor(
    "!ref", lambda loader, node: Ref(str(loader.construct_scalar(node))))
# hyperpyyaml also knows !copy and !include; treat them as opaque so unknown sections don't fail.
_InertLoader.add_constructor("!copy", lambda loader, node: Ref(str(loader.construct_scalar(node))))
_InertLoader.add_multi_constructor(
    "!", lambda loader, suffix, node: Tagged("unknown", suffix, None))

_REF_RE = re.compile(r"<([^<>]+)>")
# yaml 1.1 (PyYAML) reads "1e-06" as a string; hyperpyyaml users write such floats freely.
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _lookup(root: dict, dotted: str, path: str):
    node: Any = root
    for part in dotted.split("."):
        if isinstance(node, Tagged):
            node = node.args
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"{path}: !ref <{dotted}> points to nothing", path)
        node = node[part]
    return node


def _resolve(node: Any, root: dict, path: str, depth: int = 0) -> Any:
    if depth > 50:
        raise ConfigError(f"{path}: !ref chain too deep (cycle?)", path)
    if isinstance(node, Ref):
        expr = node.expr.strip()
        whole = _REF_RE.fullmatch(expr)
        if whole:
            return _resolve(_lookup(root, whole.group(1), path), root, path, depth + 1)
        # String interpolation such as "<root>/exp" — substitute, never evaluate.
        return _REF_RE.sub(lambda m: str(_resolve(_lookup(root, m.group(1), path), root, path,
                                                  depth + 1)), expr)
    if isinstance(node, Tagged):
        return Tagged(node.kind, node.target, _resolve(node.args, root, path, depth))
    if isinstance(node, dict):
        return {k: _resolve(v, root, path, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, path, depth) for v in node]
    if isinstance(node, str) and _FLOAT_RE.match(node):
        return float(node)
    return node


def load_inert_yaml(path: str | os.PathLike) -> dict:
    """Parse a hyperpyyaml file into plain data with :class:`Tagged` nodes and resolved refs.

    Raises:
        ModelDirError: the file does not exist or cannot be read.
        ConfigError: it is not valid YAML or its top level is not a mapping.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ModelDirError(f"model config not found: {path}", path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDirError(f"cannot read model config {path}: {e}", path) from None
    try:
        data = yaml.load(text, Loader=_InertLoader)  # noqa: S506 - inert loader, no code runs
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}", path) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections", path)
    return {k: _resolve(v, data, path) for k, v in data.items()}


class _Section:
    """Typed access to one ``!new:`` section's arguments with path-bearing errors."""

    def __init__(self, node: Any, where: str, path: str):
        if not isinstance(node, Tagged) or not isinstance(node.args, dict):
            raise ConfigError(f"{path}: section '{where}' must be a '!new:' mapping", path)
        self.node, self.where, self.path = node, where, path

    def get(self, key: str, default: Any = ...):
        if key in self.node.args:
            return self.node.args[key]
        if default is ...:
            raise ConfigError(f"{self.path}: '{self.where}' lacks required key '{key}'",
                              self.path)
        return default

    def num(self, key: str, default: Any = ..., kind=int):
        value = self.get(key, default)
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self.where}.{key}' must be a number, got "
                              f"{value!r}", self.path) from None

    def sub(self, key: str) -> "_Section":
        return _Section(self.get(key), f"{self.where}.{key}", self.path)


_ENCODER_LAYER_TYPES = {"ConformerEncoder": "conformer", "TransformerEncoder": "transformer"}


def _encoder(sec: _Section) -> EncoderConfig:
    layer_type = _ENCODER_LAYER_TYPES.get(sec.node.class_name)
    if layer_type is None:
        raise ConfigError(f"{sec.path}: '{sec.where}' is {sec.node.target}, expected one of "
                          f"{sorted(_ENCODER_LAYER_TYPES)}", sec.path)
    pos = sec.get("pos_enc_layer_type", "rel_pos_espnet")
    if pos != "rel_pos_espnet":
        raise ConfigError(f"{sec.path}: '{sec.where}.pos_enc_layer_type' is {pos!r}; only "
                          "'rel_pos_espnet' (CosyVoice v1) is supported", sec.path)
    if sec.get("use_cnn_module", False) or sec.get("macaron_style", False):
        raise ConfigError(f"{sec.path}: '{sec.where}' uses a conv module / macaron FFN, which "
                          "CosyVoice v1 does not; unsupported", sec.path)
    return EncoderConfig(
        input_size=sec.num("input_size"),
        output_size=sec.num("output_size", 256),
        attention_heads=sec.num("attention_heads", 4),
        linear_units=sec.num("linear_units", 2048),
        num_blocks=sec.num("num_blocks", 6),
        layer_type=layer_type,
        input_layer=str(sec.get("input_layer", "linear")),
        static_chunk_size=sec.num("static_chunk_size", 0),
        normalize_before=bool(sec.get("normalize_before", True)),
        key_bias=bool(sec.get("key_bias", True)),
    )


def _pairs(value, name: str, path: str) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(int(x) for x in row) for row in value)
    except TypeError:
        raise ConfigError(f"{path}: '{name}' must be a list of lists", path) from None


def _ints(value, name: str, path: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value)
    except TypeError:
        raise ConfigError(f"{path}: '{name}' must be a list of integers", path) from None


def model_config_from_data(data: dict, path: str) -> ModelConfig:
    """Build a :class:`ModelConfig` from :func:`load_inert_yaml` output (``path`` for errors)."""
    for section in ("llm", "flow", "hift"):
        if section not in data:
            raise ConfigError(f"{path}: no '{section}:' section; is this a CosyVoice v1 "
                              "cosyvoice.yaml?", path)
    llm = _Section(data["llm"], "llm", path)
    if llm.node.class_name != "TransformerLM":
        raise ConfigError(f"{path}: llm is {llm.node.target}; cosyvino supports the CosyVoice "
                          "v1 TransformerLM (CosyVoice-300M/-SFT/-Instruct)", path)
    sampling = llm.get("sampling", None)
    sampling_cfg = SamplingConfig()
    if isinstance(sampling, Tagged) and isinstance(sampling.args, dict):
        if sampling.class_name != "ras_sampling":
            raise ConfigError(f"{path}: llm.sampling is {sampling.target}; only ras_sampling "
                              "is supported", path)
        s = _Section(Tagged("new", sampling.target, sampling.args), "llm.sampling", path)
        sampling_cfg = SamplingConfig(top_p=s.num("top_p", 0.8, float), top_k=s.num("top_k", 25),
                                      win_size=s.num("win_size", 10),
                                      tau_r=s.num("tau_r", 0.1, float))
    llm_cfg = LLMConfig(
        text_encoder_input_size=llm.num("text_encoder_input_size"),
        llm_input_size=llm.num("llm_input_size"),
        llm_output_size=llm.num("llm_output_size"),
        text_token_size=llm.num("text_token_size"),
        speech_token_size=llm.num("speech_token_size"),
        spk_embed_dim=llm.num("spk_embed_dim", 192),
        text_encoder=_encoder(llm.sub("text_encoder")),
        llm=_encoder(llm.sub("llm")),
        sampling=sampling_cfg,
    )

    flow = _Section(data["flow"], "flow", path)
    if flow.node.class_name != "MaskedDiffWithXvec":
        raise ConfigError(f"{path}: flow is {flow.node.target}; only MaskedDiffWithXvec (v1) "
                          "is supported", path)
    lr = flow.sub("length_regulator")
    decoder = flow.sub("decoder")
    est = decoder.sub("estimator")
    cfm_params = decoder.get("cfm_params", None)
    cfm_args = {}
    if isinstance(cfm_params, Tagged) and isinstance(cfm_params.args, dict):
        cfm_args = cfm_params.args.get("content", cfm_params.args) or {}
    cfm = _Section(Tagged("new", "cfm_params", dict(cfm_args)), "flow.decoder.cfm_params", path)
    flow_cfg = FlowConfig(
        input_size=flow.num("input_size"),
        output_size=flow.num("output_size"),
        spk_embed_dim=flow.num("spk_embed_dim", 192),
        vocab_size=flow.num("vocab_size"),
        input_frame_rate=flow.num("input_frame_rate", 50),
        encoder=_encoder(flow.sub("encoder")),
        length_regulator_channels=lr.num("channels"),
        length_regulator_sampling_ratios=_ints(lr.get("sampling_ratios"),
                                               "flow.length_regulator.sampling_ratios", path),
        estimator=EstimatorConfig(
            in_channels=est.num("in_channels"),
            out_channels=est.num("out_channels"),
            channels=_ints(est.get("channels", [256, 256]), "flow.decoder.estimator.channels",
                           path),
            attention_head_dim=est.num("attention_head_dim", 64),
            n_blocks=est.num("n_blocks", 1),
            num_mid_blocks=est.num("num_mid_blocks", 2),
            num_heads=est.num("num_heads", 4),
            act_fn=str(est.get("act_fn", "snake")),
        ),
        cfm=CFMConfig(
            sigma_min=cfm.num("sigma_min", 1e-6, float),
            solver=str(cfm.get("solver", "euler")),
            t_scheduler=str(cfm.get("t_scheduler", "cosine")),
            inference_cfg_rate=cfm.num("inference_cfg_rate", 0.7, float),
        ),
    )

    hift = _Section(data["hift"], "hift", path)
    if hift.node.class_name != "HiFTGenerator":
        raise ConfigError(f"{path}: hift is {hift.node.target}; only HiFTGenerator is "
                          "supported", path)
    istft = hift.get("istft_params", {"n_fft": 16, "hop_len": 4})
    f0 = hift.sub("f0_predictor")
    hift_cfg = HiFTConfig(
        in_channels=hift.num("in_channels", 80),
        base_channels=hift.num("base_channels", 512),
        nb_harmonics=hift.num("nb_harmonics", 8),
        sampling_rate=hift.num("sampling_rate", 22050),
        nsf_alpha=hift.num("nsf_alpha", 0.1, float),
        nsf_sigma=hift.num("nsf_sigma", 0.003, float),
        nsf_voiced_threshold=hift.num("nsf_voiced_threshold", 10, float),
        upsample_rates=_ints(hift.get("upsample_rates", [8, 8]), "hift.upsample_rates", path),
        upsample_kernel_sizes=_ints(hift.get("upsample_kernel_sizes", [16, 16]),
                                    "hift.upsample_kernel_sizes", path),
        istft_n_fft=int(istft.get("n_fft", 16)),
        istft_hop_len=int(istft.get("hop_len", 4)),
        resblock_kernel_sizes=_ints(hift.get("resblock_kernel_sizes", [3, 7, 11]),
                                    "hift.resblock_kernel_sizes", path),
        resblock_dilation_sizes=_pairs(hift.get("resblock_dilation_sizes",
                                                [[1, 3, 5]] * 3),
                                       "hift.resblock_dilation_sizes", path),
        source_resblock_kernel_sizes=_ints(hift.get("source_resblock_kernel_sizes", [7, 11]),
                                           "hift.source_resblock_kernel_sizes", path),
        source_resblock_dilation_sizes=_pairs(hift.get("source_resblock_dilation_sizes",
                                                       [[1, 3, 5]] * 2),
                                              "hift.source_resblock_dilation_sizes", path),
        lrelu_slope=hift.num("lrelu_slope", 0.1, float),
        audio_limit=hift.num("audio_limit", 0.99, float),
        f0_num_class=f0.num("num_class", 1),
        f0_in_channels=f0.num("in_channels", 80),
        f0_cond_channels=f0.num("cond_channels", 512),
    )

    mel = MelConfig()
    feat = data.get("feat_extractor")
    if isinstance(feat, Tagged) and isinstance(feat.args, dict):
        a = feat.args
        fmax = a.get("fmax", 8000)
        mel = MelConfig(n_fft=int(a.get("n_fft", 1024)), num_mels=int(a.get("num_mels", 80)),
                        sampling_rate=int(a.get("sampling_rate", 22050)),
                        hop_size=int(a.get("hop_size", 256)),
                        win_size=int(a.get("win_size", 1024)), fmin=float(a.get("fmin", 0)),
                        fmax=None if fmax is None else float(fmax))
    sample_rate = data.get("sample_rate", hift_cfg.sampling_rate)
    return ModelConfig(sample_rate=int(sample_rate), llm=llm_cfg, flow=flow_cfg, hift=hift_cfg,
                       mel=mel, allowed_special=str(data.get("allowed_special", "all")))


def read_model_config(path: str | os.PathLike) -> ModelConfig:
    """Read ``cosyvoice.yaml`` (a file path, or a model directory containing it).

    Raises:
        ModelDirError: missing/unreadable file.
        ConfigError: malformed YAML, a missing ``llm:``/``flow:``/``hift:`` section, a
            missing required key, or an architecture other than CosyVoice v1.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "cosyvoice.yaml")
    return model_config_from_data(load_inert_yaml(path), path)
