"""CosyVoice2's speech LM (upstream ``Qwen2LM``) around our Qwen2 decoder.

Sheet v2 §4.1 (modules), §4.4 (input layout), §4.5 (the KV-cached step). Modules:
``llm_embedding`` Embedding(2, D) (row 0 SOS, row 1 TASK), ``qwen``
(:class:`~cosyvino.families.cosyvoice23.torch.qwen2.Qwen2Model`, its ``embed_tokens`` is the
text table), ``llm_decoder`` Linear(D, 6564) with bias (the speech head; Qwen's text
``lm_head`` is never built), ``speech_embedding`` Embedding(6564, D). No speaker embedding enters
the v2 LLM. The prefix layout and the KV-cached step are shared with CosyVoice3
(:class:`~cosyvino.families.cosyvoice23.torch.speech_lm.SpeechLMBase`); sampling and the decode
loop live in :mod:`cosyvino.families.cosyvoice23.decoding`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cosyvino.families.cosyvoice2.config import CosyVoice2LLMConfig, read_cosyvoice2_config
from cosyvino.families.cosyvoice2.llm_checkpoint import load_llm_state_dict
from cosyvino.families.cosyvoice23.torch.qwen2 import Qwen2Model
from cosyvino.families.cosyvoice23.torch.speech_lm import LayerCacheStep, SpeechLMBase

Tensor = torch.Tensor


class CosyVoice2LM(SpeechLMBase):
    """Module tree of the v2 LLM (sheet v2 §4.1); weights from :func:`load_cosyvoice2_lm`.
    ``lm_input`` / ``forward`` / ``embed_*`` / ``empty_cache``: :class:`SpeechLMBase`
    (``logp`` is ``[B, 6564]``)."""

    def __init__(self, cfg: CosyVoice2LLMConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.llm_input_size
        self.llm_embedding = nn.Embedding(2, d)
        self.qwen = Qwen2Model(cfg.qwen)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, cfg.vocab_out)
        self.speech_embedding = nn.Embedding(cfg.vocab_out, d)

    def special_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(sos, task)``, each float32 ``[1, 1, D]`` (rows 0 and 1 of ``llm_embedding``)."""
        w = self.llm_embedding.weight
        return w[self.cfg.sos].reshape(1, 1, -1), w[self.cfg.task_id].reshape(1, 1, -1)


def load_cosyvoice2_lm(model_dir: str | os.PathLike,
                       cfg: CosyVoice2LLMConfig | None = None) -> CosyVoice2LM:
    """The v2 LLM of an official dir, weights from ``llm.pt`` loaded strictly, float32, eval mode.

    Raises:
        ModelDirError / ConfigError: as :func:`~cosyvino.families.cosyvoice2.config.read_cosyvoice2_config`
            (when ``cfg`` is None); CheckpointError: as
            :func:`~cosyvino.families.cosyvoice2.llm_checkpoint.load_llm_state_dict`.
    """
    model_dir = os.fspath(model_dir)
    if cfg is None:
        cfg = read_cosyvoice2_config(model_dir).llm
    weights = load_llm_state_dict(os.path.join(model_dir, "llm.pt"), cfg)
    model = CosyVoice2LM(cfg)
    model.load_state_dict(weights, strict=True)
    return model.eval()


__all__ = ["CosyVoice2LM", "LayerCacheStep", "load_cosyvoice2_lm"]
