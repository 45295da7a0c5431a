"""The part of ``cosyvoice2.yaml`` / ``cosyvoice3.yaml`` that CosyVoice2 and 3 read the same way.

Both official dirs hold a hyperpyyaml file whose ``llm:`` node builds a Qwen2-based speech LM
(v2 ``Qwen2LM``, v3 ``CosyVoice3LM``, both around ``Qwen2Encoder``) with the same arguments
(``llm_input_size``, ``llm_output_size``, ``speech_token_size``, ``mix_ratio``, a
``ras_sampling`` partial), next to ``flow:`` / ``hift:`` nodes and top-level scalars (sheet v2
§1, §4.1; sheet v3 §4.1). The yaml is parsed inertly
(:func:`~cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml`: nothing it names is imported
or run). Each family supplies its class names and its own special-token layout
(:class:`SpeechLMConfig` subclasses). Must not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml
from cosyvino.families.official import FAMILY_TITLES, official_family, official_yaml

from .qwen2_config import QWEN_CONFIG_FILE, Qwen2Config
from .yaml_sections import YamlSection, ras_sampling_config, top_level_section

#: the Qwen2 wrapper both speech LMs name under ``llm.llm`` (sheet v2 §4.1, v3 §4.1)
QWEN_ENCODER_CLASS = "Qwen2Encoder"

#: what each official family's classes mean when they appear in another family's yaml
OTHER_FAMILY_HINTS = {
    "TransformerLM": "a CosyVoice v1 LLM; v1 dirs hold cosyvoice.yaml",
    "Qwen2LM": "a CosyVoice2 LLM; v2 dirs hold cosyvoice2.yaml",
    "CosyVoice3LM": "a CosyVoice3 LLM; v3 dirs hold cosyvoice3.yaml",
    "MaskedDiffWithXvec": "the CosyVoice v1 flow",
    "CausalMaskedDiffWithXvec": "the CosyVoice2 flow",
    "CausalMaskedDiffWithDiT": "the CosyVoice3 flow",
    "HiFTGenerator": "the CosyVoice v1/v2 vocoder",
    "CausalHiFTGenerator": "the CosyVoice3 vocoder",
}


@dataclass(frozen=True)
class SpeechLMConfig:
    """The ``llm:`` arguments common to v2's ``Qwen2LM`` and v3's ``CosyVoice3LM`` plus the
    Qwen2 decoder (``qwen``, from ``CosyVoice-BlankEN/config.json``).

    ``speech_token_size`` is 6561 at 0.5B (speech ids 0..6560); where the special ids sit and
    how many rows the speech head has is family-specific (subclasses define ``vocab_out``,
    ``eos_token``, ``fill_token``, ``stop_token_ids``). ``min_token_text_ratio`` /
    ``max_token_text_ratio`` bound the decoded length by the tts text length (upstream
    ``inference`` defaults 2 and 20, sheet v2 §4.5).
    """

    llm_input_size: int
    llm_output_size: int
    speech_token_size: int
    qwen: Qwen2Config
    mix_ratio: tuple[int, int] = (5, 15)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    @property
    def vocab_out(self) -> int:
        """Rows of ``llm_decoder`` / ``speech_embedding`` (v2 6564, v3 6761): the family's."""
        raise NotImplementedError


