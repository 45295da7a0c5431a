"""Typed, path-bearing access to the sections of an inert-parsed CosyVoice2/3 yaml.

The yaml is parsed by :func:`cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml` (nothing it
names is imported or run); a ``!new:pkg.Class`` node becomes a ``Tagged`` whose arguments this
wrapper reads with errors that name the file and the dotted key. Must not import torch.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged


class YamlSection:
    """One ``!new:`` node of the yaml (``where``: its dotted key, ``path``: the yaml file).

    Raises:
        ConfigError: the node is not a ``!new:`` mapping.
    """

    def __init__(self, node: Any, where: str, path: str):
        if not isinstance(node, Tagged) or not isinstance(node.args, dict):
            raise ConfigError(f"{path}: '{where}' must be a '!new:' mapping, got "
                              f"{type(node).__name__}", path)
        self.node, self.where, self.path = node, where, path

    @property
    def class_name(self) -> str:
        """The last component of the class path (``Qwen2LM`` for ``cosyvoice.llm.llm.Qwen2LM``)."""
        return self.node.class_name

    def expect_class(self, allowed: Iterable[str], hints: dict[str, str] | None = None) -> str:
        """The class name, checked against ``allowed``.

        Raises:
            ConfigError: another class, naming the file, the key and what it holds (plus the
                ``hints`` entry for that class name, e.g. "a CosyVoice v1 yaml").
        """
        allowed = tuple(allowed)
        if self.class_name not in allowed:
            hint = (hints or {}).get(self.class_name, "")
            raise ConfigError(f"{self.path}: '{self.where}' is {self.node.target}, expected "
                              f"{' or '.join(allowed)}" + (f" ({hint})" if hint else ""),
                              self.path)
        return self.class_name

    def get(self, key: str, default: Any = ...) -> Any:
        """The raw value of ``key``; ``default`` when absent (required when not given).

        Raises: ConfigError naming ``where.key`` when required and absent."""
        if key in self.node.args:
            return self.node.args[key]
        if default is ...:
            raise ConfigError(f"{self.path}: '{self.where}' lacks required key '{key}'", self.path)
        return default

    def num(self, key: str, default: Any = ..., kind=int):
        """``key`` as ``kind`` (int or float). Raises ConfigError when it is not a number."""
        value = self.get(key, default)
        if isinstance(value, bool):
            value = None  # yaml `true` is not a size
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self.where}.{key}' must be a number, got "
                              f"{value!r}", self.path) from None

    def ints(self, key: str, default: Any = ...) -> tuple[int, ...]:
        """``key`` as a tuple of ints. Raises ConfigError when it is not a list of integers."""
        value = self.get(key, default)
        try:
            return tuple(int(x) for x in value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.path}: '{self.where}.{key}' must be a list of integers, "
                              f"got {value!r}", self.path) from None

    def sub(self, key: str) -> "YamlSection":
        """The nested ``!new:`` node at ``key`` (required)."""
        return YamlSection(self.get(key), f"{self.where}.{key}", self.path)

    def partial(self, key: str) -> "YamlSection | None":
        """The nested ``!name:`` (partial) node at ``key`` as a section, None when absent."""
        node = self.get(key, None)
        if node is None:
            return None
        if not isinstance(node, Tagged) or not isinstance(node.args, (dict, type(None))):
            raise ConfigError(f"{self.path}: '{self.where}.{key}' must be a '!name:' mapping",
                              self.path)
        return YamlSection(Tagged(node.kind, node.target, dict(node.args or {})),
                           f"{self.where}.{key}", self.path)


def top_level_section(data: Mapping[str, Any], path: str) -> YamlSection:
    """The yaml's top-level scalars (``sample_rate``, ``token_frame_rate``, ``chunk_size`` ...)
    as a section, so they are read with the same typed errors (``where`` is ``(top level)``)."""
    return YamlSection(Tagged("new", "(top level)", dict(data)), "(top level)", path)


def ras_sampling_config(llm: YamlSection) -> SamplingConfig:
    """The ``llm.sampling`` partial (``!name:...ras_sampling``, sheet v2 §4.5) as a
    :class:`SamplingConfig`; its defaults (top-p 0.8, top-k 25, window 10, tau 0.1) when absent.

    Raises:
        ConfigError: ``sampling`` names another function or holds a non-numeric value.
    """
    node = llm.partial("sampling")
    if node is None:
        return SamplingConfig()
    node.expect_class(("ras_sampling",))
    return SamplingConfig(top_p=node.num("top_p", 0.8, float), top_k=node.num("top_k", 25),
                          win_size=node.num("win_size", 10), tau_r=node.num("tau_r", 0.1, float))
