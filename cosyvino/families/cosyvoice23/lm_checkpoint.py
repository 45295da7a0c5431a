"""Strict reading of a CosyVoice2/3 ``llm.pt``: exact key set, fp16 upcast, the tied text table.

Both families store a transformers ``Qwen2ForCausalLM`` under ``llm.model.`` next to their own
speech-side tensors (sheet v2 §4.3, sheet v3 §4.2). The file must hold exactly the official key
set for the config, with the official shapes; float16 / bfloat16 tensors are upcast to float32
(the tiny goldens store fp16; released checkpoints hold fp32). The text embedding is tied: the
file stores it as both ``llm.model.model.embed_tokens.weight`` and ``llm.model.lm_head.weight``,
and the official strict load copies ``lm_head`` last into the shared parameter, so that entry
wins (sheet v2 §4.3, §9). The family supplies the expected shapes. torch is imported lazily.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from cosyvino.errors import CheckpointError
from cosyvino.families.cosyvoice1.checkpoint import check_state_dict, load_torch_file

from .qwen2_config import Qwen2Config

#: where the Qwen2ForCausalLM sits in ``llm.pt``
QWEN_PREFIX = "llm.model."
EMBED_TOKENS_KEY = "llm.model.model.embed_tokens.weight"
LM_HEAD_KEY = "llm.model.lm_head.weight"


def load_speech_lm_state_dict(path: str | os.PathLike, shapes: Mapping[str, tuple[int, ...]],
                              qwen: Qwen2Config, *, config_name: str, hint: str) -> dict:
    """The float32 weights of ``llm.pt`` keyed as our speech-LM modules name them.

    Mapping: ``llm.model.model.X`` -> ``qwen.X``; the text table ``qwen.embed_tokens.weight``
    comes from ``llm.model.lm_head.weight`` when ``qwen`` ties embeddings (the official load's
    result; a warning names both keys if the file's two copies differ), else from
    ``embed_tokens.weight``; the other keys keep their names.

    Args:
        path: the ``llm.pt`` file.
        shapes: key -> shape of the official state_dict for the config (both Qwen2 copies
            included).
        qwen: the Qwen2 config (tie rule).
        config_name: the yaml the shapes came from; hint: appended to key errors.
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
    check_state_dict(sd, dict(shapes), path, config_name=config_name, hint=hint)
    for key, value in sd.items():
        if not torch.is_tensor(value) or not value.is_floating_point():
            raise CheckpointError(f"{path}: '{key}' must be a floating-point tensor, got "
                                  f"{getattr(value, 'dtype', type(value).__name__)}", path)
    embed, head = sd[EMBED_TOKENS_KEY], sd[LM_HEAD_KEY]
    if qwen.tie_word_embeddings:
        if not torch.equal(embed.float(), head.float()):
            warnings.warn(f"{path}: '{EMBED_TOKENS_KEY}' and '{LM_HEAD_KEY}' differ; the "
                          "embeddings are tied, so the text embedding is taken from "
                          f"'{LM_HEAD_KEY}' as the official load does", stacklevel=3)
        text_table = head
    else:
        text_table = embed
    out = {}
    qwen_model = QWEN_PREFIX + "model."
    for key, value in sd.items():
        if key in (EMBED_TOKENS_KEY, LM_HEAD_KEY):
            continue
        name = "qwen." + key[len(qwen_model):] if key.startswith(qwen_model) else key
        out[name] = value.to(torch.float32)
    out["qwen.embed_tokens.weight"] = text_table.to(torch.float32)
    return out
