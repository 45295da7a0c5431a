"""The whole config a CosyVoice2/3 family serves with: the LLM part of the family yaml +
``CosyVoice-BlankEN/config.json`` (``base``), the flow and the 24 kHz HiFT sections. The two
families fill it with their own section types (:mod:`cosyvino.families.cosyvoice2.model_config`,
:mod:`cosyvino.families.cosyvoice3.model_config`); the properties are what the shared serving
code (:mod:`.graph_stages`, :mod:`.program`, :mod:`.token2wav`) reads. Must not import torch."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SpeechLMModelConfig:
    """Attributes: ``base`` (the family's LLM config: ``llm``, ``sample_rate``, ``yaml_path``,
    the parsed ``sections``), ``flow`` (the flow config: ``output_size``, ``spk_embed_dim``,
    ``vocab_size``, ``token_mel_ratio``, ``pre_lookahead_len``, ``estimator.static_chunk_size``,
    ``cfm``), ``hift`` (the vocoder config: ``hop_length``, ``nb_harmonics``, ``in_channels``)."""

    base: object
    flow: object
    hift: object

    @property
    def llm(self):
        """The speech-LM config (:class:`~.lm_config.SpeechLMConfig` subclass)."""
        return self.base.llm

    @property
    def sample_rate(self) -> int:
        """Output Hz (24000, sheet v2 §2, v3 §2)."""
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
