"""The public synthesis API: text + voice -> audio, whole or streamed in token-level chunks.

``Synthesizer`` loads a model on a backend and runs :class:`cosyvino.request.SynthesisRequest` s
on the engine (:mod:`cosyvino.engine`) on its scheduler's worker threads (``synthesize``,
``stream``, ``submit``; the server uses the latter). Deterministic for a given ``seed``: the
engine's random draws are indexed by seed and position, so whole, streamed and scheduled runs
give the same audio. Not torch-dependent itself; the backend decides.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .audio import Audio, join_chunks
from .engine import CallRendezvous, Engine, RequestHandle, Scheduler
from .errors import (BackendError, InputError, ModelDirError, SynthesisCancelled,
                     UnknownSpeakerError)
from .families import get_family
from .plugins import get_backend
from .request import StreamingOptions, SynthesisRequest
from .text_stream import DEFAULT_MAX_PENDING_TOKENS, FLUSH, TextStream, feed
from .timing import StageTimes, audio_stats
from .voice_store import VoiceStore
from .voices import Voice


class ChunkStream:
    """Iterator of the :class:`Audio` chunks of one request, returned by
    :meth:`Synthesizer.stream`. Each chunk's ``stats`` has ``segment`` / ``chunk`` (0-based),
    ``is_last_in_segment``, the stage seconds, RTF and the seed. ``total`` is the number of text
    segments. ``close()`` (or leaving a ``with`` block) cancels what is still running."""

    def __init__(self, handle: RequestHandle):
        self._handle = handle
        self.total = handle.total
        self.seed = handle.state.request.seed

    def __iter__(self) -> "ChunkStream":
        return self

    def __next__(self) -> Audio:
        return next(self._handle)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "ChunkStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # an abandoned stream must not keep the workers busy
        try:
            self._handle.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _check_flag(value, name: str) -> None:
    """InputError unless ``value`` is a bool (a truthy string such as "no" must not pass)."""
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, got {value!r}")


def _check_llm_batch(n, name: str = "llm_batch") -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"{name} must be a positive integer, got {n!r}")


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
        overlap_stages: on thread-safe stages, run a request's lanes at the same time (v1:
            the LLM decodes the next tokens while the flow/vocoder turn the due hop into
            audio; one extra worker thread). False runs them one after the other (same audio).
        first_chunk_hold: while a :meth:`submit` request makes its first chunk, the steps of
            requests that already stream wait (:class:`cosyvino.engine.Scheduler`
            ``first_chunk_hold``; same audio either way). True (default): time to first audio
            under load; False: they share the cores with it.
        llm_batch: most LLM decode steps of concurrent :meth:`submit` requests one backend call
            runs (continuous batching; capped at the stages' ``max_llm_batch``). 1 (default) = off: each
            request decodes in its own session. A request's tokens and audio are the same for
            its seed either way (docs/architecture.md, "Batching across requests").
        estimator_batch: most concurrent :meth:`submit` requests whose CFM estimator calls
            run as one backend call (batch 2N; capped at the stages' ``max_estimator_batch``;
            only with ``max_parallel`` >= 2, when requests' flow hops can run at the same
            time). Only hops of equal length combine: the same number of mel frames, e.g. the
            same streaming hop of two requests without prompt audio, or two segments of the
            same speech-token count. 1 (default) = off. Same audio per seed either way (the
            rows are independent; tested to 1e-4). :attr:`estimator_batch_stats` counts it.
        voices_dir: where registered voices are kept (:mod:`cosyvino.voice_store`; one file
            per voice, read at start and whenever another process changes it). None (default):
            ``<model_dir>/voices`` (created on the first :meth:`add_voice`); give a writable
            directory when the model dir is read-only, or one shared by several model dirs of
            the same family. False: in memory only (lost on close).
        prompt_backend: the backend that runs the prompt models (``campplus.onnx``,
            ``speech_tokenizer_v1.onnx``) for ``prompt_audio`` / ``source_audio`` /
            :meth:`add_voice`; None: this backend when it runs ONNX files, else OpenVINO, else
            ONNX Runtime. Loaded on first use.
        prompt_encoder: an already built prompt encoder to share (e.g. :attr:`prompt_encoder`
            of another Synthesizer of the same model dir: the full-size speech tokenizer is
            ~0.5 GB per copy); None: this Synthesizer's own (``prompt_backend``).
        modes: the mode names to offer, overriding what the family reads from the checkpoint
            (v1: ``instruct`` only for a dir named ``*-Instruct``, like the official runtime;
            e.g. ``modes=["instruct", "sft"]`` for a renamed Instruct dir).
        **backend_options: passed to the backend's ``load``.

    Raises:
        ModelDirError / ConfigError / CheckpointError: bad (or, for None, absent) model dir.
        BackendError: unknown or unusable backend.
        InputError: ``modes`` names a mode the family does not have; ``llm_batch`` or
            ``estimator_batch`` is not a positive integer; ``first_chunk_hold`` is not a bool.
    """

    def __init__(self, model_dir: str | None = None, backend: str = "torch", *,
                 num_threads: int | None = None, max_parallel: int = 1,
                 overlap_stages: bool = True, llm_batch: int = 1, estimator_batch: int = 1,
                 first_chunk_hold: bool = True,
                 voices_dir: str | os.PathLike | bool | None = None,
                 prompt_backend: str | None = None, modes: Sequence[str] | None = None,
                 prompt_encoder=None, **backend_options):
        _check_llm_batch(llm_batch)  # before the (slow) load
        _check_llm_batch(estimator_batch, "estimator_batch")
        _check_flag(first_chunk_hold, "first_chunk_hold")
        if model_dir is None:
            model_dir = _existing_default_model()
        self.model_dir = str(model_dir)
        self.backend_name = backend
        backend_cls = get_backend(backend)
        if prompt_backend is None and getattr(backend_cls, "runs_onnx", False):
            prompt_backend = backend
        start = time.perf_counter()
        stages = backend_cls.load(self.model_dir, num_threads=num_threads, **backend_options)
        self.load_seconds = time.perf_counter() - start
        self._attach(stages, max_parallel, overlap_stages, llm_batch=llm_batch,
                     estimator_batch=estimator_batch, voices_dir=voices_dir,
                     prompt_backend=prompt_backend, modes=modes, num_threads=num_threads,
                     prompt_encoder=prompt_encoder, first_chunk_hold=first_chunk_hold)

    @classmethod
    def from_stages(cls, stages, *, backend_name: str = "custom", model_dir: str | None = None,
                    max_parallel: int = 1, voices_dir: str | os.PathLike | bool | None = None,
                    prompt_backend: str | None = None, modes: Sequence[str] | None = None,
                    prompt_encoder=None, llm_batch: int = 1,
                    estimator_batch: int = 1, first_chunk_hold: bool = True) -> "Synthesizer":
        """A Synthesizer around already loaded ``stages`` (a family's
        :class:`cosyvino.backends.Stages` subclass), e.g. a wrapper that records or times
        stage calls; ``voices_dir`` / ``prompt_backend`` / ``modes`` / ``prompt_encoder`` /
        ``llm_batch`` / ``estimator_batch`` / ``first_chunk_hold`` as in the constructor
        (without ``model_dir``: voices in memory, no prompt models unless the family finds
        some). Raises as :meth:`set_max_parallel`."""
        self = cls.__new__(cls)
        self.model_dir = model_dir
        self.backend_name = backend_name
        self.load_seconds = 0.0
        self._attach(stages, max_parallel, llm_batch=llm_batch,
                     estimator_batch=estimator_batch, voices_dir=voices_dir,
                     prompt_backend=prompt_backend, modes=modes, prompt_encoder=prompt_encoder,
                     first_chunk_hold=first_chunk_hold)
        return self

    def _attach(self, stages, max_parallel: int, overlap_stages: bool = True, *,
                llm_batch: int = 1, estimator_batch: int = 1, voices_dir=None,
                prompt_backend: str | None = None, modes: Sequence[str] | None = None,
                num_threads: int | None = None, prompt_encoder=None,
                first_chunk_hold: bool = True) -> None:
        _check_llm_batch(llm_batch)
        _check_llm_batch(estimator_batch, "estimator_batch")
        self.stages = stages
        self.overlap_stages = bool(overlap_stages)
        _check_flag(first_chunk_hold, "first_chunk_hold")
        self.first_chunk_hold = first_chunk_hold
        self.llm_batch = llm_batch
        self.estimator_batch = estimator_batch
        self.config = stages.config
        self.family = get_family(getattr(stages, "family", "") or "cosyvoice1")
        self.frontend = self.family.make_frontend(self.config)
        self.pipeline = self.family.pipeline(stages)
        if modes is not None:
            modes = [modes] if isinstance(modes, str) else list(modes)
            unknown = [m for m in modes if m not in self.family.modes]
            if unknown or not modes:
                raise InputError(f"modes: {', '.join(map(repr, unknown)) or 'none given'}; "
                                 f"the {self.family.name} modes are "
                                 f"{', '.join(self.family.modes)}")
        self._mode_names = modes
        options = {} if num_threads is None else {"num_threads": num_threads}
        self._own_prompts = prompt_encoder is None
        self._prompts = prompt_encoder if prompt_encoder is not None else \
            self.family.prompt_encoder(self.model_dir, stages, backend=prompt_backend, **options)
        if voices_dir is None:
            voices_dir = (os.path.join(self.model_dir, "voices") if self.model_dir is not None
                          else None)
        elif voices_dir is False:
            voices_dir = None
        elif voices_dir is True:
            raise InputError("voices_dir must be a directory, None or False")
        self._store = VoiceStore(voices_dir, family=self.family.name,
                                 check=getattr(self._prompts, "check_voice", None),
                                 reserved=list(stages.speakers))
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
        # Thread-safe stages may run different lanes of a request (v1: the LLM and the
        # flow/vocoder hops) at the same time: one lock per lane instead of one for all.
        lane_locks = None
        if getattr(self.stages, "thread_safe", False):
            lane_locks = {lane: (threading.Lock() if n == 1 else threading.BoundedSemaphore(n))
                          for lane in self.family.lanes}
        self.engine = Engine(self.stages, self.family, self.frontend, lock=self._lock,
                             lane_locks=lane_locks, voices=self._store,
                             model_dir=self.model_dir, modes=self._mode_names,
                             prompts=self._prompts, batchers=self._batchers(n))
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.close()
            self._scheduler = None

    def _batchers(self, n: int) -> dict:
        """Stage name -> :class:`CallRendezvous` for the engine (``estimator_batch`` >= 2
        with ``n`` >= 2 parallel requests and stages that batch the stage), else {}."""
        if n < 2 or self.estimator_batch < 2 or not getattr(self.stages, "thread_safe", False):
            return {}
        fn, cap = self.family.batchable_stages(self.stages).get("estimator", (None, 1))
        cap = min(cap, self.estimator_batch)
        return {"estimator": CallRendezvous(fn, cap)} if cap >= 2 else {}

    @property
    def estimator_batch_stats(self) -> dict | None:
        """The estimator rendezvous' :meth:`~cosyvino.engine.rendezvous.CallRendezvous.stats`:
        calls (backend calls), member_calls (request calls served), mean_members,
        max_members, members (requests inside a flow solve now), occupancy (requests per
        call -> number of calls); None when estimator calls are not batched."""
        rv = self.engine.batchers.get("estimator")
        return None if rv is None else rv.stats()

    # ---- properties --------------------------------------------------------------------------
    @property
    def speakers(self) -> list[str]:
        """Speaker ids of the model (``spk2info.pt``)."""
        return list(self.stages.speakers)

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (22050 for CosyVoice v1, 24000 for CosyVoice2)."""
        return self.config.sample_rate

    @property
    def speech_token_rate(self) -> float | None:
        """Speech tokens per second of speech at speed 1 (50 for CosyVoice v1, 25 for
        CosyVoice2; :meth:`ModelFamily.speech_token_rate`); None when the family does not
        say."""
        return self.family.speech_token_rate(self.config)

    @property
    def modes(self) -> list[str]:
        """The synthesis modes this model offers, in matching order (a request without
        ``mode`` runs in the first that fits its inputs; CosyVoice v1: ``zero_shot``,
        ``cross_lingual``, ``vc`` on a base model with its prompt models, ``instruct`` on an
        Instruct model, ``sft`` where there are built-in speakers;
        :mod:`cosyvino.families.cosyvoice1.modes`)."""
        return list(self.engine.modes)

    # ---- voices ------------------------------------------------------------------------------
    @property
    def voices(self) -> dict[str, Voice]:
        """Every voice requests may name: built-in speakers, then registered voices (name ->
        :class:`Voice`; a snapshot)."""
        return self.engine.voices

    @property
    def registered_voices(self) -> list[str]:
        """Names of the registered voices (sorted)."""
        return list(self._store.snapshot())

    @property
    def prompt_encoder(self):
        """The family's prompt encoder (None: no voice cloning; v1:
        :class:`cosyvino.families.cosyvoice1.prompt_models.PromptEncoder`), loaded on first
        use; pass it to another Synthesizer to share it."""
        return self._prompts

    @property
    def voice_store(self) -> VoiceStore:
        """The :class:`~cosyvino.voice_store.VoiceStore` of the registered voices
        (``voice_store.directory``: where they are kept, None in memory;
        ``voice_store.skipped``: stored files that could not be used, and why)."""
        return self._store

    def voice(self, name: str) -> Voice:
        """The voice ``name`` (built-in or registered). Raises UnknownSpeakerError (the message
        lists the voices), CorruptVoiceError (its stored file is unusable)."""
        builtin = self.engine.builtin_voices
        if name in builtin:
            return builtin[name]
        try:
            return self._store[name]
        except KeyError:
            raise UnknownSpeakerError(str(name), list(builtin),
                                      self.registered_voices) from None

    def voice_info(self, name: str) -> dict:
        """JSON-ready description of voice ``name``: :meth:`Voice.describe` (``name``,
        ``builtin``, ``has_prompt``, ``prompt_text``, ``prompt_tokens``, ``prompt_seconds``,
        ``embedding_dim``), plus ``created`` and ``sha256`` for a registered voice. Raises as
        :meth:`voice`."""
        voice = self.voice(name)
        if voice.builtin:
            return voice.describe()
        return self._store.info(name)

    def prompt_voice(self, prompt_wav, prompt_text: str | None = None, *,
                     name: str = "<prompt>") -> Voice:
        """The prompt bundle of a recording (speaker embedding, prompt speech tokens, prompt
        mel, ``prompt_text``) without registering it; pass it as ``voice`` to any call.

        Args:
            prompt_wav: a path, the bytes of a file, a binary file object, ``(samples,
                sample_rate)`` or an :class:`Audio` (any common format, rate, channels;
                :mod:`cosyvino.prompt_audio`).
            prompt_text: its transcript (None: none; the voice then runs cross-lingual by
                default, zero-shot with a ``prompt_text`` given per request).

        Raises:
            PromptAudioError subclasses (InputError): not audio, empty, shorter than 1 s,
                longer than 30 s, silent, bad rate or samples.
            InputError: ``prompt_text`` not a string or empty; the model has no prompt models.
            ModelDirError: a prompt-model file is missing or unreadable.
            BackendError: the prompt models failed.
        """
        if prompt_text is not None and (not isinstance(prompt_text, str)
                                        or not prompt_text.strip()):
            raise InputError("prompt_text must be a non-empty string (or None)")
        if self._prompts is None:
            raise InputError("this model has no prompt models (voice cloning needs a model dir "
                             "with campplus.onnx and speech_tokenizer_v1.onnx)")
        return self._prompts.voice(prompt_wav, name=name, prompt_text=prompt_text)

    def add_voice(self, name: str, prompt_wav, prompt_text: str | None = None, *,
                  overwrite: bool = False) -> Voice:
        """Register a voice made from a recording, usable by ``name`` in every call like a
        built-in speaker (``voice=name``): a request naming no mode runs it zero-shot when it
        has a transcript (``prompt_text``), cross-lingual otherwise. The prompt bundle is
        computed once here and stored in :attr:`voice_store` (survives restarts; visible to
        other Synthesizers on the same directory). Safe while synthesis runs.

        Args:
            name: 1-64 letters (any script), digits, ``_``, ``-``, ``.``; starting with a
                letter or digit; not a built-in speaker's name.
            prompt_wav / prompt_text: as :meth:`prompt_voice`.
            overwrite: replace a registered voice of this name (names differing only in case
                count as the same).

        Returns: the registered :class:`Voice`.

        Raises:
            InvalidVoiceNameError / VoiceExistsError (InputError): bad or taken name.
            VoiceStoreError (ModelDirError): the store cannot be written (a read-only model
                dir: pass ``voices_dir=``).
            The errors of :meth:`prompt_voice`.
        """
        self._store.check_new(name, overwrite=overwrite)
        voice = self.prompt_voice(prompt_wav, prompt_text, name=name)
        return self._store.add(voice, overwrite=overwrite)

    def remove_voice(self, name: str) -> None:
        """Unregister voice ``name`` (its file is deleted). Raises UnknownVoiceError (not a
        registered voice; built-in speakers cannot be removed), VoiceStoreError."""
        if name in self.engine.builtin_voices:
            raise InputError(f"{name!r} is a built-in speaker of the model; only registered "
                             "voices can be removed")
        self._store.remove(name)

    # ---- synthesis ---------------------------------------------------------------------------
    def request(self, text: str, speaker, *, speed: float = 1.0, seed: int | None = None,
                num_speech_tokens: int | None = None, hop_schedule: str = "latency",
                n_timesteps: int | None = None, flow_streaming: str = "auto",
                final_hop: str = "official", vocoder_streaming: str = "auto",
                **mode_inputs) -> SynthesisRequest:
        """The :class:`SynthesisRequest` that :meth:`stream` / :meth:`synthesize` run;
        ``mode_inputs``: ``mode``, ``prompt_text``, ``prompt_audio``, ``source_audio``,
        ``instruction`` (see :class:`SynthesisRequest`); ``voice=`` is accepted as another
        name of ``speaker``; ``flow_streaming`` / ``final_hop`` / ``vocoder_streaming``: the
        :class:`StreamingOptions` of those names. Raises TypeError for another keyword, or for
        both names."""
        if "voice" in mode_inputs:
            if speaker is not None:
                raise TypeError("give speaker or voice, not both")
            speaker = mode_inputs.pop("voice")
        return SynthesisRequest(text=text, voice=speaker, speed=speed, seed=seed,
                                num_speech_tokens=num_speech_tokens, n_timesteps=n_timesteps,
                                streaming=StreamingOptions(
                                    hop_schedule, flow_streaming=flow_streaming,
                                    final_hop=final_hop, vocoder_streaming=vocoder_streaming),
                                **mode_inputs)

    def stream(self, text: str | SynthesisRequest = "",
               speaker: str | Voice | None = None, *, speed: float = 1.0, seed: int | None = None,
               num_speech_tokens: int | None = None, hop_schedule: str = "latency",
               n_timesteps: int | None = None, flow_streaming: str = "auto",
               final_hop: str = "official", vocoder_streaming: str = "auto",
               cancel: threading.Event | None = None, **mode_inputs) -> ChunkStream:
        """Yield audio chunks as soon as they are synthesized: several per text segment with
        the token-hop schedules (first audio after a few speech tokens), one per segment with
        ``hop_schedule="segment"``. Runs on this model's worker threads (the LLM and the
        flow/vocoder hops overlap on thread-safe backends); iterate the result.

        Args:
            text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through;
                empty for voice conversion), or a whole :class:`SynthesisRequest` (the other
                arguments are then ignored).
            speaker: a voice: a speaker id from :attr:`speakers`, a registered voice's name
                (:meth:`add_voice`), or a :class:`Voice` (e.g. :meth:`prompt_voice`); None
                with ``prompt_audio``.
            speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
            seed: makes the output reproducible (None = random; the seed used is in
                ``Audio.stats["seed"]``).
            num_speech_tokens: force exactly this many speech tokens per segment (50 tokens =
                1 s; benchmarks).
            hop_schedule: ``"latency"`` (default: small first hop that grows), ``"official"``
                (the official v1 token hops, parity), ``"segment"`` (one chunk per segment,
                the same audio as :meth:`synthesize`); :mod:`cosyvino.families.cosyvoice1
                .streaming`.
            n_timesteps: flow-matching ODE (Euler) steps, 1..100, one estimator call each:
                None = the model's (10 for v1); fewer is faster and further from the official
                audio (docs/performance.md, "ODE steps").
            flow_streaming: CosyVoice2 token hops: ``"auto"`` (default: incremental where the
                backend runs it, torch), ``"official"`` (each hop re-runs the flow over all
                tokens so far), ``"incremental"`` (only the new tokens from chunk state: the
                same frames within 1e-4; falls back to official with a logged reason where the
                backend lacks it); :class:`~cosyvino.request.StreamingOptions`, docs/streaming.md.
            final_hop: ``"official"`` (default: the last hop re-runs with full attention as
                upstream) or ``"incremental"`` (no re-run; a documented distance).
            vocoder_streaming: CosyVoice3's vocoder: ``"auto"`` / ``"official"`` (re-run) /
                ``"incremental"`` (a window per hop, the same samples).
            cancel: when set (from another thread), synthesis stops within one stage call and
                the iterator raises :class:`~cosyvino.errors.SynthesisCancelled`.
            **mode_inputs: ``mode`` (one of :attr:`modes`; default: the first that fits the
                inputs: ``source_audio`` -> vc, a prompt with a transcript -> zero_shot, a
                prompt alone -> cross_lingual, ``instruction`` -> instruct, a speaker -> sft),
                ``prompt_audio`` (a recording instead of ``speaker``: path, bytes, file object,
                ``(samples, rate)`` or :class:`Audio`), ``prompt_text`` (its transcript),
                ``source_audio`` (vc: the recording to convert; ``text`` empty),
                ``instruction`` (instruct) as the mode needs them. Prompt processing runs once
                per request, before the first segment.

        Raises (at the call, before anything runs):
            EmptyTextError: nothing speakable in ``text``.
            UnknownSpeakerError: ``speaker`` unknown (message lists valid ones).
            PromptAudioError subclasses: bad ``prompt_audio`` / ``source_audio``
                (:mod:`cosyvino.prompt_audio`: not audio, empty, too short or long, silent...).
            InputError: bad speed / seed / n_timesteps / num_speech_tokens / hop_schedule /
                flow_streaming / final_hop / vocoder_streaming / text type; a
                mode the model does not offer (the message lists those it does), a missing
                mode input or one the mode does not take.
            CorruptVoiceError: ``speaker`` is a stored voice whose file is unusable.
            ModelDirError / BackendError: the prompt models are missing or failed.
        """
        req = text if isinstance(text, SynthesisRequest) else self.request(
            text, speaker, speed=speed, seed=seed, num_speech_tokens=num_speech_tokens,
            hop_schedule=hop_schedule, n_timesteps=n_timesteps, flow_streaming=flow_streaming,
            final_hop=final_hop, vocoder_streaming=vocoder_streaming, **mode_inputs)
        return ChunkStream(self.submit(req, cancel=cancel))

    def synthesize(self, text: str | SynthesisRequest = "",
                   speaker: str | Voice | None = None, *, speed: float = 1.0,
                   seed: int | None = None, num_speech_tokens: int | None = None,
                   hop_schedule: str = "segment", n_timesteps: int | None = None,
                   on_segment: Callable[[int, int], None] | None = None,
                   **mode_inputs) -> Audio:
        """Synthesize the whole text; chunks are concatenated with 10 ms fades at the segment
        joins (:func:`cosyvino.audio.join_chunks`, what the server sends). Same arguments and
        errors as
        :meth:`stream`, except that ``hop_schedule`` defaults to ``"segment"`` (the official
        non-streaming computation); ``on_segment(done, total)`` is called after each segment
        (progress). ``Audio.stats`` has per-stage seconds, RTF, first-chunk latency and the
        seed."""
        start = time.perf_counter()
        chunks: list[Audio] = []
        first_latency = None
        with self.stream(text, speaker, speed=speed, seed=seed,
                         num_speech_tokens=num_speech_tokens, hop_schedule=hop_schedule,
                         n_timesteps=n_timesteps, **mode_inputs) as stream:
            for chunk in stream:
                if first_latency is None:
                    first_latency = time.perf_counter() - start
                chunks.append(chunk)
                if on_segment is not None and chunk.stats.get("is_last_in_segment", True):
                    on_segment(int(chunk.stats.get("segment", len(chunks) - 1)) + 1,
                               stream.total)
        return self._join(chunks, time.perf_counter() - start, first_latency)

    # ---- text in (issue 36) ------------------------------------------------------------------
    def open_text_stream(self, speaker: str | Voice | None = None, *, speed: float = 1.0,
                         seed: int | None = None, hop_schedule: str = "latency",
                         n_timesteps: int | None = None,
                         cancel: threading.Event | None = None, callback: Callable | None = None,
                         max_pending_tokens: int = DEFAULT_MAX_PENDING_TOKENS,
                         **mode_inputs) -> TextStream:
        """Start a request whose text comes while it runs (:mod:`cosyvino.text_stream`):
        ``send`` pieces, ``flush`` ends an utterance, ``close`` ends the text; iterate the
        result (or pass ``callback(kind, value)`` as :meth:`submit`) for audio chunks.

        CosyVoice2/3 only (upstream's bistream input, sheet v2 §4.6): text tokens go to the
        LLM 5 at a time, each 5 followed by up to 15 decoded speech tokens, so audio starts
        before the text ends; at a flush (or close) the rest of the utterance is decoded to
        its end. The text is NOT normalized or split into sentences (as upstream's bistream).

        Determinism: same seed, same text, same flush points -> the same audio, whatever the
        cut into pieces and their timing (tested). This is NOT the audio of the same text given
        whole to :meth:`synthesize` / :meth:`stream` (another LLM input layout, no
        normalization).

        Args: ``speaker`` / ``speed`` / ``seed`` / ``hop_schedule`` / ``n_timesteps`` /
            ``cancel`` / ``**mode_inputs`` as :meth:`stream` (no ``text``,
            ``num_speech_tokens``, ``source_audio``: vc takes no text);
            ``max_pending_tokens``: ``send`` blocks while more text tokens than this wait for
            the LLM (backpressure).

        Raises (here): InputError when the model's family takes no streamed text (v1) or a
            bad argument; the errors of :meth:`stream` about the voice and mode.
        """
        if not getattr(self.family, "text_in", False):
            raise InputError(f"the {self.family.name} family takes no streamed text "
                             "(text in needs CosyVoice2/3's bistream LLM)")
        req = self.request("", speaker, speed=speed, seed=seed, hop_schedule=hop_schedule,
                           n_timesteps=n_timesteps, text_stream=True, **mode_inputs)
        handle = self.submit(req, cancel=cancel, callback=callback)
        try:
            return TextStream(handle, max_pending_tokens=max_pending_tokens)
        except BaseException:
            handle.cancel()
            raise

    def stream_text(self, pieces: Iterable[str | bytes], speaker: str | Voice | None = None,
                    **options) -> Iterator[Audio]:
        """Speak text as it comes: ``pieces`` is an iterable of str / UTF-8 bytes pieces (a
        chat LLM's output; :data:`cosyvino.text_stream.FLUSH` items end an utterance), read on
        a feeder thread while the audio chunks are yielded here. Options and errors as
        :meth:`open_text_stream`; an exception raised by ``pieces`` is re-raised here after
        the request is cancelled. Closing the generator cancels the request."""
        if isinstance(pieces, (str, bytes)):
            pieces = [pieces]
        stream = self.open_text_stream(speaker, **options)
        stop = threading.Event()
        failure: list = []
        feeder = threading.Thread(target=lambda: failure.append(feed(stream, pieces, stop)),
                                  name="cosyvino-text-feeder", daemon=True)
        feeder.start()
        try:
            try:
                yield from stream
            except SynthesisCancelled:
                feeder.join()
                if failure and failure[0] is not None:
                    raise failure[0] from None
                raise
            feeder.join()
            if failure and failure[0] is not None:
                raise failure[0]
        finally:
            stop.set()
            stream.cancel()

    async def astream_text(self, pieces, speaker: str | Voice | None = None, **options):
        """:meth:`stream_text` for an async iterable of pieces, as an async generator of
        chunks (the synthesis runs on the worker threads; the event loop is never blocked)."""
        import asyncio

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def callback(kind, value):
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))

        stream = self.open_text_stream(speaker, callback=callback, **options)

        async def pump():
            try:
                async for piece in pieces:
                    if isinstance(piece, str) and piece == FLUSH:
                        await asyncio.to_thread(stream.flush)
                    else:
                        await asyncio.to_thread(stream.send, piece)
                await asyncio.to_thread(stream.close)
            except BaseException as e:
                stream.cancel()
                events.put_nowait(("feeder", e))

        task = asyncio.ensure_future(pump())
        try:
            while True:
                kind, value = await events.get()
                if kind == "chunk":
                    yield value
                elif kind == "done":
                    return
                elif kind == "feeder":
                    if not isinstance(value, (SynthesisCancelled, asyncio.CancelledError)):
                        raise value
                else:  # error (SynthesisCancelled after a cancel)
                    raise value
        finally:
            stream.cancel()
            task.cancel()

    def submit(self, request: SynthesisRequest, *, cancel: threading.Event | None = None,
               callback: Callable | None = None) -> RequestHandle:
        """Run ``request`` on this model's scheduler (``max_parallel`` worker threads, steps
        of concurrent requests interleaved); returns at once with a
        :class:`~cosyvino.engine.RequestHandle` (iterate it, or pass ``callback``). Requests run
        whether or not their handles are being iterated: several handles can be iterated one
        after the other (chunks wait in the handle).

        Raises (here, before anything runs): the errors of :meth:`stream`.
        """
        with self._scheduler_lock:
            if self._scheduler is None:
                self._scheduler = Scheduler([self.engine] * self.max_parallel,
                                            lane_workers=None if self.overlap_stages else 0,
                                            llm_batch=self.llm_batch,
                                            first_chunk_hold=self.first_chunk_hold)
            scheduler = self._scheduler
        return scheduler.submit(request, cancel=cancel, callback=callback)

    @property
    def llm_batch_stats(self) -> list[dict | None]:
        """Decode-batch occupancy of :meth:`submit`'s scheduler, per engine
        (:attr:`cosyvino.engine.Scheduler.batch_stats`: steps, row_steps, mean_rows, max_rows,
        rows, occupancy; None where batching is off); [] before the first submit."""
        scheduler = self._scheduler
        return [] if scheduler is None else scheduler.batch_stats

    @property
    def hold_stats(self) -> dict:
        """First-chunk hold of :meth:`submit`'s scheduler
        (:attr:`cosyvino.engine.Scheduler.hold_stats`: holds, held_seconds, held_now); zeros
        before the first submit."""
        scheduler = self._scheduler
        if scheduler is None:
            return {"holds": 0, "held_seconds": 0.0, "held_now": 0}
        return scheduler.hold_stats

    def tokens_to_audio(self, speech_tokens: Sequence[int], speaker: str, *, speed: float = 1.0,
                        seed: int | None = None) -> Audio:
        """Vocode given speech tokens (ids 0..4095) with ``speaker``'s flow embedding
        (token-to-wav; skips the LLM). Raises InputError for tokens that are not a non-empty
        1-D integer sequence within the vocabulary, UnknownSpeakerError, bad speed/seed."""
        tokens = np.asarray(speech_tokens)
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise InputError("speech_tokens must be a non-empty 1-D sequence of integers")
        req = SynthesisRequest(voice=speaker, speed=speed, seed=seed, speech_tokens=tokens,
                               streaming=StreamingOptions("segment"))
        start = time.perf_counter()
        chunks = list(self.stream(req))
        audio = chunks[0]
        audio.stats = {**audio_stats(_times_of(chunks), audio.duration,
                                time.perf_counter() - start, int(tokens.size)),
                       "seed": audio.stats.get("seed")}
        return audio

    def _join(self, chunks: list[Audio], wall: float, first_latency: float | None) -> Audio:
        # the server's segment-join fades (cosyvino.audio.join_chunks): one audio everywhere
        samples = join_chunks(chunks, self.sample_rate)
        tokens = (np.concatenate([c.speech_tokens for c in chunks]) if chunks
                  else np.zeros(0, np.int64))
        audio = Audio(samples.astype(np.float32), self.sample_rate, tokens)
        audio.stats = audio_stats(_times_of(chunks), audio.duration, wall, int(tokens.size))
        audio.stats["segments"] = len({c.stats.get("segment", i) for i, c in enumerate(chunks)})
        audio.stats["chunks"] = len(chunks)
        audio.stats["first_chunk_latency"] = (round(first_latency, 4)
                                              if first_latency is not None else None)
        # the same number under its earlier name (first chunk = first segment before streaming)
        audio.stats["first_segment_latency"] = audio.stats["first_chunk_latency"]
        if chunks:
            audio.stats["seed"] = chunks[0].stats.get("seed")
        return audio

    def close(self) -> None:
        """Stop the scheduler's workers (if any) and release the backend."""
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None
        if self._prompts is not None and self._own_prompts:
            self._prompts.close()
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
