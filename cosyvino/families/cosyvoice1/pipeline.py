"""CosyVoice v1 inference orchestration, written once for every backend (numpy only).

What lives here: the LLM input layout and the speech-token sampling loop (upstream
``cosyvoice/llm/llm.py`` ``TransformerLM.inference``), the flow conditioning, length-regulation
matrix and CFM ODE loop (``cosyvoice/flow/flow.py``, ``flow_matching.py``), the NSF random draws
and vocoder calls (``cosyvoice/hifigan/generator.py``), and speed change. A backend only runs the
fixed stage computations of :class:`.stages.CosyVoice1Stages`. Must not import torch.
"""

from __future__ import annotations

import contextlib
import time

from dataclasses import dataclass
from typing import Callable

import numpy as np

from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages, LLMSession
from cosyvino.families.cosyvoice1.cfm import solve_euler_cfg
from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.length_regulation import interpolation_matrix, mel_frames_for_tokens
from cosyvino.families.cosyvoice1.nsf import draw_source_noise
from cosyvino.families.cosyvoice1.sampling import ras_sample
from cosyvino.timing import StageTimes


def linear_resize_time(mel: np.ndarray, n_out: int) -> np.ndarray:
    """Linear interpolation of ``mel`` [1, C, T] along time to ``n_out`` frames
    (``F.interpolate(mode='linear', align_corners=False)`` semantics; upstream speed change)."""
    n_in = mel.shape[-1]
    if n_out == n_in:
        return mel
    src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0.0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    w = (src - lo).astype(np.float32)
    return (mel[..., lo] * (1 - w) + mel[..., hi] * w).astype(np.float32)


#: Most mel frames kept from one vocoder decode window (256 frames = 2.97 s at 22050 Hz):
#: windows bound the vocoder's activation memory whatever the segment length
#: (docs/performance.md, "Measurements behind code constants").
VOCODER_CHUNK_FRAMES = 256
#: Window lengths are rounded up to a multiple of this many frames, so segments of any length
#: give the backend a handful of input shapes (runtimes keep buffers per shape; same page).
VOCODER_WINDOW_STEP = 32
#: Mel frames of context decoded on each side of a chunk and then dropped. The HiFT decode is
#: convolutional, so an output sample depends only on nearby frames; 16 frames cover its
#: receptive field (same page), so every kept sample equals the whole-segment decode's (tested).
VOCODER_CONTEXT_FRAMES = 16


