"""The whole CosyVoice2 config the family serves with: the LLM part of ``cosyvoice2.yaml`` +
``CosyVoice-BlankEN/config.json`` (:mod:`.config`), the flow (:mod:`.flow_config`) and the
24 kHz HiFT (:mod:`.hift_config`) sections. Must not import torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..cosyvoice23.model_config import SpeechLMModelConfig
from .config import CosyVoice2Config, CosyVoice2LLMConfig, read_cosyvoice2_config
from .flow_config import CausalFlowConfig, flow_config_from_data


@dataclass(frozen=True)
class CosyVoice2ModelConfig(SpeechLMModelConfig):
    """:class:`~cosyvino.families.cosyvoice23.model_config.SpeechLMModelConfig` with ``base``
    a :class:`CosyVoice2Config` (LLM, rates, the parsed yaml), ``flow`` a
    :class:`CausalFlowConfig`, ``hift`` a :class:`~.hift_config.HiFTConfig`."""

    base: CosyVoice2Config
    flow: CausalFlowConfig
    hift: object

    @property
    def llm(self) -> CosyVoice2LLMConfig:
        return self.base.llm


def read_model_config(model_dir: str | os.PathLike) -> CosyVoice2ModelConfig:
    """:class:`CosyVoice2ModelConfig` of an official or converted CosyVoice2 dir.

    Raises: ModelDirError / ConfigError (as the three section readers)."""
    from .hift_config import hift_config_from_data

    base = read_cosyvoice2_config(model_dir)
    data = base.sections
    return CosyVoice2ModelConfig(base=base, flow=flow_config_from_data(data, base.yaml_path),
                                 hift=hift_config_from_data(data, base.yaml_path))
