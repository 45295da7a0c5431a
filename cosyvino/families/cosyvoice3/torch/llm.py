"""CosyVoice3's speech LM (upstream ``CosyVoice3LM``) around our Qwen2 decoder.

Sheet v3 §4.1 (modules), §4.3 (input layout, decoding). Modules: ``qwen``
(:class:`~cosyvino.families.cosyvoice23.torch.qwen2.Qwen2Model`, its ``embed_tokens`` is the
text table), ``llm_decoder`` Linear(D, 6761) WITHOUT bias (the speech head; Qwen's text
``lm_head`` is never built), ``speech_embedding`` Embedding(6761, D), whose rows 6561 (SOS) and
6563 (TASK) start and close the text part of the prefix. There is no ``llm_embedding`` and no
speaker embedding enters the LLM. The prefix layout and the KV-cached step are shared with
CosyVoice2 (:class:`~cosyvino.families.cosyvoice23.torch.speech_lm.SpeechLMBase`); the decoding
rule is :mod:`cosyvino.families.cosyvoice3.decoding`, the ``<|endofprompt|>`` rule
:mod:`cosyvino.families.cosyvoice3.prompt`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cosyvino.families.cosyvoice3.config import (
    CosyVoice3LLMConfig,
    read_cosyvoice3_config,
)
from cosyvino.families.cosyvoice3.llm_checkpoint import load_llm_state_dict
from cosyvino.families.cosyvoice23.torch.qwen2 import Qwen2Model
from cosyvino.families.cosyvoice23.torch.speech_lm import SpeechLMBase

Tensor = torch.Tensor


class CosyVoice3LM(SpeechLMBase):
    """Module tree of the v3 LLM (sheet v3 §4.1); weights from :func:`load_cosyvoice3_lm`.
    ``lm_input`` / ``forward`` / ``embed_*`` / ``empty_cache``:
    :class:`~cosyvino.families.cosyvoice23.torch.speech_lm.SpeechLMBase` (``logp`` is
    ``[B, 6761]``; ``embed_speech`` takes ids 0 .. 6760)."""

    def __init__(self, cfg: CosyVoice3LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.qwen = Qwen2Model(cfg.qwen)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, cfg.vocab_out, bias=False)
        self.speech_embedding = nn.Embedding(cfg.vocab_out, cfg.llm_input_size)

    def special_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(sos, task)``, each float32 ``[1, 1, D]``: rows 6561 and 6563 of
        ``speech_embedding`` (sheet v3 §4.3)."""
        w = self.speech_embedding.weight
        return w[self.cfg.sos].reshape(1, 1, -1), w[self.cfg.task_id].reshape(1, 1, -1)


def load_cosyvoice3_lm(model_dir: str | os.PathLike,
                       cfg: CosyVoice3LLMConfig | None = None) -> CosyVoice3LM:
    """The v3 LLM of an official dir, weights from ``llm.pt`` loaded strictly, float32, eval mode.

    Raises:
        ModelDirError / ConfigError: as
            :func:`~cosyvino.families.cosyvoice3.config.read_cosyvoice3_config` (when ``cfg``
            is None); CheckpointError: as
            :func:`~cosyvino.families.cosyvoice3.llm_checkpoint.load_llm_state_dict`.
    """
    model_dir = os.fspath(model_dir)
    if cfg is None:
        cfg = read_cosyvoice3_config(model_dir).llm
    weights = load_llm_state_dict(os.path.join(model_dir, "llm.pt"), cfg)
    model = CosyVoice3LM(cfg)
    model.load_state_dict(weights, strict=True)
    return model.eval()
