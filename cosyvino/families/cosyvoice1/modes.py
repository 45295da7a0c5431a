"""CosyVoice v1 modes: how each builds the LLM prefix and the flow conditioning (architecture
sheet section 3.8). Must not import torch.

Only ``sft`` (a built-in speaker of an SFT model) runs today; zero-shot, cross-lingual, instruct
and voice conversion are added here, each as a :class:`Mode` entry plus its two builders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import Mode
from cosyvino.voices import Voice

SFT = Mode("sft", "a built-in speaker (spk2info.pt) of an SFT model", needs_speaker=True)

#: the modes requests may name
MODES = {m.name: m for m in (SFT,)}


@dataclass(frozen=True)
class LLMPrefix:
    """What goes before the generated speech tokens:
    ``[SOS][SPK][TEXT_ENC(prompt_text ⧺ text)][TASK][PROMPT_SPEECH]``.

    Attributes:
        embedding: float32 [1, 192] for the SPK slot (None: no slot, instruct mode).
        prompt_text_token: int64 [1, L] prompt transcript tokens (None: none).
        prompt_speech_token: int64 [1, N] prompt speech tokens (None: none).
    """

    embedding: np.ndarray | None
    prompt_text_token: np.ndarray | None = None
    prompt_speech_token: np.ndarray | None = None


@dataclass(frozen=True)
class FlowConditioning:
    """The flow's speaker and prompt: embedding float32 [1, 192], prompt tokens int64 [N1] and
    prompt mel float32 [M1, 80] (both None without a prompt)."""

    embedding: np.ndarray
    prompt_token: np.ndarray | None = None
    prompt_feat: np.ndarray | None = None


def llm_prefix(mode: str, voice: Voice) -> LLMPrefix:
    """The LLM prefix of ``mode`` for ``voice`` (sft: speaker embedding only)."""
    if mode == SFT.name:
        return LLMPrefix(embedding=voice.embedding)
    raise NotImplementedError(mode)


def flow_conditioning(mode: str, voice: Voice) -> FlowConditioning:
    """The flow conditioning of ``mode`` for ``voice`` (sft: speaker embedding, no prompt)."""
    if mode == SFT.name:
        return FlowConditioning(embedding=voice.embedding)
    raise NotImplementedError(mode)
