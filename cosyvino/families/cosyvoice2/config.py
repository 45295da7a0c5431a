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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyvino.families.cosyvoice23.lm_config import (
    QWEN_ENCODER_CLASS,
    SpeechLMConfig,
    read_family_yaml,
    speech_lm_fields,
    top_level_values,
)
from cosyvino.families.cosyvoice23.qwen2_config import (
    QWEN_CONFIG_FILE,
    QWEN_DIR,
    Qwen2Config,
    read_qwen2_config,
)

#: the yaml of an official CosyVoice2 dir
YAML_NAME = "cosyvoice2.yaml"

#: the classes a CosyVoice2 yaml names for its three models (sheet v2 §4.1, §5.1, §6)
LLM_CLASS = "Qwen2LM"
FLOW_CLASS = "CausalMaskedDiffWithXvec"
HIFT_CLASS = "HiFTGenerator"

__all__ = [
    "FLOW_CLASS",
    "HIFT_CLASS",
    "LLM_CLASS",
    "QWEN_ENCODER_CLASS",
    "YAML_NAME",
    "CosyVoice2Config",
    "CosyVoice2LLMConfig",
    "llm_config_from_data",
    "read_cosyvoice2_config",
]


@dataclass(frozen=True)
class CosyVoice2LLMConfig(SpeechLMConfig):
    """``Qwen2LM`` of the yaml (sheet v2 §4.1) with its Qwen2 decoder (``qwen``); the common
    fields are :class:`~cosyvino.families.cosyvoice23.lm_config.SpeechLMConfig`'s.

    The speech head and speech embedding have ``speech_token_size + 3`` rows (6564: tokens,
    EOS 6561, an unused stop id 6562, FILL 6563); SOS and TASK are rows 0 and 1 of the separate
    ``llm_embedding``.
    """

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


def llm_config_from_data(data: Mapping[str, Any], path: str, qwen: Qwen2Config,
                         qwen_path: str = "") -> CosyVoice2LLMConfig:
    """The :class:`CosyVoice2LLMConfig` of an inert-parsed yaml (``path``: the yaml, for errors;
    ``qwen_path``: the Qwen2 ``config.json``, for size-mismatch errors).

    Raises:
        ConfigError: no ``llm:`` section, ``llm`` is not ``Qwen2LM`` (v1/v3 classes are named as
            such) or ``llm.llm`` not ``Qwen2Encoder``, a missing/non-numeric size, or the yaml's
            ``llm_input_size`` / ``llm_output_size`` differ from the Qwen2 ``hidden_size``
            (:func:`~cosyvino.families.cosyvoice23.lm_config.speech_lm_fields`).
    """
    return CosyVoice2LLMConfig(**speech_lm_fields(data, path, qwen, llm_class=LLM_CLASS,
                                                  qwen_path=qwen_path))


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
    path, data = read_family_yaml(model_dir, "cosyvoice2",
                                  {"flow": FLOW_CLASS, "hift": HIFT_CLASS})
    qwen = read_qwen2_config(model_dir)
    llm = llm_config_from_data(data, path, qwen,
                               os.path.join(model_dir, QWEN_DIR, QWEN_CONFIG_FILE))
    return CosyVoice2Config(yaml_path=path, **top_level_values(data, path), llm=llm,
                            sections=data)
