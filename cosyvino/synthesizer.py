"""The public synthesis API: text + speaker -> audio, whole or streamed per text segment.

``Synthesizer`` ties the text frontend, a backend's stages and the shared pipeline together.
Deterministic for a given ``seed`` (numpy Generator drives sampling, flow noise and the NSF
source). Not torch-dependent itself; the backend decides.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from .audio import Audio
from .errors import InputError, UnknownSpeakerError
from .frontend import TextFrontend
from .pipeline import Pipeline, linear_resize_time  # noqa: F401  (re-export for users)
from .plugins import get_backend
from .timing import StageTimes

MIN_SPEED, MAX_SPEED = 0.25, 4.0


def _stats(times: StageTimes, audio_seconds: float, wall: float, n_tokens: int) -> dict:
    return {
        "stages": times.as_dict(),
        "speech_tokens": n_tokens,
        "audio_seconds": round(audio_seconds, 4),
        "wall_seconds": round(wall, 4),
        "rtf": round(wall / audio_seconds, 4) if audio_seconds > 0 else None,
    }


class SegmentStream:
    """Iterator of per-segment :class:`Audio` returned by :meth:`Synthesizer.stream`;
    ``total`` is the number of text segments. ``close()`` stops early."""

    def __init__(self, gen: Iterator[Audio], total: int):
        self._gen = gen
        self.total = total

    def __iter__(self) -> "SegmentStream":
        return self

    def __next__(self) -> Audio:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


class Synthesizer:
    """CosyVoice v1 text-to-speech on one backend.

    Args:
        model_dir: an official-layout model directory (CosyVoice-300M-SFT download or a
            ``cosyvino make-model`` output). None = the embedded default (created on first use,
            synthetic).
        backend: backend plugin name (``cosyvino backends`` lists them; ``"torch"`` built in).
        num_threads: CPU threads for the backend (None = backend default).
        **backend_options: passed to the backend's ``load``.

    Raises:
        ModelDirError / ConfigError / CheckpointError: bad model directory.
        BackendError: unknown or unusable backend.
    """

    def __init__(self, model_dir: str | None = None, backend: str = "torch", *,
                 num_threads: int | None = None, **backend_options):
        if model_dir is None:
            from .defaults import ensure_default_model
            model_dir = ensure_default_model()
        self.model_dir = str(model_dir)
        self.backend_name = backend
        backend_cls = get_backend(backend)
        start = time.perf_counter()
        self.stages = backend_cls.load(self.model_dir, num_threads=num_threads,
                                       **backend_options)
        self.load_seconds = time.perf_counter() - start
        self.config = self.stages.config
        self.pipeline = Pipeline(self.stages)
        self.frontend = TextFrontend()
        self._lock = threading.Lock()

    # ---- properties --------------------------------------------------------------------------
    @property
    def speakers(self) -> list[str]:
        """Speaker ids of the model (``spk2info.pt``)."""
        return list(self.stages.speakers)

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (22050 for CosyVoice v1)."""
        return self.config.sample_rate

    # ---- validation --------------------------------------------------------------------------
    def _embedding(self, speaker: str) -> np.ndarray:
        if not isinstance(speaker, str) or speaker not in self.stages.speakers:
            raise UnknownSpeakerError(str(speaker), self.stages.speakers)
        return self.stages.speakers[speaker]

    @staticmethod
    def _check_speed(speed: float) -> float:
        try:
            speed = float(speed)
        except (TypeError, ValueError):
            raise InputError(f"speed must be a number, got {speed!r}") from None
        if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
            raise InputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        return speed

    @staticmethod
    def _rng(seed: int | None) -> np.random.Generator:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int,
                                                                                  np.integer))
                                 or seed < 0):
            raise InputError(f"seed must be a non-negative integer or None, got {seed!r}")
        return np.random.default_rng(seed)

    # ---- synthesis ---------------------------------------------------------------------------
    def stream(self, text: str, speaker: str, *, speed: float = 1.0, seed: int | None = None,
               num_speech_tokens: int | None = None) -> SegmentStream:
        """Yield one :class:`Audio` per text segment, as soon as it is synthesized.

        Args:
            text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through).
            speaker: a speaker id from :attr:`speakers`.
            speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
            seed: makes the output reproducible (None = random).
            num_speech_tokens: force exactly this many speech tokens per segment (50 tokens =
                1 s; benchmarks).

        Raises:
            EmptyTextError: nothing speakable in ``text``.
            UnknownSpeakerError: ``speaker`` unknown (message lists valid ones).
            InputError: bad speed / seed / num_speech_tokens / text type.
        """
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        embedding = self._embedding(speaker)
        speed = self._check_speed(speed)
        if num_speech_tokens is not None and (not isinstance(num_speech_tokens, int)
                                              or num_speech_tokens < 1):
            raise InputError(f"num_speech_tokens must be a positive integer, got "
                             f"{num_speech_tokens!r}")
        rng = self._rng(seed)
        segments = self.frontend.segments(text)  # raises EmptyTextError
        return SegmentStream(self._run_segments(segments, embedding, rng, speed,
                                                num_speech_tokens), len(segments))

    def _run_segments(self, segments, embedding, rng, speed, num_tokens) -> Iterator[Audio]:
        for seg in segments:
            times = StageTimes()
            start = time.perf_counter()
            with self._lock:
                wav, tokens = self.pipeline.segment_to_wav(
                    seg.token_ids, embedding, rng, speed=speed, num_tokens=num_tokens,
                    times=times)
            wall = time.perf_counter() - start
            audio = Audio(wav, self.sample_rate, tokens, {})
            audio.stats = _stats(times, audio.duration, wall, int(tokens.size))
            audio.stats["text"] = seg.text
            yield audio

    def synthesize(self, text: str, speaker: str, *, speed: float = 1.0,
                   seed: int | None = None, num_speech_tokens: int | None = None,
                   on_segment: Callable[[int, int], None] | None = None) -> Audio:
        """Synthesize the whole text; segments are concatenated. Same arguments and errors as
        :meth:`stream`; ``on_segment(done, total)`` is called after each segment (progress).
        ``Audio.stats`` has per-stage seconds, RTF and first-segment latency."""
        start = time.perf_counter()
        chunks: list[Audio] = []
        first_latency = None
        stream = self.stream(text, speaker, speed=speed, seed=seed,
                             num_speech_tokens=num_speech_tokens)
        for chunk in stream:
            if first_latency is None:
                first_latency = time.perf_counter() - start
            chunks.append(chunk)
            if on_segment is not None:
                on_segment(len(chunks), stream.total)
        return self._join(chunks, time.perf_counter() - start, first_latency)

    def tokens_to_audio(self, speech_tokens: Sequence[int], speaker: str, *, speed: float = 1.0,
                        seed: int | None = None) -> Audio:
        """Vocode given speech tokens (ids 0..4095) with ``speaker``'s flow embedding
        (token-to-wav; skips the LLM)."""
        tokens = np.asarray(speech_tokens)
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise InputError("speech_tokens must be a non-empty 1-D sequence of integers")
        vocab = self.config.flow.vocab_size
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise InputError(f"speech tokens must be in [0, {vocab - 1}]")
        embedding = self._embedding(speaker)
        speed = self._check_speed(speed)
        rng = self._rng(seed)
        times = StageTimes()
        start = time.perf_counter()
        with self._lock:
            wav, _ = self.pipeline.segment_to_wav([], embedding, rng, speed=speed,
                                                  speech_tokens=tokens.astype(np.int64),
                                                  times=times)
        wall = time.perf_counter() - start
        audio = Audio(wav, self.sample_rate, tokens.astype(np.int64))
        audio.stats = _stats(times, audio.duration, wall, int(tokens.size))
        return audio

    def _join(self, chunks: list[Audio], wall: float, first_latency: float | None) -> Audio:
        samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0,
                                                                                      np.float32)
        tokens = (np.concatenate([c.speech_tokens for c in chunks]) if chunks
                  else np.zeros(0, np.int64))
        times = StageTimes()
        for c in chunks:
            for name, v in c.stats["stages"].items():
                times.seconds[name] += v["seconds"]
                times.calls[name] += v["calls"]
        audio = Audio(samples.astype(np.float32), self.sample_rate, tokens)
        audio.stats = _stats(times, audio.duration, wall, int(tokens.size))
        audio.stats["segments"] = len(chunks)
        audio.stats["first_segment_latency"] = (round(first_latency, 4)
                                                if first_latency is not None else None)
        return audio
