"""What the CosyVoice2 and CosyVoice3 speech LMs do alike, around our Qwen2 decoder.

Both feed ``inputs_embeds`` to Qwen2 (no text head) and read speech-token log-probabilities
from their ``llm_decoder``: the prefix ``[SOS][E_text(prompt_text ⧺ text)][TASK]
[E_speech(prompt speech)]`` (sheet v2 §4.4, sheet v3 §4.3), then one KV-cached step per token
(sheet v2 §4.5). They differ only in where SOS / TASK come from and in the head's size / bias,
which the subclasses define (``special_embeddings``, the modules). Sampling and the decode loop
live in :mod:`cosyvino.families.cosyvoice23.decoding`. Depends on torch.
"""

from __future__ import annotations

import torch
from torch import nn

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice23.lm_config import SpeechLMConfig

Tensor = torch.Tensor


class SpeechLMBase(nn.Module):
    """Base of :class:`~cosyvino.families.cosyvoice2.torch.llm.CosyVoice2LM` and
    :class:`~cosyvino.families.cosyvoice3.torch.llm.CosyVoice3LM`.

    Subclasses build ``qwen`` (:class:`~cosyvino.families.cosyvoice23.torch.qwen2.Qwen2Model`,
    its ``embed_tokens`` is the text table), ``llm_decoder`` and ``speech_embedding``, and
    implement :meth:`special_embeddings`.
    """

    cfg: SpeechLMConfig
    qwen: nn.Module
    llm_decoder: nn.Linear
    speech_embedding: nn.Embedding

    def special_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(sos, task)``, each float32 ``[1, 1, D]``."""
        raise NotImplementedError

    def embed_text(self, text_token: Tensor) -> Tensor:
        """int ``[1, L]`` Qwen2 text ids -> float32 ``[1, L, D]`` (unscaled rows of the tied
        table).

        Raises:
            InputError: an id outside ``0 .. vocab_size - 1`` of the Qwen2 config (a tokenizer
                that does not belong to this model; torch would fail with an index error).
        """
        vocab = self.cfg.qwen.vocab_size
        if text_token.numel() and (int(text_token.min()) < 0 or int(text_token.max()) >= vocab):
            raise InputError(f"text token ids must be in 0..{vocab - 1} (the Qwen2 vocabulary), "
                             f"got {int(text_token.min())}..{int(text_token.max())}")
        return self.qwen.embed_tokens(text_token.long())

    def embed_speech(self, speech_token: Tensor) -> Tensor:
        """int ``[1, N]`` speech ids (0 .. ``vocab_out - 1``) -> float32 ``[1, N, D]``."""
        return self.speech_embedding(speech_token.long())

    def lm_input(self, text_token: Tensor, prompt_text_token: Tensor | None = None,
                 prompt_speech_token: Tensor | None = None) -> Tensor:
        """The prefix ``[SOS][E_text(prompt_text ⧺ text)][TASK][E_speech(prompt_speech)]``
        (sheet v2 §4.4, v3 §4.3), float32 ``[1, 1 + Lp + L + 1 + N, D]``.

        Args:
            text_token: int ``[1, L]`` tts text ids.
            prompt_text_token: int ``[1, Lp]`` (zero-shot prompt or instruct text) or None.
            prompt_speech_token: int ``[1, N]`` (zero-shot) or None.
        Raises:
            InputError: a text id outside the Qwen2 vocabulary (:meth:`embed_text`).
        """
        sos, task = self.special_embeddings()
        text = text_token if prompt_text_token is None else torch.cat(
            [prompt_text_token.to(text_token.dtype), text_token], dim=1)
        parts = [sos, self.embed_text(text), task]
        if prompt_speech_token is not None and prompt_speech_token.shape[1] > 0:
            parts.append(self.embed_speech(prompt_speech_token))
        return torch.cat(parts, dim=1)

    def forward(self, inputs_embeds: Tensor, past_k: Tensor, past_v: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """One KV-cached LLM call (prefill, or one decode step) plus the speech head.

        Args:
            inputs_embeds: float32 ``[B, T, D]`` (the prefix, or one speech embedding).
            past_k, past_v: float32 ``[layers, B, kv_heads, P, head_dim]`` (``P`` may be 0).
        Returns:
            ``logp`` float32 ``[B, vocab_out]``: log-softmax of ``llm_decoder`` at the last new
            position (sheet v2 §4.5); ``present_k``, ``present_v`` with ``P + T`` positions.
        """
        h, k, v = self.qwen(inputs_embeds, past_k, past_v)
        return torch.log_softmax(self.llm_decoder(h[:, -1]), dim=-1), k, v

    def empty_cache(self, batch: int = 1) -> tuple[Tensor, Tensor]:
        """Empty ``(past_k, past_v)`` for :meth:`forward`."""
        return self.qwen.empty_cache(batch)


class LayerCacheStep(nn.Module):
    """:meth:`SpeechLMBase.forward` with one K and one V cache tensor per layer: ``(inputs_embeds
    [B, T, D], past_key_values.0.key, past_key_values.0.value, ...) -> (logp [B, V],
    present.0.key, present.0.value, ...)``, each cache ``[B, kv_heads, P, head_dim]`` (``P + T``
    out). The layout of :func:`cosyvino.families.cosyvoice23.graph_specs.layer_state_spec`: what
    the OpenVINO exporter makes stateful, one state per layer and K/V, so the CPU plugin's
    stateful attention keeps each in its own preallocated cache (as v1's step). The same step
    for CosyVoice2 and CosyVoice3 (V = 6564 / 6761)."""

    def __init__(self, lm: SpeechLMBase):
        super().__init__()
        self.lm = lm

    def forward(self, inputs_embeds: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        pasts = list(zip(past[0::2], past[1::2]))
        h, presents = self.lm.qwen.forward_layers(inputs_embeds, pasts)
        logp = torch.log_softmax(self.lm.llm_decoder(h[:, -1]), dim=-1)
        return (logp, *(t for kv in presents for t in kv))
