"""Audio on the wire: per-format encoders that stream progressively or, when the whole audio is
there before the first byte goes out, write one complete file (the joins between text segments
are :func:`cosyvino.audio.smooth_join`, re-exported here).

Every encoder takes float32 chunks at the model rate (the loaded model's
``Synthesizer.sample_rate``: 22050 Hz for CosyVoice v1, 24000 Hz for CosyVoice2) in order;
:func:`wire_rate` says the rate of what a format sends. Two cases
(docs/server.md, "Complete files and streams"):

* **complete file**: the first chunk fed is also the last (``feed(x, last=True)`` first, or
  :func:`encode_file`; the server's one-chunk responses and its cache entries). The file's
  header holds the real length: WAV sizes (soundfile), FLAC STREAMINFO total samples and MD5,
  mp3 Xing/LAME header with the encoder delay and padding (FFmpeg's muxers patch these at the
  end, which needs the seekable in-memory file used here). :attr:`StreamEncoder.complete`.
* **stream**: later chunks follow; each :meth:`StreamEncoder.feed` returns the bytes its
  encoder/muxer produced so far (one container header, then frames or pages, never the whole
  file at the end) into a non-seekable sink, so nothing already sent is patched: WAV sizes
  0xFFFFFFFF, FLAC total samples 0 ("unknown"), no Xing/LAME header.

Formats:

* ``wav``  int16 PCM at the model rate.
* ``pcm``  raw int16 little-endian mono at 24 kHz (OpenAI's ``pcm``), resampled with a
  *streaming* soxr resampler so chunk boundaries leave no resampling seams.
* ``raw``  raw int16 at the model rate, no header (CosyVoice ``/inference_sft`` wire format).
* ``mp3`` (libmp3lame), ``opus`` (libopus in Ogg), ``flac``, ``aac`` (FFmpeg's AAC encoder in
  ADTS frames): FFmpeg encoders and muxers through PyAV. mp3/flac/aac at the model rate; opus
  at 24 kHz (Opus only takes 8/12/16/24/48 kHz), through the same streaming soxr resampler as
  ``pcm``. ADTS has no field for the AAC encoder's 1024-sample priming
  (:data:`AAC_PRIMING`): decoders return it before the audio, complete file or not.

``pcm`` and ``raw`` have no header: a stream of them is a complete file. Every int16 sample
comes from :func:`cosyvino.audio.float_to_int16`, the rule the CLI's files use too.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..audio import float_to_int16, join_chunks
# re-exported: the server's join policy (used by streaming.py, tests, benchmarks)
from ..audio import JOIN_FADE_SECONDS, chunk_position, smooth_join  # noqa: F401

#: OpenAI ``response_format`` -> Content-Type
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
#: formats we produce for /v1/audio/speech (all of OpenAI's)
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
PCM_RATE = 24000
OPUS_RATE = 24000
#: samples of encoder priming FFmpeg's AAC encoder puts before the audio (its
#: ``initial_padding``: one 1024-sample frame, the MDCT overlap of AAC-LC, ISO/IEC 14496-3
#: §4.6.11). ADTS cannot signal it, so every decoder returns these samples first.
AAC_PRIMING = 1024

#: what the server sends for a list of chunks, as one float array (tests, benchmarks): the
#: joins of :func:`cosyvino.audio.join_chunks` (the server's join policy lives there)
join_segments = join_chunks


def to_int16(samples: np.ndarray) -> np.ndarray:
    """float -> int16 by :func:`cosyvino.audio.float_to_int16` (clip to [-1, 1], x 32767,
    round to nearest)."""
    return float_to_int16(samples)


# ---- encoders --------------------------------------------------------------------------------
def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """44-byte PCM WAV header with unknown length (RIFF and data sizes 0xFFFFFFFF), for streams
    only: a complete file gets its real sizes (:func:`wav_file`)."""
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate,
                                    sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def wav_file(samples: np.ndarray, sample_rate: int) -> bytes:
    """A complete 16-bit mono WAV of int16 ``samples`` [S] (libsndfile through soundfile:
    RIFF and data sizes are the real ones)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(samples, np.int16), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