def vocoder_chunks(n_frames: int, chunk_frames: int | None,
                   context: int = VOCODER_CONTEXT_FRAMES,
                   step: int = VOCODER_WINDOW_STEP) -> list[tuple[int, int, int, int]]:
    """Split ``n_frames`` mel frames into ``(lo, a, b, hi)`` windows: frames ``[a, b)`` are kept
    from a decode of frames ``[lo, hi)``.

    The segment is cut into the fewest near-equal parts of at most ``chunk_frames``; all
    windows have one length, a part plus ``context`` frames on each side rounded up to a
    multiple of ``step``, and keep at least ``context`` frames on each side of their kept
    range (fewer only at the segment's ends); the last window is moved back to end at
    ``n_frames`` (its extra frames are more context). The kept ranges tile ``[0, n_frames)``.
    One window covers everything when ``chunk_frames`` is None or the segment is no longer
    than a part plus its context.
    """
    if chunk_frames is None or n_frames <= chunk_frames + 2 * context:
        return [(0, 0, n_frames, n_frames)]
    parts = -(-n_frames // chunk_frames)
    kept = -(-n_frames // parts)
    width = min(n_frames, -(-(kept + 2 * context) // step) * step)
    windows = []
    a = 0
    while a < n_frames:
        lo = max(0, min(a - context, n_frames - width))
        hi = lo + width
        b = n_frames if hi >= n_frames else hi - context
        windows.append((lo, a, b, hi))
        a = b
    return windows


@dataclass(frozen=True)
class FlowInputs:
    """The CFM conditioning of one flow call (M = M1 prompt frames + M2 generated frames):
    ``mu`` float32 [1, 80, M] (length-regulated encoder output), ``spks`` float32 [1, 80]
    (projected speaker), ``cond`` float32 [1, 80, M] (prompt mel in the first M1 frames, zeros
    after), ``prompt_frames`` M1."""

    mu: np.ndarray
    spks: np.ndarray
    cond: np.ndarray
    prompt_frames: int


class Pipeline:
    """Text tokens -> speech tokens -> mel -> waveform on one loaded :class:`CosyVoice1Stages`."""

    def __init__(self, stages: CosyVoice1Stages, *,
                 vocoder_chunk_frames: int | None = VOCODER_CHUNK_FRAMES,
                 estimator_rendezvous=None):
        """``vocoder_chunk_frames``: longest mel the vocoder decode gets in one call (see
        :func:`vocoder_chunks`); None decodes every segment whole. ``estimator_rendezvous``:
        a :class:`cosyvino.engine.rendezvous.CallRendezvous` over ``stages.estimate`` shared
        with other requests' pipelines: the estimator calls of concurrent flow solves with
        equal shapes then run as one batched call (None: each call alone)."""
        if vocoder_chunk_frames is not None and vocoder_chunk_frames < 1:
            raise InputError(f"vocoder_chunk_frames must be >= 1 or None, got "
                             f"{vocoder_chunk_frames}")
        self.stages = stages
        self.config = stages.config
        self.vocoder_chunk_frames = vocoder_chunk_frames
        self.estimator_rendezvous = estimator_rendezvous
        self._sos, self._task = stages.llm_special_embeddings()

    # ---- LLM -------------------------------------------------------------------------------
    def build_lm_input(self, text_token: np.ndarray, embedding: np.ndarray | None,
                       prompt_text_token: np.ndarray | None = None,
                       prompt_speech_token: np.ndarray | None = None,
                       times: StageTimes | None = None) -> np.ndarray:
        """``[SOS][SPK][TEXT_ENC(prompt_text ⧺ text)][TASK][PROMPT_SPEECH]`` float32 [1, T, D].

        ``embedding`` None drops the SPK slot (instruct mode). Token arrays are int [1, L].
        """
        times = times or StageTimes()
        text = np.asarray(text_token, dtype=np.int64).reshape(1, -1)
        if prompt_text_token is not None and np.size(prompt_text_token):
            text = np.concatenate(
                [np.asarray(prompt_text_token, dtype=np.int64).reshape(1, -1), text], axis=1)
        parts = [self._sos]
        with times.measure("text_encoder"):
            if embedding is not None:
                parts.append(self.stages.embed_llm_speaker(
                    np.asarray(embedding, dtype=np.float32).reshape(1, -1)))
            parts.append(self.stages.encode_text(text))
        parts.append(self._task)
        if prompt_speech_token is not None and np.size(prompt_speech_token):
            parts.append(self.stages.embed_speech_tokens(
                np.asarray(prompt_speech_token, dtype=np.int64).reshape(1, -1)))
        return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)

    def decoding_bounds(self, n_text: int, num_tokens: int | None = None) -> tuple[int, int]:
        """``(min_len, max_len)`` speech tokens for ``n_text`` tts text tokens: EOS is
        forbidden before ``int(2 * n_text)`` and decoding stops at ``int(20 * n_text)``
        (upstream ``min_token_text_ratio`` / ``max_token_text_ratio``); ``num_tokens`` forces
        exactly that many. Raises InputError for ``num_tokens`` < 1."""
        if num_tokens is not None:
            if num_tokens < 1:
                raise InputError(f"num_tokens must be >= 1, got {num_tokens}")
            return num_tokens, num_tokens
        cfg = self.config.llm
        return int(n_text * cfg.min_token_text_ratio), int(n_text * cfg.max_token_text_ratio)

    def sample_token(self, logp: np.ndarray, decoded: list[int], rng: np.random.Generator,
                     min_len: int) -> int:
        """The next speech token (RAS) from ``logp`` float32 [V+1] after ``decoded``; EOS is
        masked while fewer than ``min_len`` tokens are decoded."""
        cfg = self.config.llm
        if len(decoded) < min_len:
            logp = logp.copy()
            logp[cfg.eos_token] = -np.inf
        return ras_sample(logp, decoded, rng, cfg.sampling)

    def generate_speech_tokens(self, text_token: np.ndarray, embedding: np.ndarray | None,
                               rng: np.random.Generator, *,
                               prompt_text_token: np.ndarray | None = None,
                               prompt_speech_token: np.ndarray | None = None,
                               num_tokens: int | None = None,
                               session: LLMSession | None = None,
                               times: StageTimes | None = None,
                               on_token: Callable[[int], None] | None = None) -> np.ndarray:
        """Autoregressive RAS decoding with the KV cache.

        EOS is forbidden until ``int(2 * n_text)`` tokens and decoding stops at
        ``int(20 * n_text)`` (n_text = tts text tokens, prompt text excluded; upstream
        ``min_token_text_ratio``/``max_token_text_ratio``). ``num_tokens`` forces exactly that
        many tokens (EOS never sampled) — for benchmarks with a fixed audio length.

        Returns:
            int64 [N] speech tokens (EOS not included).
        """
        cfg = self.config.llm
        times = times or StageTimes()
        n_text = int(np.size(text_token))
        if n_text == 0:
            raise InputError("no text tokens to synthesize")
        eos = cfg.eos_token
        min_len, max_len = self.decoding_bounds(n_text, num_tokens)
        lm_input = self.build_lm_input(text_token, embedding, prompt_text_token,
                                       prompt_speech_token, times)
        own_session = session is None
        session = session or self.stages.new_llm_session()
        session.reset()
        out: list[int] = []
        try:
            with times.measure("llm_prefill"):
                logp = session.forward(lm_input)
            for step in range(max_len):
                with times.measure("llm_sampling"):
                    token = self.sample_token(logp, out, rng, min_len)
                if token == eos:
                    break
                out.append(token)
                if on_token is not None:
                    on_token(token)
                if len(out) >= max_len:
                    break
                emb = self.stages.embed_speech_tokens(np.array([[token]], dtype=np.int64))
                with times.measure("llm_decode"):
                    logp = session.forward(emb)
        finally:
            if own_session:
                session.close()
            else:
                session.reset()
        return np.asarray(out, dtype=np.int64)

    # ---- flow ------------------------------------------------------------------------------
    def flow_inputs(self, tokens: np.ndarray, embedding: np.ndarray, *,
                    prompt_token: np.ndarray | None = None,
                    prompt_feat: np.ndarray | None = None,
                    times: StageTimes | None = None) -> FlowInputs:
        """The CFM conditioning of speech tokens int [N2] (prompt ⧺ tokens through the flow
        encoder and length regulator): see :class:`FlowInputs`. ``prompt_token`` int [N1] and
        ``prompt_feat`` float32 [M1, 80] (or [1, M1, 80]) condition on a prompt (zero-shot).
        Raises InputError for no tokens."""
        times = times or StageTimes()
        fcfg = self.config.flow
        gen = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if gen.size == 0:
            raise InputError("no speech tokens to synthesize")
        prompt = (np.zeros(0, dtype=np.int64) if prompt_token is None
                  else np.asarray(prompt_token, dtype=np.int64).reshape(-1))
        feat = (np.zeros((0, fcfg.output_size), dtype=np.float32) if prompt_feat is None
                else np.asarray(prompt_feat, dtype=np.float32).reshape(-1, fcfg.output_size))
        n1, n2 = prompt.size, gen.size
        m1 = feat.shape[0]
        m2 = mel_frames_for_tokens(n2, token_rate=fcfg.input_frame_rate,
                                   sample_rate=self.config.sample_rate,
                                   hop=self.config.hift.hop_length)
        with times.measure("flow_encoder"):
            h, spks = self.stages.flow_encode(np.concatenate([prompt, gen])[None, :],
                                              np.asarray(embedding, np.float32).reshape(1, -1))
            interp = interpolation_matrix(n1, n2, m1, m2)
            mu = self.stages.length_regulate(h, interp)  # [1, M, 80]
        cond = np.zeros((1, fcfg.output_size, m1 + m2), dtype=np.float32)
        cond[0, :, :m1] = feat.T
        return FlowInputs(np.array(mu.transpose(0, 2, 1), dtype=np.float32, order="C"), spks,
                          cond, m1)

    def solve_flow(self, noise: np.ndarray, inputs: FlowInputs,
                   times: StageTimes | None = None,
                   before_step: Callable[[], None] | None = None,
                   n_timesteps: int | None = None) -> np.ndarray:
        """CFM Euler + CFG from ``noise`` float32 [1, 80, M] on ``inputs`` -> the generated
        part of the mel, float32 [1, 80, M - M1]. ``before_step`` runs before every estimator
        call (raise there to stop); ``n_timesteps``: Euler steps (None: the config's).
        ``times`` gets the solve's seconds as ``flow_estimator`` with one call per estimator
        call (= Euler step)."""
        times = times or StageTimes()
        fcfg = self.config.flow
        mask = np.ones((1, 1, inputs.mu.shape[-1]), dtype=np.float32)
        calls = 0

        rv = self.estimator_rendezvous
        # every call of this solve has the shapes of mu (batch 2): the rendezvous key
        joined = (contextlib.nullcontext(self.stages.estimate) if rv is None
                  else rv.member(("estimate",) + tuple(inputs.mu.shape[1:])))
        start = time.perf_counter()
        try:
            with joined as call:
                def estimate(*args):
                    nonlocal calls
                    calls += 1
                    return call(*args)

                mel = solve_euler_cfg(estimate, noise, mask, inputs.mu, inputs.spks,
                                      inputs.cond,
                                      n_timesteps=n_timesteps or fcfg.cfm.n_timesteps,
                                      cfg_rate=fcfg.cfm.inference_cfg_rate,
                                      before_step=before_step)
        finally:
            times.add("flow_estimator", time.perf_counter() - start, calls)
        return np.ascontiguousarray(mel[:, :, inputs.prompt_frames:])

    def tokens_to_mel(self, tokens: np.ndarray, embedding: np.ndarray,
                      rng: np.random.Generator | None = None, *,
                      noise: np.ndarray | None = None,
                      prompt_token: np.ndarray | None = None,
                      prompt_feat: np.ndarray | None = None,
                      times: StageTimes | None = None,
                      before_step: Callable[[], None] | None = None,
                      n_timesteps: int | None = None) -> np.ndarray:
        """Speech tokens int [N2] -> mel float32 [1, 80, M2], M2 = int(N2 / 50 * 22050 / 256)
        (:meth:`flow_inputs` then :meth:`solve_flow`).

        ``prompt_token`` int [N1] and ``prompt_feat`` float32 [M1, 80] (or [1, M1, 80]) condition
        on a prompt (zero-shot); ``noise`` float32 [1, 80, M1 + M2] replaces the draw from
        ``rng`` (parity tests); ``n_timesteps`` as in :meth:`solve_flow`.
        """
        inputs = self.flow_inputs(tokens, embedding, prompt_token=prompt_token,
                                  prompt_feat=prompt_feat, times=times)
        if noise is None:
            if rng is None:
                raise InputError("tokens_to_mel needs rng or noise")
            noise = rng.standard_normal(inputs.mu.shape, dtype=np.float32)
        return self.solve_flow(noise, inputs, times, before_step, n_timesteps)

    # ---- vocoder ---------------------------------------------------------------------------
    def mel_to_wav(self, mel: np.ndarray, rng: np.random.Generator | None = None, *,
                   source: np.ndarray | None = None,
                   times: StageTimes | None = None,
                   before_window: Callable[[], None] | None = None) -> np.ndarray:
        """mel float32 [1, 80, T] -> waveform float32 [hop * T] at the model rate (22050 Hz).

        ``source`` float32 [1, 1, hop*T] replaces the NSF source drawn from ``rng``. f0 and the
        NSF source (a running phase) are computed over the whole segment; the decode runs in
        windows of :func:`vocoder_chunks` (same samples as one whole decode, bounded memory);
        ``before_window`` runs before each window's decode (raise there to stop).
        """
        times = times or StageTimes()
        h = self.config.hift
        mel = np.ascontiguousarray(mel, dtype=np.float32)
        with times.measure("vocoder"):
            if source is None:
                if rng is None:
                    raise InputError("mel_to_wav needs rng or source")
                f0 = self.stages.vocoder_f0(mel)
                phase, noise = draw_source_noise(rng, mel.shape[-1], h.nb_harmonics,
                                                 h.hop_length)
                source = self.stages.vocoder_source(f0, phase, noise)
            wav = self._decode(mel, np.asarray(source, np.float32).reshape(1, 1, -1),
                               before_window)
        return wav

    def _decode(self, mel: np.ndarray, source: np.ndarray,
                before_window: Callable[[], None] | None = None) -> np.ndarray:
        hop = self.config.hift.hop_length
        n = mel.shape[-1]
        if source.shape[-1] != hop * n:
            raise InputError(f"vocoder source has {source.shape[-1]} samples, expected "
                             f"{hop * n} (hop {hop} x {n} mel frames)")
        pieces = []
        for lo, a, b, hi in vocoder_chunks(n, self.vocoder_chunk_frames):
            if before_window is not None:
                before_window()
            wav = self.stages.vocoder_decode(np.ascontiguousarray(mel[..., lo:hi]),
                                             np.ascontiguousarray(source[..., hop * lo:hop * hi]))
            wav = np.asarray(wav, dtype=np.float32).reshape(-1)
            pieces.append(wav[hop * (a - lo):hop * (b - lo)])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
