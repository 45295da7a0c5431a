"""CosyVoice2 config: ``cosyvoice2.yaml`` read inertly plus ``CosyVoice-BlankEN/config.json``.

The yaml is the official hyperpyyaml file (sheet v2 §1); it is parsed with
:func:`~cosyvino.families.cosyvoice1.yaml_config.load_inert_yaml`, so nothing it names is imported
or run, and the recipe's data-pipeline / training sections are present and ignored. This module
builds the LLM part (:class:`CosyVoice2LLMConfig`, sheet v2 §4.1, §4.5) and checks that ``llm``,
``flow`` and ``hift`` name the CosyVoice2 classes; the flow and HiFT hyperparameters are read by
their own modules from :attr:`CosyVoice2Config.sections`. Must not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged, load_inert_yaml
from cosyvino.families.cosyvoice23.qwen2_config import (
    QWEN_CONFIG_FILE,
    QWEN_DIR,
    Qwen2Config,
    read_qwen2_config,
)
from cosyvino.families.cosyvoice23.yaml_sections import YamlSection
from cosyvino.families.official import FAMILY_TITLES, official_family

#: the yaml of an official CosyVoice2 dir
YAML_NAME = "cosyvoice2.yaml"

#: the classes a CosyVoice2 yaml names for its three models (sheet v2 §4.1, §5.1, §6)
LLM_CLASS = "Qwen2LM"
QWEN_ENCODER_CLASS = "Qwen2Encoder"
FLOW_CLASS = "CausalMaskedDiffWithXvec"
HIFT_CLASS = "HiFTGenerator"

#: what another family's class in one of those places means
_OTHER_FAMILY_HINTS = {
    "TransformerLM": "a CosyVoice v1 LLM; v1 dirs hold cosyvoice.yaml",
    "CosyVoice3LM": "a CosyVoice3 LLM; v3 dirs hold cosyvoice3.yaml",
    "MaskedDiffWithXvec": "the CosyVoice v1 flow",
    "CausalHiFTGenerator": "the CosyVoice3 vocoder",
}


@dataclass(frozen=True)
class CosyVoice2LLMConfig:
    """``Qwen2LM`` of the yaml (sheet v2 §4.1) with its Qwen2 decoder (``qwen``).

    ``speech_token_size`` is 6561; the speech head and speech embedding have
    ``speech_token_size + 3`` rows (6564: tokens, EOS 6561, an unused stop id 6562, FILL 6563).
    ``min_token_text_ratio`` / ``max_token_text_ratio`` bound the decoded length by the tts text
    length (upstream ``inference`` defaults 2 and 20, sheet v2 §4.5).
    """

    llm_input_size: int
    llm_output_size: int
    speech_token_size: int
    qwen: Qwen2Config
    mix_ratio: tuple[int, int] = (5, 15)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    #: rows of ``llm_embedding`` (sheet v2 §4.1: row 0 = SOS, row 1 = TASK_ID)
    sos: int = 0
    task_id: int = 1

    @property
    def vocab_out(self) -> int:
        """Rows of ``llm_decoder`` / ``speech_embedding``: ``speech_token_size + 3`` (6564)."""
        return self.speech_token_size + 3

    @property
    def eos_token(self) -> int:
        """EOS = ``speech_token_size`` (6561), the only id masked below min_len."""
        return self.speech_token_size

    @property
    def fill_token(self) -> int:
        """FILL = ``speech_token_size + 2`` (6563), the bistream group marker (sheet v2 §4.6)."""
        return self.speech_token_size + 2

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Any of these ends an utterance: 6561, 6562, 6563 (sheet v2 §4.1, §4.5)."""
        return tuple(self.speech_token_size + i for i in range(3))


@dataclass(frozen=True)
class CosyVoice2Config:
    """What cosyvino reads from a CosyVoice2 dir's ``cosyvoice2.yaml`` and ``config.json``.

    ``sections`` holds the inert-parsed yaml (``llm`` / ``flow`` / ``hift`` nodes and the top-level
    scalars) for the flow and HiFT config readers; ``yaml_path`` names the file in their errors.
    """

    yaml_path: str
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int
    llm: CosyVoice2LLMConfig
    sections: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _sampling(llm: YamlSection) -> SamplingConfig:
    node = llm.partial("sampling")
    if node is None:
        return SamplingConfig()
    node.expect_class(("ras_sampling",))
    return SamplingConfig(top_p=node.num("top_p", 0.8, float), top_k=node.num("top_k", 25),
                          win_size=node.num("win_size", 10), tau_r=node.num("tau_r", 0.1, float))