def speech_lm_fields(data: Mapping[str, Any], path: str, qwen: Qwen2Config, *,
                     llm_class: str, qwen_path: str = "") -> dict[str, Any]:
    """The :class:`SpeechLMConfig` arguments of an inert-parsed yaml (``qwen`` included).

    Args:
        data: the parsed yaml; path: the yaml file (named in errors).
        qwen: the Qwen2 config; qwen_path: its ``config.json`` (named in size errors).
        llm_class: the class ``llm:`` must name (``Qwen2LM`` / ``CosyVoice3LM``).
    Raises:
        ConfigError: no ``llm:`` section, ``llm`` names another class (another family's is
            named as such) or ``llm.llm`` is not ``Qwen2Encoder``, a missing / non-numeric size,
            a bad ``mix_ratio``, ``llm_input_size`` / ``llm_output_size`` not equal to the Qwen2
            ``hidden_size``, a non-positive ``speech_token_size``.
    """
    if "llm" not in data:
        raise ConfigError(f"{path}: no 'llm:' section", path)
    llm = YamlSection(data["llm"], "llm", path)
    llm.expect_class((llm_class,), OTHER_FAMILY_HINTS)
    llm.sub("llm").expect_class((QWEN_ENCODER_CLASS,))
    mix = llm.ints("mix_ratio", [5, 15])
    if len(mix) != 2 or min(mix) <= 0:
        raise ConfigError(f"{path}: 'llm.mix_ratio' must be two positive integers, got "
                          f"{list(mix)}", path)
    fields = {"llm_input_size": llm.num("llm_input_size"),
              "llm_output_size": llm.num("llm_output_size"),
              "speech_token_size": llm.num("speech_token_size"),
              "qwen": qwen, "mix_ratio": (mix[0], mix[1]), "sampling": ras_sampling_config(llm)}
    for key in ("llm_input_size", "llm_output_size"):
        if fields[key] != qwen.hidden_size:
            raise ConfigError(f"{path}: 'llm.{key}' is {fields[key]} but "
                              f"{qwen_path or QWEN_CONFIG_FILE} gives hidden_size "
                              f"{qwen.hidden_size}; they must be equal", path)
    if fields["speech_token_size"] <= 0:
        raise ConfigError(f"{path}: 'llm.speech_token_size' must be positive", path)
    return fields


def family_yaml_path(model_dir: str, family: str) -> str:
    """``<model_dir>/<the family's yaml>``; a dir of another official family is a typed error.

    Raises:
        ModelDirError: no such dir; a dir of another family (names it: "... is a CosyVoice2
            model dir, not a CosyVoice3 one"); no yaml at all.
    """
    yaml_name = official_yaml(family)
    path = os.path.join(model_dir, yaml_name)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    other = official_family(model_dir)
    if other is not None:
        raise ModelDirError(f"{model_dir} is a {FAMILY_TITLES[other]} model dir, not a "
                            f"{FAMILY_TITLES[family]} one (it has no {yaml_name})", model_dir)
    raise ModelDirError(f"model config not found: {path}", path)


def read_family_yaml(model_dir: str, family: str, model_classes: Mapping[str, str]
                     ) -> tuple[str, dict]:
    """``(path, data)``: the family's yaml parsed inertly, with each ``section -> class`` of
    ``model_classes`` (e.g. ``{"flow": "CausalMaskedDiffWithDiT", "hift": ...}``) checked.

    Raises:
        ModelDirError: as :func:`family_yaml_path`.
        ConfigError: malformed yaml, a missing section, a section naming another class (names
            the file, the key and, for another family's class, that family).
    """
    path = family_yaml_path(model_dir, family)
    data = load_inert_yaml(path)
    for section, cls in model_classes.items():
        if section not in data:
            raise ConfigError(f"{path}: no '{section}:' section", path)
        YamlSection(data[section], section, path).expect_class((cls,), OTHER_FAMILY_HINTS)
    return path, data


def top_level_values(data: Mapping[str, Any], path: str) -> dict[str, int]:
    """``sample_rate`` (24000), ``token_frame_rate`` (25), ``token_mel_ratio`` (2) and
    ``chunk_size`` (25) from the yaml's top level (defaults: the released values, sheet v2 §2).

    Raises: ConfigError when one is not a number."""
    top = top_level_section(data, path)
    return {"sample_rate": top.num("sample_rate", 24000),
            "token_frame_rate": top.num("token_frame_rate", 25),
            "token_mel_ratio": top.num("token_mel_ratio", 2),
            "chunk_size": top.num("chunk_size", 25)}
