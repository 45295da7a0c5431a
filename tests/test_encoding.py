"""Progressive stream encoders (every response format), chunk joins and the one float -> int16
rule, without HTTP."""

from __future__ import annotations

import hashlib
import io
import wave

import numpy as np
import pytest

from cosyvino.audio import Audio, float_to_int16
from cosyvino.server.encoding import (AAC_PRIMING, AV_FORMATS, OPUS_RATE, PCM_RATE,
                                      SPEECH_FORMATS, chunk_position, encode_file,
                                      join_segments, make_encoder, smooth_join, to_int16)

sf = pytest.importorskip("soundfile")
av = pytest.importorskip("av")
soxr = pytest.importorskip("soxr")

RATE = 22050


def speech_like(seconds: float = 3.3, seed: int = 0) -> np.ndarray:
    """A voiced, pitch-varying, amplitude-modulated signal with a little noise (float32)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 0.7 * t)) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(4 * np.pi * t)) ** 2
    x = 0.3 * x / np.abs(x).max() + 0.003 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def encode_chunks(fmt: str, x: np.ndarray, n_chunks: int) -> list[bytes]:
    """Bytes returned by each feed (the last chunk marked last), then by finish()."""
    enc = make_encoder(fmt, RATE)
    parts = np.array_split(x, n_chunks)
    out = [enc.feed(p, i == n_chunks - 1) for i, p in enumerate(parts)]
    return out + [enc.finish()]


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode with FFmpeg (PyAV): samples as float (int formats keep their integer values)."""
    with av.open(io.BytesIO(data)) as c:
        rate = c.streams.audio[0].rate
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(audio=0)]
    return (np.concatenate(frames) if frames else np.zeros(0)), rate


