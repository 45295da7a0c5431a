"""Synthesized audio, the one float -> int16 rule, and writing audio files (soundfile/libsndfile),
atomically. No torch."""

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
#: subtypes written from our own int16 samples (:func:`float_to_int16`), never from floats
_INT16_SUBTYPES = ("PCM_16",)
#: int16 full scale used by :func:`float_to_int16` (symmetric: -1.0 -> -32767)
INT16_SCALE = 32767.0


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """The one float -> int16 rule of cosyvino (CLI files and every server format).

    ``int16(rint(clip(x, -1, 1) * 32767))``: NaN becomes 0, values are clipped to [-1, 1],
    scaled by 32767 (so the range is symmetric, -32767..32767) and rounded to the nearest
    integer, ties to even (``numpy.rint``, the IEEE default rounding mode that libsndfile's
    ``lrintf`` also uses).

    Args:
        samples: float array of any shape (float32 or float64).

    Returns:
        int16 array of the same shape.
    """
    x = np.nan_to_num(np.asarray(samples, dtype=np.float32), nan=0.0)
    return np.rint(np.clip(x, -1.0, 1.0) * np.float32(INT16_SCALE)).astype(np.int16)


# ---- joins between text segments (the server's wire audio; tests and benchmarks) -------------
#: length of the raised-cosine fade on each side of a segment join
JOIN_FADE_SECONDS = 0.010


def chunk_position(stats: dict, default_segment: int) -> tuple[int, int, bool]:
    """Where a chunk sits in its text: ``(segment, chunk, is_last_in_segment)``.

    Read from ``Audio.stats`` (``segment``: 0-based text segment, ``chunk``: 0-based index
    within it, ``is_last_in_segment``). A chunk without ``chunk``/``is_last_in_segment`` is a
    whole segment (chunk 0, last); one without ``segment`` is segment ``default_segment``.
    """
    segment = int(stats.get("segment", default_segment))
    if "chunk" not in stats and "is_last_in_segment" not in stats:
        return segment, 0, True
    return segment, int(stats.get("chunk", 0)), bool(stats.get("is_last_in_segment", True))


def smooth_join(samples: np.ndarray, segment: int, total: int, sample_rate: int, *,
                first: bool = True, last: bool = True) -> np.ndarray:
    """A chunk of segment ``segment`` of ``total`` with short fades at the segment joins.

    Segments are synthesized independently, so the waveform jumps where one ends and the next
    starts. The first segment keeps its start, the last its end; every join gets a 10 ms
    raised-cosine fade-out on the left and fade-in on the right, both meeting at zero: a fade-in
    on the segment's ``first`` chunk when ``segment > 0``, a fade-out on its ``last`` chunk when
    ``segment < total - 1``. Chunks inside a segment are continuous and returned untouched.
    Needs no look-ahead (``total`` is known up front), so streaming adds no latency, and a
    one-segment text is returned unchanged.

    Args:
        samples: float32 [S].
        segment: 0-based text segment of the chunk; total: number of segments.
        first / last: the chunk is the first / last of its segment (a whole segment: both).

    Returns:
        float32 [S] (``samples`` itself when nothing is faded).
    """
    n = min(int(round(JOIN_FADE_SECONDS * sample_rate)), samples.shape[0] // 2)
    fade_in = first and segment > 0
    fade_out = last and segment < total - 1
    if total <= 1 or n <= 0 or not (fade_in or fade_out):
        return samples
    out = np.array(samples, dtype=np.float32, copy=True)
    ramp = (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float64))).astype(np.float32)
    if fade_in:
        out[:n] *= ramp
    if fade_out:
        out[-n:] *= ramp[::-1]
    return out


def join_chunks(chunks: list, sample_rate: int, total: int | None = None) -> np.ndarray:
    """Chunks joined as the server sends them: :func:`smooth_join` at every segment join.

    Args:
        chunks: in order, each an :class:`~cosyvino.audio.Audio` (its position read by
            :func:`chunk_position`) or a float array (a whole segment).
        total: number of text segments (default: the last chunk's segment + 1).

    Returns:
        float32 [S]: the chunks with the server's join fades, concatenated.
    """
    if not chunks:
        return np.zeros(0, np.float32)
    positions, arrays, done = [], [], 0
    for c in chunks:
        stats = getattr(c, "stats", None)
        pos = chunk_position(stats, done) if stats is not None else (done, 0, True)
        done += int(pos[2])
        positions.append(pos)
        arrays.append(np.asarray(getattr(c, "samples", c), dtype=np.float32))
    if total is None:
        total = positions[-1][0] + 1
    return np.concatenate([smooth_join(a, seg, total, sample_rate, first=ci == 0, last=last)
                           for a, (seg, ci, last) in zip(arrays, positions)])


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
        """int16 PCM [S] by :func:`float_to_int16` (clip, x 32767, round to nearest)."""
        return float_to_int16(self.samples)

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
    """Atomically write float samples [S] to ``path`` in format ``fmt`` (see FORMATS).

    16-bit PCM formats (wav, flac) are written from :func:`float_to_int16` samples, so a file
    holds exactly the int16 the server sends for the same floats (libsndfile's own float ->
    PCM scaling is never used); lossy formats get the clipped floats.
    """
    import soundfile as sf

    container, subtype = FORMATS[fmt]
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        # A typo in an output path must not silently create directories.
        raise InputError(f"output directory does not exist: {directory}")
    fd, tmp = tempfile.mkstemp(prefix=".cosyvino-", suffix=f".{fmt}", dir=directory)
    os.close(fd)
    try:
        data = (float_to_int16(samples) if subtype in _INT16_SUBTYPES
                else np.clip(samples, -1.0, 1.0))
        sf.write(tmp, data, sample_rate, format=container, subtype=subtype)
        publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
