"""CosyVoice2 speech tokens -> waveform, one hop at a time: the flow from the fixed noise and the
HiFT cache of the official streaming (sheet v2 §5.3-5.4, §7.3). numpy only; the stage calls run
on any backend. The program (:mod:`.program`) drives it; the hop windows come from
:mod:`.streaming`.

Per hop ``(start, stop, finalize)`` of a segment:

* flow: ``prompt ⧺ tokens[0:stop]`` through the encoder (``finalize=False``: the last 3 tokens
  are look-ahead only, chunk attention; the final hop: full attention, zero look-ahead), CFM
  Euler + CFG from columns ``0..M-1`` of the fixed noise table (no random draw), prompt frames
  cut, then only the new frames ``[2 start, ...)`` kept (upstream ``token2wav``'s
  ``[:, :, 2·offset:]``). The whole-segment computation is the final hop with ``start`` 0.
* vocoder: f0 and the SineGen2 source over the cached 8 frames + the new ones, the Gaussian
  noise drawn at the call's output-sample position on the segment, then
  :class:`~.official_stream.VocoderStream` (source overwrite, decode, Hamming cross-fade,
  held-back tail).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from cosyvino.errors import InputError
from cosyvino.timing import StageTimes

from ..cosyvoice1.pipeline import linear_resize_time
from ..cosyvoice23.cfm import solve_fixed_noise
from .official_stream import StreamConstants, VocoderStream
from .streaming import OFFICIAL


class Token2Wav:
    """One segment's flow + vocoder state on loaded :class:`~.stages.CosyVoice2Stages`.

    ``embedding`` float32 [1, 192] (raw flow x-vector); ``prompt_token`` int [N1] and
    ``prompt_feat`` float32 [2 N1, 80] (None: no prompt); ``n_timesteps`` Euler steps (None:
    the config's 10); ``speed`` a tempo change of each hop's new frames (linear resize).
    """

    def __init__(self, stages, embedding: np.ndarray, *, prompt_token=None, prompt_feat=None,
                 n_timesteps: int | None = None, speed: float = 1.0,
                 constants: StreamConstants = OFFICIAL):
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
        self.constants = constants
        self.stream = VocoderStream(_StageVocoder(stages), constants)
        self.vocoder_frame = 0  # first mel frame of the next vocoder call on the segment

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
        mel = np.ascontiguousarray(mel[:, :, m1 + cfg.token_mel_ratio * start:])
        if self.speed != 1.0:
            mel = linear_resize_time(mel, max(1, int(mel.shape[-1] / self.speed)))
        return mel

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder(self, new_mel: np.ndarray, noise: Callable[[int, int], np.ndarray],
                finalize: bool, before_decode: Callable[[], None] | None = None) -> np.ndarray:
        """Vocode a hop's new mel frames (:meth:`flow`) and return the samples it emits,
        float32 [n]. ``noise(start_sample, samples)`` gives the SineGen2 Gaussian draw float32
        [1, 9, samples] for the call's samples on the segment's sample line."""
        hop = self.cfg.samples_per_frame
        mel = self.stream.vocoder_mel(new_mel)
        n = mel.shape[-1]
        f0 = self.stages.vocoder_f0(mel)
        source = self.stages.vocoder_source(f0, noise(hop * self.vocoder_frame, hop * n))
        if before_decode is not None:
            before_decode()
        wav = self.stream.hop(new_mel, finalize, source=source)
        if not finalize:
            self.vocoder_frame += n - self.constants.mel_cache_len
        return wav


class _StageVocoder:
    """The stages' vocoder calls as :class:`~.official_stream.Vocoder`."""

    def __init__(self, stages):
        self.stages = stages
        self.hop_length = stages.config.samples_per_frame
        self.nb_harmonics = stages.config.hift.nb_harmonics

    def f0(self, mel):
        return self.stages.vocoder_f0(mel)

    def source(self, f0, noise):
        return self.stages.vocoder_source(f0, noise)

    def decode(self, mel, source):
        return self.stages.vocoder_decode(mel, source)


__all__ = ["Token2Wav"]