class StreamEncoder:
    """Feed chunks in order with :meth:`feed` (``last=True`` on the final one, which then also
    returns the trailing bytes); :meth:`finish` returns whatever is still due (all of it when
    no chunk was marked last); :meth:`close` frees the encoder of a stream that was cut.

    A first :meth:`feed` with ``last=True`` (or :meth:`finish` before any feed) returns one
    complete file instead of a stream (module docstring); :attr:`complete` then says so.

    Attributes:
        media_type: the Content-Type.
        sample_rate: Hz of the float input (the model rate).
        complete: True when the bytes returned make a complete file whose header holds the
            real length (always for the headerless ``pcm``/``raw``); False for a stream.
    """

    media_type = "application/octet-stream"
    complete = True

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def feed(self, samples: np.ndarray, last: bool) -> bytes:  # pragma: no cover - abstract
        """Encode float32 [S] (``last``: no more chunks follow); returns the bytes ready."""
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""

    def close(self) -> None:
        """Release the encoder without finishing (idempotent)."""


class RawEncoder(StreamEncoder):
    """int16 LE at the model rate, no header (CosyVoice server wire format)."""

    def feed(self, samples, last):
        return to_int16(samples).tobytes()


class WavEncoder(StreamEncoder):
    """A complete WAV for a first chunk marked last; otherwise one unknown-length WAV header,
    then int16 LE at the model rate per chunk.

    Raises:
        ValueError: audio fed after the last chunk.
    """

    media_type = CONTENT_TYPES["wav"]

    def __init__(self, sample_rate):
        super().__init__(sample_rate)
        self.complete = False
        self._started = False
        self._ended = False

    def feed(self, samples, last):
        if self._ended:
            raise ValueError("audio fed after the last chunk")
        self._ended = last
        data = to_int16(samples)
        if not self._started and last:
            self._started = self.complete = True
            return wav_file(data, self.sample_rate)
        head = b"" if self._started else wav_stream_header(self.sample_rate)
        self._started = True
        return head + data.tobytes()

    def finish(self):
        if self._started:
            return b""
        # no audio at all: a complete, empty WAV
        self._started = self._ended = self.complete = True
        return wav_file(np.zeros(0, np.int16), self.sample_rate)


class _Resampler:
    """One soxr stream from ``rate_in`` to ``rate_out`` (float32 mono), HQ quality."""

    def __init__(self, rate_in: int, rate_out: int):
        import soxr

        self._stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32",
                                           quality="HQ")
        self.done = False

    def __call__(self, samples: np.ndarray, last: bool) -> np.ndarray:
        if self.done:
            raise ValueError("audio fed after the last chunk")
        self.done = last
        return self._stream.resample_chunk(np.ascontiguousarray(samples, np.float32),
                                           last=last)

    def flush(self) -> np.ndarray:
        return np.zeros(0, np.float32) if self.done else self(np.zeros(0, np.float32), True)


class PcmEncoder(StreamEncoder):
    """int16 LE mono at 24 kHz; one soxr stream across all chunks."""

    media_type = CONTENT_TYPES["pcm"]

    def __init__(self, sample_rate):
        super().__init__(sample_rate)
        self._resampler = _Resampler(sample_rate, PCM_RATE) if sample_rate != PCM_RATE \
            else None

    def feed(self, samples, last):
        if self._resampler is None:
            return to_int16(samples).tobytes()
        return to_int16(self._resampler(samples, last)).tobytes()

    def finish(self):
        if self._resampler is None:
            return b""
        return to_int16(self._resampler.flush()).tobytes()


@dataclass(frozen=True)
class AvFormat:
    """How one response format is made with FFmpeg (through PyAV).

    Attributes:
        muxer: FFmpeg output format name; codec: encoder name.
        sample_format: the encoder's input sample format (``s16`` gets
            :func:`float_to_int16` samples, so flac is exactly the wav's samples).
        rate: output Hz, or None for the model rate.
        bit_rate: bits per second for lossy codecs (our choice for mono speech), None for
            lossless.
        options: muxer options.
    """

    muxer: str
    codec: str
    sample_format: str
    rate: int | None = None
    bit_rate: int | None = None
    options: dict = field(default_factory=dict)


