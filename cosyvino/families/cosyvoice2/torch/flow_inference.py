"""CosyVoice2 flow inference in torch: tokens (+ prompt) -> mel, the reference path.

Upstream ``CausalMaskedDiffWithXvec.inference`` + ``CausalConditionalCFM.forward``; sheet §5.3
(steps 1-8), §5.4 (fixed noise, solver). The encoder and the estimator run in torch; the Euler
solve is the shared numpy one (:func:`cosyvino.families.cosyvoice23.cfm.solve_fixed_noise`).
Batch 1.
"""

from __future__ import annotations

import numpy as np
import torch

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice2.torch.flow import CausalMaskedDiffWithXvec
from cosyvino.families.cosyvoice23.cfm import solve_fixed_noise


def _tokens(name: str, value, vocab: int) -> torch.Tensor:
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


def _estimator(flow: CausalMaskedDiffWithXvec, streaming: bool):
    est = flow.decoder.estimator

    def call(x, mask, mu, t, spks, cond):
        with torch.inference_mode():
            out = est(*(torch.from_numpy(np.ascontiguousarray(a))
                        for a in (x, mask, mu, t, spks, cond)), streaming=streaming)
        return out.numpy()

    return call


@torch.inference_mode()
def flow_mu(flow: CausalMaskedDiffWithXvec, token, prompt_token=None, *, finalize: bool = True,
            streaming: bool = False) -> np.ndarray:
    """``encoder_proj`` output for ``prompt_token ⧺ token``, float32 ``[1, frames, 80]``
    (the golden ``encoder_proj_out``); raises InputError as :func:`flow_inference`."""
    cfg = flow.cfg
    tok = _tokens("token", token, cfg.vocab_size)
    ptok = (_tokens("prompt_token", prompt_token, cfg.vocab_size) if prompt_token is not None
            else tok[:, :0])
    all_tok = torch.cat([ptok, tok], dim=1)
    need = 1 + (0 if finalize else cfg.pre_lookahead_len)
    if all_tok.shape[1] < need:
        raise InputError(f"the flow needs at least {need} tokens (prompt included) for a "
                         f"{'final' if finalize else 'non-final'} call, got {all_tok.shape[1]}")
    if finalize:
        return flow.encode(all_tok, streaming=streaming).numpy()
    k = cfg.pre_lookahead_len
    return flow.encode(all_tok[:, :-k], all_tok[:, -k:], streaming=streaming).numpy()


def flow_inference(flow: CausalMaskedDiffWithXvec, token, embedding, noise_table: np.ndarray, *,
                   prompt_token=None, prompt_feat=None, streaming: bool = False,
                   finalize: bool = True, n_timesteps: int | None = None) -> np.ndarray:
    """Mel frames of ``token`` (the prompt's frames cut off).

    Args:
        flow: a loaded :class:`CausalMaskedDiffWithXvec` (eval mode).
        token: int ``[1, N]`` (or ``[N]``) speech tokens.
        embedding: float32 ``[1, spk_embed_dim]`` x-vector (raw; normalized here).
        noise_table: float32 ``[1, 80, frames]`` fixed CFM noise
            (:func:`cosyvino.families.cosyvoice23.fixed_noise.make_cfm_noise_table`).
        prompt_token: int ``[1, P]`` or None; prompt_feat: float32 ``[1, 2P, 80]`` prompt mel
            (time-major) or None, given together.
        streaming: chunk-mask attention in encoder and estimator (sheet §5.2, §5.5).
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
    cond = np.zeros_like(mu)
    cond[:, :, :m1] = feat.transpose(0, 2, 1)
    mask = np.ones((1, 1, frames), np.float32)
    mel = solve_fixed_noise(_estimator(flow, streaming), noise_table, mu, mask, spks, cond,
                            n_timesteps=n_timesteps or cfg.cfm.n_timesteps,
                            cfg_rate=cfg.cfm.inference_cfg_rate)
    return np.ascontiguousarray(mel[:, :, m1:])


__all__ = ["flow_inference", "flow_mu"]
