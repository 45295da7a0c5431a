"""Reading the ``flow:`` section of an inert-parsed CosyVoice2/3 yaml: typed, path-bearing access
to one ``!new:`` node's arguments, the arithmetic hyperpyyaml evaluates in a ``!ref``, and the
``CausalConditionalCFM`` solver parameters both flows share.

The yaml is parsed by :func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` (nothing it
names is imported or run). Facts: CosyVoice2 sheet §5.4 (CFM parameters; the CosyVoice3 sheet
§5.1 reuses that CFM unchanged). Must not import torch.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import CFMConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged

_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}


def arith(text: str) -> float | int:
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


class FlowArgs:
    """Typed access to the arguments of one ``!new:`` node; errors name ``path`` and the key.

    Args:
        node: the parsed node.
        where: its dotted key (``"flow.decoder.estimator"``), for messages.
        path: the yaml file, for messages.
        expected_class: the upstream class the node must construct (last dotted component).
        family: the family named in messages (``"CosyVoice2"``).
    Raises:
        ConfigError: the node is not a ``!new:`` mapping of ``expected_class``.
    """

    def __init__(self, node: Any, where: str, path: str, expected_class: str, family: str):
        if not isinstance(node, Tagged) or node.kind != "new" or not isinstance(node.args, dict):
            raise ConfigError(f"{path}: '{where}' must be a '!new:' mapping "
                              f"({expected_class})", path)
        if node.class_name != expected_class:
            raise ConfigError(f"{path}: '{where}' is {node.target}; the {family} flow needs "
                              f"{expected_class}", path)
        self.args, self.where, self.path, self.family = node.args, where, path, family

    def _key(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str, default: Any = ...) -> Any:
        """The raw value; ``default`` when absent (ConfigError when required and absent)."""
        if key in self.args:
            return self.args[key]
        if default is ...:
            raise ConfigError(f"{self.path}: '{self.where}' lacks required key '{key}'",
                              self.path)
        return default

    def int(self, key: str, default: Any = ...) -> int:
        """An integer (a ``!ref`` product such as ``"25 * 2"`` included); ConfigError otherwise."""
        value = self.get(key, default)
        try:
            number = arith(value) if isinstance(value, str) else value
            if isinstance(number, bool):  # yaml true/false is not a number
                raise TypeError(value)
            if int(number) != number:
                raise ValueError(value)
            return int(number)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be an integer, got "
                              f"{value!r}", self.path) from None

    def float(self, key: str, default: Any = ...) -> float:
        """A number; ConfigError otherwise."""
        value = self.get(key, default)
        try:
            number = arith(value) if isinstance(value, str) else value
            if isinstance(number, bool):  # yaml true/false is not a number
                raise TypeError(value)
            return float(number)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be a number, got "
                              f"{value!r}", self.path) from None

    def positive(self, key: str, default: Any = ...) -> int:
        """An integer > 0; ConfigError otherwise."""
        value = self.int(key, default)
        if value <= 0:
            raise ConfigError(f"{self.path}: '{self._key(key)}' must be positive, got {value}",
                              self.path)
        return value

    def choice(self, key: str, allowed: tuple, default: Any = ...) -> Any:
        """One of ``allowed``; ConfigError naming the supported values otherwise."""
        value = self.get(key, default)
        if value not in allowed:
            raise ConfigError(f"{self.path}: '{self._key(key)}' is {value!r}; the {self.family} "
                              f"flow supports {', '.join(repr(a) for a in allowed)}", self.path)
        return value


def cfm_config(decoder: FlowArgs) -> CFMConfig:
    """``flow.decoder.cfm_params`` (an ``omegaconf.DictConfig(content={...})`` node or a plain
    mapping) as a :class:`CFMConfig` (upstream defaults where a key is absent; sheet v2 §5.4).

    Raises:
        ConfigError: not a mapping, a solver other than euler, a schedule other than cosine,
            or a non-numeric rate.
    """
    path = decoder.path
    params = decoder.get("cfm_params")
    args = params.args if isinstance(params, Tagged) else params
    if isinstance(args, dict) and isinstance(args.get("content"), dict):
        args = args["content"]  # omegaconf.DictConfig(content={...})
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: 'flow.decoder.cfm_params' must be a mapping", path)
    cfm = FlowArgs(Tagged("new", "cfm_params", dict(args)), "flow.decoder.cfm_params", path,
                   "cfm_params", decoder.family)
    return CFMConfig(sigma_min=cfm.float("sigma_min", 1e-6),
                     solver=cfm.choice("solver", ("euler",), "euler"),
                     t_scheduler=cfm.choice("t_scheduler", ("cosine",), "cosine"),
                     inference_cfg_rate=cfm.float("inference_cfg_rate", 0.7))