#: response format -> how PyAV makes it. Ogg pages are closed every 20 ms of audio, one Opus
#: frame each (the muxer's default is 1 s, which would hold back the first second of every
#: stream; with 40 ms pages the latency schedule's 116 ms first chunk decoded to nothing until
#: the next chunk arrived).
AV_FORMATS = {
    "mp3": AvFormat("mp3", "libmp3lame", "fltp", bit_rate=64000),
    "opus": AvFormat("ogg", "libopus", "flt", rate=OPUS_RATE, bit_rate=32000,
                     options={"page_duration": "20000"}),
    "flac": AvFormat("flac", "flac", "s16"),
    "aac": AvFormat("adts", "aac", "fltp", bit_rate=64000),
}


class _StreamSink:
    """The file a streaming muxer writes to: appends, cannot seek (so nothing already sent is
    rewritten; muxers then leave lengths "unknown"); :meth:`take` hands out what was written
    since the last call."""

    def __init__(self):
        self._buf = bytearray()

    def write(self, data) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class _FileSink(io.BytesIO):
    """The file a complete file's muxer writes to: seekable, so the muxer's trailer patches the
    header (FLAC STREAMINFO, mp3 Xing/LAME frame); :meth:`take` is called once, after the
    muxer closed."""

    def take(self) -> bytes:
        out = self.getvalue()
        self.seek(0)
        self.truncate()
        return out


class AvEncoder(StreamEncoder):
    """mp3 / opus / flac / aac with PyAV (FFmpeg's encoders and muxers): a complete file for a
    first chunk marked last, otherwise progressively.

    A stream's container header goes out with the first bytes; every :meth:`feed` returns the
    frames (pages) the encoder and muxer completed for it. What the codec still needs for its
    look-ahead and to fill a frame (an Ogg page) stays in it until the next chunk or the end
    (how much: docs/server.md).

    Raises:
        ValueError: unknown format, or audio fed after the last chunk.
    """

    def __init__(self, sample_rate: int, fmt: str):
        super().__init__(sample_rate)
        import av

        if fmt not in AV_FORMATS:
            raise ValueError(f"unknown format {fmt!r}")
        self.fmt = fmt
        self.media_type = CONTENT_TYPES[fmt]
        self._spec = spec = AV_FORMATS[fmt]
        self.output_rate = spec.rate or sample_rate
        self._resampler = (_Resampler(sample_rate, self.output_rate)
                           if self.output_rate != sample_rate else None)
        self._av = av
        self._sink = None  # opened by the first feed / finish: a stream or a complete file
        self._container = None
        self._stream = None
        self.complete = False
        self._pts = 0
        self._packets = 0          # packets muxed (mp3 end padding, :meth:`_end`)
        self._initial_padding = 0  # the encoder's priming, from its first packet
        self._ended = False
        self._closed = False

    def _open(self, complete: bool) -> None:
        av, spec = self._av, self._spec
        self.complete = complete
        self._sink = _FileSink() if complete else _StreamSink()
        self._container = av.open(self._sink, "w", format=spec.muxer,
                                  container_options=dict(spec.options))
        # flush_packets: bytes reach the sink per packet, not per 32 KiB of I/O buffer;
        # bitexact: no random Ogg serial, no version strings (same input, same bytes)
        self._container.flags |= (av.container.Flags.flush_packets.value
                                  | av.container.Flags.bitexact.value)
        self._stream = self._container.add_stream(spec.codec, rate=self.output_rate)
        codec = self._stream.codec_context
        codec.layout = "mono"
        if spec.bit_rate:
            codec.bit_rate = spec.bit_rate

    def _encode(self, samples: np.ndarray) -> None:
        if samples.size == 0:
            return
        if self._spec.sample_format == "s16":
            data = to_int16(samples)
        else:
            data = np.clip(np.ascontiguousarray(samples, np.float32), -1.0, 1.0)
        frame = self._av.AudioFrame.from_ndarray(data.reshape(1, -1),
                                                 format=self._spec.sample_format,
                                                 layout="mono")
        frame.sample_rate = self.output_rate
        frame.time_base = Fraction(1, self.output_rate)
        frame.pts = self._pts
        self._pts += data.size
        self._mux(self._stream.encode(frame))

    def _mux(self, packets: list) -> None:
        self._note_priming(packets)
        self._packets += len(packets)
        self._container.mux(packets)

    def _note_priming(self, packets: list) -> None:
        if packets and not self._packets:  # the encoder's first packet carries its priming
            self._initial_padding = _skip_samples(packets[0])[0]

    def _end(self) -> None:
        if self._resampler is not None:
            self._encode(self._resampler.flush())
        packets = self._stream.encode(None)  # the encoder's delayed frames
        if self.complete and self._spec.codec == "libmp3lame" and packets:
            self._note_priming(packets)
            self._set_mp3_end_padding(packets[-1], self._packets + len(packets))
        self._mux(packets)
        self._ended = True
        self.close()  # the trailer (a stream's sink cannot seek: nothing sent is rewritten)

    def _set_mp3_end_padding(self, last_packet, n_packets: int) -> None:
        """Make the LAME header's padding the real one.

        FFmpeg's mp3 muxer takes the padding from the last packet's skip-samples side data
        alone, but libmp3lame's flush gives a partly filled frame then an all-padding one, so
        the partly filled frame's padding (up to one 576-sample frame) was lost and decoders
        returned that much extra at the end. The padding the decoders must drop is what the
        packets hold beyond the priming and the input: ``packets x frame_size - priming -
        samples``.
        """
        frame_size = self._stream.codec_context.frame_size
        padding = n_packets * frame_size - self._initial_padding - self._pts
        side = last_packet.get_sidedata("skip_samples")
        if padding < 0 or not side:  # nothing to correct (no partly filled frame)
            return
        data = bytearray(bytes(side))
        data[4:8] = struct.pack("<I", padding)
        side.update(bytes(data))
        last_packet.set_sidedata(side)

    def feed(self, samples, last):
        if self._ended:
            raise ValueError("audio fed after the last chunk")
        if self._container is None:
            self._open(complete=last)
        x = np.asarray(samples, np.float32)
        if self._resampler is not None:
            x = self._resampler(x, False)
        self._encode(x)
        if last:
            self._end()
        return self._sink.take()

    def finish(self):
        if not self._ended:
            if self._container is None:
                self._open(complete=True)  # no audio at all: a complete, empty file
            self._end()
        return self._sink.take()

    def close(self):
        if not self._closed:
            self._closed = True
            if self._container is not None:
                self._container.close()


