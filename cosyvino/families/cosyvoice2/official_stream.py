"""The official CosyVoice2 streaming: token-hop schedule and vocoder cache (numpy only, no torch).

Upstream: ``CosyVoice2Model.tts(stream=True)`` and ``token2wav`` (``cosyvoice/cli/model.py``),
``HiFTGenerator.inference(mel, cache_source)``, ``fade_in_out`` (``cosyvoice/utils/common.py``);
CosyVoice2 architecture sheet §7.2, §7.3. Golden: ``tests/fixtures/tiny-c/stream.pt``
(tests/test_official_stream_cosyvoice2.py).

Per utterance:

* Schedule (:class:`TokenHopSchedule`, :func:`hop_schedule`): with P flow-prompt tokens the first
  hop is ``25 + pad`` (``pad`` makes P + hop a multiple of 25), later hops 50, 100, 100 ...
  (×2 per chunk up to 100). While at least ``hop + 3`` tokens beyond ``token_offset`` exist, the
  flow gets ``tokens[0 : offset + hop + 3]`` (ALL tokens so far: it re-runs over the prefix; the
  last 3 are look-ahead context only) with chunk attention (``streaming``) and
  ``finalize=False``; its new frames start at ``2 * token_offset``. When the LLM has ended, the
  remaining tokens go through one last call with ``finalize=True`` and FULL attention (upstream
  passes no stream flag there). Upstream keeps the hop on the model object, so a second request
  starts at hop 100; here every request starts at 25 (the sheet's §7.2 quirk, not reproduced).
* Vocoder cache (:class:`VocoderStream`): the last 8 mel frames, 3840 source samples and 3840
  speech samples of the previous vocoder call. The frames are prepended to the new mel, the source
  samples overwrite the head of the new NSF source (so the re-vocoded frames get the same
  excitation), and the first 3840 output samples are cross-faded with the cached speech by the two
  halves of ``numpy.hamming(7680)`` (float64). A non-final chunk holds back its last 3840 samples.

The flow is not part of this module: :class:`VocoderStream` takes each chunk's NEW mel frames
from any flow implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.official_stream import fade_in_out
from cosyvino.families.cosyvoice2.nsf import draw_sine_noise

__all__ = ["FlowCall", "StreamConstants", "TokenHopSchedule", "Vocoder", "VocoderStream",
           "emitted_samples", "hop_schedule", "vocoder_frames"]


@dataclass(frozen=True)
class StreamConstants:
    """Upstream v2 streaming constants (``CosyVoice2Model.__init__`` and the flow's
    ``pre_lookahead_len`` / ``token_mel_ratio``; sheet §7.2). Field names are the keys of
    stream.pt's ``constants``.

    Raises:
        InputError: a non-positive size, a scale factor below 1 or a max hop below the hop.
    """

    token_hop_len: int = 25
    token_max_hop_len: int = 100
    stream_scale_factor: int = 2
    pre_lookahead_len: int = 3
    token_mel_ratio: int = 2
    mel_cache_len: int = 8
    #: upstream ``mel_cache_len * 480``: the samples of the cached frames at 24 kHz
    source_cache_len: int = 3840

    def __post_init__(self) -> None:
        positive = ("token_hop_len", "token_max_hop_len", "token_mel_ratio", "mel_cache_len",
                    "source_cache_len")
        bad = [n for n in positive if int(getattr(self, n)) <= 0]
        if bad or self.pre_lookahead_len < 0:
            raise InputError("stream constants must be positive: "
                             f"{', '.join(bad) or 'pre_lookahead_len'}")
        if self.stream_scale_factor < 1:
            raise InputError(f"stream_scale_factor must be >= 1, got {self.stream_scale_factor}")
        if self.token_max_hop_len < self.token_hop_len:
            raise InputError("token_max_hop_len must be >= token_hop_len")

    @classmethod
    def from_mapping(cls, values) -> StreamConstants:
        """From a mapping with (some of) the field names (e.g. stream.pt ``constants``)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in dict(values).items() if k in names})


@dataclass(frozen=True)
class FlowCall:
    """One ``token2wav`` call of the official stream.

    Attributes:
        token_offset: tokens whose audio was already emitted; the call's new mel frames start
            at flow frame ``token_offset * token_mel_ratio`` (prompt frames excluded).
        n_tokens: the flow gets generated tokens ``[0, n_tokens)`` (plus the flow prompt).
        finalize: the flow's ``finalize`` (False: the last ``lookahead`` tokens are context only
            and produce no frames).
        streaming: chunk attention masks (True) or full attention (the last call).
        lookahead: tokens at the end used as look-ahead context only (0 when finalizing).
    """

    token_offset: int
    n_tokens: int
    finalize: bool
    streaming: bool
    lookahead: int

    @property
    def new_tokens(self) -> int:
        """Tokens whose frames this call emits: ``n_tokens - lookahead - token_offset``."""
        return self.n_tokens - self.lookahead - self.token_offset

    def new_frames(self, token_mel_ratio: int = 2) -> int:
        """Mel frames this call adds (``token_mel_ratio`` per new token; sheet §2)."""
        return self.new_tokens * token_mel_ratio


