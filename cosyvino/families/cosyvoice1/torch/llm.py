"""The CosyVoice v1 speech-token language model (``TransformerLM``) and its export stages.

Upstream ``cosyvoice/llm/llm.py::TransformerLM``; submodule names equal upstream so the
official ``llm.pt`` loads with ``strict=True``. The stage modules each wrap one tensor-only
forward (what an exporter converts); sampling and the decode loop live elsewhere.
Depends on torch and :mod:`cosyvino.families.cosyvoice1.torch.transformer` only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyvino.families.cosyvoice1.config import LLMConfig
from cosyvino.families.cosyvoice1.torch.transformer import Encoder

Tensor = torch.Tensor


class TransformerLM(nn.Module):
    """Module tree of the v1 LLM (architecture sheet section 4.1).

    ``text_embedding`` Embedding(text_token_size, text_encoder_input_size); ``text_encoder``
    causal conformer; ``text_encoder_affine_layer`` Linear; ``llm_embedding`` Embedding(2, D)
    (row 0 SOS/EOS, row 1 TASK_ID); ``llm`` causal transformer; ``llm_decoder``
    Linear(D, speech_token_size+1); ``speech_embedding`` Embedding(speech_token_size, D);
    ``spk_embed_affine_layer`` Linear(spk_embed_dim, D).
    """

    SOS_EOS = 0
    TASK_ID = 1

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.text_embedding = nn.Embedding(cfg.text_token_size, cfg.text_encoder_input_size)
        self.text_encoder = Encoder(cfg.text_encoder)
        self.text_encoder_affine_layer = nn.Linear(cfg.text_encoder.output_size,
                                                   cfg.llm_input_size)
        self.llm_embedding = nn.Embedding(2, cfg.llm_input_size)
        self.llm = Encoder(cfg.llm)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, cfg.speech_token_size + 1)
        self.speech_embedding = nn.Embedding(cfg.speech_token_size, cfg.llm_input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.llm_input_size)

    def special_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(sos, task_id)``, each float ``[1, 1, D]`` (rows 0 and 1 of ``llm_embedding``)."""
        w = self.llm_embedding.weight
        return (w[self.SOS_EOS].reshape(1, 1, -1), w[self.TASK_ID].reshape(1, 1, -1))


class TextEncoderStage(nn.Module):
    """text tokens -> LLM-width text features (embedding, causal conformer, affine)."""

    def __init__(self, lm: TransformerLM):
        super().__init__()
        self.lm = lm

    def forward(self, text_token: Tensor) -> Tensor:
        """int64 ``[1, L]`` -> float32 ``[1, L, D]`` (upstream ``TransformerLM.encode`` + affine)."""
        x = self.lm.text_embedding(text_token)
        x = self.lm.text_encoder(x)
        return self.lm.text_encoder_affine_layer(x)


class SpeakerEmbedStage(nn.Module):
    """x-vector -> the LLM speaker slot: ``spk_embed_affine_layer(L2-normalize(e))``."""

    def __init__(self, lm: TransformerLM):
        super().__init__()
        self.lm = lm

    def forward(self, embedding: Tensor) -> Tensor:
        """float32 ``[1, 192]`` -> ``[1, 1, D]`` (``F.normalize`` eps 1e-12, as upstream)."""
        e = F.normalize(embedding, dim=1)
        return self.lm.spk_embed_affine_layer(e).unsqueeze(1)


class SpeechEmbedStage(nn.Module):
    """speech tokens -> LLM input embeddings."""

    def __init__(self, lm: TransformerLM):
        super().__init__()
        self.lm = lm

    def forward(self, tokens: Tensor) -> Tensor:
        """int64 ``[1, N]`` (each in ``0..speech_token_size-1``) -> float32 ``[1, N, D]``."""
        return self.lm.speech_embedding(tokens)


