"""The official CosyVoice v1 token-hop streaming of flow + vocoder (numpy only, no torch).

Upstream: ``CosyVoiceModel.tts(stream=True)`` / ``token2wav`` (``cosyvoice/cli/model.py``),
``ConditionalCFM.forward`` (flow cache) and ``HiFTGenerator.inference`` (cache source); the
architecture sheet, section 7. The engine runs it through the ``official`` and ``latency``
hop schedules (:mod:`.streaming`); golden parity in tests/test_official_stream.py.

Per utterance:

* Token schedule (:func:`hop_windows`): while at least ``hop + overlap`` (120) tokens are
  pending, the first 120 go through the flow with ``finalize=False`` and the first 100 are
  dropped (the last 20 stay as the overlap of the next chunk); when the LLM has ended, the
  remainder goes through with ``finalize=True``.
* Flow cache: the CFM noise and mu of the prompt frames and of the last 34 frames of a chunk are
  kept; the next chunk's first ``prompt + 34`` frames of noise and mu are overwritten with them
  (the drawn noise is given BEFORE that overwrite).
* Mel cross-fade: the first 34 frames of a new mel are blended with the previous chunk's held-back
  last 34 frames with the two halves of ``numpy.hamming(68)``.
* HiFT cache: the last 20 mel frames, 5120 source samples and 5120 speech samples of the previous
  vocoder call; the mel frames are prepended, the source samples overwrite the start of the new
  source (given BEFORE that overwrite), and the first 5120 output samples are blended with the
  cached speech using ``numpy.hamming(10240)``. A non-final chunk holds back its last 34 mel
  frames (next cross-fade) and its last 5120 samples (next speech cross-fade).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.length_regulation import mel_frames_for_tokens
from cosyvino.families.cosyvoice1.nsf import draw_source_noise
from cosyvino.families.cosyvoice1.pipeline import Pipeline, linear_resize_time
from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages
from cosyvino.timing import StageTimes


@dataclass(frozen=True)
class StreamConstants:
    """Upstream v1 streaming constants (``CosyVoiceModel.__init__``)."""

    token_min_hop_len: int = 100
    token_max_hop_len: int = 200
    token_overlap_len: int = 20
    mel_overlap_len: int = 34
    mel_cache_len: int = 20
    source_cache_len: int = 5120
    stream_scale_factor: float = 1
    #: CFM Euler steps of the first hop when it is not also the last one (None: the
    #: utterance's ``n_timesteps``; never more than those): our latency schedule's lever on
    #: the first chunk, not an upstream constant
    first_hop_n_timesteps: int | None = None

    @classmethod
    def from_mapping(cls, values) -> "StreamConstants":
        """From a mapping with (some of) the field names (e.g. stream.pt ``constants``)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in dict(values).items() if k in names})


def hop_windows(n_tokens: int, constants: StreamConstants = StreamConstants()
                ) -> list[tuple[int, int, bool]]:
    """The ``(start, stop, finalize)`` token windows of an utterance of ``n_tokens`` tokens when
    all tokens are known (the LLM has ended): chunks of ``hop + overlap`` tokens advancing by
    ``hop`` while that many are pending, then the remainder as the final chunk. The hop stays
    ``token_min_hop_len`` with ``stream_scale_factor`` 1 (upstream grows it by that factor after
    each chunk, capped at ``token_max_hop_len``)."""
    c = constants
    hop = c.token_min_hop_len
    start, out = 0, []
    while n_tokens - start >= hop + c.token_overlap_len:
        out.append((start, start + hop + c.token_overlap_len, False))
        start += hop
        hop = min(c.token_max_hop_len, int(hop * c.stream_scale_factor))
    out.append((start, n_tokens, True))
    return out


