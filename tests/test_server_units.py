"""Server building blocks without HTTP: joins, encoders, result cache, Synthesizer cancel."""

from __future__ import annotations

import io
import os
import threading
import wave

import numpy as np
import pytest

from cosyvino.errors import InputError, SynthesisCancelled
from cosyvino.server.cache import ResultCache, cache_key, model_fingerprint
from cosyvino.server.encoding import join_segments, make_encoder, smooth_join, wav_stream_header


def _tone(n, offset=0.5):
    return (offset + 0.3 * np.sin(np.arange(n) / 7.0)).astype(np.float32)


def test_single_segment_is_untouched():
    x = _tone(5000)
    assert smooth_join(x, 0, 1, 22050) is x


def test_joins_fade_to_zero_without_jumps():
    a, b = _tone(4000, 0.6), _tone(4000, -0.6)
    raw = np.concatenate([a, b])
    joined = join_segments([a, b], 22050)
    assert joined.shape == raw.shape
    assert np.abs(np.diff(raw)).max() > 1.0          # the raw join jumps by ~1.2
    assert np.abs(np.diff(joined)).max() < 0.05      # smoothed: no pop
    np.testing.assert_array_equal(joined[:1000], a[:1000])   # starts/ends untouched
    np.testing.assert_array_equal(joined[-1000:], b[-1000:])


def test_wav_stream_header_is_readable():
    x = _tone(2205, 0.0)
    enc = make_encoder("wav", 22050)
    data = enc.feed(x[:1000], False) + enc.feed(x[1000:], True) + enc.finish()
    assert data[:44] == wav_stream_header(22050) and data.count(b"RIFF") == 1
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == 22050 and samples.shape == (2205,)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)


def test_pcm_stream_resampling_matches_one_shot():
    pytest.importorskip("soxr")
    x = _tone(22050, 0.0)
    enc = make_encoder("pcm", 22050)
    parts = [enc.feed(x[i:i + 5000], i + 5000 >= x.size) for i in range(0, x.size, 5000)]
    stream = np.frombuffer(b"".join(parts) + enc.finish(), "<i2")
    enc2 = make_encoder("pcm", 22050)
    whole = np.frombuffer(enc2.feed(x, True) + enc2.finish(), "<i2")
    assert abs(stream.size - 24000) <= 2 and abs(whole.size - 24000) <= 2
    n = min(stream.size, whole.size)
    assert np.abs(stream[:n].astype(int) - whole[:n]).max() <= 2  # no seams at chunk edges


def test_cache_memory_and_disk(tmp_path):
    c = ResultCache(str(tmp_path), memory_bytes=100, disk_bytes=10_000)
    c.put("a" * 64, b"x" * 60)
    c.put("b" * 64, b"y" * 60)  # evicts "a" from memory (cap 100 bytes)
    assert len(c._mem) == 1
    assert c.get("a" * 64) == b"x" * 60  # from disk
    assert c.get("c" * 64) is None
    leftovers = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.startswith(".tmp-")]
    assert not leftovers


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_cache_file_is_ignored_and_rewritten(tmp_path, damage):
    key = "d" * 64
    c = ResultCache(str(tmp_path), memory_bytes=0)
    c.put(key, b"payload" * 100)
    path = c.path(key)
    blob = open(path, "rb").read()
    bad = {"flip": blob[:50] + bytes([blob[50] ^ 0xFF]) + blob[51:],
           "truncate": blob[:-10], "empty": b"", "garbage": b"not a cache file"}[damage]
    with open(path, "wb") as f:
        f.write(bad)
    assert c.get(key) is None and not os.path.exists(path)
    assert c.corrupt_recovered == 1
    c.put(key, b"payload" * 100)
    assert ResultCache(str(tmp_path), memory_bytes=0).get(key) == b"payload" * 100


def test_disk_cap_evicts_oldest(tmp_path):
    c = ResultCache(str(tmp_path), memory_bytes=0, disk_bytes=5000)
    keys = [f"{i:064x}" for i in range(10)]
    for i, k in enumerate(keys):
        c.put(k, bytes([i]) * 1000)
        os.utime(c.path(k), (1000 + i, 1000 + i))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path)
                for f in fs)
    assert total <= 5000
    assert c.get(keys[-1]) == bytes([9]) * 1000 and c.get(keys[0]) is None


def test_cache_key_and_fingerprint(tmp_path):
    k = cache_key(model="m", text="t", voice="v", speed=1.0, format="wav", seed=1)
    assert len(k) == 64 and k == cache_key(seed=1, format="wav", speed=1.0, voice="v", text="t",
                                           model="m")
    assert k != cache_key(model="m", text="t", voice="v", speed=1.0, format="wav", seed=2)
    (tmp_path / "llm.pt").write_bytes(b"1")
    a = model_fingerprint(str(tmp_path), "torch")
    assert a != model_fingerprint(str(tmp_path), "openvino")
    (tmp_path / "llm.pt").write_bytes(b"22")
    assert a != model_fingerprint(str(tmp_path), "torch")


def test_synthesizer_cancel_and_max_parallel(tiny_model_dir):
    from cosyvino import Synthesizer

    tts = Synthesizer(tiny_model_dir, num_threads=1)
    text = "第一句话说完了。" * 12 + "Then an English sentence follows here."
    cancel = threading.Event()
    stream = tts.stream(text, "中文女", seed=0, num_speech_tokens=5, cancel=cancel)
    first = next(stream)
    assert first.samples.size
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        next(stream)
    # an unset event changes nothing
    a = tts.synthesize(text, "中文女", seed=0, num_speech_tokens=5)
    b = np.concatenate([x.samples for x in tts.stream(text, "中文女", seed=0,
                                                      num_speech_tokens=5,
                                                      cancel=threading.Event())])
    np.testing.assert_array_equal(a.samples, b)
    with pytest.raises(InputError):
        tts.set_max_parallel(0)
    tts.set_max_parallel(3)  # torch stages are thread-safe per call
    assert tts.max_parallel == 3
