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
from .backends.base import LLMSession
from .errors import BackendError, InputError, SynthesisCancelled, UnknownSpeakerError
from .frontend import TextFrontend
from cosyvino.families.cosyvoice1.pipeline import Pipeline, linear_resize_time  # noqa: F401  (re-export for users)
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


class _CancellableSession(LLMSession):
    """Wraps a backend LLM session; raises SynthesisCancelled at the next token once
    ``cancel`` is set (so a cancelled request stops mid-segment, not after it)."""

    def __init__(self, inner: LLMSession, cancel: threading.Event):
        self._inner = inner
        self._cancel = cancel

    def forward(self, inputs_embeds: np.ndarray) -> np.ndarray:
        if self._cancel.is_set():
            raise SynthesisCancelled("synthesis cancelled")
        return self._inner.forward(inputs_embeds)

    def reset(self) -> None:
        self._inner.reset()

    def close(self) -> None:
        self._inner.close()


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
        max_parallel: how many segments may run at once on this one loaded model (from
            different threads; each call has its own LLM session). Values > 1 need a backend
            whose stages are thread-safe per call (``Stages.thread_safe``); default 1
            serializes segments.
        **backend_options: passed to the backend's ``load``.

    Raises:
        ModelDirError / ConfigError / CheckpointError: bad model directory.
        BackendError: unknown or unusable backend.
    """

    def __init__(self, model_dir: str | None = None, backend: str = "torch", *,
                 num_threads: int | None = None, max_parallel: int = 1, **backend_options):
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
        self.set_max_parallel(max_parallel)

    def set_max_parallel(self, n: int) -> None:
        """Allow ``n`` segments to run at once on this model (see ``max_parallel``). Call it
        while no synthesis is running.

        Raises:
            InputError: ``n`` is not a positive integer.
            BackendError: ``n > 1`` on a backend whose stages are not thread-safe.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"max_parallel must be a positive integer, got {n!r}")
        if n > 1 and not getattr(self.stages, "thread_safe", False):
            raise BackendError(f"backend {self.backend_name!r} is not thread-safe per call; "
                               "use one Synthesizer per worker (max_parallel=1)")
        self.max_parallel = n
        # Guards the stage calls: a plain lock (n = 1) or a bounded semaphore.
        self._lock = threading.Lock() if n == 1 else threading.BoundedSemaphore(n)

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
               num_speech_tokens: int | None = None,
               cancel: threading.Event | None = None) -> SegmentStream:
        """Yield one :class:`Audio` per text segment, as soon as it is synthesized.

        Args:
            text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through).
            speaker: a speaker id from :attr:`speakers`.
            speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
            seed: makes the output reproducible (None = random).
            num_speech_tokens: force exactly this many speech tokens per segment (50 tokens =
                1 s; benchmarks).
            cancel: when set (from another thread), synthesis stops at the next speech token
                and the iterator raises :class:`~cosyvino.errors.SynthesisCancelled`.

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
                                                num_speech_tokens, cancel), len(segments))

    def _run_segments(self, segments, embedding, rng, speed, num_tokens,
                      cancel=None) -> Iterator[Audio]:
        for seg in segments:
            if cancel is not None and cancel.is_set():
                raise SynthesisCancelled("synthesis cancelled")
            times = StageTimes()
            start = time.perf_counter()
            session = (None if cancel is None
                       else _CancellableSession(self.stages.new_llm_session(), cancel))
            try:
                with self._lock:
                    wav, tokens = self.pipeline.segment_to_wav(
                        seg.token_ids, embedding, rng, speed=speed, num_tokens=num_tokens,
                        session=session, times=times)
            finally:
                if session is not None:
                    session.close()
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

    # ---- planner (issue 5): Synthesizer.auto ------------------------------------------------
    #: the :class:`cosyvino.planner.Plan` this instance was built from (``auto`` only)
    plan = None

    @classmethod
    def auto(cls, model_dir: str | None = None, plan=None, *,
             goal: str = "latency") -> "Synthesizer":
        """A Synthesizer configured by the deployment plan (backend, threads, streams,
        precision, pinning).

        Args:
            model_dir: as in the constructor (None = the plan's model, else the default).
            plan: a :class:`cosyvino.planner.Plan`, a plan file path, or None: look in
                ``$COSYVINO_PLAN``, ``./plan.toml``, ``<model_dir>/plan.toml``; if none is
                found, plan now for this machine (nothing is written; see ``cosyvino plan``).
            goal: "latency" or "throughput", used only when planning on the fly.

        Warns :class:`cosyvino.planner.auto.PlanMismatchWarning` when this machine no longer
        matches the plan's probe (CPU count, quota, ISA flags, memory). ``self.plan`` holds
        the plan used.

        Raises:
            cosyvino.planner.PlanError: unreadable plan file given; no usable backend; not
                enough memory. Plus the constructor's errors.
        """
        from .planner.auto import resolve_plan, synthesizer_from_plan

        resolved = resolve_plan(model_dir, plan, goal=goal)
        return synthesizer_from_plan(cls, model_dir, resolved)
