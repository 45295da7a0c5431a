"""The stage calls of CosyVoice v1 inference: what a backend implements for this family.

A backend only *runs stages*: fixed computations on numpy arrays. The speech-token sampling
loop, the CFM ODE loop, length-regulation matrices, NSF random draws and the segment loop live
once in :mod:`cosyvino.families.cosyvoice1.pipeline` and :mod:`.program`. All arrays are numpy,
C-contiguous; float arrays are float32, token arrays int64; batch size is 1 unless stated.
Shapes use D = LLM width (1024 for 300M), T = frames, N = tokens; the exported graphs behind
these calls are in :mod:`.graphs`. Must not import torch.

Input contract. Stages need not validate their inputs: the pipeline builds every array in the
documented shape and dtype, and the stage calls are the hot path. For inputs outside the
contract a backend promises only this (``cosyvino.testing`` checks it):

* wrong rank or a mismatched fixed dimension (e.g. width D+1, 81 mel bins): the call raises an
  exception (any ``Exception``; :class:`cosyvino.errors.BackendError` preferred). It never
  returns an array of another shape than documented, and never takes the process down.
* wrong dtype (float64 instead of float32, int32 instead of int64): the call either raises or
  computes as if the input had been converted; a result it returns has the documented dtype.
* an :class:`LLMSession` whose ``forward`` raised is usable again after ``reset()``.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from cosyvino.backends.base import Stages

from .config import ModelConfig


class LLMSession(abc.ABC):
    """One utterance's LLM decoding state (the KV cache). Not thread-safe; one per request.

    ``forward`` appends ``inputs_embeds`` to the cached sequence and returns the log-softmax of
    the speech-token head at the last position.
    """

    @abc.abstractmethod
    def forward(self, inputs_embeds: np.ndarray) -> np.ndarray:
        """inputs_embeds float32 [1, T, D] -> logp float32 [V+1] (V speech tokens + EOS)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop the cache (start a new utterance)."""

    def close(self) -> None:
        """Release resources (default: reset)."""
        self.reset()


class CosyVoice1Stages(Stages):
    """A CosyVoice v1 model loaded on one backend: the stage calls of v1 inference."""

    family: ClassVar[str] = "cosyvoice1"
    config: ModelConfig
    #: speaker name -> embedding float32 [1, 192]
    speakers: dict[str, np.ndarray]
    # ---- LLM -------------------------------------------------------------------------------
    @abc.abstractmethod
    def encode_text(self, text_token: np.ndarray) -> np.ndarray:
        """int64 [1, L] -> float32 [1, L, D]: text embedding, causal conformer, affine layer."""

    @abc.abstractmethod
    def embed_llm_speaker(self, embedding: np.ndarray) -> np.ndarray:
        """float32 [1, 192] -> [1, 1, D]: L2-normalize, spk_embed_affine_layer."""

    @abc.abstractmethod
    def embed_speech_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """int64 [1, N] -> float32 [1, N, D] (speech_embedding)."""

    @abc.abstractmethod
    def llm_special_embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(sos, task_id) rows of llm_embedding, each float32 [1, 1, D]."""

    @abc.abstractmethod
    def new_llm_session(self) -> LLMSession:
        """A fresh decoding session with an empty KV cache."""

    # ---- flow ------------------------------------------------------------------------------
    @abc.abstractmethod
    def flow_encode(self, tokens: np.ndarray, embedding: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """tokens int64 [1, N] (prompt ⧺ generated), embedding float32 [1, 192] ->
        (h float32 [1, N, 80] = encoder_proj(encoder(...)), spks float32 [1, 80])."""

    @abc.abstractmethod
    def length_regulate(self, h: np.ndarray, interp: np.ndarray) -> np.ndarray:
        """h float32 [1, N, 80], interp float32 [M, N] -> mu float32 [1, M, 80]
        (conv stack of the InterpolateRegulator applied to ``interp @ h``)."""

    @abc.abstractmethod
    def estimate(self, x: np.ndarray, mask: np.ndarray, mu: np.ndarray, t: np.ndarray,
                 spks: np.ndarray, cond: np.ndarray) -> np.ndarray:
        """One CFM estimator call, batch 2 (conditional, unconditional):
        x/mu/cond float32 [2, 80, T], mask [2, 1, T], t [2], spks [2, 80] -> [2, 80, T]."""

    # ---- vocoder ---------------------------------------------------------------------------
    @abc.abstractmethod
    def vocoder_f0(self, mel: np.ndarray) -> np.ndarray:
        """mel float32 [1, 80, T] -> f0 float32 [1, T] (Hz, mel-frame rate)."""

    @abc.abstractmethod
    def vocoder_source(self, f0: np.ndarray, phase: np.ndarray, noise: np.ndarray
                       ) -> np.ndarray:
        """NSF source: f0 [1, T], phase [1, H+1], noise [1, H+1, hop*T] -> [1, 1, hop*T]."""

    @abc.abstractmethod
    def vocoder_decode(self, mel: np.ndarray, source: np.ndarray) -> np.ndarray:
        """mel float32 [1, 80, T], source [1, 1, hop*T] -> wav float32 [1, hop*T] in ±0.99."""
