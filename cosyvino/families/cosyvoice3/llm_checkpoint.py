"""Strict reading of a CosyVoice3 ``llm.pt`` (sheet v3 §4.2).

The file must hold exactly the official key set for the config (293 tensors at 0.5B: the Qwen2
decoder under ``llm.model.`` with both copies of the tied text table, ``llm_decoder.weight``
[6761, D] without a bias, ``speech_embedding.weight`` [6761, D]; no ``llm_embedding``) with the
official shapes. Reading, fp16 upcast and the tie rule are shared with CosyVoice2
(:func:`cosyvino.families.cosyvoice23.lm_checkpoint.load_speech_lm_state_dict`). torch is
imported lazily.
"""

from __future__ import annotations

import os

from cosyvino.families.cosyvoice23.lm_checkpoint import (
    QWEN_PREFIX,
    load_speech_lm_state_dict,
)
from cosyvino.families.cosyvoice23.qwen2_checkpoint import qwen2_state_dict_shapes

from .config import YAML_NAME, CosyVoice3LLMConfig


def llm_state_dict_shapes(cfg: CosyVoice3LLMConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the official ``CosyVoice3LM`` state_dict for ``cfg``, in the official
    order (sheet v3 §4.2; the manifest ``cosyvoice3-0.5b-state-dict-keys.json`` at 0.5B)."""
    return {
        **qwen2_state_dict_shapes(cfg.qwen, QWEN_PREFIX),
        "llm_decoder.weight": (cfg.vocab_out, cfg.llm_output_size),
        "speech_embedding.weight": (cfg.vocab_out, cfg.llm_input_size),
    }


def load_llm_state_dict(path: str | os.PathLike, cfg: CosyVoice3LLMConfig) -> dict:
    """The float32 weights of ``llm.pt`` keyed as :class:`~.torch.llm.CosyVoice3LM` names them
    (``llm.model.model.X`` -> ``qwen.X``, the tied text table from ``lm_head``: see
    :func:`~cosyvino.families.cosyvoice23.lm_checkpoint.load_speech_lm_state_dict`).

    Raises:
        ModelDirError: missing or unreadable file.
        CheckpointError: truncated/corrupt file, missing/unexpected keys (a v2 ``llm.pt`` has
            ``llm_embedding.weight`` and ``llm_decoder.bias``) or wrong shapes (names the file
            and the keys), a non-floating tensor (names the key).
    """
    return load_speech_lm_state_dict(path, llm_state_dict_shapes(cfg), cfg.qwen,
                                     config_name=YAML_NAME,
                                     hint="Is this the llm.pt of this CosyVoice3 model dir?")
