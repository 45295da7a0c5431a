"""The two ONNX prompt models of a CosyVoice v1 model dir, run on the numpy features of
:mod:`cosyvino.frontend.features` (architecture sheet 3.4 / 3.5):

* ``campplus.onnx``: mean-normalized Kaldi fbank float32 [T, 80] (fed as [1, T, 80]) ->
  speaker embedding float32 [1, 192] (raw CAM++ x-vector, as ``spk2info.pt`` stores it).
* ``speech_tokenizer_v1.onnx``: whisper log-mel float32 [1, 128, T] and its length int32 [1]
  (= T) -> speech tokens int64 [1, T'] (the model's [1, 1, T'] flattened; 50 Hz, ids 0..4095).
  T <= 3000 (30 s at 100 frames/s; the official frontend asserts 30 s).

Both files are fed by position, as the official frontend does (their tensor names are not
relied upon). A backend runs them when its class sets ``runs_onnx`` and implements
``onnx_runner(path, **options)``
(OpenVINO, the default: it reads ONNX directly; ONNX Runtime); the runners are built here
from the backend's name through the plugin registry, or passed in by the caller. Must not
import torch.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from cosyvino.errors import BackendError, InputError, ModelDirError

CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v1.onnx"
#: backend that runs the prompt models unless the caller names another
DEFAULT_BACKEND = "openvino"
#: fbank bins of CAM++'s input and its embedding size (sheet 3.4)
FBANK_BINS, EMBEDDING_DIM = 80, 192
#: whisper log-mel bins of the speech tokenizer's input (sheet 3.5)
LOG_MEL_BINS = 128
#: longest tokenizer input: 30 s of 100 Hz log-mel frames (sheet 3.5: "at most 30 s (asserted)")
MAX_LOG_MEL_FRAMES = 3000
#: speech-token vocabulary of v1 (sheet 2: ids 0..4095)
SPEECH_VOCAB = 4096

#: ``factory(path) -> runner``; a runner has ``run(inputs: list[np.ndarray]) -> list[np.ndarray]``
RunnerFactory = Callable[[str], object]


def runner_factory(backend: str = DEFAULT_BACKEND, **options) -> RunnerFactory:
    """``path -> runner`` of the registered backend ``backend`` (its ``onnx_runner``), with
    ``options`` (e.g. ``num_threads``) passed to each runner.

    Raises:
        BackendError: unknown backend, or one that cannot run plain ONNX files (the message
            lists those that can).
    """
    from cosyvino.plugins import backend_classes, get_backend

    cls = get_backend(backend)
    make = cls.onnx_runner
    if not getattr(cls, "runs_onnx", False):
        able = sorted(n for n, c in backend_classes().items() if getattr(c, "runs_onnx", False))
        raise BackendError(f"backend {backend!r} cannot run plain ONNX files ({CAMPPLUS_FILE}, "
                           f"{SPEECH_TOKENIZER_FILE}); backends that can: "
                           f"{', '.join(able) or 'none installed'}")
    return lambda path: make(path, **options)


def _open(model_dir: str, name: str, factory: RunnerFactory, tokenizer_file: str):
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        where = "the base CosyVoice-300M dir" if tokenizer_file == SPEECH_TOKENIZER_FILE else \
            "the model dir"
        raise ModelDirError(
            f"{name} not found in {model_dir}: voice cloning needs the prompt models of {where} "
            f"({CAMPPLUS_FILE}, {tokenizer_file}); `cosyvino make-model` writes synthetic ones",
            path)
    return factory(path)


class PromptModels:
    """The speaker-embedding and speech-token models of one model dir, loaded on one backend.

    ``PromptModels(model_dir)`` loads both files on OpenVINO; ``backend=`` names another
    registered backend, ``factory=`` gives the runners directly (then ``backend`` and
    ``options`` are unused). ``tokenizer_file`` / ``speech_vocab``: the speech tokenizer's file
    and its id range (v1 defaults; CosyVoice2: ``speech_tokenizer_v2.onnx``, 6561). ``model_dir`` may be an official dir or a converted one (the
    converters copy both files). Thread-safe when the backend's runners are (both built-in
    ones are).

    Raises (constructor):
        ModelDirError: a file is missing or not a readable ONNX model (the message names it).
        BackendError: the backend is unknown, cannot run ONNX files, or failed to compile.
    """

    def __init__(self, model_dir: str | os.PathLike, backend: str = DEFAULT_BACKEND, *,
                 factory: RunnerFactory | None = None,
                 tokenizer_file: str = SPEECH_TOKENIZER_FILE, speech_vocab: int = SPEECH_VOCAB,
                 **options):
        self.model_dir = os.fspath(model_dir)
        if not os.path.isdir(self.model_dir):
            raise ModelDirError(f"model directory not found: {self.model_dir}", self.model_dir)
        make = factory or runner_factory(backend, **options)
        self.backend = backend if factory is None else getattr(factory, "name", "custom")
        self.tokenizer_file, self.speech_vocab = tokenizer_file, speech_vocab
        self._campplus = _open(self.model_dir, CAMPPLUS_FILE, make, tokenizer_file)
        self._tokenizer = _open(self.model_dir, tokenizer_file, make, tokenizer_file)

    def embedding(self, fbank: np.ndarray) -> np.ndarray:
        """Speaker embedding of a prompt: ``fbank`` float [T, 80] (or [1, T, 80]), the
        mean-normalized Kaldi fbank of :func:`cosyvino.frontend.features.campplus_fbank` ->
        float32 [1, 192]. The whole prompt is used (no cropping; sheet 3.4).

        Raises:
            InputError: wrong shape, no frames, NaN/inf.
            BackendError: the runtime failed, or the model returned another shape.
        """
        x = np.asarray(fbank, dtype=np.float32)
        if x.ndim == 2:
            x = x[None]
        if x.ndim != 3 or x.shape[0] != 1 or x.shape[2] != FBANK_BINS or x.shape[1] < 1:
            raise InputError(f"speaker embedding: fbank must be [T, {FBANK_BINS}] with T >= 1, "
                             f"got shape {list(np.shape(fbank))}")
        if not np.isfinite(x).all():
            raise InputError("speaker embedding: fbank contains NaN or infinity")
        out = np.asarray(self._campplus.run([np.ascontiguousarray(x)])[0], dtype=np.float32)
        if out.size != EMBEDDING_DIM:
            raise BackendError(f"{CAMPPLUS_FILE} returned shape {list(out.shape)}, expected "
                               f"[1, {EMBEDDING_DIM}]")
        return out.reshape(1, EMBEDDING_DIM)

    def speech_tokens(self, log_mel: np.ndarray) -> np.ndarray:
        """Speech tokens of a prompt: ``log_mel`` float [1, 128, T] (or [128, T]), the whisper
        log-mel of :func:`cosyvino.frontend.features.whisper_log_mel`, 1 <= T <= 3000 ->
        int64 [1, T'] (v1 file: T' = ceil(T / 2), ids 0..4095; v2 file: 25 Hz, ids 0..6560,
        sheet v2 §3.4). The length input is T (int32 [1]; sheet 3.5).

        Raises:
            InputError: wrong shape, T over 3000 (30 s), NaN/inf.
            BackendError: the runtime failed, or the model returned ids outside
                0..speech_vocab - 1.
        """
        x = np.asarray(log_mel, dtype=np.float32)
        if x.ndim == 2:
            x = x[None]
        if x.ndim != 3 or x.shape[0] != 1 or x.shape[1] != LOG_MEL_BINS or x.shape[2] < 1:
            raise InputError(f"speech tokens: log-mel must be [1, {LOG_MEL_BINS}, T] with "
                             f"T >= 1, got shape {list(np.shape(log_mel))}")
        frames = x.shape[2]
        if frames > MAX_LOG_MEL_FRAMES:
            raise InputError(f"speech tokens: {frames} log-mel frames ({frames / 100:.2f} s) "
                             f"exceed the speech tokenizer's limit of {MAX_LOG_MEL_FRAMES} "
                             "(30 s)")
        if not np.isfinite(x).all():
            raise InputError("speech tokens: log-mel contains NaN or infinity")
        out = np.asarray(self._tokenizer.run([np.ascontiguousarray(x),
                                              np.array([frames], dtype=np.int32)])[0])
        if not np.issubdtype(out.dtype, np.integer):
            raise BackendError(f"{self.tokenizer_file} returned {out.dtype} values, "
                               "expected integer token ids")
        tokens = out.astype(np.int64).reshape(1, -1)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.speech_vocab):
            raise BackendError(f"{self.tokenizer_file} returned token ids outside "
                               f"0..{self.speech_vocab - 1} ({tokens.min()}..{tokens.max()})")
        return tokens

    def close(self) -> None:
        """Release both runners."""
        for r in (self._campplus, self._tokenizer):
            close = getattr(r, "close", None)
            if close is not None:
                close()


def default_prompt_backend(backend: str | None = None) -> str:
    """The backend that runs the prompt models: ``backend`` when given; else
    :data:`DEFAULT_BACKEND` when installed, else the first installed backend that runs plain
    ONNX files. Raises BackendError when none can."""
    from cosyvino.plugins import backend_classes

    if backend is not None:
        return backend
    classes = backend_classes()
    able = [n for n, c in classes.items() if getattr(c, "runs_onnx", False)]
    if DEFAULT_BACKEND in able:
        return DEFAULT_BACKEND
    if not able:
        raise BackendError(f"no installed backend runs plain ONNX files ({CAMPPLUS_FILE}, "
                           f"{SPEECH_TOKENIZER_FILE}); install cosyvino[openvino] or "
                           "cosyvino[onnxruntime] for voice cloning")
    return sorted(able)[0]


class PromptEncoder:
    """Recordings -> voices for the v1 prompt modes (the family's ``prompt_encoder`` hook,
    :meth:`cosyvino.families.base.ModelFamily.prompt_encoder`). Cheap to build: the two prompt
    models are loaded on first use (thread-safe; a load error is raised again on each use).

    Args:
        model_dir: the dir holding ``campplus.onnx`` and ``speech_tokenizer_v1.onnx``.
        backend: the backend running them (None: :func:`default_prompt_backend`).
        embedding_dim / speech_vocab / mel_bins: what a voice must have to fit the loaded model
            (speaker embedding size, speech-token ids below ``speech_vocab``, prompt mel bins).
        factory / options: as :class:`PromptModels`.

    A family with other prompt models subclasses it and sets :attr:`tokenizer_file` and
    :attr:`mel` (CosyVoice2: :class:`cosyvino.families.cosyvoice2.prompt_models.PromptEncoder`).
    """

    #: the speech tokenizer's file in the model dir
    tokenizer_file: str = SPEECH_TOKENIZER_FILE
    #: the prompt mel's config (``MelConfig``); None: v1's 22.05 kHz mel
    mel = None

    def __init__(self, model_dir: str, backend: str | None = None, *, embedding_dim: int,
                 speech_vocab: int, mel_bins: int, factory: RunnerFactory | None = None,
                 **options):
        import threading

        self.model_dir = os.fspath(model_dir)
        self.backend = backend
        self.embedding_dim, self.speech_vocab, self.mel_bins = embedding_dim, speech_vocab, \
            mel_bins
        self._factory, self._options = factory, options
        self._models: PromptModels | None = None
        self._lock = threading.Lock()

    @property
    def mel_rate(self) -> int:
        """The rate (Hz) recordings are loaded at for the prompt mel (:attr:`mel`'s; v1:
        :data:`cosyvino.prompt_audio.MEL_RATE`, 22050): pass it to
        :func:`cosyvino.prompt_audio.load_prompt_audio` to load a recording for :meth:`voice`
        ahead of time."""
        from cosyvino.prompt_audio import MEL_RATE

        return MEL_RATE if self.mel is None else self.mel.sampling_rate

    @property
    def models(self) -> PromptModels:
        """The loaded :class:`PromptModels` (loaded now if needed; raises as its constructor,
        plus BackendError from :func:`default_prompt_backend`)."""
        with self._lock:
            if self._models is None:
                files = dict(tokenizer_file=self.tokenizer_file, speech_vocab=self.speech_vocab)
                if self._factory is not None:
                    self._models = PromptModels(self.model_dir, factory=self._factory, **files)
                else:
                    self._models = PromptModels(self.model_dir,
                                                default_prompt_backend(self.backend),
                                                **files, **self._options)
            return self._models

    def voice(self, audio, *, name: str = "<prompt>", prompt_text: str | None = None):
        """A prompt bundle (:class:`cosyvino.voices.Voice`) from one recording: CAM++
        embedding float32 [1, 192], prompt speech tokens int64 [N], prompt mel float32 [M, 80]
        (:attr:`mel`'s rate and hop), ``prompt_text`` as given (normalized where it is used).

        Raises: the :func:`cosyvino.prompt_audio.load_prompt_audio` errors (typed
        ``PromptAudioError`` s), ModelDirError (prompt models missing), BackendError."""
        from cosyvino.prompt_audio import load_prompt_audio, prompt_features
        from cosyvino.voices import Voice

        loaded = load_prompt_audio(audio, mel_rate=self.mel_rate)
        feats = prompt_features(loaded, self.models, mel=self.mel)
        return Voice(name=name, embedding=feats.embedding,
                     prompt_speech_tokens=feats.speech_tokens.reshape(-1),
                     prompt_mel=feats.mel, prompt_text=prompt_text,
                     prompt_seconds=round(float(loaded.seconds), 3))

    def speech_tokens(self, audio) -> np.ndarray:
        """int64 [N] speech tokens of a voice-conversion source recording (at least
        :data:`cosyvino.prompt_audio.SOURCE_MIN_SECONDS` long, at most 30 s).

        Raises: the ``load_prompt_audio`` errors (named "source audio"), ModelDirError,
        BackendError."""
        from cosyvino.frontend.features import whisper_log_mel
        from cosyvino.prompt_audio import SOURCE_MIN_SECONDS, load_prompt_audio

        loaded = load_prompt_audio(audio, what="source audio", min_seconds=SOURCE_MIN_SECONDS,
                                   mel_rate=self.mel_rate)
        return self.models.speech_tokens(whisper_log_mel(loaded.wav_16k)).reshape(-1)

    def check_voice(self, voice) -> str | None:
        """Why ``voice`` (e.g. read from a voice store) does not fit this model, or None."""
        if voice.embedding.shape[1] != self.embedding_dim:
            return (f"speaker embedding has {voice.embedding.shape[1]} values, the model takes "
                    f"{self.embedding_dim}")
        if voice.has_prompt:
            tokens, mel = voice.prompt_speech_tokens, voice.prompt_mel
            if tokens.size and (tokens.min() < 0 or tokens.max() >= self.speech_vocab):
                return f"prompt speech tokens outside 0..{self.speech_vocab - 1}"
            if mel.ndim != 2 or mel.shape[1] != self.mel_bins:
                return f"prompt mel is {list(mel.shape)}, the model takes [M, {self.mel_bins}]"
        return None

    def close(self) -> None:
        with self._lock:
            if self._models is not None:
                self._models.close()
                self._models = None
