"""Synthesized audio and writing it to files (soundfile/libsndfile), atomically. No torch."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .fileutil import publish

#: output format -> (libsndfile format, subtype)
FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "ogg": ("OGG", "VORBIS"),
}


@dataclass
class Audio:
    """Mono audio.

    Attributes:
        samples: float32 [S] in [-1, 1].
        sample_rate: Hz (22050 for CosyVoice v1).
        speech_tokens: int64 [N] speech tokens the audio was made from (all segments).
        stats: per-stage seconds/calls and derived numbers (``rtf`` = compute seconds /
            audio seconds).
    """

    samples: np.ndarray
    sample_rate: int
    speech_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stats: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.samples.shape[0] / float(self.sample_rate)

    def to_int16(self) -> np.ndarray:
        """int16 PCM [S] (scaled by 32767, clipped)."""
        return (np.clip(self.samples, -1.0, 1.0) * 32767.0).astype(np.int16)

    def write(self, path: str | os.PathLike, format: str | None = None) -> str:
        """Write to ``path`` (format from ``format`` or the extension: wav, flac, mp3, ogg).

        The file appears complete or not at all (temp file + rename).

        Raises:
            InputError: unknown format or no samples.
        """
        path = os.fspath(path)
        fmt = (format or os.path.splitext(path)[1].lstrip(".") or "wav").lower()
        if fmt not in FORMATS:
            raise InputError(f"unknown audio format {fmt!r}; choose one of "
                             f"{', '.join(FORMATS)}")
        if self.samples.size == 0:
            raise InputError("refusing to write an empty audio file")
        write_audio_file(path, self.samples, self.sample_rate, fmt)
        return path


def write_audio_file(path: str, samples: np.ndarray, sample_rate: int, fmt: str) -> None:
    """Atomically write float samples [S] to ``path`` in format ``fmt`` (see FORMATS)."""
    import soundfile as sf

    container, subtype = FORMATS[fmt]
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        # A typo in an output path must not silently create directories.
        raise InputError(f"output directory does not exist: {directory}")
    fd, tmp = tempfile.mkstemp(prefix=".cosyvino-", suffix=f".{fmt}", dir=directory)
    os.close(fd)
    try:
        sf.write(tmp, np.clip(samples, -1.0, 1.0), sample_rate, format=container,
                 subtype=subtype)
        publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
