"""Strict reading of a CosyVoice2 ``llm.pt`` (sheet v2 §4.3).

The file must hold exactly the official key set for the config (295 tensors at 0.5B:
``llm_embedding``, the Qwen2 decoder under ``llm.model.``, ``llm_decoder``, ``speech_embedding``)
with the official shapes; float16 / bfloat16 tensors are upcast to float32 (the tiny goldens
store fp16; released checkpoints hold fp32). The text embedding is tied: ``llm.pt`` stores it as
both ``llm.model.model.embed_tokens.weight`` and ``llm.model.lm_head.weight``, and the official
strict load copies ``lm_head`` last into the shared parameter, so that entry wins (sheet v2 §4.3,
§9). torch is imported lazily.
"""

from __future__ import annotations

import os
import warnings

from cosyvino.errors import CheckpointError
from cosyvino.families.cosyvoice1.checkpoint import check_state_dict, load_torch_file
from cosyvino.families.cosyvoice23.qwen2_checkpoint import qwen2_state_dict_shapes

from .config import YAML_NAME, CosyVoice2LLMConfig

#: where the Qwen2ForCausalLM sits in ``llm.pt``
QWEN_PREFIX = "llm.model."
EMBED_TOKENS_KEY = "llm.model.model.embed_tokens.weight"
LM_HEAD_KEY = "llm.model.lm_head.weight"


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
    """The float32 weights of ``llm.pt`` keyed as :class:`~.torch.llm.CosyVoice2LM` names them.

    Mapping: ``llm.model.model.X`` -> ``qwen.X``; the text table ``qwen.embed_tokens.weight``
    comes from ``llm.model.lm_head.weight`` when the Qwen2 config ties embeddings (the official
    load's result; a warning names both keys if the file's two copies differ), else from
    ``embed_tokens.weight``; the other keys keep their names.

    Raises:
        ModelDirError: missing or unreadable file.
        CheckpointError: truncated/corrupt file, missing/unexpected keys or wrong shapes (names
            the file and the keys), a non-floating tensor (names the key).
    """
    import torch

    path = os.fspath(path)
    sd = load_torch_file(path)
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: expected a state_dict (a dict of tensors), got "
                              f"{type(sd).__name__}", path)
    check_state_dict(sd, llm_state_dict_shapes(cfg), path, config_name=YAML_NAME,
                     hint="Is this the llm.pt of this CosyVoice2 model dir?")
    for key, value in sd.items():
        if not torch.is_tensor(value) or not value.is_floating_point():
            raise CheckpointError(f"{path}: '{key}' must be a floating-point tensor, got "
                                  f"{getattr(value, 'dtype', type(value).__name__)}", path)
    embed, head = sd[EMBED_TOKENS_KEY], sd[LM_HEAD_KEY]
    if cfg.qwen.tie_word_embeddings:
        if not torch.equal(embed.float(), head.float()):
            warnings.warn(f"{path}: '{EMBED_TOKENS_KEY}' and '{LM_HEAD_KEY}' differ; the "
                          "embeddings are tied, so the text embedding is taken from "
                          f"'{LM_HEAD_KEY}' as the official load does", stacklevel=2)
        text_table = head
    else:
        text_table = embed
    out = {}
    for key, value in sd.items():
        if key in (EMBED_TOKENS_KEY, LM_HEAD_KEY):
            continue
        name = "qwen." + key[len(QWEN_PREFIX) + len("model."):] if key.startswith(
            QWEN_PREFIX + "model.") else key
        out[name] = value.to(torch.float32)
    out["qwen.embed_tokens.weight"] = text_table.to(torch.float32)
    return out