class TokenHopSchedule:
    """The official v2 chunking of one request, fed as tokens arrive (sheet §7.2).

    Args:
        n_prompt_tokens: flow prompt tokens P (0 without a prompt); the first hop is padded by
            ``ceil(P / hop) * hop - P``.
        constants: :class:`StreamConstants`.

    Call :meth:`next_call` whenever more tokens exist (it returns the next chunk's
    :class:`FlowCall` or None while fewer than ``hop + lookahead`` new tokens are there; call it
    again until None, since several chunks may be ready), then :meth:`final_call` once the LLM
    has ended. Not thread-safe.

    Raises:
        InputError: a negative ``n_prompt_tokens``.
    """

    def __init__(self, n_prompt_tokens: int = 0, constants: StreamConstants = StreamConstants()):
        if n_prompt_tokens < 0:
            raise InputError(f"n_prompt_tokens must be >= 0, got {n_prompt_tokens}")
        self.constants = constants
        hop = constants.token_hop_len
        self.prompt_pad = math.ceil(n_prompt_tokens / hop) * hop - n_prompt_tokens
        self.token_offset = 0
        self.hop = hop
        self.tokens_given = 0
        self.finished = False

    def current_hop(self) -> int:
        """Tokens the next chunk emits (the first hop includes the prompt padding)."""
        return self.hop + self.prompt_pad if self.token_offset == 0 else self.hop

    def next_call(self, n_available: int) -> FlowCall | None:
        """The next streaming chunk if ``n_available`` tokens suffice, else None.

        Raises:
            InputError: after :meth:`final_call`, or fewer tokens than a previous call saw.
        """
        self._check(n_available)
        hop, c = self.current_hop(), self.constants
        if n_available - self.token_offset < hop + c.pre_lookahead_len:
            return None
        call = FlowCall(self.token_offset, self.token_offset + hop + c.pre_lookahead_len,
                        finalize=False, streaming=True, lookahead=c.pre_lookahead_len)
        self.token_offset += hop
        self.tokens_given = call.n_tokens
        self.hop = min(c.token_max_hop_len, self.hop * c.stream_scale_factor)
        return call

    def final_call(self, n_total: int) -> FlowCall:
        """The last call over all ``n_total`` tokens (``finalize``, full attention).

        Raises:
            InputError: no tokens at all, fewer tokens than already given to the flow, or a
                second final call.
        """
        self._check(n_total)
        if n_total <= self.token_offset:
            raise InputError(f"no speech tokens after token {self.token_offset} for the final "
                             f"call ({n_total} in total)")
        self.finished = True
        return FlowCall(self.token_offset, n_total, finalize=True, streaming=False, lookahead=0)

    def _check(self, n: int) -> None:
        if self.finished:
            raise InputError("the stream's final call was already made")
        if n < self.tokens_given:
            raise InputError(f"{n} tokens, but the flow was already given {self.tokens_given}")


def hop_schedule(n_tokens: int, n_prompt_tokens: int = 0,
                 constants: StreamConstants = StreamConstants()) -> list[FlowCall]:
    """Every :class:`FlowCall` of a request whose ``n_tokens`` generated tokens are all known
    (the chunking depends only on token counts, not on timing; sheet §7.2).

    Raises:
        InputError: ``n_tokens < 1`` or a negative ``n_prompt_tokens``.
    """
    if n_tokens < 1:
        raise InputError(f"a stream needs at least one speech token, got {n_tokens}")
    schedule = TokenHopSchedule(n_prompt_tokens, constants)
    calls = []
    while (call := schedule.next_call(n_tokens)) is not None:
        calls.append(call)
    calls.append(schedule.final_call(n_tokens))
    return calls


def vocoder_frames(calls: list[FlowCall], constants: StreamConstants = StreamConstants()
                   ) -> list[int]:
    """Mel frames the vocoder decodes per call: the new frames plus the ``mel_cache_len`` cached
    ones on every call after the first (its NSF source has ``hop_length`` times as many
    samples; sheet §7.3)."""
    return [call.new_frames(constants.token_mel_ratio) + (constants.mel_cache_len if i else 0)
            for i, call in enumerate(calls)]


def emitted_samples(calls: list[FlowCall], constants: StreamConstants = StreamConstants(),
                    hop_length: int = 480) -> list[int]:
    """Output samples each call emits: all decoded samples less the ``source_cache_len`` held
    back by a non-final call (sheet §7.3). They sum to ``hop_length`` × all new frames."""
    held = constants.source_cache_len
    return [hop_length * n - (0 if call.finalize else held)
            for call, n in zip(calls, vocoder_frames(calls, constants))]


