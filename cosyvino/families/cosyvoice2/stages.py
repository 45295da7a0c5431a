"""The stage calls of CosyVoice2 inference: what a backend implements for this family (directly,
or through a graph runner: :mod:`.graph_stages`). Must not import torch.

Arrays are numpy, C-contiguous; floats float32, ids int64; batch 1 unless stated. D = LLM width,
V3 = speech tokens + 3 (6564), C = mel bins (80), T = mel frames, N = tokens. The orchestration
(LLM input layout, decoding, the CFM solve from the fixed noise, NSF draws, streaming) lives in
:mod:`.program` and :mod:`.official_stream`.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from cosyvino.backends.base import Stages

from ..cosyvoice1.stages import LLMBatch, LLMSession, LoopLLMBatch
from .voices import PromptVoice


class CosyVoice2Stages(Stages):
    """A CosyVoice2 model loaded on one backend.

    Attributes:
        config: :class:`~.model_config.CosyVoice2ModelConfig`.
        speakers: SFT speaker name -> flow embedding float32 [1, 192] (sheet v2 §3.7).
        prompt_voices: the zero-shot bundles of the model's ``spk2info.pt`` (name ->
            :class:`~.voices.PromptVoice`), usable by name in the prompt modes.
    """

    family: ClassVar[str] = "cosyvoice2"
    prompt_voices: dict[str, PromptVoice]

    # ---- LLM -------------------------------------------------------------------------------
    @abc.abstractmethod
    def embed_text(self, ids: np.ndarray) -> np.ndarray:
        """Qwen text ids int64 [1, L] -> float32 [1, L, D]."""

    @abc.abstractmethod
    def embed_speech(self, tokens: np.ndarray) -> np.ndarray:
        """Speech tokens int64 [1, N] (0..V3-1) -> float32 [1, N, D]."""

    @abc.abstractmethod
    def llm_special_embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(SOS, TASK) rows of ``llm_embedding``, each float32 [1, 1, D] (sheet v2 §4.4)."""

    @abc.abstractmethod
    def new_llm_session(self) -> LLMSession:
        """A fresh KV-cached session: ``forward(inputs_embeds [1, T, D]) -> logp [V3]``."""

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
        look-ahead only); ``streaming``: chunk attention (sheet v2 §5.2-5.3)."""

    @abc.abstractmethod
    def estimate(self, x: np.ndarray, mask: np.ndarray, mu: np.ndarray, t: np.ndarray,
                 spks: np.ndarray, cond: np.ndarray, *, streaming: bool) -> np.ndarray:
        """One CFM estimator call, batch 2: x / mu / cond [2, C, T], mask [2, 1, T], t [2],
        spks [2, C] -> velocity [2, C, T]; ``streaming``: 50-frame chunk attention (sheet v2
        §5.5), else full."""

    @abc.abstractmethod
    def cfm_noise(self) -> np.ndarray:
        """The fixed CFM noise table float32 [1, C, 15000] (sheet v2 §5.4)."""

    # ---- vocoder ---------------------------------------------------------------------------
    @abc.abstractmethod
    def vocoder_f0(self, mel: np.ndarray) -> np.ndarray:
        """mel float32 [1, C, T] -> f0 float32 [1, T] (Hz)."""

    @abc.abstractmethod
    def vocoder_source(self, f0: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """SineGen2 source: f0 [1, T], noise [1, NH, hop*T] (standard normal) ->
        [1, 1, hop*T] (sheet v2 §6.2)."""

    @abc.abstractmethod
    def vocoder_decode(self, mel: np.ndarray, source: np.ndarray) -> np.ndarray:
        """mel float32 [1, C, T], source [1, 1, hop*T] -> wav float32 [1, hop*T] in ±0.99."""