class LLMStepStage(nn.Module):
    """One KV-cached forward of the LLM (prefill or decode step) plus the token head.

    ``query_side_pos`` (constructor, a Python constant baked into a traced graph) picks the
    positional-term evaluation order, see :class:`~.transformer.RelPositionMultiHeadedAttention`:
    True is much cheaper for single-token decode steps, False for long prefills. Both are the
    same math.
    """

    def __init__(self, lm: TransformerLM, query_side_pos: bool = True):
        super().__init__()
        self.lm = lm
        self.query_side_pos = query_side_pos

    def forward(self, inputs_embeds: Tensor, past_k: Tensor, past_v: Tensor,
                attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Run ``T`` new positions after ``P`` cached ones, for ``B`` rows.

        Args:
            inputs_embeds: float32 ``[B, T, D]`` (``T >= 1``).
            past_k, past_v: float32 ``[num_layers, B, H, P, d_k]`` (``P`` may be 0), rows
                left-padded to the common ``P``.
            attention_mask: ``[B, P+T]``, 1 = real key, 0 = padding (see
                :meth:`~.transformer.Encoder.forward_cached`); ``None`` = no padding.
        Returns:
            ``logp`` float32 ``[B, speech_token_size+1]``: log-softmax of ``llm_decoder`` at the
            last new position; ``present_k``, ``present_v`` ``[num_layers, B, H, P+T, d_k]``.
        """
        n = len(self.lm.llm.encoders)
        ks = [past_k[i] for i in range(n)]
        vs = [past_v[i] for i in range(n)]
        h, pk, pv = self.lm.llm.forward_cached(inputs_embeds, ks, vs, self.query_side_pos,
                                               key_mask=attention_mask)
        logits = self.lm.llm_decoder(h[:, -1])
        return torch.log_softmax(logits, dim=-1), torch.stack(pk), torch.stack(pv)

    def empty_cache(self) -> tuple[Tensor, Tensor]:
        """Empty ``(past_k, past_v)``, each ``[num_layers, 1, H, 0, d_k]`` float32."""
        enc = self.lm.llm
        shape = (len(enc.encoders), 1, enc.num_heads, 0, enc.head_dim)
        return torch.zeros(shape), torch.zeros(shape)


class LLMExplicitCacheStep(nn.Module):
    """``(inputs_embeds [B, T, D], attention_mask [B, P+T], pos_offset [1], pos_keys_0, ...,
    pos_keys_{L-1}, past_0_key, past_0_value, ...) -> (logp [B, V+1], present_0_key,
    present_0_value, ...)``; per-layer caches float32 ``[B, H, P, d_k]`` (rows left-padded to
    the common ``P``), presents ``[B, H, P+T, d_k]``; ``attention_mask`` float32, 1 = real
    key, 0 = padding (:meth:`~.transformer.Encoder.forward_cached`); ``pos_keys_l`` float32
    ``[H, N, d_k]``, layer ``l``'s projected relative-position table by head, row
    ``pos_offset + k`` for distance ``P+T-1-k``
    (:class:`cosyvino.families.cosyvoice1.positional.PositionalKeys`):
    the step itself builds no sinusoid and multiplies nothing by ``linear_pos``. Serves
    prefill (B = 1) and batched decode steps (T = 1) with one graph. ``pos_bucket``: see
    :meth:`~.transformer.Encoder.forward_cached`."""

    def __init__(self, lm: TransformerLM, pos_bucket: int = 1):
        super().__init__()
        self.lm = lm
        self.pos_bucket = pos_bucket

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
                *rest: torch.Tensor):
        n = len(self.lm.llm.encoders)
        pos_offset, pos_keys, past = rest[0], rest[1:n + 1], rest[n + 1:]
        h, pk, pv = self.lm.llm.forward_cached(inputs_embeds, list(past[0::2]),
                                               list(past[1::2]), pos_bucket=self.pos_bucket,
                                               key_mask=attention_mask, pos_keys=pos_keys,
                                               pos_offset=pos_offset)
        out = [torch.log_softmax(self.lm.llm_decoder(h[:, -1]), dim=-1)]
        for k, v in zip(pk, pv):
            out += [k, v]
        return tuple(out)
