"""Strict reading of a CosyVoice2 ``llm.pt`` (sheet v2 §4.3).

The file must hold exactly the official key set for the config (295 tensors at 0.5B:
``llm_embedding``, the Qwen2 decoder under ``llm.model.``, ``llm_decoder``, ``speech_embedding``)
with the official shapes; float16 / bfloat16 tensors are upcast to float32 (the tiny goldens
store fp16; released checkpoints hold fp32). The text embedding is tied: ``llm.pt`` stores it as
both ``llm.model.model.embed_tokens.weight`` and ``llm.model.lm_head.weight``, and the official
strict load copies ``lm_head`` last into the shared parameter, so that entry wins (sheet v2 §4.3,
§9); the reading itself is shared with CosyVoice3
(:func:`cosyvino.families.cosyvoice23.lm_checkpoint.load_speech_lm_state_dict`). torch is
imported lazily.
"""

from __future__ import annotations

import os

from cosyvino.families.cosyvoice23.lm_checkpoint import (
    EMBED_TOKENS_KEY,
    LM_HEAD_KEY,
    QWEN_PREFIX,
    load_speech_lm_state_dict,
)
from cosyvino.families.cosyvoice23.qwen2_checkpoint import qwen2_state_dict_shapes

from .config import YAML_NAME, CosyVoice2LLMConfig

__all__ = ["EMBED_TOKENS_KEY", "LM_HEAD_KEY", "QWEN_PREFIX", "llm_state_dict_shapes",
           "load_llm_state_dict"]


def llm_state_dict_shapes(cfg: CosyVoice2LLMConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the official ``Qwen2LM`` state_dict for ``cfg``, in the official order."""
    d = cfg.llm_input_size
    return {
        "llm_embedding.weight": (2, d),
        **qwen2_state_dict_shapes(cfg.qwen, QWEN_PREFIX),
        "llm_decoder.weight": (cfg.vocab_out, cfg.llm_output_size),
        "llm_decoder.bias": (cfg.vocab_out,),
        "speech_embedding.weight": (cfg.vocab_out, d),
    }


def load_llm_state_dict(path: str | os.PathLike, cfg: CosyVoice2LLMConfig) -> dict:
    """The float32 weights of ``llm.pt`` keyed as :class:`~.torch.llm.CosyVoice2LM` names them
    (mapping and tie rule: :func:`~cosyvino.families.cosyvoice23.lm_checkpoint.load_speech_lm_state_dict`).

    Raises:
        ModelDirError: missing or unreadable file.
        CheckpointError: truncated/corrupt file, missing/unexpected keys or wrong shapes (names
            the file and the keys), a non-floating tensor (names the key).
    """
    return load_speech_lm_state_dict(path, llm_state_dict_shapes(cfg), cfg.qwen,
                                     config_name=YAML_NAME,
                                     hint="Is this the llm.pt of this CosyVoice2 model dir?")
