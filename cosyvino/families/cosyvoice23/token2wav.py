"""CosyVoice2/3 speech tokens -> mel, one streaming hop at a time: the flow from the fixed noise
(sheet v2 §5.3-5.4, v3 §5.2-5.4; the same steps, only the stage calls differ). numpy only; the
stage calls run on any backend. The families add their vocoder
(:class:`cosyvino.families.cosyvoice2.token2wav.Token2Wav`: HiFT cache and cross-fade;
:class:`cosyvino.families.cosyvoice3.token2wav.Token2Wav3`: causal re-run and cut).

Per hop ``(start, stop, finalize)`` of a segment: ``prompt ⧺ tokens[0:stop]`` through the flow
encoder (``finalize=False``: the last 3 tokens are look-ahead only, chunk attention; the final
hop: full attention, zero look-ahead), CFM Euler + CFG from columns ``0..M-1`` of the fixed
noise table (no random draw), prompt frames cut, then only the new frames ``[2 start, ...)``
kept (upstream ``token2wav``'s ``[:, :, 2·offset:]``). The whole-segment computation is the final
hop with ``start`` 0.

With a ``flow_stream`` (the incremental flow, issue 36; ``StreamingOptions.flow_streaming``) a
non-final hop computes only its new tokens from the stream's chunk state (the same frames within
1e-4); the final hop re-runs as above (``final_hop="official"``) or continues incrementally
(``"incremental"``). A segment whose first hop is its final one always runs as above (nothing to
save, and the non-streaming computation stays the official one). The chunk state grows with the
segment (~231 MB per second of audio at CosyVoice2-0.5B, 10 steps): past
:data:`MAX_FLOW_STATE_BYTES` the stream is dropped and the segment's remaining hops re-run
officially (the same frames, so the audio does not change; only the cost does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from cosyvino.errors import InputError
from cosyvino.timing import StageTimes

from ..cosyvoice1.pipeline import linear_resize_time
from .cfm import solve_fixed_noise

log = logging.getLogger(__name__)

#: chunk state one segment's incremental flow may hold (bytes) before its later hops go back
#: to the official re-runs: 4 GiB = ~18 s of CosyVoice2-0.5B audio (prompt included) at 10 ODE
#: steps; bounds the memory of concurrent long segments
MAX_FLOW_STATE_BYTES = 4 << 30


class FlowHops:
    """One segment's flow on loaded CosyVoice2/3 stages (``flow_encode``, ``estimate``,
    ``cfm_noise``, ``config``); the families add their vocoder (:meth:`vocoder`).

    ``embedding`` float32 [1, 192] (raw flow x-vector); ``prompt_token`` int [N1] and
    ``prompt_feat`` float32 [2 N1, 80] (None: no prompt); ``n_timesteps`` Euler steps (None:
    the config's 10); ``speed`` a tempo change of each hop's new frames (linear resize);
    ``flow_stream``: an incremental flow stream for this segment (``stages.new_flow_stream``)
    or None (official re-runs); ``final_hop``: ``"official"`` | ``"incremental"`` (module
    docstring); ``max_state_bytes``: the stream's state cap (:data:`MAX_FLOW_STATE_BYTES`).
    ``last_flow_mode`` says how the last hop's flow ran.
    """

    def __init__(self, stages, embedding: np.ndarray, *, prompt_token=None, prompt_feat=None,
                 n_timesteps: int | None = None, speed: float = 1.0, flow_stream=None,
                 final_hop: str = "official", max_state_bytes: int = MAX_FLOW_STATE_BYTES):
        self.stages = stages
        cfg = stages.config
        self.cfg = cfg
        c = cfg.flow.output_size
        self.embedding = np.asarray(embedding, np.float32).reshape(1, -1)
        self.prompt_token = (np.zeros(0, np.int64) if prompt_token is None
                             else np.asarray(prompt_token, np.int64).reshape(-1))
        self.prompt_feat = (np.zeros((0, c), np.float32) if prompt_feat is None
                            else np.asarray(prompt_feat, np.float32).reshape(-1, c))
        self.n_timesteps = n_timesteps or cfg.flow.cfm.n_timesteps
        self.speed = float(speed)
        self.flow_stream = flow_stream
        self.final_hop = final_hop
        self.max_state_bytes = int(max_state_bytes)
        self.last_flow_mode = "official"

    # ---- flow ------------------------------------------------------------------------------
    def flow(self, tokens: np.ndarray, start: int, finalize: bool, *,
             estimate: Callable | None = None, before_step: Callable[[], None] | None = None,
             times: StageTimes | None = None) -> np.ndarray:
        """The new mel frames of a hop: ``tokens`` int [stop] (the segment's tokens 0..stop-1),
        ``start`` the hop's token offset -> float32 [1, 80, 2 (stop - 3 - start)] (non-final)
        or [1, 80, 2 (stop - start)] (final), resized by ``speed``. ``estimate`` replaces the
        stages' estimator call (a rendezvous); ``before_step`` runs before each estimator call.
        Raises InputError (no tokens, too few for a non-final hop, > 15000 frames)."""
        times = times or StageTimes()
        cfg = self.cfg.flow
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if tokens.size == 0 or (not finalize and tokens.size <= cfg.pre_lookahead_len):
            raise InputError(f"a flow hop needs more speech tokens (got {tokens.size})")
        inc = self.flow_stream
        if inc is not None and (not finalize or (self.final_hop == "incremental"
                                                 and inc.hops > 0)):
            mel = self._incremental(tokens, start, finalize, before_step, times)
        else:
            mel = self._rerun(tokens, start, finalize, estimate, before_step, times)
            self.last_flow_mode = "official"
        if self.speed != 1.0:
            mel = linear_resize_time(mel, max(1, int(mel.shape[-1] / self.speed)))
        return mel

    def _incremental(self, tokens, start, finalize, before_step, times) -> np.ndarray:
        """The hop's new frames from the incremental stream; its start must be where the
        previous hop's frames ended (the official hop schedules)."""
        inc = self.flow_stream
        if start != inc.emitted:
            raise InputError(f"an incremental flow hop must start where the previous one "
                             f"ended (token {inc.emitted}), got {start}")
        mel = inc.hop(tokens, finalize, "incremental", before_step=before_step)
        enc, est = inc.state.last_seconds
        times.add("flow_encoder", enc)
        times.add("flow_estimator", est, self.n_timesteps)
        self.last_flow_mode = "incremental"
        if finalize:
            self.flow_stream = None  # the chunk state is freed with the segment's last hop
        elif inc.nbytes() > self.max_state_bytes:
            log.info("incremental flow state %.0f MB > %.0f MB: the segment's later hops re-run "
                     "officially", inc.nbytes() / 1e6, self.max_state_bytes / 1e6)
            self.flow_stream = None
        return mel

    def _rerun(self, tokens, start, finalize, estimate, before_step, times) -> np.ndarray:
        """The official computation: the flow over the prompt and ``tokens[0:stop]``."""
        cfg = self.cfg.flow
        streaming = not finalize
        all_tokens = np.concatenate([self.prompt_token, tokens])[None, :]
        with times.measure("flow_encoder"):
            mu, spks = self.stages.flow_encode(all_tokens, self.embedding, finalize=finalize,
                                               streaming=streaming)
        frames, m1 = mu.shape[-1], self.prompt_feat.shape[0]
        cond = np.zeros_like(mu)
        cond[0, :, :m1] = self.prompt_feat.T
        mask = np.ones((1, 1, frames), np.float32)
        call = estimate or self.stages.estimate
        calls = 0

        def estimator(*args):
            nonlocal calls
            calls += 1
            return call(*args, streaming=streaming)

        t0 = time.perf_counter()
        try:
            mel = solve_fixed_noise(estimator, self.stages.cfm_noise(), mu, mask, spks, cond,
                                    n_timesteps=self.n_timesteps,
                                    cfg_rate=cfg.cfm.inference_cfg_rate, before_step=before_step)
        finally:
            times.add("flow_estimator", time.perf_counter() - t0, calls)
        if finalize:
            self.flow_stream = None
        return np.ascontiguousarray(mel[:, :, m1 + cfg.token_mel_ratio * start:])


__all__ = ["FlowHops"]