def llm_config_from_data(data: Mapping[str, Any], path: str, qwen: Qwen2Config,
                         qwen_path: str = "") -> CosyVoice2LLMConfig:
    """The :class:`CosyVoice2LLMConfig` of an inert-parsed yaml (``path``: the yaml, for errors;
    ``qwen_path``: the Qwen2 ``config.json``, for size-mismatch errors).

    Raises:
        ConfigError: no ``llm:`` section, ``llm`` is not ``Qwen2LM`` (v1/v3 classes are named as
            such) or ``llm.llm`` not ``Qwen2Encoder``, a missing/non-numeric size, or the yaml's
            ``llm_input_size`` / ``llm_output_size`` differ from the Qwen2 ``hidden_size``.
    """
    if "llm" not in data:
        raise ConfigError(f"{path}: no 'llm:' section", path)
    llm = YamlSection(data["llm"], "llm", path)
    llm.expect_class((LLM_CLASS,), _OTHER_FAMILY_HINTS)
    llm.sub("llm").expect_class((QWEN_ENCODER_CLASS,))
    mix = llm.ints("mix_ratio", [5, 15])
    if len(mix) != 2 or min(mix) <= 0:
        raise ConfigError(f"{path}: 'llm.mix_ratio' must be two positive integers, got "
                          f"{list(mix)}", path)
    cfg = CosyVoice2LLMConfig(
        llm_input_size=llm.num("llm_input_size"),
        llm_output_size=llm.num("llm_output_size"),
        speech_token_size=llm.num("speech_token_size"),
        qwen=qwen,
        mix_ratio=(mix[0], mix[1]),
        sampling=_sampling(llm),
    )
    for key in ("llm_input_size", "llm_output_size"):
        if getattr(cfg, key) != qwen.hidden_size:
            raise ConfigError(f"{path}: 'llm.{key}' is {getattr(cfg, key)} but "
                              f"{qwen_path or QWEN_CONFIG_FILE} gives hidden_size "
                              f"{qwen.hidden_size}; they must be equal", path)
    if cfg.speech_token_size <= 0:
        raise ConfigError(f"{path}: 'llm.speech_token_size' must be positive", path)
    return cfg


def _yaml_path(model_dir: str) -> str:
    """``<model_dir>/cosyvoice2.yaml``; a dir of another family is a typed error."""
    path = os.path.join(model_dir, YAML_NAME)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    other = official_family(model_dir)
    if other is not None:
        raise ModelDirError(f"{model_dir} is a {FAMILY_TITLES[other]} model dir, not a CosyVoice2 "
                            f"one (it has no {YAML_NAME})", model_dir)
    raise ModelDirError(f"model config not found: {path}", path)


def read_cosyvoice2_config(model_dir: str | os.PathLike) -> CosyVoice2Config:
    """Read a CosyVoice2 dir's ``cosyvoice2.yaml`` and ``CosyVoice-BlankEN/config.json``.

    The yaml's ``qwen_pretrain_path`` is ignored: the official loader overrides it with
    ``<model_dir>/CosyVoice-BlankEN`` (sheet v2 §1), and so does this one.

    Raises:
        ModelDirError: no such dir, a v1/v3 dir (names the family), a missing yaml or a missing
            ``CosyVoice-BlankEN/config.json``.
        ConfigError: malformed yaml/JSON, a missing section or key, ``llm`` / ``flow`` /
            ``hift`` naming classes other than CosyVoice2's (message names file and key),
            sizes that disagree between the two files.
    """
    model_dir = os.fspath(model_dir)
    path = _yaml_path(model_dir)
    data = load_inert_yaml(path)
    for section, cls in (("flow", FLOW_CLASS), ("hift", HIFT_CLASS)):
        if section not in data:
            raise ConfigError(f"{path}: no '{section}:' section", path)
        YamlSection(data[section], section, path).expect_class((cls,), _OTHER_FAMILY_HINTS)
    qwen = read_qwen2_config(model_dir)
    llm = llm_config_from_data(data, path, qwen,
                               os.path.join(model_dir, QWEN_DIR, QWEN_CONFIG_FILE))
    top = YamlSection(_top_level(data), "(top level)", path)
    return CosyVoice2Config(
        yaml_path=path,
        sample_rate=top.num("sample_rate", 24000),
        token_frame_rate=top.num("token_frame_rate", 25),
        token_mel_ratio=top.num("token_mel_ratio", 2),
        chunk_size=top.num("chunk_size", 25),
        llm=llm,
        sections=data,
    )


def _top_level(data: Mapping[str, Any]) -> Tagged:
    """The top-level scalars as a ``!new:``-like node so :class:`YamlSection` can read them."""
    return Tagged("new", "(top level)", dict(data))
