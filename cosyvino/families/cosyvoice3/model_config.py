"""The whole CosyVoice3 config the family serves with: the LLM part of ``cosyvoice3.yaml`` +
``CosyVoice-BlankEN/config.json`` (:mod:`.config`), the DiT flow (:mod:`.flow_config`) and the
causal HiFT (:mod:`.hift_config`) sections, in the shape the code shared with CosyVoice2 reads
(:class:`~cosyvino.families.cosyvoice23.model_config.SpeechLMModelConfig`). Must not import
torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..cosyvoice23.model_config import SpeechLMModelConfig
from .config import CosyVoice3Config, CosyVoice3LLMConfig, read_cosyvoice3_config
from .flow_config import DiTFlowConfig, flow_config_from_data
from .hift_config import CausalHiFTConfig, hift_config_from_data


@dataclass(frozen=True)
class CosyVoice3ModelConfig(SpeechLMModelConfig):
    """``base`` a :class:`CosyVoice3Config` (LLM, rates, the parsed yaml), ``flow`` a
    :class:`DiTFlowConfig`, ``hift`` a :class:`CausalHiFTConfig`."""

    base: CosyVoice3Config
    flow: DiTFlowConfig
    hift: CausalHiFTConfig

    @property
    def llm(self) -> CosyVoice3LLMConfig:
        return self.base.llm


def read_model_config(model_dir: str | os.PathLike) -> CosyVoice3ModelConfig:
    """:class:`CosyVoice3ModelConfig` of an official or converted CosyVoice3 dir.

    Raises: ModelDirError / ConfigError (as the three section readers)."""
    base = read_cosyvoice3_config(model_dir)
    data = base.sections
    return CosyVoice3ModelConfig(base=base, flow=flow_config_from_data(data, base.yaml_path),
                                 hift=hift_config_from_data(data, base.yaml_path))