def aligned(ref: np.ndarray, y: np.ndarray, max_lag: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``ref`` and ``y`` cut to their overlap after removing ``y``'s codec delay (the lag in
    0..max_lag with the largest cross-correlation)."""
    n = min(ref.size, y.size - max_lag)
    scores = [float(np.dot(ref[:n], y[lag:lag + n])) for lag in range(max_lag + 1)]
    lag = int(np.argmax(scores))
    m = min(ref.size, y.size - lag)
    return ref[:m], y[lag:lag + m], lag


def snr_db(ref: np.ndarray, y: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)))


# ---- the one int16 rule ----------------------------------------------------------------------
def test_int16_rule_rounds_to_nearest_clips_and_maps_nan_to_zero():
    lsb = 1.0 / 32767
    x = np.array([0.0, 0.4 * lsb, 0.6 * lsb, -0.6 * lsb, 1.4 * lsb, 2.5 * lsb, 1.0, -1.0,
                  1.5, -7.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(
        float_to_int16(x), [0, 0, 1, -1, 1, 2, 32767, -32767, 32767, -32767, 0, 32767, -32767])
    assert float_to_int16(x).dtype == np.int16
    # the server's conversion is the same function
    y = speech_like(0.2)
    np.testing.assert_array_equal(to_int16(y), float_to_int16(y))
    np.testing.assert_array_equal(Audio(y, RATE).to_int16(), float_to_int16(y))


def test_cli_wav_file_has_exactly_the_servers_wav_samples(tmp_path):
    # values just below .5 LSB steps, where truncation and rounding differ by one LSB
    x = (speech_like(0.5) + np.float32(0.49 / 32767)).astype(np.float32)
    path = Audio(x, RATE).write(tmp_path / "cli.wav")
    cli, rate = sf.read(path, dtype="int16")
    server = b"".join(encode_chunks("wav", x, 3))
    streamed, srate = sf.read(io.BytesIO(server), dtype="int16")
    assert rate == srate == RATE
    np.testing.assert_array_equal(cli, streamed)
    np.testing.assert_array_equal(cli, float_to_int16(x))
    # truncation would have given other samples: the test can tell the rules apart
    assert np.any((np.clip(x, -1, 1) * 32767).astype(np.int16) != cli)


def test_cli_flac_file_has_exactly_the_servers_flac_samples(tmp_path):
    x = speech_like(0.5)
    path = Audio(x, RATE).write(tmp_path / "cli.flac")
    cli, _ = sf.read(path, dtype="int16")
    streamed, rate = decode(b"".join(encode_chunks("flac", x, 3)))
    assert rate == RATE
    np.testing.assert_array_equal(cli, streamed)


# ---- progressive encoders --------------------------------------------------------------------
#: format -> (decoded rate, most extra samples a decoder may return at the end: encoder delay
#: and frame padding that the stream does not signal, at the decoded rate)
DECODED = {"wav": (RATE, 0), "flac": (RATE, 0), "mp3": (RATE, 1105 + 2 * 576),
           "aac": (RATE, 1024 + 2 * 1024), "opus": (48000, 0)}


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_stream_decodes_to_the_input(fmt):
    x = speech_like()
    parts = encode_chunks(fmt, x, 7)
    y, rate = decode(b"".join(parts))
    want_rate, extra = DECODED[fmt]
    assert rate == want_rate
    ref = x if rate == RATE else soxr.resample(x, RATE, rate).astype(np.float32)
    assert ref.size <= y.size <= ref.size + extra, (y.size, ref.size)
    if fmt in ("wav", "flac"):  # lossless: exactly the int16 of the input
        np.testing.assert_array_equal(y, float_to_int16(x))
        return
    a, b, _ = aligned(ref, y.astype(np.float32), max_lag=extra or 64)
    assert np.corrcoef(a, b)[0, 1] > 0.99
    assert snr_db(a, b) > 15.0, snr_db(a, b)  # measured 22-30 dB (docs/server.md)


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3", "opus", "aac"])
def test_bytes_leave_before_finish(fmt):
    x = speech_like()
    parts = encode_chunks(fmt, x, 7)
    early = b"".join(parts[:3])  # what the first 3 of 7 chunks (~1.4 s) gave, nothing forced
    if fmt == "pcm":
        n = len(early) // 2
    else:
        n = decode(early)[0].size * (RATE / DECODED[fmt][0])
    # most of those 1.4 s already decode: only codec look-ahead / page filling is held back
    assert n > 0.8 * 3 * x.size / 7, (fmt, n)
    assert all(parts[1:-2])  # every chunk of the stream produced bytes
    assert not parts[-1]  # the last chunk was marked last: nothing left for finish()


def test_pcm_stream_is_24khz_int16_of_the_resampled_input():
    x = speech_like(1.0)
    pcm = np.frombuffer(b"".join(encode_chunks("pcm", x, 5)), "<i2")
    ref = float_to_int16(soxr.resample(x, RATE, PCM_RATE, quality="HQ"))
    assert abs(pcm.size - ref.size) <= 2
    n = min(pcm.size, ref.size)
    assert np.abs(pcm[:n].astype(int) - ref[:n]).max() <= 2  # no seams at chunk edges


def test_flac_stream_has_one_header_and_finish_only_ends_it():
    x = speech_like(1.0)
    enc = make_encoder("flac", RATE)
    first = enc.feed(x[:10000], False)
    rest = enc.feed(x[10000:], False)
    tail = enc.finish()  # no chunk was marked last: finish() flushes and ends the stream
    assert first[:4] == b"fLaC" and (first + rest + tail).count(b"fLaC") == 1
    np.testing.assert_array_equal(decode(first + rest + tail)[0], float_to_int16(x))


@pytest.mark.parametrize("fmt", sorted(AV_FORMATS))
def test_same_input_gives_the_same_bytes(fmt):
    x = speech_like(0.7)
    assert b"".join(encode_chunks(fmt, x, 3)) == b"".join(encode_chunks(fmt, x, 3))


@pytest.mark.parametrize("fmt", ["wav", "pcm", "mp3", "opus", "aac", "flac"])
@pytest.mark.parametrize("complete", [True, False])
def test_feeding_after_the_last_chunk_is_an_error(fmt, complete):
    enc = make_encoder(fmt, RATE)
    if not complete:
        enc.feed(speech_like(0.1), False)
    enc.feed(speech_like(0.1), True)
    with pytest.raises(ValueError, match="after the last chunk"):
        enc.feed(speech_like(0.1), False)


def test_unknown_format_and_aac_is_offered():
    with pytest.raises(ValueError, match="unknown format"):
        make_encoder("ogg", RATE)
    assert set(SPEECH_FORMATS) == {"wav", "pcm", "flac", "mp3", "opus", "aac"}
    assert make_encoder("aac", RATE).media_type == "audio/aac"


def test_a_cut_encoder_can_be_closed():
    enc = make_encoder("mp3", RATE)
    enc.feed(speech_like(0.3), False)
    enc.close()
    enc.close()  # idempotent


# ---- complete files ---------------------------------------------------------------------------
def one_chunk(fmt: str, x: np.ndarray) -> bytes:
    """What a response whose first chunk is its last sends (the server's complete file)."""
    enc = make_encoder(fmt, RATE)
    data = enc.feed(x, True) + enc.finish()
    assert enc.complete
    return data


def streaminfo(data: bytes) -> tuple[int, bytes]:
    """(total samples, MD5) of a FLAC's STREAMINFO (FLAC format spec, "METADATA_BLOCK_STREAMINFO":
    the block follows ``fLaC`` and its 4-byte block header; total samples are the low 36 bits
    of bytes 13..17, the MD5 of the decoded samples the last 16 bytes)."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # first block is STREAMINFO
    info = data[8:8 + 34]
    total = int.from_bytes(info[13:18], "big") & ((1 << 36) - 1)
    return total, info[18:34]


#: lengths around mp3 frame edges (576 samples) and the tiny one of a short reply
LENGTHS = [100, 577, 23041, 72765]


@pytest.mark.parametrize("n", LENGTHS)
def test_complete_wav_has_its_length_for_every_reader(n):
    x = speech_like(n / RATE + 0.01)[:n]
    data = one_chunk("wav", x)
    with wave.open(io.BytesIO(data)) as w:  # the stdlib reads the header's sizes
        assert (w.getnframes(), w.getframerate(), w.getsampwidth()) == (n, RATE, 2)
        np.testing.assert_array_equal(np.frombuffer(w.readframes(n + 10), "<i2"),
                                      float_to_int16(x))
    assert sf.info(io.BytesIO(data)).frames == n
    y, rate = decode(data)
    assert rate == RATE and y.size == n
    assert data == encode_file("wav", x, RATE)


@pytest.mark.parametrize("n", LENGTHS)
def test_complete_flac_has_total_samples_and_md5(n):
    x = speech_like(n / RATE + 0.01)[:n]
    data = one_chunk("flac", x)
    pcm = float_to_int16(x)
    assert streaminfo(data) == (n, hashlib.md5(pcm.astype("<i2").tobytes()).digest())
    assert sf.info(io.BytesIO(data)).frames == n
    y, rate = sf.read(io.BytesIO(data), dtype="int16")  # raised "array is too big" before
    assert rate == RATE
    np.testing.assert_array_equal(y, pcm)
    np.testing.assert_array_equal(decode(data)[0], pcm)


@pytest.mark.parametrize("n", LENGTHS)
def test_complete_mp3_starts_and_ends_with_the_audio(n):
    x = speech_like(n / RATE + 0.01)[:n]
    data = one_chunk("mp3", x)
    y, rate = decode(data)  # FFmpeg reads the LAME header's delay and padding
    assert rate == RATE and y.size == n
    assert sf.info(io.BytesIO(data)).frames == n  # so does mpg123 (libsndfile)
    z, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and z.size == n
    np.testing.assert_allclose(z, y, atol=1e-4)  # both decoders give the same samples
    if n > 2000:  # the start lines up: no priming left in front
        _, _, lag = aligned(x, y.astype(np.float32), max_lag=1105 + 576)
        assert lag == 0
        assert snr_db(x, y) > 15.0


def test_complete_mp3_is_the_streams_audio_without_its_delay():
    x = speech_like()
    streamed, _ = decode(b"".join(encode_chunks("mp3", x, 7)))
    whole, _ = decode(one_chunk("mp3", x))
    # the same LAME frames: the stream (no LAME header) shows the 1105-sample delay
    # (docs/server.md) that the complete file's header removes
    np.testing.assert_allclose(streamed[1105:1105 + x.size], whole, atol=1e-6)


def test_complete_opus_has_its_length():
    x = speech_like()
    data = one_chunk("opus", x)
    n_opus = round(x.size * OPUS_RATE / RATE)
    y, rate = decode(data)  # FFmpeg decodes Opus at 48 kHz
    assert rate == 48000 and abs(y.size - 2 * n_opus) <= 2
    z, rate = sf.read(io.BytesIO(data), dtype="float32")  # libsndfile at the stream's rate
    assert rate == OPUS_RATE and abs(z.size - n_opus) <= 1
    ref = soxr.resample(x, RATE, 48000).astype(np.float32)
    _, _, lag = aligned(ref, y.astype(np.float32), max_lag=64)
    assert lag == 0


def test_aac_decodes_with_the_documented_priming():
    # ADTS cannot signal the encoder's priming: decoders return AAC_PRIMING samples first and
    # pad the end to a 1024-sample frame (docs/server.md); after them the start lines up
    x = speech_like()
    for data in (one_chunk("aac", x), b"".join(encode_chunks("aac", x, 7))):
        y, rate = decode(data)
        assert rate == RATE
        assert x.size + AAC_PRIMING <= y.size < x.size + AAC_PRIMING + 1024
        _, b, lag = aligned(x, y.astype(np.float32), max_lag=2048)
        assert lag == AAC_PRIMING
        assert snr_db(x[:b.size], b) > 15.0


def test_streamed_files_say_their_length_is_unknown():
    # what docs/server.md tells stream readers: no muxer patches what was sent
    x = speech_like(1.0)
    flac = b"".join(encode_chunks("flac", x, 3))
    assert streaminfo(flac)[0] == 0  # "unknown"; FFmpeg still decodes all of it
    np.testing.assert_array_equal(decode(flac)[0], float_to_int16(x))
    wav = b"".join(encode_chunks("wav", x, 3))
    with wave.open(io.BytesIO(wav)) as w:
        assert w.getnframes() == 0x7FFFFFFF  # 0xFFFFFFFF bytes; reading stops at the end
        assert len(w.readframes(w.getnframes())) == 2 * x.size
    assert sf.read(io.BytesIO(wav))[0].size == x.size


@pytest.mark.parametrize("fmt", SPEECH_FORMATS)
def test_no_audio_at_all_is_a_complete_response(fmt):
    enc = make_encoder(fmt, RATE)
    data = enc.finish()  # no audio at all (mp3/opus/aac: no bytes, as before)
    assert enc.complete
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as w:
            assert w.getnframes() == 0


# ---- joins -----------------------------------------------------------------------------------
def _tone(n, offset):
    return (offset + 0.3 * np.sin(np.arange(n) / 7.0)).astype(np.float32)


def test_chunk_position_defaults_to_a_whole_segment():
    assert chunk_position({}, 3) == (3, 0, True)
    assert chunk_position({"segment": 1}, 3) == (1, 0, True)
    assert chunk_position({"segment": 2, "chunk": 1, "is_last_in_segment": False}, 0) == \
        (2, 1, False)


def test_fades_only_at_segment_joins():
    x = _tone(3000, 0.6)
    n = int(round(0.010 * RATE))
    inner = smooth_join(x, 1, 3, RATE, first=False, last=False)
    assert inner is x  # a chunk inside a segment is untouched
    head = smooth_join(x, 1, 3, RATE, first=True, last=False)
    assert head[0] == 0 and np.array_equal(head[n:], x[n:])
    tail = smooth_join(x, 1, 3, RATE, first=False, last=True)
    assert tail[-1] == 0 and np.array_equal(tail[:-n], x[:-n])
    # the text's first chunk keeps its start, the last chunk its end
    assert smooth_join(x, 0, 3, RATE, first=True, last=False) is x
    assert smooth_join(x, 2, 3, RATE, first=False, last=True) is x


def test_join_of_chunks_equals_join_of_their_segments():
    segs = [_tone(5000, 0.6), _tone(7000, -0.5), _tone(4000, 0.4)]
    chunks = []
    for s, seg in enumerate(segs):
        pieces = np.array_split(seg, 3)
        for c, p in enumerate(pieces):
            chunks.append(Audio(p, RATE, stats={"segment": s, "chunk": c,
                                                "is_last_in_segment": c == len(pieces) - 1}))
    by_chunk = join_segments(chunks, RATE)
    np.testing.assert_array_equal(by_chunk, join_segments(segs, RATE))
    # and the joins are smooth where the raw concatenation jumps
    raw = np.concatenate(segs)
    assert np.abs(np.diff(raw)).max() > 0.5 and np.abs(np.diff(by_chunk)).max() < 0.05
    # chunks without position keys are whole segments
    plain = [Audio(s, RATE) for s in segs]
    np.testing.assert_array_equal(join_segments(plain, RATE), join_segments(segs, RATE))
