"""CosyVoice3 config: ``cosyvoice3.yaml`` read inertly plus ``CosyVoice-BlankEN/config.json``.

The yaml is the official hyperpyyaml file (sheet v3 §1); it is parsed without importing or
running anything it names, and the recipe's data-pipeline / training sections are present and
ignored (:mod:`cosyvino.families.cosyvoice23.lm_config`, shared with CosyVoice2). This module
builds the LLM part (:class:`CosyVoice3LLMConfig`, sheet v3 §4.1) and checks that ``llm``,
``flow`` and ``hift`` name the CosyVoice3 classes; the flow and HiFT hyperparameters are read by
their own modules from :attr:`CosyVoice3Config.sections`. A v1 or v2 dir given here is a
:class:`~cosyvino.errors.ModelDirError` naming its family. Must not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyvino.families.cosyvoice23.lm_config import (
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

#: the yaml of an official CosyVoice3 dir (sheet v3 §1)
YAML_NAME = "cosyvoice3.yaml"

#: the classes a CosyVoice3 yaml names for its three models (sheet v3 §4.1, §5.1, §6)
LLM_CLASS = "CosyVoice3LM"
FLOW_CLASS = "CausalMaskedDiffWithDiT"
HIFT_CLASS = "CausalHiFTGenerator"

#: how many rows past ``speech_token_size`` the v3 head / speech embedding have (sheet v3 §4.1:
#: ``Linear(896, speech_token_size + 200)``); every one of them is a stop id
N_SPECIAL_ROWS = 200


@dataclass(frozen=True)
class CosyVoice3LLMConfig(SpeechLMConfig):
    """``CosyVoice3LM`` of the yaml (sheet v3 §4.1) with its Qwen2 decoder (``qwen``); the
    common fields are :class:`~cosyvino.families.cosyvoice23.lm_config.SpeechLMConfig`'s.

    There is no ``llm_embedding``: the specials are rows of ``speech_embedding`` (and columns of
    ``llm_decoder``) right after the speech tokens: SOS = 6561, EOS = 6562, TASK = 6563,
    FILL = 6564; rows 6565..6760 are not referenced by the code; ids 6561..6760 all stop
    decoding (sheet v3 §2, §4.1). ``llm_decoder`` has no bias.
    """

    @property
    def vocab_out(self) -> int:
        """Rows of ``llm_decoder`` / ``speech_embedding``: ``speech_token_size + 200`` (6761)."""
        return self.speech_token_size + N_SPECIAL_ROWS

    @property
    def sos(self) -> int:
        """SOS = ``speech_token_size`` (6561), the row that starts the prefix. HEAD's min_len
        guard masks this index (not the EOS), see :mod:`~cosyvino.families.cosyvoice3.decoding`."""
        return self.speech_token_size

    @property
    def eos_token(self) -> int:
        """EOS = ``speech_token_size + 1`` (6562), the trained end of an utterance."""
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        """TASK = ``speech_token_size + 2`` (6563), the row after the text."""
        return self.speech_token_size + 2

    @property
    def fill_token(self) -> int:
        """FILL = ``speech_token_size + 3`` (6564), the bistream group marker (sheet v3 §4.3)."""
        return self.speech_token_size + 3

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Any of these ends an utterance: 6561 .. 6760, all 200 special rows (sheet v3 §4.1)."""
        return tuple(range(self.speech_token_size, self.vocab_out))


@dataclass(frozen=True)
class CosyVoice3Config:
    """What cosyvino reads from a CosyVoice3 dir's ``cosyvoice3.yaml`` and ``config.json``.

    ``sections`` holds the inert-parsed yaml (``llm`` / ``flow`` / ``hift`` nodes and the
    top-level scalars) for the flow and HiFT config readers; ``yaml_path`` names the file in
    their errors. Rates as v2 (sheet v3 §2): 24000 Hz, 25 tokens/s, 2 mel frames per token.
    """

    yaml_path: str
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int
    llm: CosyVoice3LLMConfig
    sections: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def llm_config_from_data(data: Mapping[str, Any], path: str, qwen: Qwen2Config,
                         qwen_path: str = "") -> CosyVoice3LLMConfig:
    """The :class:`CosyVoice3LLMConfig` of an inert-parsed yaml (``path``: the yaml, for errors;
    ``qwen_path``: the Qwen2 ``config.json``, for size-mismatch errors).

    Raises:
        ConfigError: no ``llm:`` section, ``llm`` is not ``CosyVoice3LM`` (v1/v2 classes are
            named as such) or ``llm.llm`` not ``Qwen2Encoder``, a missing/non-numeric size, or
            the yaml's ``llm_input_size`` / ``llm_output_size`` differ from the Qwen2
            ``hidden_size`` (:func:`~cosyvino.families.cosyvoice23.lm_config.speech_lm_fields`).
    """
    return CosyVoice3LLMConfig(**speech_lm_fields(data, path, qwen, llm_class=LLM_CLASS,
                                                  qwen_path=qwen_path))


def read_cosyvoice3_config(model_dir: str | os.PathLike) -> CosyVoice3Config:
    """Read a CosyVoice3 dir's ``cosyvoice3.yaml`` and ``CosyVoice-BlankEN/config.json``.

    The yaml's ``qwen_pretrain_path`` is ignored: the official loader overrides it with
    ``<model_dir>/CosyVoice-BlankEN`` (sheet v3 §1), and so does this one.

    Raises:
        ModelDirError: no such dir, a v1/v2 dir (names the family), a missing yaml or a missing
            ``CosyVoice-BlankEN/config.json``.
        ConfigError: malformed yaml/JSON, a missing section or key, ``llm`` / ``flow`` /
            ``hift`` naming classes other than CosyVoice3's (message names file and key, and
            the family a v1/v2 class belongs to), sizes that disagree between the two files.
    """
    model_dir = os.fspath(model_dir)
    path, data = read_family_yaml(model_dir, "cosyvoice3",
                                  {"flow": FLOW_CLASS, "hift": HIFT_CLASS})
    qwen = read_qwen2_config(model_dir)
    llm = llm_config_from_data(data, path, qwen,
                               os.path.join(model_dir, QWEN_DIR, QWEN_CONFIG_FILE))
    return CosyVoice3Config(yaml_path=path, **top_level_values(data, path), llm=llm,
                            sections=data)
