"""The whole CosyVoice2 config the family serves with: the LLM part of ``cosyvoice2.yaml`` +
``CosyVoice-BlankEN/config.json`` (:mod:`.config`), the flow (:mod:`.flow_config`) and the
24 kHz HiFT (:mod:`.hift_config`) sections. Must not import torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .config import CosyVoice2Config, CosyVoice2LLMConfig, read_cosyvoice2_config
from .flow_config import CausalFlowConfig, flow_config_from_data


@dataclass(frozen=True)
class CosyVoice2ModelConfig:
    """Attributes: ``base`` (:class:`CosyVoice2Config`: LLM, rates, the parsed yaml), ``flow``
    (:class:`CausalFlowConfig`), ``hift`` (:class:`~.hift_config.HiFTConfig`)."""

    base: CosyVoice2Config
    flow: CausalFlowConfig
    hift: object

    @property
    def llm(self) -> CosyVoice2LLMConfig:
        return self.base.llm

    @property
    def sample_rate(self) -> int:
        """Output Hz (24000, sheet v2 §2)."""
        return self.base.sample_rate

    @property
    def yaml_path(self) -> str:
        return self.base.yaml_path

    @property
    def model_dir(self) -> str:
        """The dir the config was read from (official or converted)."""
        return os.path.dirname(self.base.yaml_path)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (480 at 24 kHz, sheet v2 §2)."""
        return int(self.hift.hop_length)

    @property
    def frames_per_token(self) -> int:
        """Mel frames per speech token (``token_mel_ratio``, 2)."""
        return int(self.flow.token_mel_ratio)


def read_model_config(model_dir: str | os.PathLike) -> CosyVoice2ModelConfig:
    """:class:`CosyVoice2ModelConfig` of an official or converted CosyVoice2 dir.

    Raises: ModelDirError / ConfigError (as the three section readers)."""
    from .hift_config import hift_config_from_data

    base = read_cosyvoice2_config(model_dir)
    data = base.sections
    return CosyVoice2ModelConfig(base=base, flow=flow_config_from_data(data, base.yaml_path),
                                 hift=hift_config_from_data(data, base.yaml_path))
