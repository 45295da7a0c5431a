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

Batched decode (:meth:`CosyVoice1Stages.new_llm_batch`): each request prefills in its own
:class:`LLMSession`, then its session joins an :class:`LLMBatch` as a row; one
:meth:`LLMBatch.step` advances every row by one position. A row's logp equals what its session
alone would return (fp32 rounding only, ``cosyvino.testing`` checks 1e-4): rows are left-padded
to a common cache length and the padded keys are masked (see
:meth:`cosyvino.families.cosyvoice1.torch.transformer.Encoder.forward_cached`).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from cosyvino.backends.base import Stages
from cosyvino.errors import BackendError

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


class LLMBatch(abc.ABC):
    """Several requests' decoding states advanced together, one position per :meth:`step`.

    Rows join (:meth:`add`, a prefilled :class:`LLMSession`) and leave (:meth:`remove`)
    between steps; each keeps its own cache and position. Row ids are ints unique within the
    batch; :attr:`rows` gives the batch order, the order of :meth:`step`'s inputs and
    outputs. Not thread-safe; one per scheduler loop.

    Backends that batch in one call subclass it with :meth:`_join` / :meth:`_leave` /
    :meth:`_step` (the bookkeeping of ids, lengths and the key mask lives here);
    :class:`LoopLLMBatch` is the generic fallback (one session call per row).
    """

    def __init__(self):
        self._ids: list[int] = []
        self._lengths: list[int] = []  # real cached positions per row
        self._sessions: list[LLMSession] = []
        self._next_id = 0

    @property
    def rows(self) -> tuple[int, ...]:
        """Row ids in batch order."""
        return tuple(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def cache_length(self, row: int) -> int:
        """Cached positions of ``row`` (its prefill plus its decode steps so far)."""
        return self._lengths[self._index(row)]

    def add(self, session: LLMSession) -> int:
        """Make ``session`` (after its prefill: at least one cached position) a new last row;
        returns its id. The batch owns the session's cache from now on: the caller must not
        use ``session`` until :meth:`remove` gives it back empty (reset).

        Raises: BackendError (an empty session, a session already in a batch, or one of
        another backend)."""
        if any(s is session for s in self._sessions):
            raise BackendError("LLM session is already a row of this batch")
        length = int(self._join(session))
        if length < 1:
            raise BackendError("an LLM session joins a batch after its prefill; this one has "
                               "no cached positions")
        row = self._next_id
        self._next_id += 1
        self._ids.append(row)
        self._lengths.append(length)
        self._sessions.append(session)
        return row

    def remove(self, row: int) -> None:
        """Drop ``row`` (its request finished its segment or was cancelled); its session is
        reset and usable again. Raises: BackendError (unknown row)."""
        i = self._index(row)
        self._leave(i)
        session = self._sessions.pop(i)
        del self._ids[i], self._lengths[i]
        session.reset()

    def step(self, inputs_embeds: np.ndarray) -> np.ndarray:
        """inputs_embeds float32 [B, 1, D] (row ``b`` of :attr:`rows` at index ``b``) -> logp
        float32 [B, V+1]: each row's next-position log-softmax.

        Raises: BackendError (no rows, or B is not the number of rows)."""
        x = np.asarray(inputs_embeds)
        if not self._ids:
            raise BackendError("LLM batch step with no rows")
        if x.ndim != 3 or x.shape[0] != len(self._ids) or x.shape[1] != 1:
            raise BackendError(f"LLM batch step takes inputs_embeds [{len(self._ids)}, 1, D], "
                               f"got {list(x.shape)}")
        out = self._step(np.ascontiguousarray(x, np.float32))
        self._lengths = [n + 1 for n in self._lengths]
        return out

    def close(self) -> None:
        """Remove every row (their sessions are reset)."""
        for row in list(self._ids):
            self.remove(row)

    # ---- for subclasses ----------------------------------------------------------------------
    def _index(self, row: int) -> int:
        try:
            return self._ids.index(row)
        except ValueError:
            raise BackendError(f"no row {row!r} in this LLM batch") from None

    def key_mask(self, width: int, new: int = 1) -> np.ndarray:
        """float32 [B, width + new]: the ``attention_mask`` of a step over caches left-padded
        to ``width`` positions (row ``b``'s first ``width - P_b`` keys 0, the rest 1)."""
        cols = np.arange(width + new)
        starts = width - np.asarray(self._lengths, np.int64)
        return (cols[None, :] >= starts[:, None]).astype(np.float32)

    @abc.abstractmethod
    def _join(self, session: LLMSession) -> int:
        """Take ``session``'s cache as a new last row; return its cached positions."""

    @abc.abstractmethod
    def _leave(self, index: int) -> None:
        """Drop the row at ``index`` (before the bookkeeping forgets it)."""

    @abc.abstractmethod
    def _step(self, inputs_embeds: np.ndarray) -> np.ndarray:
        """[B, 1, D] float32 -> logp [B, V+1] float32; lengths are updated after it."""


class LoopLLMBatch(LLMBatch):
    """The fallback of a backend that cannot batch: the rows stay in their own sessions and a
    step calls each session once (no cache is copied; the weights are read once per row)."""

    def _join(self, session):
        length = getattr(session, "cache_length", None)
        if length is None:
            # a third-party session without cache_length: it has prefilled by contract
            return 1
        return length()

    def _leave(self, index):
        pass

    def _step(self, inputs_embeds):
        return np.stack([s.forward(inputs_embeds[b:b + 1])
                         for b, s in enumerate(self._sessions)])


def left_pad(a: np.ndarray, width: int, axis: int = 2) -> np.ndarray:
    """``a`` with its ``axis`` grown to ``width`` by zeros at the front, or cut to its last
    ``width`` entries (leading padding no row needs any more). Shared by the batches that keep
    caches as numpy arrays."""
    n = a.shape[axis]
    if n == width:
        return a
    if n > width:
        return np.ascontiguousarray(np.take(a, np.arange(n - width, n), axis=axis))
    pad = [(0, 0)] * a.ndim
    pad[axis] = (width - n, 0)
    return np.pad(a, pad)


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

    #: rows one :meth:`LLMBatch.step` advances in one backend call (1: the backend cannot
    #: batch and :meth:`new_llm_batch` is the per-session loop); a hint for the scheduler and
    #: the planner: larger batches still run
    max_llm_batch: ClassVar[int] = 1

    def new_llm_batch(self) -> LLMBatch:
        """An empty batch for decode steps of sessions of these stages (default: the
        per-session loop, :class:`LoopLLMBatch`)."""
        return LoopLLMBatch()

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

    #: requests one :meth:`estimate` call can hold (batch 2N for N requests: rows 2i, 2i+1 are
    #: request i's conditional and unconditional rows); 1 = batch 2 only. Concurrent requests'
    #: calls of equal shape are combined up to it (:class:`cosyvino.engine.rendezvous
    #: .CallRendezvous`); each row's output must not depend on the other rows.
    max_estimator_batch: ClassVar[int] = 1

    @abc.abstractmethod
    def estimate(self, x: np.ndarray, mask: np.ndarray, mu: np.ndarray, t: np.ndarray,
                 spks: np.ndarray, cond: np.ndarray) -> np.ndarray:
        """One CFM estimator call, batch B = 2 (conditional, unconditional), or 2N for N
        requests where ``max_estimator_batch`` >= N: x/mu/cond float32 [B, 80, T],
        mask [B, 1, T], t [B], spks [B, 80] -> velocity float32 [B, 80, T]."""

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
