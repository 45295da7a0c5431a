"""The stage interface every backend implements (PyTorch, OpenVINO, ONNX Runtime, plugins).

A backend only *runs stages*: fixed computations on numpy arrays. The speech-token sampling
loop, the CFM ODE loop, length-regulation matrices, NSF random draws and the segment loop live
once in :mod:`cosyvino.families.cosyvoice1.pipeline`. All arrays are numpy, C-contiguous; float arrays are float32,
token arrays int64; batch size is 1 unless stated. Shapes use D = LLM width (1024 for 300M),
T = frames, N = tokens. Must not import torch.

Input contract. Stages need not validate their inputs: :mod:`cosyvino.families.cosyvoice1.pipeline` builds every
array in the documented shape and dtype, and the stage calls are the hot path. For inputs
outside the contract a backend promises only this (``cosyvino.testing`` checks it):

* wrong rank or a mismatched fixed dimension (e.g. width D+1, 81 mel bins): the call raises an
  exception (any ``Exception``; :class:`cosyvino.errors.BackendError` preferred). It never
  returns an array of another shape than documented, and never takes the process down.
* wrong dtype (float64 instead of float32, int32 instead of int64): the call either raises or
  computes as if the input had been converted; a result it returns has the documented dtype.
* an :class:`LLMSession` whose ``forward`` raised is usable again after ``reset()``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from cosyvino.families.cosyvoice1.config import ModelConfig
from ..errors import ModelDirError


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


class Stages(abc.ABC):
    """A loaded model on one backend: the stage calls of CosyVoice v1 inference."""

    config: ModelConfig
    #: speaker name -> embedding float32 [1, 192]
    speakers: dict[str, np.ndarray]
    #: True when stage calls (and sessions from :meth:`new_llm_session`) may run concurrently
    #: from several threads on this one object (``Synthesizer(max_parallel=N)``, the server's
    #: shared-model pool). False: the server loads one model per worker instead.
    thread_safe: ClassVar[bool] = False

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

    def close(self) -> None:
        """Release backend resources."""


@dataclass(frozen=True)
class Capabilities:
    """A backend's self-description for one model dir: what the planner weighs when it picks a
    backend (:meth:`Backend.capabilities`). Cost hints are estimates, not promises; the planner
    records them in the plan's reasons.

    Attributes:
        ready: ``model_dir`` can be loaded as it is now (e.g. converted files present).
        reason: one line: what would be loaded, or what is missing and the command that fixes it.
        load_dir: directory to pass to :meth:`Backend.load` (None = ``model_dir``).
        relative_speed: expected end-to-end synthesis speed relative to the torch backend in
            fp32 on the same CPU and threads (> 1 = faster). Measured numbers belong here
            (docs/performance.md); 1.0 when unknown.
        resident_bytes: expected resident memory of one loaded model in bytes (None = unknown).
        resident_basis: what ``resident_bytes`` is computed from (for the plan's reason).
        thread_safe: one loaded model serves concurrent requests (see :attr:`Stages.thread_safe`).
        streams: the backend can run several inference streams in one process (NUM_STREAMS);
            the planner then sizes streams and passes ``num_streams=N`` to :meth:`Backend.load`
            (the OpenVINO backend also gets its own option names; see docs/plugins.md).
        pinning: the backend can pin its threads to cores; the planner then decides pinning and
            passes ``cpu_pinning=bool``.
        precisions: compute precisions the backend can run here (``fp32``, ``bf16``, ``int8``...).
        options: backend options (``load(**options)``) it recommends for this machine.
    """

    ready: bool
    reason: str = ""
    load_dir: str | None = None
    relative_speed: float = 1.0
    resident_bytes: int | None = None
    resident_basis: str = ""
    thread_safe: bool = False
    streams: bool = False
    pinning: bool = False
    precisions: tuple[str, ...] = ("fp32",)
    options: dict = field(default_factory=dict)


class Backend(abc.ABC):
    """A backend plugin's entry class, registered through the ``register_backends`` hook.

    Subclasses set ``name`` (used in ``--backend NAME``) and ``description``, and implement
    :meth:`load`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(usable, reason) — e.g. False when its runtime package is not installed."""
        return True, ""

    @classmethod
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Describe what this backend would do with ``model_dir`` on the probed machine
        (``probe``: :class:`cosyvino.planner.topology.Probe` or None). The planner calls this on
        every installed backend and picks among the ready ones. Must be cheap: no model
        loading, no heavy imports.

        ``probe.model`` (when it describes ``model_dir``) is the planner's inventory of the dir
        (:func:`cosyvino.planner.inventory.model_inventory`); a backend may use it instead of
        looking at the disk again. An exception raised here, or a return value that is not a
        :class:`Capabilities`, makes the planner skip this backend with a warning naming it.
        Default: not ready when ``model_dir`` names no directory, else ready at the torch
        backend's speed (fp32, not thread-safe, no streams or pinning).
        """
        if model_dir is not None and not os.path.isdir(model_dir):
            return Capabilities(ready=False, reason=f"model directory not found: {model_dir}")
        return Capabilities(ready=True, reason="no capability description")

    @classmethod
    def prepare(cls, model_dir: str, out_dir: str | None = None, progress=None) -> str:
        """Turn an official checkpoint dir (``cosyvoice.yaml``, ``llm.pt``, ``flow.pt``,
        ``hift.pt``, ``spk2info.pt``) into what :meth:`load` serves, and return that dir.

        Backends that load the checkpoint as it is keep this default (return ``model_dir``
        unchanged). Converting backends write ``out_dir`` (their own default when None,
        usually a subdirectory of ``model_dir``) atomically: on failure nothing half-written is
        left there. ``progress`` is None or a callable taking one str (a step description).
        Preparing may need torch (to read the ``.pt`` files) even when serving does not.

        Raises:
            cosyvino.errors.ModelDirError (and its ConfigError / CheckpointError subclasses):
                ``model_dir`` is missing or not a readable model dir.
            cosyvino.errors.BackendError: the backend cannot prepare here (e.g. its export
                dependencies, or torch, are not installed).
        """
        if not os.path.isdir(model_dir):
            raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
        return model_dir

    @classmethod
    @abc.abstractmethod
    def load(cls, model_dir: str, **options) -> Stages:
        """Load the model in ``model_dir`` and return its :class:`Stages`.

        Raises:
            cosyvino.errors.ModelDirError / CheckpointError / ConfigError: bad model dir.
            cosyvino.errors.BackendError: the backend cannot run here.
        """