def _skip_samples(packet) -> tuple[int, int]:
    """(samples to skip at the start, samples to discard at the end) of a packet's
    AV_PKT_DATA_SKIP_SAMPLES side data (FFmpeg libavcodec/packet.h: u32le, u32le, u8, u8);
    (0, 0) when it has none."""
    side = packet.get_sidedata("skip_samples")
    if not side or side.data_size < 8:
        return 0, 0
    start, end = struct.unpack_from("<II", bytes(side))
    return start, end


def wire_rate(fmt: str, sample_rate: int) -> int:
    """Hz of the audio a response in ``fmt`` carries for a model at ``sample_rate`` Hz (what
    the ``X-Sample-Rate`` header says): :data:`PCM_RATE` for ``pcm``, :data:`OPUS_RATE` for
    ``opus``, the model rate for ``raw``, ``wav``, ``flac``, ``mp3`` and ``aac`` (module
    docstring).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "pcm":
        return PCM_RATE
    if fmt in ("raw", "wav"):
        return sample_rate
    if fmt in AV_FORMATS:
        return AV_FORMATS[fmt].rate or sample_rate
    raise ValueError(f"unknown format {fmt!r}")


def make_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    """Encoder for an OpenAI ``response_format`` or ``raw`` (CosyVoice wire format).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "raw":
        return RawEncoder(sample_rate)
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt in AV_FORMATS:
        return AvEncoder(sample_rate, fmt)
    raise ValueError(f"unknown format {fmt!r}")


def encode_file(fmt: str, samples: np.ndarray, sample_rate: int) -> bytes:
    """The complete file of float32 ``samples`` [S] at ``sample_rate`` Hz in ``fmt`` (what
    a one-chunk response sends; the result cache stores these).

    Raises:
        ValueError: unknown format.
    """
    encoder = make_encoder(fmt, sample_rate)
    try:
        return encoder.feed(samples, True) + encoder.finish()
    finally:
        encoder.close()
