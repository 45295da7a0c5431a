"""CosyVoice2/3 flow inference in torch: tokens (+ prompt) -> mel, the reference path.

Upstream ``CausalMaskedDiffWithXvec.inference`` (v2) and ``CausalMaskedDiffWithDiT.inference``
(v3) + ``CausalConditionalCFM.forward``: sheet v2 §5.3 (steps 1-8) and §5.4 (fixed noise,
solver); sheet v3 §5.2 (the same steps with the pre-lookahead layer in place of the encoder).
Both flows differ only in how tokens become ``mu`` (their ``encode``) and in the estimator; the
token checks, the look-ahead split, the prompt conditioning and the Euler solve (the shared numpy
one, :func:`cosyvino.families.cosyvoice23.cfm.solve_fixed_noise`) live here once. Batch 1.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice23.cfm import solve_fixed_noise

Tensor = torch.Tensor


class CausalFlow(Protocol):
    """What this module needs of a flow module (v2 ``CausalMaskedDiffWithXvec``, v3
    ``CausalMaskedDiffWithDiT``).

    ``cfg`` has ``vocab_size``, ``spk_embed_dim``, ``output_size``, ``token_mel_ratio``,
    ``pre_lookahead_len`` and ``cfm`` (``n_timesteps``, ``inference_cfg_rate``);
    ``decoder.estimator(x, mask, mu, t, spks, cond, streaming=...)`` is the velocity estimator
    (float32 ``[B, 80, T]`` in and out).
    """

    cfg: Any
    decoder: Any

    def speaker(self, embedding: Tensor) -> Tensor:
        """float32 ``[1, spk_embed_dim]`` -> ``spks`` float32 ``[1, output_size]``."""

    def encode(self, token: Tensor, context_token: Tensor | None = None,
               streaming: bool = False) -> Tensor:
        """int64 ``[1, L]`` (+ ``[1, pre_lookahead_len]`` look-ahead of a non-final call) ->
        ``mu`` time-major float32 ``[1, token_mel_ratio * L, output_size]``."""


def speech_tokens(name: str, value, vocab: int) -> Tensor:
    """``value`` as int64 ``[1, N]`` (a ``[N]`` input gets the batch axis).

    Raises:
        InputError: not integer, not one row, or an id ``>= vocab`` (negative ids are clamped
            to 0 by the flows, as upstream).
    """
    t = torch.as_tensor(value)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[0] != 1 or t.is_floating_point():
        raise InputError(f"{name} must be integer token ids [1, N], got {t.dtype} "
                         f"{list(t.shape)}")
    if t.numel() and int(t.max()) >= vocab:
        raise InputError(f"{name} holds id {int(t.max())}; the flow's vocabulary has {vocab} "
                         "speech tokens")
    return t.long()


def split_lookahead(flow: CausalFlow, token, prompt_token=None, *, finalize: bool = True
                    ) -> tuple[Tensor, Tensor | None]:
    """``prompt_token ⧺ token`` split into the tokens that produce frames and, for a non-final
    call, the last ``pre_lookahead_len`` tokens that are look-ahead context only (sheet v2 §5.2,
    v3 §5.2).

    Returns:
        (int64 ``[1, L]``, int64 ``[1, pre_lookahead_len]`` or None when ``finalize``).
    Raises:
        InputError: malformed tokens (:func:`speech_tokens`) or fewer than 1 (final) /
            ``1 + pre_lookahead_len`` (non-final) tokens, prompt included.
    """
    cfg = flow.cfg
    tok = speech_tokens("token", token, cfg.vocab_size)
    ptok = (speech_tokens("prompt_token", prompt_token, cfg.vocab_size)
            if prompt_token is not None else tok[:, :0])
    all_tok = torch.cat([ptok, tok], dim=1)
    need = 1 + (0 if finalize else cfg.pre_lookahead_len)
    if all_tok.shape[1] < need:
        raise InputError(f"the flow needs at least {need} tokens (prompt included) for a "
                         f"{'final' if finalize else 'non-final'} call, got {all_tok.shape[1]}")
    if finalize:
        return all_tok, None
    k = cfg.pre_lookahead_len
    return all_tok[:, :-k], all_tok[:, -k:]


@torch.inference_mode()
def flow_mu(flow: CausalFlow, token, prompt_token=None, *, finalize: bool = True,
            streaming: bool = False) -> np.ndarray:
    """``mu`` for ``prompt_token ⧺ token``, time-major float32 ``[1, frames, 80]`` (v2: the
    golden ``encoder_proj_out``; v3: the pre-lookahead output repeated per frame). Raises
    InputError as :func:`split_lookahead`."""
    tokens, context = split_lookahead(flow, token, prompt_token, finalize=finalize)
    return flow.encode(tokens, context, streaming=streaming).numpy()


def _estimator(flow: CausalFlow, streaming: bool):
    est = flow.decoder.estimator

    def call(x, mask, mu, t, spks, cond):
        with torch.inference_mode():
            out = est(*(torch.from_numpy(np.ascontiguousarray(a))
                        for a in (x, mask, mu, t, spks, cond)), streaming=streaming)
        return out.numpy()

    return call


def flow_inference(flow: CausalFlow, token, embedding, noise_table: np.ndarray, *,
                   prompt_token=None, prompt_feat=None, streaming: bool = False,
                   finalize: bool = True, n_timesteps: int | None = None) -> np.ndarray:
    """Mel frames of ``token`` (the prompt's frames cut off).

    Args:
        flow: a loaded v2 or v3 flow (eval mode), see :class:`CausalFlow`.
        token: int ``[1, N]`` (or ``[N]``) speech tokens.
        embedding: float32 ``[1, spk_embed_dim]`` x-vector (raw; normalized by the flow).
        noise_table: float32 ``[1, 80, frames]`` fixed CFM noise
            (:func:`cosyvino.families.cosyvoice23.fixed_noise.make_cfm_noise_table`).
        prompt_token: int ``[1, P]`` or None; prompt_feat: float32 ``[1, 2P, 80]`` prompt mel
            (time-major) or None, given together.
        streaming: chunk-mask attention (v2: encoder and estimator, v3: the DiT).
        finalize: False = the last ``pre_lookahead_len`` tokens are look-ahead only.
        n_timesteps: Euler steps (default ``cfg.cfm.n_timesteps``, 10).
    Returns:
        float32 ``[1, 80, token_mel_ratio * L - 2P]`` (``L`` = P + N, minus the look-ahead
        when not final), natural-log mel.
    Raises:
        InputError: malformed tokens or ids outside the vocabulary, too few tokens, a prompt
            mel whose length is not ``token_mel_ratio`` × prompt tokens, an embedding of the
            wrong size, or more frames than the noise table.
    """
    cfg = flow.cfg
    p = 0 if prompt_token is None else int(torch.as_tensor(prompt_token).reshape(1, -1).shape[1])
    if (prompt_feat is None) != (prompt_token is None):
        raise InputError("prompt_token and prompt_feat must be given together")
    emb = torch.as_tensor(embedding, dtype=torch.float32)
    if tuple(emb.shape) != (1, cfg.spk_embed_dim):
        raise InputError(f"embedding must be float [1, {cfg.spk_embed_dim}], got "
                         f"{list(emb.shape)}")
    feat = np.zeros((1, 0, cfg.output_size), np.float32)
    if prompt_feat is not None:
        feat = np.asarray(prompt_feat, np.float32)
        if feat.ndim != 3 or feat.shape[0] != 1 or feat.shape[2] != cfg.output_size \
                or feat.shape[1] != cfg.token_mel_ratio * p:
            raise InputError(f"prompt_feat must be float [1, {cfg.token_mel_ratio * p}, "
                             f"{cfg.output_size}] ({cfg.token_mel_ratio} frames per prompt "
                             f"token), got {list(feat.shape)}")
    h = flow_mu(flow, token, prompt_token, finalize=finalize, streaming=streaming)
    with torch.inference_mode():
        spks = flow.speaker(emb).numpy()
    frames, m1 = h.shape[1], feat.shape[1]
    if frames <= m1:
        raise InputError(f"no frames to generate: {frames} frames for a {m1}-frame prompt")
    mu = np.ascontiguousarray(h.transpose(0, 2, 1))
    cond = np.zeros((1, cfg.output_size, frames), np.float32)  # mel width, not mu's
    cond[:, :, :m1] = feat.transpose(0, 2, 1)
    mask = np.ones((1, 1, frames), np.float32)
    mel = solve_fixed_noise(_estimator(flow, streaming), noise_table, mu, mask, spks, cond,
                            n_timesteps=n_timesteps or cfg.cfm.n_timesteps,
                            cfg_rate=cfg.cfm.inference_cfg_rate)
    return np.ascontiguousarray(mel[:, :, m1:])


__all__ = ["CausalFlow", "flow_inference", "flow_mu", "speech_tokens", "split_lookahead"]
