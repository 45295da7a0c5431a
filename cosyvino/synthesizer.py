"""The public synthesis API: text + voice -> audio, whole or streamed per text segment.

``Synthesizer`` loads a model on a backend and runs :class:`cosyvino.request.SynthesisRequest` s
on the engine (:mod:`cosyvino.engine`): in the caller's thread (``synthesize`` / ``stream``) or
on worker threads (``submit``, what the server uses). Deterministic for a given ``seed``: the
engine's random draws are indexed by seed and position, so whole, streamed and scheduled runs
give the same audio. Not torch-dependent itself; the backend decides.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from .audio import Audio
from .engine import Engine, RequestHandle, Scheduler
from .errors import BackendError, InputError, ModelDirError
from .families import get_family
from .plugins import get_backend
from .request import SynthesisRequest
from .timing import StageTimes, audio_stats
from .voices import Voice


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
    """CosyVoice text-to-speech on one backend.

    Args:
        model_dir: an official-layout model directory (CosyVoice-300M-SFT download or a
            ``cosyvino make-model`` output) or a converted one. None = the embedded default
            (``cosyvino.defaults.default_model_dir()``), which must exist already: the CLI
            (``cosyvino demo``/``serve``/``synth`` without ``--model-dir``) creates the synthetic
            default, loudly; the library never writes 1.7 GB behind a caller's back.
        backend: backend plugin name (``cosyvino backends`` lists them; ``"torch"`` built in).
        num_threads: CPU threads for the backend (None = backend default).
        max_parallel: how many requests may run steps at once on this one loaded model (from
            different threads; each request has its own LLM session). Values > 1 need a backend
            whose stages are thread-safe per call (``Stages.thread_safe``); default 1
            serializes steps.
        **backend_options: passed to the backend's ``load``.

    Raises:
        ModelDirError / ConfigError / CheckpointError: bad (or, for None, absent) model dir.
        BackendError: unknown or unusable backend.
    """

    def __init__(self, model_dir: str | None = None, backend: str = "torch", *,
                 num_threads: int | None = None, max_parallel: int = 1, **backend_options):
        if model_dir is None:
            model_dir = _existing_default_model()
        self.model_dir = str(model_dir)
        self.backend_name = backend
        backend_cls = get_backend(backend)
        start = time.perf_counter()
        stages = backend_cls.load(self.model_dir, num_threads=num_threads, **backend_options)
        self.load_seconds = time.perf_counter() - start
        self._attach(stages, max_parallel)

    @classmethod
    def from_stages(cls, stages, *, backend_name: str = "custom", model_dir: str | None = None,
                    max_parallel: int = 1) -> "Synthesizer":
        """A Synthesizer around already loaded ``stages`` (a family's
        :class:`cosyvino.backends.Stages` subclass), e.g. a wrapper that records or times
        stage calls. Raises as :meth:`set_max_parallel`."""
        self = cls.__new__(cls)
        self.model_dir = model_dir
        self.backend_name = backend_name
        self.load_seconds = 0.0
        self._attach(stages, max_parallel)
        return self

    def _attach(self, stages, max_parallel: int) -> None:
        self.stages = stages
        self.config = stages.config
        self.family = get_family(getattr(stages, "family", "") or "cosyvoice1")
        self.frontend = self.family.make_frontend(self.config)
        self.pipeline = self.family.pipeline(stages)
        self.voices: dict[str, Voice] = {}
        self._scheduler: Scheduler | None = None
        self._scheduler_lock = threading.Lock()
        self.set_max_parallel(max_parallel)

    def set_max_parallel(self, n: int) -> None:
        """Allow ``n`` requests to run steps at once on this model (see ``max_parallel``). Call
        it while no synthesis is running.

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
        # Guards the engine steps: a plain lock (n = 1) or a bounded semaphore.
        self._lock = threading.Lock() if n == 1 else threading.BoundedSemaphore(n)
        self.engine = Engine(self.stages, self.family, self.frontend, lock=self._lock,
                             voices=self.voices)
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.close()
            self._scheduler = None

    # ---- properties --------------------------------------------------------------------------
    @property
    def speakers(self) -> list[str]:
        """Speaker ids of the model (``spk2info.pt``)."""
        return list(self.stages.speakers)

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (22050 for CosyVoice v1)."""
        return self.config.sample_rate

    @property
    def modes(self) -> list[str]:
        """Synthesis modes of the model's family (CosyVoice v1 today: ``sft``)."""
        return list(self.family.modes)

    # ---- synthesis ---------------------------------------------------------------------------
    def request(self, text: str, speaker, *, speed: float = 1.0, seed: int | None = None,
                num_speech_tokens: int | None = None, **mode_inputs) -> SynthesisRequest:
        """The :class:`SynthesisRequest` that :meth:`stream` / :meth:`synthesize` run;
        ``mode_inputs``: ``mode``, ``prompt_text``, ``prompt_audio``, ``instruction`` (see
        :class:`SynthesisRequest`). Raises TypeError for another keyword."""
        return SynthesisRequest(text=text, voice=speaker, speed=speed, seed=seed,
                                num_speech_tokens=num_speech_tokens, **mode_inputs)

    def stream(self, text: str | SynthesisRequest, speaker: str | Voice | None = None, *,
               speed: float = 1.0, seed: int | None = None,
               num_speech_tokens: int | None = None,
               cancel: threading.Event | None = None, **mode_inputs) -> SegmentStream:
        """Yield one :class:`Audio` per text segment, as soon as it is synthesized (in this
        thread, while iterating).

        Args:
            text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through),
                or a whole :class:`SynthesisRequest` (the other arguments are then ignored).
            speaker: a speaker id from :attr:`speakers` (or a :class:`Voice`).
            speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
            seed: makes the output reproducible (None = random; the seed used is in
                ``Audio.stats["seed"]``).
            num_speech_tokens: force exactly this many speech tokens per segment (50 tokens =
                1 s; benchmarks).
            cancel: when set (from another thread), synthesis stops before the next step (the
                next speech token) and the iterator raises
                :class:`~cosyvino.errors.SynthesisCancelled`.
            **mode_inputs: ``mode`` (default: the family's first, v1 ``sft``; :attr:`modes`),
                ``prompt_text``, ``prompt_audio``, ``instruction`` as the mode needs them.

        Raises (at the call, before anything runs):
            EmptyTextError: nothing speakable in ``text``.
            UnknownSpeakerError: ``speaker`` unknown (message lists valid ones).
            InputError: bad speed / seed / num_speech_tokens / text type.
        """
        req = text if isinstance(text, SynthesisRequest) else self.request(
            text, speaker, speed=speed, seed=seed, num_speech_tokens=num_speech_tokens,
            **mode_inputs)
        state = self.engine.start(req, cancel)
        return SegmentStream(self.engine.run(state), state.total_segments)

    def synthesize(self, text: str | SynthesisRequest, speaker: str | Voice | None = None, *,
                   speed: float = 1.0, seed: int | None = None,
                   num_speech_tokens: int | None = None,
                   on_segment: Callable[[int, int], None] | None = None,
                   **mode_inputs) -> Audio:
        """Synthesize the whole text; segments are concatenated. Same arguments and errors as
        :meth:`stream`; ``on_segment(done, total)`` is called after each segment (progress).
        ``Audio.stats`` has per-stage seconds, RTF, first-segment latency and the seed."""
        start = time.perf_counter()
        chunks: list[Audio] = []
        first_latency = None
        stream = self.stream(text, speaker, speed=speed, seed=seed,
                             num_speech_tokens=num_speech_tokens, **mode_inputs)
        for chunk in stream:
            if first_latency is None:
                first_latency = time.perf_counter() - start
            chunks.append(chunk)
            if on_segment is not None:
                on_segment(len(chunks), stream.total)
        return self._join(chunks, time.perf_counter() - start, first_latency)

    def submit(self, request: SynthesisRequest, *, cancel: threading.Event | None = None,
               callback: Callable | None = None) -> RequestHandle:
        """Run ``request`` on this model's scheduler (``max_parallel`` worker threads, steps
        of concurrent requests interleaved); returns at once with a
        :class:`~cosyvino.engine.RequestHandle` (iterate it, or pass ``callback``).

        Raises (here, before anything runs): the errors of :meth:`stream`.
        """
        with self._scheduler_lock:
            if self._scheduler is None:
                self._scheduler = Scheduler([self.engine] * self.max_parallel)
            scheduler = self._scheduler
        return scheduler.submit(request, cancel=cancel, callback=callback)

    def tokens_to_audio(self, speech_tokens: Sequence[int], speaker: str, *, speed: float = 1.0,
                        seed: int | None = None) -> Audio:
        """Vocode given speech tokens (ids 0..4095) with ``speaker``'s flow embedding
        (token-to-wav; skips the LLM). Raises InputError for tokens that are not a non-empty
        1-D integer sequence within the vocabulary, UnknownSpeakerError, bad speed/seed."""
        tokens = np.asarray(speech_tokens)
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise InputError("speech_tokens must be a non-empty 1-D sequence of integers")
        req = SynthesisRequest(voice=speaker, speed=speed, seed=seed, speech_tokens=tokens)
        start = time.perf_counter()
        chunks = list(self.stream(req))
        audio = chunks[0]
        audio.stats = {**audio_stats(_times_of(chunks), audio.duration,
                                time.perf_counter() - start, int(tokens.size)),
                       "seed": audio.stats.get("seed")}
        return audio

    def _join(self, chunks: list[Audio], wall: float, first_latency: float | None) -> Audio:
        samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0,
                                                                                      np.float32)
        tokens = (np.concatenate([c.speech_tokens for c in chunks]) if chunks
                  else np.zeros(0, np.int64))
        audio = Audio(samples.astype(np.float32), self.sample_rate, tokens)
        audio.stats = audio_stats(_times_of(chunks), audio.duration, wall, int(tokens.size))
        audio.stats["segments"] = len(chunks)
        audio.stats["first_segment_latency"] = (round(first_latency, 4)
                                                if first_latency is not None else None)
        if chunks:
            audio.stats["seed"] = chunks[0].stats.get("seed")
        return audio

    def close(self) -> None:
        """Stop the scheduler's workers (if any) and release the backend."""
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None
        self.stages.close()

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


def _times_of(chunks: list[Audio]) -> StageTimes:
    times = StageTimes()
    for c in chunks:
        for name, v in c.stats["stages"].items():
            times.seconds[name] += v["seconds"]
            times.calls[name] += v["calls"]
    return times


def _existing_default_model() -> str:
    """The embedded default model dir when it holds a model; else ModelDirError saying how to
    create it (the library does not write the synthetic default itself)."""
    from .defaults import default_model_dir

    path = default_model_dir()
    if os.path.isfile(os.path.join(path, "cosyvoice.yaml")):
        return path
    raise ModelDirError(
        f"no model_dir given and no model at the default location {path}; pass the directory "
        "of a CosyVoice checkpoint (e.g. CosyVoice-300M-SFT), or create the SYNTHETIC default "
        "(random weights, ~1.7 GB) with `cosyvino make-model --preset 300m " + path + "` or by "
        "running `cosyvino demo` once", path)
