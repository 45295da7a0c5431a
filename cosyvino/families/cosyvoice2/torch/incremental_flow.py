"""Incremental CosyVoice2 streaming flow: per hop, compute only the new frames (issue 36 item 1).

The official stream (sheet v2 §7.2-7.3; :mod:`cosyvino.families.cosyvoice2.official_stream`)
calls the flow with ALL tokens so far at every hop (``tokens[0 : offset + hop + 3]``,
``streaming=True, finalize=False``) and keeps the frames from ``2 * offset``; the last call runs
once more over everything with full attention. In streaming mode every convolution is causal
and every attention chunk-causal (encoder 25 tokens, up-sampled encoder and estimator 50 frames,
chunks counted from the first PROMPT token; sheet v2 §5.2, §5.5), and the fixed CFM noise gives
frame ``f`` noise column ``f`` in every call (§5.4). So the frames of finished chunks never change
(§5.6), and this module computes each hop's tokens ``[B, E)`` once, reading what the earlier
chunks left behind:

* encoder (once per hop, :class:`~.incremental_encoder.EncoderState`): keys/values of the
  finished chunks in each of the ``num_blocks`` + ``num_up_blocks`` conformer blocks, 2
  ``leaky_relu(conv1)`` frames of the pre-lookahead layer, the last 2 tokens before ``B`` for
  the up-sampling conv (k5 over repeated frames);
* estimator, ONE state PER ODE STEP (:class:`~.incremental_estimator.EstimatorStepState`): step
  ``s``'s input ``x`` of the new frames comes from step ``s - 1`` of the same frames, and its
  chunk-causal attention reads step ``s``'s keys/values of every earlier frame, so each step
  keeps every transformer block's K/V of finished chunks (batch 2: the CFG pair) and the 2 input
  frames of each causal k3 convolution.

Which frames are final, and what is recomputed:

* A hop of the official schedule ends on a chunk boundary ``E`` (25 tokens / 50 frames,
  prompt included: the first hop is ``25 + pad``, then 50, 100, ...). Every frame before
  ``2E`` is then final and every state moves to ``E``: nothing is ever recomputed. The
  look-ahead tokens ``E .. E+2`` reach the last 3 tokens' pre-lookahead outputs (``conv1``
  sees ``i .. i+3``), hence through the chunk attention every frame of the hop's last chunk:
  those frames are final only because the look-ahead tokens ARE the next hop's first real
  tokens (they "become ordinary tokens of the next chunk", §7.2), and the next hop computes
  nothing that reads them again except via the state (the pre-lookahead ``conv1`` frames at
  ``E-2, E-1`` and the keys/values). A later call whose tokens differ from an earlier call's
  look-ahead is therefore an :class:`InputError`, not a silent change.
* A non-final hop that does NOT end on a chunk boundary (not the official schedule, but
  allowed): the state moves only to the last boundary ``B' < E``; the frames ``[2B', 2E)`` are
  emitted from this call's values (equal to the official re-run's, whose chunk there is also
  partial) and their tokens are computed again by the next call, from ``B'``; only the frames
  after what was emitted are returned.
* The final hop (``finalize=True``): ``final="incremental"`` computes tokens ``[B, N)`` with
  zero look-ahead and chunk masks (no re-run; differs from upstream, whose last call re-runs
  everything with FULL attention: tests/test_incremental_flow_cosyvoice2.py measures by how
  much, docs/performance.md); ``final="official"`` is exactly upstream's re-run (the plain flow
  over every token, full attention) for the frames from the last hop's end.

State memory (:func:`state_bytes_per_second`, from the config; fp32): per second of audio
(prompt included, 50 frames) and ODE step, the estimator keeps ``n_blocks * (2 +
num_mid_blocks)`` blocks x (K, V) x 2 CFG rows x ``num_heads * attention_head_dim`` floats per
frame; the encoder adds ``(25 * num_blocks + 50 * num_up_blocks)`` x (K, V) x ``output_size``
floats. CosyVoice2-0.5B (56 blocks, 8 x 64; 6 + 4 blocks, 512): 56 x 2 x 2 x 512 x 4 B x 50 =
22.9 MB per step-second, x 10 steps = 229.4 MB, + 1.4 MB encoder = **230.8 MB per second of
audio** (a 3 s prompt + 20 s utterance: 5.3 GB at the end). ``left_chunks = n`` keeps only the
``n`` chunks before the next one (upstream's ``num_decoding_left_chunks``; changes the
attention, so it is not the official computation): at most ``n x 230.8 MB``.

Batch 1; not thread-safe (one state per request). torch float32, eval mode, no gradients.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from cosyvino.errors import ConfigError, InputError
from cosyvino.families.cosyvoice1.cfm import cosine_time_grid
from cosyvino.families.cosyvoice2.flow_config import CausalFlowConfig
from cosyvino.families.cosyvoice2.torch.flow import CausalMaskedDiffWithXvec
from cosyvino.families.cosyvoice2.torch.incremental_encoder import (
    EncoderState,
    encode_span,
)
from cosyvino.families.cosyvoice2.torch.incremental_estimator import (
    EstimatorStepState,
    estimate_span,
)
from cosyvino.families.cosyvoice23.fixed_noise import noise_columns
from cosyvino.families.cosyvoice23.torch.flow_inference import (
    flow_inference,
    speech_tokens,
)

Tensor = torch.Tensor

#: how the final hop is computed (module docstring)
FINAL_MODES = ("incremental", "official")


def commit_unit(cfg: CausalFlowConfig) -> int:
    """Tokens between the boundaries where every chunk mask restarts: the least multiple of
    the encoder chunk (tokens) whose frames are whole up-encoder and estimator chunks (25 for
    CosyVoice2: 25 tokens = 50 frames, sheet v2 §5.1).

    Raises:
        ConfigError: a chunk size of 0 (full attention only: no streaming mode to follow).
    """
    r = cfg.token_mel_ratio
    enc = cfg.encoder.static_chunk_size
    chunks = (enc * cfg.encoder.upsample_stride, cfg.estimator.static_chunk_size)
    if enc <= 0 or min(chunks) <= 0:
        raise ConfigError("the incremental flow needs the streaming chunk masks "
                          "(static_chunk_size > 0 in the encoder and the estimator)")
    unit = enc
    for c in chunks:
        unit = math.lcm(unit, c // math.gcd(c, r))
    return unit


def state_bytes_per_second(cfg: CausalFlowConfig, n_timesteps: int | None = None,
                           element_size: int = 4) -> int:
    """Bytes of :class:`FlowStreamState` per second of audio (prompt included) without a
    left-context cap: the estimator's per-step keys/values plus the encoder's (module
    docstring; the few conv frames are constant and left out)."""
    n = n_timesteps or cfg.cfm.n_timesteps
    est = cfg.estimator
    frames = cfg.input_frame_rate * cfg.token_mel_ratio
    per_frame = est.n_blocks * (2 + est.num_mid_blocks) * 2 * 2 * est.num_heads \
        * est.attention_head_dim
    enc = cfg.encoder
    encoder = (cfg.input_frame_rate * enc.num_blocks
               + cfg.input_frame_rate * enc.upsample_stride * enc.num_up_blocks) \
        * 2 * enc.output_size
    return (n * frames * per_frame + encoder) * element_size


@dataclass
class FlowStreamState:
    """One request's stream (create with :meth:`IncrementalFlow.start`).

    Attributes:
        embedding: float32 ``[1, spk_embed_dim]`` raw x-vector (the ``official`` final re-run).
        spks: float32 ``[2, output_size]``: projected speaker, zeros (the CFG pair).
        prompt_token: int64 ``[1, P]``; prompt_feat: float32 ``[1, 80, 2P]`` (channel-major).
        tokens: int64 ``[1, P + n]``: prompt and every token given so far (look-ahead too).
        committed: tokens (prompt included) up to which the states are final.
        emitted: tokens (prompt included) whose frames were returned.
        encoder: :class:`EncoderState`; steps: one :class:`EstimatorStepState` per ODE step.
        finished: the final hop was made.
        last_seconds: (encoder, estimator) wall seconds of the last incremental span.
    """

    embedding: Tensor
    spks: Tensor
    prompt_token: Tensor
    prompt_feat: Tensor
    tokens: Tensor
    committed: int
    emitted: int
    encoder: EncoderState
    steps: list[EstimatorStepState]
    finished: bool = False
    last_seconds: tuple[float, float] = (0.0, 0.0)

    def nbytes(self) -> int:
        """Bytes held by the encoder and estimator states."""
        return self.encoder.nbytes() + sum(s.nbytes() for s in self.steps)


class IncrementalFlow:
    """The v2 flow's streaming hops without re-computation (module docstring).

    Args:
        flow: a loaded v2 flow (eval mode).
        noise_table: float32 ``[1, 80, frames]`` fixed CFM noise
            (:func:`cosyvino.families.cosyvoice23.fixed_noise.make_cfm_noise_table`).
        n_timesteps: Euler steps (default ``cfg.cfm.n_timesteps``, 10).
        left_chunks: ``None`` (official: every finished chunk stays visible) or ``n >= 0``
            chunks of left context kept per attention layer (bounds the memory; not the
            official computation).

    Raises:
        ConfigError: a config without chunk masks (:func:`commit_unit`).
        InputError: a negative ``left_chunks`` or ``n_timesteps < 1``.
    """

    def __init__(self, flow: CausalMaskedDiffWithXvec, noise_table: np.ndarray, *,
                 n_timesteps: int | None = None, left_chunks: int | None = None):
        self.flow = flow
        self.cfg = flow.cfg
        self.unit = commit_unit(self.cfg)
        if left_chunks is not None and left_chunks < 0:
            raise InputError(f"left_chunks must be None or >= 0, got {left_chunks}")
        self.left_chunks = left_chunks
        self.n_timesteps = int(n_timesteps or self.cfg.cfm.n_timesteps)
        if self.n_timesteps < 1:
            raise InputError(f"n_timesteps must be >= 1, got {self.n_timesteps}")
        self.noise_table = noise_table
        rate = np.float32(self.cfg.cfm.inference_cfg_rate)
        self._a, self._b = float(np.float32(1.0) + rate), float(rate)
        self._times = self._time_steps(self.n_timesteps)

    @staticmethod
    def _time_steps(n: int) -> list[tuple[float, float]]:
        """(t, dt) per Euler step, in float32 as ``solve_euler_cfg`` advances them (sheet v2
        §5.4: ``t += dt; dt = t_span[k+1] - t``)."""
        grid = cosine_time_grid(n)
        t, dt, out = grid[0], np.float32(grid[1] - grid[0]), []
        for step in range(1, n + 1):
            out.append((float(t), float(dt)))
            t = np.float32(t + dt)
            if step < n:
                dt = np.float32(grid[step + 1] - t)
        return out

    @torch.inference_mode()
    def start(self, embedding, prompt_token=None, prompt_feat=None) -> FlowStreamState:
        """A fresh stream.

        Args:
            embedding: float32 ``[1, spk_embed_dim]`` x-vector (raw).
            prompt_token: int ``[1, P]`` or None; prompt_feat: float32 ``[1, 2P, 80]``
                (time-major, as ``flow_inference``) or None, given together.
        Raises:
            InputError: as :func:`~cosyvino.families.cosyvoice23.torch.flow_inference.
                flow_inference` (embedding size, prompt shapes, token ids).
        """
        cfg = self.cfg
        emb = torch.as_tensor(embedding, dtype=torch.float32)
        if tuple(emb.shape) != (1, cfg.spk_embed_dim):
            raise InputError(f"embedding must be float [1, {cfg.spk_embed_dim}], got "
                             f"{list(emb.shape)}")
        if (prompt_feat is None) != (prompt_token is None):
            raise InputError("prompt_token and prompt_feat must be given together")
        ptok = (torch.zeros(1, 0, dtype=torch.long) if prompt_token is None
                else speech_tokens("prompt_token", prompt_token, cfg.vocab_size))
        p = ptok.shape[1]
        feat = torch.zeros(1, cfg.output_size, 0)
        if prompt_feat is not None:
            f = torch.as_tensor(np.asarray(prompt_feat, np.float32))
            if tuple(f.shape) != (1, cfg.token_mel_ratio * p, cfg.output_size):
                raise InputError(f"prompt_feat must be float [1, {cfg.token_mel_ratio * p}, "
                                 f"{cfg.output_size}] ({cfg.token_mel_ratio} frames per prompt "
                                 f"token), got {list(f.shape)}")
            feat = f.transpose(1, 2).contiguous()
        spks = self.flow.speaker(emb)
        return FlowStreamState(
            embedding=emb, spks=torch.cat([spks, torch.zeros_like(spks)], dim=0),
            prompt_token=ptok, prompt_feat=feat, tokens=ptok.clone(), committed=0, emitted=p,
            encoder=EncoderState(self.flow, self.left_chunks),
            steps=[EstimatorStepState(self.flow.decoder.estimator, self.left_chunks)
                   for _ in range(self.n_timesteps)])

    def hop(self, state: FlowStreamState, token, *, finalize: bool = False,
            final: str = "incremental", before_step=None) -> np.ndarray:
        """The mel frames of one official flow call that were not returned before.

        Args:
            state: the request's :class:`FlowStreamState`.
            token: int ``[1, n]`` (or ``[n]``): every generated token so far, prompt excluded
                (the official call's ``token``); it must extend the tokens of the previous
                call, look-ahead included.
            finalize: False: the last ``pre_lookahead_len`` tokens are look-ahead only;
                True: the last hop (no look-ahead; the state is finished after it).
            final: for ``finalize``: ``"incremental"`` or ``"official"`` (module docstring).
            before_step: called before each ODE step of an incremental span (cancellation:
                what it raises propagates; the state is then unusable).
        Returns:
            float32 ``[1, 80, 2 * (P + n - lookahead - emitted)]``: frames from the end of
            the previous call's frames (``2 * token_offset`` of the official call) on.
        Raises:
            InputError: a finished state; malformed tokens or ids outside the vocabulary; tokens
                that do not extend the previous call's (look-ahead included); no new frames;
                more frames than the noise table; an unknown ``final``.
        """
        if state.finished:
            raise InputError("the flow stream's final hop was already made")
        if final not in FINAL_MODES:
            raise InputError(f"final must be one of {FINAL_MODES}, got {final!r}")
        cfg = self.cfg
        tok = speech_tokens("token", token, cfg.vocab_size)
        all_tok = torch.cat([state.prompt_token, tok], dim=1)
        seen = state.tokens.shape[1]
        if all_tok.shape[1] < seen or not torch.equal(all_tok[:, :seen], state.tokens):
            raise InputError("token must extend the tokens of the previous flow call (its "
                             "look-ahead tokens included): the frames already made read them")
        ahead = 0 if finalize else cfg.pre_lookahead_len
        end = all_tok.shape[1] - ahead
        if end <= state.emitted:
            raise InputError(f"no new frames: {all_tok.shape[1] - state.prompt_token.shape[1]} "
                             f"tokens with {ahead} look-ahead end at or before the "
                             f"{state.emitted - state.prompt_token.shape[1]} tokens already "
                             "made")
        noise_columns(self.noise_table, cfg.token_mel_ratio * end)  # size check first
        if finalize and final == "official":
            mel = self._official_final(state, tok)
        else:
            mel = self._span(state, all_tok, end, finalize, before_step)
        state.tokens = all_tok
        state.emitted = end
        state.finished = finalize
        return mel

    def _official_final(self, state: FlowStreamState, tok: Tensor) -> np.ndarray:
        """Upstream's last call: the flow over every token with full attention, frames from
        the last hop's end."""
        p = state.prompt_token.shape[1]
        prompt = ({} if p == 0 else
                  {"prompt_token": state.prompt_token,
                   "prompt_feat": state.prompt_feat.transpose(1, 2).numpy()})
        mel = flow_inference(self.flow, tok, state.embedding.numpy(), self.noise_table,
                             streaming=False, finalize=True, n_timesteps=self.n_timesteps,
                             **prompt)
        r = self.cfg.token_mel_ratio
        return np.ascontiguousarray(mel[:, :, r * (state.emitted - p):])

    @torch.inference_mode()
    def _span(self, state: FlowStreamState, all_tok: Tensor, end: int, finalize: bool,
              before_step=None) -> np.ndarray:
        """Tokens ``[committed, end)`` through the encoder and every ODE step; commits up to
        the last chunk boundary (a non-final hop) and returns the frames after ``emitted``."""
        cfg, r = self.cfg, self.cfg.token_mel_ratio
        b = state.committed
        new_b = b if finalize else end // self.unit * self.unit
        commit = new_b - b
        context = None if finalize else all_tok[:, end:end + cfg.pre_lookahead_len]
        t0 = time.perf_counter()
        mu = encode_span(self.flow, state.encoder, all_tok[:, b:end], context, commit)
        mu = mu.transpose(1, 2)  # [1, 80, frames]
        lo, hi = r * b, r * end
        x = torch.from_numpy(noise_columns(self.noise_table, hi)[:, :, lo:])
        cond = torch.zeros_like(mu)
        m1 = state.prompt_feat.shape[2]
        if lo < m1:
            top = min(m1, hi)
            cond[:, :, :top - lo] = state.prompt_feat[:, :, lo:top]
        mu2 = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        cond2 = torch.cat([cond, torch.zeros_like(cond)], dim=0)
        est = self.flow.decoder.estimator
        t1 = time.perf_counter()
        for step, (t, dt) in zip(state.steps, self._times):
            if before_step is not None:
                before_step()
            t2 = torch.full((2,), t, dtype=torch.float32)
            v = estimate_span(est, step, torch.cat([x, x], dim=0), mu2, t2, state.spks, cond2,
                              r * commit)
            x = x + dt * (self._a * v[:1] - self._b * v[1:2])
        state.committed = new_b
        state.last_seconds = (t1 - t0, time.perf_counter() - t1)
        return np.ascontiguousarray(x[:, :, r * (state.emitted - b):].numpy())


class FlowStream:
    """One segment's incremental flow on numpy arrays, in the shapes of
    :class:`cosyvino.families.cosyvoice23.token2wav.FlowHops` (what the serving program calls;
    :meth:`cosyvino.families.cosyvoice2.torch.model.CosyVoice2TorchModel.flow_stream`).

    Args:
        flow: the :class:`IncrementalFlow`; embedding: float32 [1, 192] raw x-vector;
        prompt_token: int [N1] or None; prompt_feat: float32 [2 N1, 80] or None.
    Raises: InputError as :meth:`IncrementalFlow.start`.
    """

    def __init__(self, flow: IncrementalFlow, embedding, prompt_token=None, prompt_feat=None):
        self.flow = flow
        if prompt_token is not None and np.asarray(prompt_token).size == 0:
            prompt_token = prompt_feat = None
        if prompt_token is not None:
            prompt_token = np.asarray(prompt_token, np.int64).reshape(1, -1)
            prompt_feat = np.asarray(prompt_feat, np.float32).reshape(
                1, -1, flow.cfg.output_size)
        self.state = flow.start(np.asarray(embedding, np.float32).reshape(1, -1),
                                prompt_token, prompt_feat)
        self.prompt_tokens = int(self.state.prompt_token.shape[1])
        self.hops = 0  # hops made so far (the final one included)

    @property
    def emitted(self) -> int:
        """Generated tokens (prompt excluded) whose frames were returned."""
        return self.state.emitted - self.prompt_tokens

    def hop(self, tokens: np.ndarray, finalize: bool, final: str = "incremental",
            before_step=None) -> np.ndarray:
        """The new frames of one official flow call: ``tokens`` int [stop] (every generated
        token so far, look-ahead included) -> float32 [1, 80, 2 (stop - 3 - emitted)]
        (non-final) or [1, 80, 2 (stop - emitted)] (final). Raises InputError as
        :meth:`IncrementalFlow.hop`."""
        mel = self.flow.hop(self.state, np.asarray(tokens, np.int64).reshape(1, -1),
                            finalize=finalize, final=final, before_step=before_step)
        self.hops += 1
        return mel

    def nbytes(self) -> int:
        """Bytes of chunk state held (:meth:`FlowStreamState.nbytes`)."""
        return self.state.nbytes()


__all__ = ["FINAL_MODES", "FlowStream", "FlowStreamState", "IncrementalFlow", "commit_unit",
           "state_bytes_per_second"]
