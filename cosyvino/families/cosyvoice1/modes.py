"""CosyVoice v1 modes: what each needs from a request and how it builds the LLM prefix and the
flow conditioning (architecture sheet section 3.8). Must not import torch.

A mode is one :class:`Mode` entry in :data:`MODES` (what ``SynthesisRequest.validated``
checks: speaker, prompt audio/text, instruction) and its two builders in :data:`BUILDERS`:
``llm_prefix(request, tokenize) -> LLMPrefix`` and ``flow_conditioning(request) ->
FlowConditioning``; both get the validated request (its ``voice`` a
:class:`cosyvino.voices.Voice`, its mode inputs) and ``tokenize`` is the family frontend's text
tokenizer (str -> list of int). The program calls them once per request; nothing else changes
for a new mode. Only ``sft`` (a built-in speaker of an SFT model) runs today.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..base import Mode

SFT = Mode("sft", "a built-in speaker (spk2info.pt) of an SFT model", needs_speaker=True)

#: the modes requests may name; the first is the default (``SynthesisRequest.mode`` None)
MODES = {m.name: m for m in (SFT,)}


@dataclass(frozen=True)
class LLMPrefix:
    """What goes before the generated speech tokens:
    ``[SOS][SPK][TEXT_ENC(prompt_text ⧺ text)][TASK][PROMPT_SPEECH]``.

    Attributes:
        embedding: float32 [1, 192] for the SPK slot (None: no slot, instruct mode).
        prompt_text_token: int64 [1, L] tokens encoded before the text (a prompt transcript,
            or an instruction; None: none).
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


Tokenize = Callable[[str], list]


def _sft_prefix(request, tokenize: Tokenize) -> LLMPrefix:
    return LLMPrefix(embedding=request.voice.embedding)


def _sft_conditioning(request) -> FlowConditioning:
    return FlowConditioning(embedding=request.voice.embedding)


#: mode name -> (llm_prefix builder, flow_conditioning builder)
BUILDERS = {SFT.name: (_sft_prefix, _sft_conditioning)}


def llm_prefix(request, tokenize: Tokenize) -> LLMPrefix:
    """The LLM prefix of a validated request in its mode."""
    return BUILDERS[request.mode][0](request, tokenize)


def flow_conditioning(request) -> FlowConditioning:
    """The flow conditioning of a validated request in its mode."""
    return BUILDERS[request.mode][1](request)
