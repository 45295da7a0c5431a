"""Audio on the wire: segment joins without pops, and per-format stream encoders.

Every encoder takes float32 segments at the model rate (22050 Hz) and returns bytes to send:

* ``wav``  one RIFF header (sizes 0xFFFFFFFF = unknown length, the usual streaming form), then
  int16 PCM as each segment arrives; model rate.
* ``pcm``  raw int16 little-endian mono at 24 kHz (OpenAI's ``pcm``), resampled with a
  *streaming* soxr resampler so segment boundaries leave no resampling seams.
* ``raw``  raw int16 at the model rate, no header (CosyVoice ``/inference_sft`` wire format).
* ``flac`` / ``mp3`` / ``opus``: container formats are encoded once the last segment is in
  (libsndfile via soundfile); flac/mp3 at the model rate, opus (Ogg) at 24 kHz because Opus
  only takes 8/12/16/24/48 kHz.
"""

from __future__ import annotations

import io
import struct

import numpy as np

#: OpenAI ``response_format`` -> Content-Type
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
#: formats we produce for /v1/audio/speech (aac is OpenAI's but libsndfile cannot write it)
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")
PCM_RATE = 24000
OPUS_RATE = 24000
#: length of the raised-cosine fade on each side of a segment join
JOIN_FADE_SECONDS = 0.010


def to_int16(samples: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16 (x 32767, clipped), the same rule as ``Audio.to_int16``."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def smooth_join(samples: np.ndarray, index: int, total: int, sample_rate: int) -> np.ndarray:
    """Segment ``index`` of ``total`` with short fades at the joins (no pop between segments).

    Segments are synthesized independently, so the waveform jumps where one ends and the next
    starts. The first segment keeps its start, the last its end; every join gets a 10 ms
    raised-cosine fade-out on the left and fade-in on the right, both meeting at zero. Needs no
    look-ahead (``total`` is known up front), so streaming adds no latency, and a one-segment
    text is returned unchanged (bit-identical to ``Synthesizer.synthesize``).
    """
    n = min(int(round(JOIN_FADE_SECONDS * sample_rate)), samples.shape[0] // 2)
    if total <= 1 or n <= 0:
        return samples
    out = np.array(samples, dtype=np.float32, copy=True)
    ramp = (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float64))).astype(np.float32)
    if index > 0:
        out[:n] *= ramp
    if index < total - 1:
        out[-n:] *= ramp[::-1]
    return out


def join_segments(chunks: list[np.ndarray], sample_rate: int) -> np.ndarray:
    """What the server sends for these segments, as one float array (tests, benchmarks)."""
    total = len(chunks)
    if not total:
        return np.zeros(0, np.float32)
    return np.concatenate([smooth_join(c, i, total, sample_rate) for i, c in enumerate(chunks)])


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """44-byte PCM WAV header with unknown length (RIFF and data sizes 0xFFFFFFFF)."""
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate,
                                    sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


class StreamEncoder:
    """Feed segments in order with :meth:`feed`; :meth:`finish` returns the trailing bytes."""

    media_type = "application/octet-stream"

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def feed(self, samples: np.ndarray, last: bool) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""


class RawEncoder(StreamEncoder):
    """int16 LE at the model rate, no header (CosyVoice server wire format)."""

    def feed(self, samples, last):
        return to_int16(samples).tobytes()


class WavEncoder(StreamEncoder):
    media_type = CONTENT_TYPES["wav"]

    def __init__(self, sample_rate):
        super().__init__(sample_rate)
        self._header_sent = False

    def _header(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return wav_stream_header(self.sample_rate)

    def feed(self, samples, last):
        return self._header() + to_int16(samples).tobytes()

    def finish(self):
        return self._header()  # an empty stream is still a valid (empty) WAV


class PcmEncoder(StreamEncoder):
    """int16 LE mono at 24 kHz; one soxr stream across all segments."""

    media_type = CONTENT_TYPES["pcm"]

    def __init__(self, sample_rate):
        super().__init__(sample_rate)
        self._resampler = None
        self._done = False

    def feed(self, samples, last):
        if self.sample_rate == PCM_RATE:
            return to_int16(samples).tobytes()
        import soxr

        if self._resampler is None:
            self._resampler = soxr.ResampleStream(self.sample_rate, PCM_RATE, 1,
                                                  dtype="float32", quality="HQ")
        out = self._resampler.resample_chunk(np.ascontiguousarray(samples, np.float32),
                                             last=last)
        self._done = self._done or last
        return to_int16(out).tobytes()

    def finish(self):
        if self._resampler is None or self._done:
            return b""
        self._done = True
        return to_int16(self._resampler.resample_chunk(np.zeros(0, np.float32),
                                                       last=True)).tobytes()


class FileEncoder(StreamEncoder):
    """Collects the segments and encodes one file at the end (flac, mp3, opus)."""

    _SF = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}

    def __init__(self, sample_rate, fmt: str):
        super().__init__(sample_rate)
        self.fmt = fmt
        self.media_type = CONTENT_TYPES[fmt]
        self._parts: list[np.ndarray] = []

    def feed(self, samples, last):
        self._parts.append(np.asarray(samples, np.float32))
        return b""

    def finish(self):
        import soundfile as sf

        samples = (np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32))
        rate = self.sample_rate
        if self.fmt == "opus" and rate != OPUS_RATE:
            import soxr

            samples = soxr.resample(samples, rate, OPUS_RATE, quality="HQ").astype(np.float32)
            rate = OPUS_RATE
        container, subtype = self._SF[self.fmt]
        buf = io.BytesIO()
        with sf.SoundFile(buf, "w", samplerate=rate, channels=1, format=container,
                          subtype=subtype) as f:
            f.write(np.clip(samples, -1.0, 1.0))
        return buf.getvalue()


def make_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    """Encoder for an OpenAI ``response_format`` or ``raw`` (CosyVoice wire format)."""
    if fmt == "raw":
        return RawEncoder(sample_rate)
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt in FileEncoder._SF:
        return FileEncoder(sample_rate, fmt)
    raise ValueError(f"unknown format {fmt!r}")