def stream_mel_frames(n_tokens: int, constants: StreamConstants = StreamConstants()) -> int:
    """Mel frames (x 256 = samples) a v1 token-hop stream of ``n_tokens`` tokens emits at
    speed 1, no prompt: every window's frames (:func:`mel_frames_for_tokens`) less the
    ``mel_overlap_len`` frames each cross-fade merges. It can differ by a frame or two from the
    whole-segment ``mel_frames_for_tokens(n_tokens)``: each window rounds down on its own."""
    windows = hop_windows(n_tokens, constants)
    frames = sum(mel_frames_for_tokens(b - a) for a, b, _ in windows)
    return frames - constants.mel_overlap_len * (len(windows) - 1)


def fade_in_out(fade_in: np.ndarray, fade_out: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Upstream ``fade_in_out``: the first ``len(window)//2`` entries (last axis) of ``fade_in``
    become ``fade_in * window[:n] + fade_out[-n:] * window[n:]``; computed in float64 (the
    window is float64 upstream) and stored back as float32."""
    n = window.shape[0] // 2
    out = np.array(fade_in, dtype=np.float32, copy=True)
    head = (out[..., :n].astype(np.float64) * window[:n]
            + np.asarray(fade_out, np.float64)[..., -n:] * window[n:])
    out[..., :n] = head.astype(np.float32)
    return out


class OfficialTokenHopStream:
    """One utterance's flow + vocoder state in the official v1 token-hop streaming.

    ``stages``: loaded :class:`CosyVoice1Stages`; ``embedding`` float32 [1, 192] (the raw flow
    speaker embedding); ``prompt_token`` int [N1] and ``prompt_feat`` float32 [M1, 80] (or
    [1, M1, 80]) for the zero-shot case; ``n_timesteps``: CFM Euler steps (None: the config's).
    Call :meth:`hop` once per chunk, in order, with the
    tokens of :func:`hop_windows`. Not thread-safe.
    """

    def __init__(self, stages: CosyVoice1Stages, embedding: np.ndarray, *,
                 prompt_token: np.ndarray | None = None,
                 prompt_feat: np.ndarray | None = None,
                 constants: StreamConstants = StreamConstants(), speed: float = 1.0,
                 pipeline: Pipeline | None = None, n_timesteps: int | None = None):
        self.stages = stages
        self.speed = float(speed)
        self.n_timesteps = n_timesteps
        self.config = stages.config
        self.pipeline = pipeline or Pipeline(stages)
        self.constants = constants
        n_mels = self.config.flow.output_size
        self.embedding = np.asarray(embedding, np.float32).reshape(1, -1)
        self.prompt_token = (np.zeros(0, np.int64) if prompt_token is None
                             else np.asarray(prompt_token, np.int64).reshape(-1))
        self.prompt_feat = (np.zeros((0, n_mels), np.float32) if prompt_feat is None
                            else np.asarray(prompt_feat, np.float32).reshape(-1, n_mels))
        if (self.prompt_token.size == 0) != (self.prompt_feat.shape[0] == 0):
            raise InputError("prompt_token and prompt_feat go together")
        self.mel_window = np.hamming(2 * constants.mel_overlap_len)
        self.speech_window = np.hamming(2 * constants.source_cache_len)
        # flow cache: (noise, mu) float32 [1, 80, C] each, C = 0 before the first chunk
        self.flow_cache: tuple[np.ndarray, np.ndarray] | None = None
        self.mel_overlap = np.zeros((1, n_mels, 0), np.float32)
        self.hift_cache: dict[str, np.ndarray] | None = None
        self.finished = False
        self._pending = None  # (mel, cache source, finalize) between flow_hop and vocoder_hop

    # ---- flow ------------------------------------------------------------------------------
    def flow_frames(self, n_tokens: int) -> int:
        """M1 + M2: the CFM noise frames of a chunk of ``n_tokens`` tokens."""
        return self.prompt_feat.shape[0] + self._m2(n_tokens)

    def _m2(self, n_tokens: int) -> int:
        return mel_frames_for_tokens(n_tokens, token_rate=self.config.flow.input_frame_rate,
                                     sample_rate=self.config.sample_rate,
                                     hop=self.config.hift.hop_length)

    def _steps(self, finalize: bool) -> int | None:
        """CFM Euler steps of this hop: fewer for a first hop that is not the last one when the
        constants say so (:attr:`StreamConstants.first_hop_n_timesteps`)."""
        first = self.constants.first_hop_n_timesteps
        if first is None or finalize or self.flow_cache is not None:
            return self.n_timesteps
        full = self.n_timesteps or self.config.flow.cfm.n_timesteps
        return min(int(first), int(full))

    def _flow(self, tokens: np.ndarray, noise: np.ndarray,
              before_step: Callable[[], None] | None = None,
              n_timesteps: int | None = None, times: StageTimes | None = None) -> np.ndarray:
        inputs = self.pipeline.flow_inputs(tokens, self.embedding,
                                           prompt_token=self.prompt_token,
                                           prompt_feat=self.prompt_feat, times=times)
        mu, m1 = inputs.mu, inputs.prompt_frames
        m = mu.shape[-1]
        z = np.array(noise, dtype=np.float32, copy=True).reshape(1, mu.shape[1], -1)
        if z.shape[-1] != m:
            raise InputError(f"flow noise has {z.shape[-1]} frames, expected {m}")
        if self.flow_cache is not None:  # the official overwrites the first frames of both
            cz, cmu = self.flow_cache
            c = cz.shape[-1]
            z[..., :c] = cz
            mu[..., :c] = cmu
        tail = self.constants.mel_overlap_len
        self.flow_cache = (np.concatenate([z[..., :m1], z[..., m - tail:]], axis=-1),
                           np.concatenate([mu[..., :m1], mu[..., m - tail:]], axis=-1))
        return self.pipeline.solve_flow(z, inputs, times, before_step=before_step,
                                        n_timesteps=n_timesteps or self.n_timesteps)

    # ---- vocoder ---------------------------------------------------------------------------
    def _hift(self, mel: np.ndarray, source: np.ndarray | None, cache_source: np.ndarray,
              rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        h = self.config.hift
        mel = np.ascontiguousarray(mel, np.float32)
        n = mel.shape[-1]
        if source is None:
            if rng is None:
                raise InputError("hop needs rng or source")
            f0 = self.stages.vocoder_f0(mel)
            phase, noise = draw_source_noise(rng, n, h.nb_harmonics, h.hop_length)
            source = self.stages.vocoder_source(f0, phase, noise)
        s = np.array(source, dtype=np.float32, copy=True).reshape(1, 1, -1)
        if s.shape[-1] != h.hop_length * n:
            raise InputError(f"vocoder source has {s.shape[-1]} samples, expected "
                             f"{h.hop_length * n} ({n} mel frames)")
        c = cache_source.shape[-1]
        if c:
            s[..., :c] = cache_source
        wav = self.stages.vocoder_decode(mel, s)
        return np.asarray(wav, np.float32).reshape(1, -1), s

    def vocoder_frames(self, n_tokens: int, finalize: bool) -> int:
        """Mel frames the vocoder decodes for the next chunk of ``n_tokens`` tokens (its NSF
        source has ``hop_length`` times as many samples)."""
        n = self._m2(n_tokens)
        if self.hift_cache is not None:
            n += self.hift_cache["mel"].shape[-1]
        return n if finalize else n - self.constants.mel_overlap_len

    # ---- one hop ----------------------------------------------------------------------------
    def flow_hop(self, tokens: np.ndarray, finalize: bool, noise: np.ndarray | None = None,
                 rng: np.random.Generator | None = None,
                 before_step: Callable[[], None] | None = None,
                 times: StageTimes | None = None) -> np.ndarray:
        """The flow half of a hop: ``tokens`` int [N] (this chunk's window, overlap included)
        -> the mel float32 [1, 80, T] the vocoder gets next (cached frames included; T =
        :meth:`vocoder_frames` at speed 1). ``noise`` float32 [1, 80, M1 + M2]
        (:meth:`flow_frames`) is the draw BEFORE the flow cache overwrites its first frames;
        None draws it from ``rng``. ``before_step`` runs before every estimator call (it may
        raise to cancel); ``times`` gets ``flow_encoder`` and ``flow_estimator`` (one call
        per estimator call), as the whole-segment path. Call :meth:`vocoder_hop` next."""
        if self.finished:
            raise InputError("the stream has already been finalized")
        if self._pending is not None:
            raise InputError("flow_hop called twice without vocoder_hop")
        c = self.constants
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        if tokens.size == 0:
            raise InputError("no speech tokens in this hop")
        if noise is None:
            if rng is None:
                raise InputError("hop needs rng or noise")
            noise = rng.standard_normal((1, self.config.flow.output_size,
                                         self.flow_frames(tokens.size)), dtype=np.float32)
        mel = self._flow(tokens, noise, before_step, self._steps(finalize), times)
        if self.mel_overlap.shape[-1]:
            mel = fade_in_out(mel, self.mel_overlap, self.mel_window)
        if not finalize:
            self.mel_overlap = np.ascontiguousarray(mel[..., -c.mel_overlap_len:])
            mel = mel[..., :-c.mel_overlap_len]
        if self.speed != 1.0:  # tempo change of the new frames (upstream: whole-mel resize)
            mel = linear_resize_time(mel, max(1, int(round(mel.shape[-1] / self.speed))))
        if self.hift_cache is not None:
            mel = np.concatenate([self.hift_cache["mel"], mel], axis=-1)
            cache_source = self.hift_cache["source"]
        else:
            cache_source = np.zeros((1, 1, 0), np.float32)
        mel = np.ascontiguousarray(mel, np.float32)
        self._pending = (mel, cache_source, finalize)
        return mel

    def vocoder_hop(self, source: np.ndarray | None = None,
                    rng: np.random.Generator | None = None) -> np.ndarray:
        """The vocoder half of a hop: decodes the mel of the last :meth:`flow_hop` and returns
        the float32 waveform [n] this chunk emits (22050 Hz). ``source`` float32
        [1, 1, 256 * T] is the NSF source BEFORE the HiFT cache overwrites its first samples;
        None draws it from ``rng``."""
        if self._pending is None:
            raise InputError("vocoder_hop needs a flow_hop first")
        c = self.constants
        mel, cache_source, finalize = self._pending
        self._pending = None
        speech, s = self._hift(mel, source, cache_source, rng)
        if self.hift_cache is not None:
            speech = fade_in_out(speech, self.hift_cache["speech"], self.speech_window)
        if finalize:
            self.finished = True
            self.hift_cache = None
            return speech.reshape(-1)
        self.hift_cache = {"mel": np.ascontiguousarray(mel[..., -c.mel_cache_len:]),
                           "source": np.ascontiguousarray(s[..., -c.source_cache_len:]),
                           "speech": np.ascontiguousarray(speech[:, -c.source_cache_len:])}
        return np.ascontiguousarray(speech[0, :-c.source_cache_len])

    def hop(self, tokens: np.ndarray, finalize: bool, noise: np.ndarray | None = None,
            source: np.ndarray | None = None, rng: np.random.Generator | None = None
            ) -> np.ndarray:
        """Upstream ``token2wav`` for one chunk (:meth:`flow_hop` then :meth:`vocoder_hop`):
        ``tokens`` int [N] -> the float32 waveform [n] this chunk emits. ``noise`` and
        ``source`` as there; either may be None to draw it from ``rng``."""
        self.flow_hop(tokens, finalize, noise, rng)
        return self.vocoder_hop(source, rng)
