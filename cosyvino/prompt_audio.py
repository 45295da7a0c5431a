"""Prompt audio intake for voice cloning: one recording in any common format -> the 16 kHz
waveform (CAM++, speech tokenizer) and the waveform at the model's prompt-mel rate (22.05 kHz for
CosyVoice v1, the default; 24 kHz for CosyVoice2: ``mel_rate``), with typed errors for bad input,
and the prompt pieces computed from it (speaker embedding, prompt speech tokens, prompt mel).

Reading: soundfile (libsndfile: WAV, FLAC, OGG/Vorbis/Opus, MP3 with libsndfile >= 1.1, AIFF...)
from a path, bytes or a binary file object; what libsndfile cannot read (AAC/M4A, WebM, ...) is
decoded with PyAV when it is installed. Channels are averaged to mono (as the official
``load_wav``, architecture sheet 3.1), then soxr (``HQ``) resamples the source straight to
16 kHz (CAM++ and the speech tokenizer, sheet 3.4 / 3.5) and to the mel rate (the flow prompt
mel, sheet 3.6 and known issue 8.5(1); sheet v2 §3.1; resampling the source, not the 16 kHz
copy, keeps the band up to the mel's 8 kHz fmax and is what the frontend goldens' 22.05 kHz
waveform matches best).

Limits (every violation raises a :class:`PromptAudioError` subclass naming the limit; nothing is
cut or padded silently):

* :data:`MIN_SECONDS` (1 s): a shorter prompt gives CAM++ under 100 frames and the flow under
  86 prompt frames; speaker embeddings of sub-second speech are unreliable.
* :data:`MAX_SECONDS` (30 s): the speech tokenizer's limit (the official frontend asserts
  ``len / 16000 <= 30``; sheet 3.5). Checked from the header before decoding when the format
  says its length, else while decoding (decoding stops past the limit).
* :data:`SILENCE_RMS_DBFS` (-60 dBFS): a prompt whose RMS over the whole recording (mono, full
  scale 1.0) is below 0.001 is silent (digital zeros, a muted or unplugged microphone);
  speech recordings sit near -30..-15 dBFS (the two reference prompts: -23 and -19 dBFS).
* :data:`MIN_SAMPLE_RATE` (8 kHz): lower rates carry no usable speech band (the official code
  requires >= 16 kHz; 8-16 kHz telephone audio is upsampled here).

Must not import torch.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import BinaryIO, Union

import numpy as np

from .errors import InputError

#: shortest accepted prompt, seconds (module docstring)
MIN_SECONDS = 1.0
#: longest accepted prompt, seconds: the speech tokenizer's limit (sheet 3.5)
MAX_SECONDS = 30.0
#: a prompt whose RMS is below this (dB relative to full scale 1.0) is silent
SILENCE_RMS_DBFS = -60.0
#: lowest accepted source sample rate, Hz
MIN_SAMPLE_RATE = 8000
#: rate of CAM++ and the speech tokenizer (sheet 3.4 / 3.5)
TOKENIZER_RATE = 16000
#: rate of the flow prompt mel of CosyVoice v1 (sheet 3.6), the default ``mel_rate``
MEL_RATE = 22050

#: shortest accepted voice-conversion source recording, seconds (the source needs no speaker
#: embedding; 0.2 s = 10 speech tokens)
SOURCE_MIN_SECONDS = 0.2

#: what the intake reads: a path, the bytes of a file, a binary file object, or decoded samples
#: as ``(samples, sample_rate)`` (float [N] or [N, channels] in [-1, 1], or int16) or any
#: object with ``samples`` and ``sample_rate`` attributes (e.g. :class:`cosyvino.audio.Audio`)
AudioSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO, tuple]


class PromptAudioError(InputError):
    """Bad prompt (or source) audio: the base of the errors below. Maps to HTTP 400."""


class NotAudioError(PromptAudioError):
    """The data is not a readable audio file (or the path does not exist)."""


class EmptyAudioError(PromptAudioError):
    """The file holds no samples (0 bytes, or a valid header with no frames)."""


class AudioTooShortError(PromptAudioError):
    """Shorter than the minimum; ``seconds`` and ``limit`` say by how much."""

    def __init__(self, message: str, seconds: float, limit: float):
        super().__init__(message)
        self.seconds, self.limit = seconds, limit


class AudioTooLongError(PromptAudioError):
    """Longer than :data:`MAX_SECONDS` (the speech tokenizer's 30 s); ``seconds`` is the
    length read so far (at least the limit), ``limit`` the limit."""

    def __init__(self, message: str, seconds: float, limit: float):
        super().__init__(message)
        self.seconds, self.limit = seconds, limit


class SilentAudioError(PromptAudioError):
    """RMS below :data:`SILENCE_RMS_DBFS`; ``rms_dbfs`` is the measured level."""

    def __init__(self, message: str, rms_dbfs: float):
        super().__init__(message)
        self.rms_dbfs = rms_dbfs


class InvalidAudioError(PromptAudioError):
    """Readable but unusable: sample rate below :data:`MIN_SAMPLE_RATE`, NaN or infinite
    samples."""


@dataclass(frozen=True)
class PromptAudio:
    """A validated prompt recording.

    Attributes:
        wav_16k: float32 [N16], mono, 16 kHz, in the file's scale ([-1, 1] for PCM).
        wav_mel: float32 [Nm], mono, at ``mel_rate`` (the prompt mel's input).
        sample_rate: the file's sample rate, Hz.
        channels: the file's channel count (averaged to mono).
        seconds: duration, seconds (frames / sample_rate of the file).
        mel_rate: the rate of ``wav_mel``, Hz (22050 for CosyVoice v1, 24000 for CosyVoice2).
    """

    wav_16k: np.ndarray
    wav_mel: np.ndarray
    sample_rate: int
    channels: int
    seconds: float
    mel_rate: int = MEL_RATE

    @property
    def wav_22k(self) -> np.ndarray:
        """``wav_mel`` of a v1 intake (22.05 kHz). Raises AttributeError for another rate."""
        if self.mel_rate != MEL_RATE:
            raise AttributeError(f"this prompt audio was loaded at {self.mel_rate} Hz, not "
                                 f"{MEL_RATE} Hz: use wav_mel")
        return self.wav_mel


@dataclass(frozen=True)
class PromptFeatures:
    """The model-side pieces of a prompt bundle, from one recording (architecture sheet 3.8:
    what zero-shot, cross-lingual and vc feed the LLM and the flow).

    Attributes:
        embedding: float32 [1, 192], the raw CAM++ x-vector (LLM and flow speaker embedding).
        speech_tokens: int64 [1, T] prompt speech tokens (v1: 50 Hz, T = ceil(N16 / 160 / 2);
            CosyVoice2: 25 Hz).
        mel: float32 [M, 80] flow prompt mel, time-major (v1: 22.05 kHz, hop 256,
            M = N22 // 256; CosyVoice2: 24 kHz, hop 480, M = N24 // 480).
    """

    embedding: np.ndarray
    speech_tokens: np.ndarray
    mel: np.ndarray


def _describe(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return getattr(source, "name", None) or "<file object>"


def _decoder_message(e: Exception) -> str:
    """A decoder's error as a client can read it: without the in-memory object it names
    (``<_io.BytesIO object at 0x...>``: a different address every call), libsndfile's "Error
    opening ...:" preamble and FFmpeg's ``[Errno N]`` code (``-1094995529``:
    AVERROR_INVALIDDATA, meaningless to a client)."""
    msg = re.sub(r"<_io\.\w+ object at 0x[0-9a-f]+>", "the data", str(e)).replace(
        "'<none>'", "the data")
    msg = re.sub(r"^Error opening (the data|'[^']*'): ", "", msg)
    msg = re.sub(r"^\[Errno -?\d+\] ", "", msg)
    return re.sub(r": the data$", "", msg).strip()


#: the first bytes of a RIFF/RF64 WAVE file (bytes 0-3 the container, 8-11 the form type)
_WAV_MAGIC = (b"RIFF", b"RIFX", b"RF64")


def _looks_like_wav(source) -> bool:
    """Whether ``source`` (a path, bytes or a binary file object) starts as a WAV file does,
    so a decoder's refusal means a damaged WAV, not another format."""
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            head = bytes(source[:12])
        elif isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                head = f.read(12)
        else:
            source.seek(0)
            head = source.read(12)
            source.seek(0)
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(head, bytes) and head[:4] in _WAV_MAGIC and head[8:12] == b"WAVE"


def _reopen(source):
    """A fresh readable object for each decoder try (bytes -> BytesIO; file object rewound)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(source))
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    source.seek(0)
    return source


def _too_long(what: str, seconds: float, max_seconds: float, exact: bool = True):
    length = f"{seconds:.2f} s" if exact else f"more than {seconds:.2f} s"
    return AudioTooLongError(
        f"{what} is {length} long; the limit is {max_seconds:g} s (the speech tokenizer "
        "takes at most 30 s): trim the recording", seconds, max_seconds)


def _read_soundfile(source, what: str, max_seconds: float):
    import soundfile as sf

    with sf.SoundFile(_reopen(source)) as f:
        rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
        if rate > 0 and frames > 0 and frames / rate > max_seconds:
            raise _too_long(what, frames / rate, max_seconds)
        data = f.read(dtype="float32", always_2d=True)
    return data, rate, channels


def _read_av(source, what: str, max_seconds: float):
    import av

    with av.open(_reopen(source), mode="r") as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise NotAudioError(f"{what}: {_describe(source)} has no audio stream")
        stream = streams[0]
        if stream.codec_context is None:  # FFmpeg found no decoder for what the header says
            raise NotAudioError(f"{what}: {_describe(source)}: its audio stream has no decoder "
                                "(unknown or damaged codec header)")
        rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        resampler = av.AudioResampler(format="fltp")  # float planar; layout and rate kept
        chunks, total = [], 0
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                a = out.to_ndarray()  # [channels, n]
                chunks.append(a)
                total += a.shape[1]
            if rate and total / rate > max_seconds + 1.0:
                raise _too_long(what, total / rate, max_seconds, exact=False)
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray())
    if not chunks:
        return np.zeros((0, 1), np.float32), rate, 1
    data = np.concatenate(chunks, axis=1).T.astype(np.float32, copy=False)
    return data, rate, data.shape[1]


def _samples_of(source, what: str):
    """``(samples [N, C] float32, rate)`` of decoded audio given as ``(samples, rate)`` or an
    object with ``samples`` / ``sample_rate``; None for anything else."""
    if isinstance(source, tuple):
        if len(source) != 2:
            raise NotAudioError(f"{what}: a tuple must be (samples, sample_rate), got "
                                f"{len(source)} items")
        samples, rate = source
    elif hasattr(source, "samples") and hasattr(source, "sample_rate"):
        samples, rate = source.samples, source.sample_rate
    else:
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise InvalidAudioError(f"{what}: sample rate must be a positive integer (Hz), got "
                                f"{rate!r}")
    x = np.asarray(samples)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    elif not np.issubdtype(x.dtype, np.floating):
        raise NotAudioError(f"{what}: samples must be float (in [-1, 1]) or int16, got "
                            f"dtype {x.dtype}")
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise NotAudioError(f"{what}: samples must be [N] or [N, channels], got shape "
                            f"{list(x.shape)}")
    return x.astype(np.float32, copy=False), int(rate)


def read_audio(source: AudioSource, *, what: str = "prompt audio",
               max_seconds: float = MAX_SECONDS) -> tuple[np.ndarray, int, int]:
    """Decode ``source`` (a path, bytes, a binary file object, or decoded samples: see
    :data:`AudioSource`) -> (float32 [N] mono, sample rate Hz, channel count). Channels are
    averaged. soundfile first, then PyAV (when installed) for formats libsndfile cannot read.

    Raises:
        NotAudioError: missing path, an object of another type, or neither decoder can read
            the data.
        EmptyAudioError: 0 bytes or 0 frames.
        AudioTooLongError: longer than ``max_seconds`` (decoding stops there).
        InvalidAudioError: NaN or infinite samples; a bad sample rate of given samples.
    """
    given = _samples_of(source, what)
    if given is not None:
        data, rate = given
        if data.shape[0] == 0:
            raise EmptyAudioError(f"{what} holds no audio samples")
        if data.shape[0] / rate > max_seconds:
            raise _too_long(what, data.shape[0] / rate, max_seconds)
        return _mono(data, what, "the given samples"), rate, data.shape[1]
    if not isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview)) and not (
            hasattr(source, "read") and hasattr(source, "seek")):
        raise NotAudioError(f"{what} must be a path, bytes, a binary file object or "
                            f"(samples, sample_rate), got {type(source).__name__}")
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise NotAudioError(f"{what}: file not found: {os.fspath(source)}")
        if os.path.getsize(source) == 0:
            raise EmptyAudioError(f"{what}: {os.fspath(source)} is empty (0 bytes)")
    elif isinstance(source, (bytes, bytearray, memoryview)) and len(source) == 0:
        raise EmptyAudioError(f"{what} is empty (0 bytes)")
    errors = []
    data = None
    try:
        data, rate, channels = _read_soundfile(source, what, max_seconds)
    except PromptAudioError:
        raise
    except Exception as e:  # soundfile.LibsndfileError / RuntimeError / TypeError ...
        errors.append(f"soundfile: {_decoder_message(e)}")
        wav_error = _decoder_message(e)
    if data is None:
        try:
            import av  # noqa: F401
        except ImportError:
            errors.append("PyAV is not installed (pip install av) for other formats")
        else:
            try:
                data, rate, channels = _read_av(source, what, max_seconds)
            except PromptAudioError as e:
                if not _looks_like_wav(source) or not isinstance(e, NotAudioError):
                    raise
            except Exception as e:  # av.error.InvalidDataError and friends
                errors.append(f"PyAV: {_decoder_message(e)}")
    if data is None and _looks_like_wav(source):
        # both decoders refused what starts as a WAV file: its header is broken, and
        # libsndfile's reason names the part (FFmpeg's is a generic 'invalid data')
        raise NotAudioError(f"{what}: {_describe(source)} is a WAV file with a corrupt "
                            f"header ({wav_error.rstrip('.')}); export the recording again "
                            "as WAV, FLAC or MP3")
    if data is None:
        raise NotAudioError(f"{what}: {_describe(source)} is not a readable audio file "
                            f"(wav, flac, ogg, mp3, ...): {'; '.join(errors)}")
    if data.shape[0] == 0:
        raise EmptyAudioError(f"{what}: {_describe(source)} holds no audio samples")
    return _mono(data, what, _describe(source)), rate, channels


def header_seconds(source: AudioSource) -> float | None:
    """The duration (s) a recording's header states, without decoding it: libsndfile's frame
    count over its rate, else PyAV's container duration (when installed). None when neither
    reads a length (not audio, a stream without one, decoded samples given): the caller then
    learns it by decoding (:func:`read_audio`, which raises the typed errors). For cheap
    decisions before decoding (the server's admission); never raises."""
    if isinstance(source, (tuple, np.ndarray)) or hasattr(source, "samples"):
        return None
    return _soundfile_seconds(source) or _av_seconds(source)


def _soundfile_seconds(source) -> float | None:
    try:
        import soundfile as sf

        info = sf.info(_reopen(source))
    except Exception:  # noqa: BLE001 - libsndfile's errors for what it cannot read
        return None
    if info.samplerate > 0 and info.frames > 0:
        return float(info.frames) / float(info.samplerate)
    return None


def _av_seconds(source) -> float | None:
    try:
        import av

        with av.open(_reopen(source), mode="r") as container:
            duration = container.duration
    except Exception:  # noqa: BLE001 - not audio, no PyAV, a damaged header
        return None
    return float(duration) / 1_000_000 if duration and duration > 0 else None  # AV_TIME_BASE


def _mono(data: np.ndarray, what: str, described: str) -> np.ndarray:
    if not np.isfinite(data).all():
        raise InvalidAudioError(f"{what}: {described} contains NaN or infinite samples")
    return data.mean(axis=1, dtype=np.float64).astype(np.float32) if data.shape[1] > 1 \
        else data[:, 0].copy()


def _resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return x.astype(np.float32, copy=True)
    try:
        import soxr
    except ImportError as e:
        raise InputError(f"resampling prompt audio needs soxr ({e}); pip install soxr") \
            from None
    return soxr.resample(x, rate, target, quality="HQ").astype(np.float32, copy=False)


def load_prompt_audio(source: AudioSource, *, what: str = "prompt audio",
                      min_seconds: float = MIN_SECONDS,
                      max_seconds: float = MAX_SECONDS,
                      mel_rate: int = MEL_RATE) -> PromptAudio:
    """Read and validate one recording (module docstring: formats, limits; ``source`` as
    :data:`AudioSource`, or an already loaded :class:`PromptAudio` of the same ``mel_rate``,
    returned as is) -> its 16 kHz and ``mel_rate`` mono waveforms (the model family's prompt-mel
    rate: 22.05 kHz for CosyVoice v1, 24 kHz for CosyVoice2). ``what`` names the recording in
    messages (e.g. "source audio" for voice conversion).

    Raises:
        NotAudioError, EmptyAudioError, AudioTooShortError, AudioTooLongError,
        SilentAudioError, InvalidAudioError (all :class:`PromptAudioError`, an InputError);
        InputError: a :class:`PromptAudio` loaded for another ``mel_rate``.
    """
    if isinstance(source, PromptAudio):
        if source.mel_rate != mel_rate:
            raise InputError(f"{what} was loaded for a {source.mel_rate} Hz prompt mel; this "
                             f"model needs {mel_rate} Hz: load the recording again")
        return source
    mono, rate, channels = read_audio(source, what=what, max_seconds=max_seconds)
    if rate < MIN_SAMPLE_RATE:
        raise InvalidAudioError(f"{what}: sample rate {rate} Hz is below the minimum of "
                                f"{MIN_SAMPLE_RATE} Hz")
    seconds = mono.size / rate
    if seconds > max_seconds:
        raise _too_long(what, seconds, max_seconds)
    if seconds < min_seconds:
        raise AudioTooShortError(f"{what} is {seconds:.2f} s long; the minimum is "
                                 f"{min_seconds:g} s", seconds, min_seconds)
    rms = float(np.sqrt(np.mean(np.square(mono, dtype=np.float64))))
    rms_db = 20 * np.log10(rms) if rms > 0 else float("-inf")
    if rms_db < SILENCE_RMS_DBFS:
        level = "digital silence" if rms == 0 else f"RMS {rms_db:.1f} dBFS"
        raise SilentAudioError(f"{what} is silent ({level}; speech needs an RMS level of at "
                               f"least {SILENCE_RMS_DBFS:g} dBFS)", rms_db)
    return PromptAudio(wav_16k=_resample(mono, rate, TOKENIZER_RATE),
                       wav_mel=_resample(mono, rate, mel_rate), sample_rate=rate,
                       channels=channels, seconds=seconds, mel_rate=mel_rate)


def prompt_features(audio: PromptAudio | AudioSource, models, *, mel=None) -> PromptFeatures:
    """The prompt pieces of one recording: speaker embedding, prompt speech tokens and prompt
    mel (sheet 3.8; sheet v2 §3.8).

    ``audio``: a :class:`PromptAudio` or anything :func:`load_prompt_audio` reads. ``models``:
    the prompt models (:class:`cosyvino.families.cosyvoice1.prompt_models.PromptModels`, or
    any object with ``embedding(fbank [T, 80]) -> [1, 192]`` and ``speech_tokens(log_mel
    [1, 128, T]) -> int64 [1, T']``). ``mel``: the family's prompt-mel config (a
    :class:`cosyvino.families.cosyvoice1.config.MelConfig`, e.g. CosyVoice2's 24 kHz one); None
    is CosyVoice v1's (22.05 kHz, n_fft 1024, hop 256). ``audio`` is loaded at its rate.

    Lengths are not aligned: the v1 frontend uses the tokens and the mel of the prompt as
    they come (architecture sheet 10, row "Prompt alignment": v1 "none"; only v2 truncates
    its 24 kHz mel to 2 frames per token, and not in every mode: that cut belongs to the v2
    family, :func:`cosyvino.families.cosyvoice2.prompt_models.align_prompt`), and the v1 flow
    regulates the prompt part of its encoder output to the prompt mel's own frame count
    (sheet 5.2, step 4-5: M1 = prompt mel frames, independent of the prompt token count). So
    for v1 T = ceil(N16 / 320) tokens (50 Hz) and M = N22 // 256 frames (86.13 Hz), about 1.72
    frames per token.

    Raises: the :func:`load_prompt_audio` errors; BackendError from the models.
    """
    from .frontend.features import campplus_fbank, prompt_mel, prompt_mel_of, whisper_log_mel

    rate = MEL_RATE if mel is None else int(mel.sampling_rate)
    audio = load_prompt_audio(audio, mel_rate=rate)
    embedding = models.embedding(campplus_fbank(audio.wav_16k))
    tokens = models.speech_tokens(whisper_log_mel(audio.wav_16k))
    feat = prompt_mel(audio.wav_mel, sample_rate=MEL_RATE) if mel is None else \
        prompt_mel_of(audio.wav_mel, mel)
    return PromptFeatures(embedding=embedding, speech_tokens=tokens,
                          mel=np.ascontiguousarray(feat[0].T))