class Vocoder(Protocol):
    """The three vocoder stages on numpy arrays (float32), e.g. the torch HiFT stages.

    ``hop_length`` (samples per mel frame) and ``nb_harmonics`` size the NSF noise;
    ``f0(mel [1, 80, T]) -> [1, T]``, ``source(f0, noise [1, H, hop T]) -> [1, 1, hop T]``,
    ``decode(mel, source) -> [1, hop T]``.
    """

    hop_length: int
    nb_harmonics: int

    def f0(self, mel: np.ndarray) -> np.ndarray: ...

    def source(self, f0: np.ndarray, noise: np.ndarray) -> np.ndarray: ...

    def decode(self, mel: np.ndarray, source: np.ndarray) -> np.ndarray: ...


class VocoderStream:
    """The vocoder half of the official v2 stream for one utterance (upstream ``token2wav``
    after the flow, with ``hift_cache_dict[uuid]``; sheet §7.3).

    Args:
        vocoder: the HiFT stages (:class:`Vocoder`).
        constants: :class:`StreamConstants` (``source_cache_len`` must equal
            ``mel_cache_len * vocoder.hop_length``: the overwrite covers the cached frames).

    Raises:
        InputError: constants that do not fit the vocoder's hop.

    Call :meth:`hop` once per :class:`FlowCall`, in order, with that call's new mel frames.
    Not thread-safe.
    """

    def __init__(self, vocoder: Vocoder, constants: StreamConstants = StreamConstants()):
        self.vocoder = vocoder
        self.constants = constants
        self.hop_length = int(vocoder.hop_length)
        if constants.source_cache_len != constants.mel_cache_len * self.hop_length:
            raise InputError(f"source_cache_len {constants.source_cache_len} must be "
                             f"mel_cache_len {constants.mel_cache_len} x the vocoder's "
                             f"{self.hop_length} samples per frame")
        self.speech_window = np.hamming(2 * constants.source_cache_len)
        self.cache: dict[str, np.ndarray] | None = None
        self.finished = False

    def vocoder_mel(self, new_mel: np.ndarray) -> np.ndarray:
        """The mel the next :meth:`hop` decodes: the cached frames, then ``new_mel``
        (float32 [1, 80, C + M])."""
        mel = np.asarray(new_mel, np.float32)
        if mel.ndim != 3 or mel.shape[0] != 1:
            raise InputError(f"new mel must be [1, n_mels, frames], got {mel.shape}")
        if self.cache is not None:
            mel = np.concatenate([self.cache["mel"], mel], axis=-1)
        return np.ascontiguousarray(mel)

    def hop(self, new_mel: np.ndarray, finalize: bool, source: np.ndarray | None = None,
            rng: np.random.Generator | None = None) -> np.ndarray:
        """Vocode one call's new frames and return the samples it emits (float32 [n], 24 kHz).

        Args:
            new_mel: float32 [1, 80, M], the flow's frames from ``2 * token_offset`` on.
            finalize: the call's ``finalize`` (the last call emits everything left).
            source: float32 [1, 1, hop (C + M)], the NSF source BEFORE the cache overwrites its
                first ``source_cache_len`` samples (C = cached frames); None draws it: f0 of
                the whole vocoder mel, noise from ``rng``.
            rng: numpy generator for the NSF noise when ``source`` is None.

        Raises:
            InputError: after the final hop; a mel of the wrong rank or without frames; a
                non-final mel shorter than the cache; a source of the wrong size; neither
                ``source`` nor ``rng``.
        """
        if self.finished:
            raise InputError("the stream has already been finalized")
        c = self.constants
        mel = self.vocoder_mel(new_mel)
        n = mel.shape[-1]
        if n == (0 if self.cache is None else c.mel_cache_len):
            raise InputError("a vocoder hop needs at least one new mel frame")
        if not finalize and n < c.mel_cache_len:
            raise InputError(f"a non-final hop needs at least {c.mel_cache_len} mel frames "
                             f"(the next cache), got {n}")
        if source is None:
            if rng is None:
                raise InputError("hop needs a source or an rng to draw it")
            noise = draw_sine_noise(rng, n, self.vocoder.nb_harmonics, self.hop_length)
            source = self.vocoder.source(self.vocoder.f0(mel), noise)
        s = np.array(source, dtype=np.float32, copy=True)
        if s.shape != (1, 1, self.hop_length * n):
            raise InputError(f"vocoder source has shape {s.shape}, expected "
                             f"(1, 1, {self.hop_length * n}) for {n} mel frames")
        if self.cache is not None:  # the re-vocoded frames keep the previous excitation
            s[..., :c.source_cache_len] = self.cache["source"]
        speech = np.asarray(self.vocoder.decode(mel, s), np.float32).reshape(1, -1)
        if self.cache is not None:
            speech = fade_in_out(speech, self.cache["speech"], self.speech_window)
        if finalize:
            self.finished, self.cache = True, None
            return speech.reshape(-1)
        self.cache = {"mel": np.ascontiguousarray(mel[..., -c.mel_cache_len:]),
                      "source": np.ascontiguousarray(s[..., -c.source_cache_len:]),
                      "speech": np.ascontiguousarray(speech[:, -c.source_cache_len:])}
        return np.ascontiguousarray(speech[0, :-c.source_cache_len])
