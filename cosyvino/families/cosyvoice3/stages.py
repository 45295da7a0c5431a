"""The stage calls of CosyVoice3 inference: what a backend implements for this family (directly,
or through a graph runner: :mod:`.graph_stages`). Must not import torch.

Arrays are numpy, C-contiguous; floats float32, ids int64; batch 1 unless stated. D = LLM width,
V = speech head rows (6761), C = mel bins (80), T = mel frames, N = tokens. The orchestration
(LLM input layout, decoding, the silent-token filter, the CFM solve from the fixed noise,
streaming) lives in :mod:`.program` and the shared
:mod:`cosyvino.families.cosyvoice23.program` / :mod:`~cosyvino.families.cosyvoice23.token2wav`.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from cosyvino.backends.base import Stages

from ..cosyvoice1.stages import LLMBatch, LLMSession, LoopLLMBatch
from ..cosyvoice23.voices import PromptVoice


class CosyVoice3Stages(Stages):
    """A CosyVoice3 model loaded on one backend.

    Attributes:
        config: :class:`~.model_config.CosyVoice3ModelConfig`.
        speakers: SFT speaker name -> flow embedding float32 [1, 192].
        prompt_voices: the zero-shot bundles of the model's ``spk2info.pt`` (name ->
            :class:`~cosyvino.families.cosyvoice23.voices.PromptVoice`).
    """

    family: ClassVar[str] = "cosyvoice3"
    prompt_voices: dict[str, PromptVoice]

    # ---- LLM -------------------------------------------------------------------------------
    @abc.abstractmethod
    def embed_text(self, ids: np.ndarray) -> np.ndarray:
        """Qwen text ids int64 [1, L] -> float32 [1, L, D]."""

    @abc.abstractmethod
    def embed_speech(self, tokens: np.ndarray) -> np.ndarray:
        """Speech-embedding rows int64 [1, N] (0..V-1) -> float32 [1, N, D]."""

    @abc.abstractmethod
    def llm_special_embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(SOS, TASK): rows 6561 and 6563 of ``speech_embedding``, each float32 [1, 1, D]
        (sheet v3 §4.3)."""

    @abc.abstractmethod
    def new_llm_session(self) -> LLMSession:
        """A fresh KV-cached session: ``forward(inputs_embeds [1, T, D]) -> logp [V]``."""

    max_llm_batch: ClassVar[int] = 1

    def new_llm_batch(self) -> LLMBatch:
        """An empty decode batch (default: one session call per row)."""
        return LoopLLMBatch()

    # ---- flow ------------------------------------------------------------------------------
    @abc.abstractmethod
    def flow_encode(self, tokens: np.ndarray, embedding: np.ndarray, *, finalize: bool,
                    streaming: bool) -> tuple[np.ndarray, np.ndarray]:
        """tokens int64 [1, N] (prompt first), x-vector float32 [1, 192] -> (mu float32
        [1, C, 2L], spks float32 [1, C]); L = N (``finalize``) or N - 3 (the last 3 tokens are
        look-ahead only); ``streaming`` changes nothing (no attention before the DiT, sheet v3
        §5.2), accepted for the shared flow code."""

    @abc.abstractmethod
    def estimate(self, x: np.ndarray, mask: np.ndarray, mu: np.ndarray, t: np.ndarray,
                 spks: np.ndarray, cond: np.ndarray, *, streaming: bool) -> np.ndarray:
        """One DiT call, batch 2: x / mu / cond [2, C, T], mask [2, 1, T], t [2], spks [2, C]
        -> velocity [2, C, T]; ``streaming``: 50-frame chunk attention (sheet v3 §5.3), else
        full."""

    @abc.abstractmethod
    def cfm_noise(self) -> np.ndarray:
        """The fixed CFM noise table float32 [1, C, 15000] (sheet v3 §5.4)."""

    # ---- vocoder ---------------------------------------------------------------------------
    @abc.abstractmethod
    def vocoder(self, mel: np.ndarray, finalize: bool) -> np.ndarray:
        """Upstream ``CausalHiFTGenerator.inference(mel, finalize)`` (sheet v3 §6.3): mel
        float32 [1, C, T] -> wav float32 [1, 480 T] (``finalize``) or [1, 480 (T - 8)] (the
        last 8 frames are look-ahead / held back), in ±0.99, the NSF noise from the fixed
        table. Raises InputError (too few frames for the mode, longer than the table)."""
