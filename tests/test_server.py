"""`cosyvino serve` against real uvicorn servers on 127.0.0.1 (tiny synthetic model, forced
small speech-token counts so every request is fast)."""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.server import ServerConfig  # noqa: E402
from cosyvino.server.encoding import join_segments, to_int16  # noqa: E402
from server_harness import RunningServer, metric  # noqa: E402

TOKENS = 8  # forced speech tokens per segment
SHORT = "Hello world."
TWO = "第一句话说完了。" * 12 + "Then an English sentence follows here."
LONG = "第一句话说完了，第二句话也说完了。" * 180  # ~45 segments: far longer than any check
VOICE = "英文女"


# One torch thread: this suite runs many requests at once on a small (often shared) machine,
# where intra-op threads only oversubscribe the cores.
@pytest.fixture(scope="module")
def synth(tiny_model_dir):
    return Synthesizer(tiny_model_dir, backend="torch", num_threads=1, max_parallel=4)


@pytest.fixture(scope="module")
def serial_synth(tiny_model_dir):
    return Synthesizer(tiny_model_dir, backend="torch", num_threads=1)


@pytest.fixture(scope="module")
def server(synth, tmp_path_factory):
    cfg = ServerConfig(max_sessions=4, queue_size=32, num_speech_tokens=TOKENS,
                       cache_dir=str(tmp_path_factory.mktemp("cache")), request_timeout=60)
    s = RunningServer(cfg, [synth])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def busy_server(serial_synth):
    """One session, no queue, API key: for 503, disconnect and auth tests."""
    # a long timeout: LONG must be admitted (it is the long-running request these tests hold)
    cfg = ServerConfig(max_sessions=1, queue_size=0, num_speech_tokens=60, api_key="s3cret",
                       cache_memory_mb=0, request_timeout=600, metrics_auth=False)
    s = RunningServer(cfg, [serial_synth])
    yield s
    s.stop()


def post(url, body, **kw):
    return httpx.post(url + "/v1/audio/speech", json=body, timeout=60, **kw)


def expected_pcm16(synth, text, seed, voice=VOICE, tokens=TOKENS, speed=1.0) -> np.ndarray:
    chunks = list(synth.stream(text, voice, seed=seed, speed=speed, num_speech_tokens=tokens))
    return to_int16(join_segments(chunks, synth.sample_rate))


def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    return samples, rate


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


# ---- endpoints and formats -------------------------------------------------------------------
def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decoded mono float samples and rate: soundfile, or PyAV for the streamed FLAC (its
    STREAMINFO says "length unknown", which libsndfile cannot read to the end) and aac."""
    if fmt not in ("flac", "aac"):
        return sf.read(io.BytesIO(data), dtype="float32")
    import av

    with av.open(io.BytesIO(data)) as f:
        frames = [fr.to_ndarray().astype(np.float32).reshape(-1) for fr in f.decode(audio=0)]
        rate = f.streams.audio[0].rate
    x = np.concatenate(frames)
    return (x / 32768.0 if fmt == "flac" and np.abs(x).max() > 1.5 else x), rate


@pytest.mark.parametrize("fmt,ctype,rate", [("wav", "audio/wav", 22050),
                                            ("flac", "audio/flac", 22050),
                                            ("mp3", "audio/mpeg", 22050),
                                            ("opus", "audio/ogg", 24000),
                                            ("aac", "audio/aac", 22050)])
def test_speech_formats_decode(server, synth, fmt, ctype, rate):
    r = post(server.url, {"model": "tts-1", "input": TWO, "voice": VOICE,
                          "response_format": fmt, "seed": 5})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ctype
    samples, sr = _decode(r.content, fmt)
    assert sr == rate
    n_expected = expected_pcm16(synth, TWO, 5).shape[0] * rate / 22050
    assert abs(samples.shape[0] - n_expected) < 0.05 * n_expected + 2048
    assert np.abs(samples).max() > 1e-3


# ---- complete files and streams (docs/server.md, "Complete files and streams") ----------------
def _av_decode(data: bytes) -> tuple[np.ndarray, int]:
    """PyAV (FFmpeg) decode as users do: mono samples as float32 (int formats scaled), rate."""
    import av

    with av.open(io.BytesIO(data)) as f:
        frames = [fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]
        rate = f.streams.audio[0].rate
    x = np.concatenate(frames)
    return (x.astype(np.float32) / 32768 if x.dtype == np.int16 else x.astype(np.float32)), rate


def _lag(ref: np.ndarray, y: np.ndarray, max_lag: int) -> int:
    """The shift of ``y`` against ``ref`` (0..max_lag) with the largest cross-correlation."""
    n = min(ref.size, y.size - max_lag)
    return int(np.argmax([np.dot(ref[:n], y[k:k + n]) for k in range(max_lag + 1)]))


def _wave_frames(data: bytes) -> tuple[int, int, np.ndarray]:
    import wave

    with wave.open(io.BytesIO(data)) as w:
        n, rate = w.getnframes(), w.getframerate()
        return n, rate, np.frombuffer(w.readframes(1 << 30), "<i2")


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_one_chunk_response_is_a_complete_file(server, fmt):
    # one segment, one hop: the whole audio exists before the first byte, so the server sends
    # a complete file whose header has the length; every reader agrees with the wav
    body = {"input": SHORT, "voice": VOICE, "seed": 41, "hop_schedule": "segment"}
    wav = post(server.url, {**body, "response_format": "wav"})
    n, rate, ref16 = _wave_frames(wav.content)
    assert rate == 22050 and n == ref16.size > 0  # wave reads the header's real length
    ref = ref16.astype(np.float32) / 32767
    r = post(server.url, {**body, "response_format": fmt})
    assert r.status_code == 200, r.text
    data = r.content
    y, av_rate = _av_decode(data)
    if fmt == "wav":
        assert sf.info(io.BytesIO(data)).frames == n and (av_rate, y.size) == (22050, n)
    elif fmt == "flac":  # soundfile raised "array is too big" on "length unknown"
        samples, sr = sf.read(io.BytesIO(data), dtype="int16")
        assert sr == 22050
        np.testing.assert_array_equal(samples, ref16)
        assert (av_rate, y.size) == (22050, n)
    elif fmt == "mp3":  # the LAME header takes off the delay and the padding
        assert sf.info(io.BytesIO(data)).frames == n
        samples, sr = sf.read(io.BytesIO(data), dtype="float32")
        assert (sr, samples.size) == (22050, n) and (av_rate, y.size) == (22050, n)
        assert _lag(ref, y, 1105) == 0 and np.corrcoef(ref, y)[0, 1] > 0.9
    elif fmt == "opus":
        samples, sr = sf.read(io.BytesIO(data), dtype="float32")
        n24 = round(n * 24000 / 22050)
        assert sr == 24000 and abs(samples.size - n24) <= 1
        assert av_rate == 48000 and abs(y.size - 2 * n24) <= 2
    else:  # aac in ADTS: the documented 1024-sample priming first, then the audio
        assert av_rate == 22050 and n + 1024 <= y.size < n + 2048
        assert _lag(ref, y, 2048) == 1024


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_streamed_response_and_its_cache_hit(server, fmt):
    # several chunks: streamed with "length unknown"; the cache hit has the whole audio, so
    # it is a complete file of the same samples
    body = {"input": TWO, "voice": VOICE, "seed": 43}
    wav = post(server.url, {**body, "response_format": "wav"})
    ref16 = wav_samples(wav.content)[0]
    n = ref16.size
    miss = wav if fmt == "wav" else post(server.url, {**body, "response_format": fmt})
    hit = post(server.url, {**body, "response_format": fmt})
    assert (miss.headers["x-cosyvino-cache"], hit.headers["x-cosyvino-cache"]) == ("miss", "hit")
    streamed, _ = _av_decode(miss.content)
    whole, _ = _av_decode(hit.content)
    if fmt == "wav":
        assert miss.content[4:8] == miss.content[40:44] == b"\xff\xff\xff\xff"  # unknown
        assert _wave_frames(hit.content)[:2] == (n, 22050)
        np.testing.assert_array_equal(_wave_frames(hit.content)[2], ref16)
    elif fmt == "flac":
        # STREAMINFO (bytes 8..41) total samples, its bits 108..143: 0 = unknown
        assert miss.content[:4] == b"fLaC"
        assert int.from_bytes(miss.content[21:26], "big") & (2 ** 36 - 1) == 0
        assert sf.info(io.BytesIO(hit.content)).frames == n
        np.testing.assert_array_equal(sf.read(io.BytesIO(hit.content), dtype="int16")[0], ref16)
        np.testing.assert_array_equal(streamed, whole)  # same samples, streamed or not
    else:
        assert sf.info(io.BytesIO(hit.content)).frames == n == whole.size
        # the stream shows LAME's 1105-sample delay (docs/server.md); the file does not
        assert n + 1105 <= streamed.size <= n + 1105 + 2 * 576
        np.testing.assert_allclose(streamed[1105:1105 + n], whole, atol=1e-5)


def test_pcm_is_int16_24khz(server, synth):
    r = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "pcm", "seed": 2})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
    assert len(r.content) % 2 == 0
    pcm = np.frombuffer(r.content, "<i2")
    ref = expected_pcm16(synth, TWO, 2)
    assert abs(pcm.shape[0] - round(ref.shape[0] * 24000 / 22050)) <= 2
    # same waveform, resampled: compare after resampling back
    import soxr

    back = soxr.resample(pcm.astype(np.float32) / 32767, 24000, 22050)
    n = min(back.shape[0], ref.shape[0])
    corr = np.corrcoef(back[:n], ref[:n].astype(np.float32))[0, 1]
    assert corr > 0.95


def test_default_format_is_mp3(server):
    r = post(server.url, {"input": SHORT, "voice": VOICE})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    sf.read(io.BytesIO(r.content))


def test_wav_is_identical_to_synthesizer_and_has_one_header(server, synth):
    r = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "wav", "seed": 11})
    assert r.status_code == 200
    assert r.content.count(b"RIFF") == 1 and r.content[:4] == b"RIFF"
    samples, rate = wav_samples(r.content)
    assert rate == 22050
    np.testing.assert_array_equal(samples, expected_pcm16(synth, TWO, 11))


def test_n_timesteps_reaches_the_engine(server, synth):
    """The ODE step count of the body is the request's (same samples as the library with it,
    other samples than the default), on the JSON and the CosyVoice endpoints."""
    body = {"input": SHORT, "voice": VOICE, "response_format": "wav", "seed": 3}
    three, _ = wav_samples(post(server.url, dict(body, n_timesteps=3)).content)
    direct = synth.synthesize(SHORT, VOICE, seed=3, num_speech_tokens=TOKENS, n_timesteps=3)
    np.testing.assert_array_equal(three, direct.to_int16())
    default, _ = wav_samples(post(server.url, body).content)  # not the cached 3-step result
    assert not np.array_equal(default, three)
    raw = httpx.post(server.url + "/inference_sft", data={"tts_text": SHORT, "spk_id": VOICE,
                                                          "seed": "3", "n_timesteps": "3"},
                     timeout=60)
    assert raw.status_code == 200
    np.testing.assert_array_equal(np.frombuffer(raw.content, "<i2"), direct.to_int16())


def test_single_segment_equals_synthesize(server, synth):
    r = post(server.url, {"input": SHORT, "voice": VOICE, "response_format": "wav", "seed": 3})
    samples, _ = wav_samples(r.content)
    direct = synth.synthesize(SHORT, VOICE, seed=3, num_speech_tokens=TOKENS)
    np.testing.assert_array_equal(samples, direct.to_int16())


def test_segment_joins_have_no_jumps(server, synth):
    r = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "wav", "seed": 4})
    samples, _ = wav_samples(r.content)
    chunks = list(synth.stream(TWO, VOICE, seed=4, num_speech_tokens=TOKENS))
    assert {c.stats["segment"] for c in chunks} == {0, 1}
    join = sum(c.samples.shape[0] for c in chunks if c.stats["segment"] == 0)
    around = samples[join - 3:join + 3].astype(np.float32) / 32767
    assert np.abs(around).max() < 0.02  # both sides fade to zero at the join


def test_speed_changes_length(server, synth):
    slow = post(server.url, {"input": SHORT, "voice": VOICE, "response_format": "wav",
                             "seed": 1, "speed": 0.5})
    fast = post(server.url, {"input": SHORT, "voice": VOICE, "response_format": "wav",
                             "seed": 1, "speed": 2.0})
    n_slow, n_fast = wav_samples(slow.content)[0].shape[0], wav_samples(fast.content)[0].shape[0]
    assert n_slow > 3 * n_fast
    np.testing.assert_array_equal(wav_samples(fast.content)[0],
                                  expected_pcm16(synth, SHORT, 1, speed=2.0))


def test_sse_stream(server):
    audio = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "pcm",
                              "seed": 6})
    r = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "pcm", "seed": 6,
                          "stream_format": "sse"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] in (0, 2 * TOKENS)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 1
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == audio.content


def test_sse_done_reports_the_stage_times(server):
    """The done event carries the synthesis' per-stage seconds and calls (the web page shows
    them): summed over the chunks of both segments."""
    r = post(server.url, {"input": TWO, "voice": VOICE, "response_format": "pcm",
                          "stream_format": "sse"})  # no seed: never a cache hit
    done = [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ")][-1]
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == 2 * TOKENS
    stages = done["stages"]
    assert stages["llm_decode"]["calls"] == 2 * (TOKENS - 1)  # per segment: first token is prefill
    assert stages["vocoder"]["seconds"] > 0 and stages["flow_estimator"]["seconds"] > 0


def test_models_and_voices(server, synth):
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert "tts-1" in ids and all(m["object"] == "model" for m in r.json()["data"])
    assert all(m["modes"] == synth.modes for m in r.json()["data"]) and "sft" in synth.modes
    r = httpx.get(server.url + "/v1/audio/voices")
    assert r.status_code == 200
    assert [v["id"] for v in r.json()["voices"]] == synth.speakers
    assert r.json()["data"] == r.json()["voices"]


@pytest.mark.parametrize("how", ["get-query", "get-form-body", "post-form", "post-multipart"])
def test_inference_sft_compat(server, synth, how):
    params = {"tts_text": TWO, "spk_id": "中文女", "seed": "9"}
    url = server.url + "/inference_sft"
    if how == "get-query":
        r = httpx.get(url, params=params, timeout=60)
    elif how == "get-form-body":  # the official client: requests.request("GET", data=...)
        r = httpx.request("GET", url, data=params, timeout=60)
    elif how == "post-form":
        r = httpx.post(url, data=params, timeout=60)
    else:
        r = httpx.post(url, data=params, files={"unused": ("x.txt", b"x")}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    pcm = np.frombuffer(r.content, "<i2")
    np.testing.assert_array_equal(pcm, expected_pcm16(synth, TWO, 9, voice="中文女"))


def test_inference_sft_errors(server):
    r = httpx.get(server.url + "/inference_sft", params={"spk_id": "中文女"})
    assert_error(r, 400, "tts_text", "missing_required_parameter")
    r = httpx.get(server.url + "/inference_sft", params={"tts_text": "hi", "spk_id": "nobody"})
    err = assert_error(r, 400, "spk_id", "unknown_voice")
    assert "中文女" in err["message"]


def test_health_ready_metrics(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    r = httpx.get(server.url + "/ready")
    assert r.status_code == 200 and r.json()["ready"] is True
    post(server.url, {"input": SHORT, "voice": VOICE, "response_format": "wav"})
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in ("cosyvino_requests_total", "cosyvino_request_duration_seconds_bucket",
                 "cosyvino_first_byte_seconds_bucket", "cosyvino_rtf_bucket",
                 "cosyvino_audio_seconds_total", "cosyvino_queue_depth", "cosyvino_in_flight",
                 "cosyvino_cache_hits_total", "cosyvino_cache_misses_total"):
        assert name in r.text, name
    assert metric(server.url, "cosyvino_requests_total",
                  'endpoint="/v1/audio/speech",status="200"') >= 1
    assert metric(server.url, "cosyvino_audio_seconds_total") > 0


# ---- bad input -------------------------------------------------------------------------------
BAD = [
    ("malformed-json", b'{"input": "hi",', 400, None, "invalid_json"),
    ("not-an-object", b'["hi"]', 400, None, None),
    ("missing-input", {"voice": VOICE}, 400, "input", "missing_required_parameter"),
    ("empty-input", {"input": "", "voice": VOICE}, 400, "input", "empty_input"),
    ("whitespace-input", {"input": " \n\t ", "voice": VOICE}, 400, "input", "empty_input"),
    ("emoji-input", {"input": "😀🎉 😀", "voice": VOICE}, 400, "input", "empty_input"),
    ("too-long", {"input": "a" * 4097, "voice": VOICE}, 400, "input",
     "string_above_max_length"),
    ("unknown-format", {"input": "hi", "voice": VOICE, "response_format": "aiff"}, 400,
     "response_format", None),
    ("speed-0", {"input": "hi", "voice": VOICE, "speed": 0}, 400, "speed", None),
    ("speed-10", {"input": "hi", "voice": VOICE, "speed": 10}, 400, "speed", None),
    ("input-int", {"input": 123, "voice": VOICE}, 400, "input", "invalid_type"),
    ("speed-str", {"input": "hi", "voice": VOICE, "speed": "fast"}, 400, "speed",
     "invalid_type"),
    ("voice-int", {"input": "hi", "voice": 5}, 400, "voice", "invalid_type"),
    ("seed-str", {"input": "hi", "voice": VOICE, "seed": "x"}, 400, "seed", "invalid_type"),
    ("seed-negative", {"input": "hi", "voice": VOICE, "seed": -1}, 400, "seed", None),
    ("seed-bool", {"input": "hi", "voice": VOICE, "seed": True}, 400, "seed", "invalid_type"),
    ("stream-format", {"input": "hi", "voice": VOICE, "stream_format": "ws"}, 400,
     "stream_format", None),
    ("huge-body", b'{"input": "' + b"a" * (2 << 20) + b'"}', 413, None, "body_too_large"),
    ("steps-0", {"input": "hi", "voice": VOICE, "n_timesteps": 0}, 400, "n_timesteps", None),
    ("steps-float", {"input": "hi", "voice": VOICE, "n_timesteps": 2.5}, 400, "n_timesteps",
     "invalid_type"),
]


@pytest.mark.parametrize("name,body,status,param,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gives_4xx_and_server_stays_healthy(server, name, body, status, param, code):
    url = server.url + "/v1/audio/speech"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"},
                       timeout=60)
    else:
        r = httpx.post(url, json=body, timeout=60)
    assert_error(r, status, param, code)
    assert httpx.get(server.url + "/health").status_code == 200


def test_unknown_voice_lists_voices(server, synth):
    # (an OpenAI name such as alloy is an alias of a built-in speaker: tests/test_server_interop.py)
    r = post(server.url, {"input": "hi", "voice": "no-such-voice"})
    err = assert_error(r, 400, "voice", "unknown_voice")
    for v in synth.speakers:
        assert v in err["message"]


def test_unknown_route_and_method(server):
    assert_error(httpx.get(server.url + "/nope"), 404)
    assert_error(httpx.get(server.url + "/v1/audio/speech"), 405)


def test_server_still_synthesizes_after_bad_input(server):
    r = post(server.url, {"input": SHORT, "voice": VOICE, "response_format": "wav"})
    assert r.status_code == 200


# ---- concurrency -----------------------------------------------------------------------------
def test_16_concurrent_clients_match_direct_synthesis(server, synth):
    jobs = [(TWO if i % 2 else SHORT, 100 + i) for i in range(16)]

    def one(job):
        text, seed = job
        r = post(server.url, {"input": text, "voice": VOICE, "response_format": "wav",
                              "seed": seed})
        return r.status_code, r.content

    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, jobs))
    assert [s for s, _ in results] == [200] * 16
    for (text, seed), (_, content) in zip(jobs, results):
        np.testing.assert_array_equal(wav_samples(content)[0],
                                      expected_pcm16(synth, text, seed))
    assert metric(server.url, "cosyvino_in_flight") == 0
    assert metric(server.url, "cosyvino_queue_depth") == 0


def _open_stream(url, client):
    """Start a long streamed request and wait until its first audio bytes arrive."""
    req = client.build_request("POST", url + "/v1/audio/speech",
                               json={"input": LONG, "voice": VOICE, "response_format": "pcm"})
    resp = client.send(req, stream=True)
    assert resp.status_code == 200
    chunks = resp.iter_raw()  # keep a reference: a dropped generator closes the stream
    assert next(chunks)
    return resp, chunks


def _wait_metric(url, name, value, timeout=20.0, labels=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(url, name, labels) == value:
            return True
        time.sleep(0.05)
    return False


def test_queue_full_gives_503_and_disconnect_frees_the_session(busy_server):
    url = busy_server.url
    auth = {"Authorization": "Bearer s3cret"}
    with httpx.Client(headers=auth, timeout=60) as client:
        resp, _chunks = _open_stream(url, client)
        try:
            assert metric(url, "cosyvino_in_flight") == 1
            r = client.post(url + "/v1/audio/speech", json={"input": "hi", "voice": VOICE})
            assert_error(r, 503, code="server_busy")
            assert int(r.headers["retry-after"]) >= 1
        finally:
            resp.close()  # client disconnects mid-stream
    # the worker stops at the next token and gives the session back
    assert _wait_metric(url, "cosyvino_in_flight", 0)
    assert metric(url, "cosyvino_cancelled_total", 'reason="disconnect"') >= 1
    assert metric(url, "cosyvino_stopped_early_total") >= 1  # not run to the end
    r = httpx.post(url + "/v1/audio/speech", headers=auth, timeout=60,
                   json={"input": "hi", "voice": VOICE, "response_format": "wav"})
    assert r.status_code == 200



def test_disconnect_takes_the_request_out_of_the_scheduler(busy_server):
    """A client gone mid-stream: its request leaves the scheduler before its last segment and
    the slot is free again for the next request."""
    url, pool = busy_server.url, busy_server.state.pool
    auth = {"Authorization": "Bearer s3cret"}
    with httpx.Client(headers=auth, timeout=60) as client:
        resp, _chunks = _open_stream(url, client)
        try:
            assert pool.running == 1 and pool.scheduler.active == 1
        finally:
            resp.close()
    deadline = time.monotonic() + 20
    while (pool.running or pool.scheduler.active) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.running == 0 and pool.scheduler.active == 0
    r = httpx.post(url + "/v1/audio/speech", headers=auth, timeout=60,
                   json={"input": SHORT, "voice": VOICE, "response_format": "wav", "seed": 8})
    assert r.status_code == 200
    deadline = time.monotonic() + 20  # the worker reports the end just after the last byte
    while pool.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.running == 0

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic czNjcmV0"}],
                         ids=["none", "wrong", "not-bearer"])
def test_api_key_required(busy_server, headers):
    r = httpx.post(busy_server.url + "/v1/audio/speech", headers=headers, timeout=60,
                   json={"input": "hi", "voice": VOICE})
    assert_error(r, 401, code="invalid_api_key")
    assert_error(httpx.get(busy_server.url + "/v1/models", headers=headers), 401)
    assert httpx.get(busy_server.url + "/health").status_code == 200


def test_timeout_cancels_work(serial_synth):
    cfg = ServerConfig(max_sessions=1, queue_size=0, num_speech_tokens=20, cache_memory_mb=0,
                       request_timeout=0.4)
    s = RunningServer(cfg, [serial_synth])
    try:
        try:
            r = post(s.url, {"input": LONG, "voice": VOICE, "response_format": "pcm"})
            if r.status_code != 200:
                assert_error(r, 504, code="timeout")
            else:  # headers were out: the transfer is cut short
                pytest.fail("a timed-out stream must not complete normally")
        except httpx.RemoteProtocolError:
            pass
        assert _wait_metric(s.url, "cosyvino_in_flight", 0)
        assert metric(s.url, "cosyvino_cancelled_total", 'reason="timeout"') == 1
        assert metric(s.url, "cosyvino_stopped_early_total") == 1
    finally:
        s.stop()


# ---- cache -----------------------------------------------------------------------------------
def test_cache_hit_is_byte_identical_and_corrupt_file_recovered(server):
    body = {"input": "Cache me. Please.", "voice": VOICE, "response_format": "flac", "seed": 77}
    hits0 = metric(server.url, "cosyvino_cache_hits_total")
    first = post(server.url, body)
    assert first.status_code == 200 and first.headers["x-cosyvino-cache"] == "miss"
    second = post(server.url, body)
    assert second.headers["x-cosyvino-cache"] == "hit"
    assert second.content == first.content
    assert metric(server.url, "cosyvino_cache_hits_total") == hits0 + 1

    cache = server.state.cache
    files = [os.path.join(d, f) for d, _, fs in os.walk(cache.directory) for f in fs
             if f.endswith(".bin")]
    assert files and not [f for d, _, fs in os.walk(cache.directory) for f in fs
                          if f.startswith(".tmp-")]
    target = max(files, key=os.path.getmtime)
    with open(target, "r+b") as f:  # flip payload bytes
        f.seek(60)
        f.write(b"\xff\x00\xff\x00")
    cache.clear_memory()
    third = post(server.url, body)
    assert third.headers["x-cosyvino-cache"] == "miss"  # corrupt entry ignored
    assert third.content == first.content
    assert cache.corrupt_recovered >= 1
    cache.clear_memory()
    fourth = post(server.url, body)  # rewritten entry now served from disk
    assert fourth.headers["x-cosyvino-cache"] == "hit" and fourth.content == first.content


def test_unseeded_requests_are_not_cached(server):
    body = {"input": "Not cached.", "voice": VOICE, "response_format": "wav"}
    a, b = post(server.url, body), post(server.url, body)
    assert a.headers["x-cosyvino-cache"] == b.headers["x-cosyvino-cache"] == "off"


def test_cache_key_depends_on_every_parameter(server):
    base = {"input": "Key test.", "voice": VOICE, "response_format": "wav", "seed": 1}
    post(server.url, base)
    for change in ({"seed": 2}, {"voice": "中文女"}, {"speed": 1.5},
                   {"response_format": "pcm"}, {"input": "Key test two."}):
        r = post(server.url, {**base, **change})
        assert r.headers["x-cosyvino-cache"] == "miss", change
    r = post(server.url, {**base, "input": "  Key   test. "})  # same normalized text
    assert r.headers["x-cosyvino-cache"] == "hit"


def test_one_model_per_worker_pool(tiny_model_dir, synth):
    """Backends that are not thread-safe get one loaded Synthesizer per session."""
    workers = [Synthesizer(tiny_model_dir, backend="torch", num_threads=1) for _ in range(2)]
    s = RunningServer(ServerConfig(max_sessions=2, queue_size=8, num_speech_tokens=TOKENS,
                                   cache_memory_mb=0), workers)
    try:
        assert not s.state.pool.shared
        with ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(lambda seed: post(s.url, {"input": TWO, "voice": VOICE,
                                                       "response_format": "wav",
                                                       "seed": seed}), range(4)))
        for seed, r in enumerate(rs):
            assert r.status_code == 200
            np.testing.assert_array_equal(wav_samples(r.content)[0],
                                          expected_pcm16(synth, TWO, seed))
    finally:
        s.stop()


def test_concurrent_requests_on_a_shared_model_run_together_on_the_scheduler(tiny_model_dir):
    """Two requests at once on one shared model: both are stepped by the pool's scheduler
    workers, interleaved, and each gives what Synthesizer.synthesize gives for its seed."""
    shared = Synthesizer(tiny_model_dir, backend="torch", num_threads=1, max_parallel=2)
    s = RunningServer(ServerConfig(max_sessions=2, queue_size=0, num_speech_tokens=TOKENS,
                                   cache_memory_mb=0), [shared])
    engine = shared.engine
    steps, first = [], set()
    lock = threading.Lock()
    both_in = threading.Barrier(2, timeout=30)

    def step(state, *args, **kwargs):
        with lock:
            steps.append((threading.current_thread().name, id(state)))
            is_first = id(state) not in first
            first.add(id(state))
        if is_first:  # hold each request's first step until the other is scheduled too
            both_in.wait()
        return type(engine).step(engine, state, *args, **kwargs)

    jobs = [(SHORT, 31), ("Good morning.", 32)]
    try:
        assert s.state.pool.shared and s.state.pool.scheduler.engines == [engine]
        engine.step = step
        with ThreadPoolExecutor(2) as ex:
            rs = list(ex.map(lambda job: post(s.url, {"input": job[0], "voice": VOICE,
                                                      "response_format": "wav",
                                                      "seed": job[1]}), jobs))
    finally:
        engine.__dict__.pop("step", None)
        s.stop()
    assert [r.status_code for r in rs] == [200, 200]
    names = {name for name, _ in steps}
    # the pool's scheduler threads: its workers and their spares (for held steps)
    assert len(names) == 2 and {n.rsplit("-", 1)[0] for n in names} <= {
        "cosyvino-synth", "cosyvino-synth-spare"}
    order = [sid for _, sid in steps]
    a, b = dict.fromkeys(order)  # the two requests, in order of their first step
    assert len(set(order)) == 2
    last = {sid: len(order) - 1 - order[::-1].index(sid) for sid in (a, b)}
    assert order.index(b) < last[a]  # interleaved: b started before a finished
    for (text, seed), r in zip(jobs, rs):
        direct = shared.synthesize(text, VOICE, seed=seed, num_speech_tokens=TOKENS)
        assert direct.stats["segments"] == 1
        np.testing.assert_array_equal(wav_samples(r.content)[0], direct.to_int16())


# ---- reliability (issue 19) --------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["/v1/audio/speech", "/inference_sft"])
@pytest.mark.parametrize("depth", [40, 1000, 100_000])
def test_deeply_nested_json_is_a_400(server, endpoint, depth):
    """Item 7: an `input` nested 1,000 levels gave 500 RecursionError."""
    field = "input" if endpoint == "/v1/audio/speech" else "tts_text"
    body = ('{"%s": ' % field + "[" * depth + "]" * depth + ', "voice": "x"}').encode()
    r = httpx.post(server.url + endpoint, content=body, timeout=60,
                   headers={"content-type": "application/json"})
    err = assert_error(r, 400, code="invalid_json")
    assert "nested too deeply" in err["message"] and "32 levels" in err["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_input_that_cannot_finish_within_the_timeout_is_refused_up_front(serial_synth):
    """Item 2: a long input was admitted, streamed for the whole timeout and cut with status
    200. Once the server has measured its speed, such a request is a 400 naming the limit,
    before any synthesis."""
    cfg = ServerConfig(max_sessions=1, queue_size=8, num_speech_tokens=60, cache_memory_mb=0,
                       request_timeout=5)
    s = RunningServer(cfg, [serial_synth])
    try:
        # measured alone: 1 s per s of speech
        s.state.pool.estimator.observe_chunk(10.0, 10.0, alone=True)
        r = post(s.url, {"input": LONG, "voice": VOICE, "response_format": "wav"})
        err = assert_error(r, 400, "input", "input_too_long")
        assert "request timeout of 5 s" in err["message"]
        r = httpx.post(s.url + "/inference_sft", data={"tts_text": LONG, "spk_id": VOICE},
                       timeout=60)
        assert_error(r, 400, "tts_text", "input_too_long")
        assert metric(s.url, "cosyvino_refused_total", 'reason="too_long"') == 2
        assert s.state.pool.running == 0 and s.state.pool._admitted == 0
        info = httpx.get(s.url + "/ready").json()["admission"]
        assert info["rtf"] == pytest.approx(1.0) and info["measured_speech_seconds"] == 10
        assert info["quiet_rtf"] == {"plain": 1.0, "prompt": None, "vc": None}
        # a short one still runs
        r = post(s.url, {"input": SHORT, "voice": VOICE, "response_format": "wav"})
        assert r.status_code == 200
    finally:
        s.stop()


def test_load_alone_never_gets_a_400_an_idle_server_serves(serial_synth):
    """Issue 33 defect 1: after load the learned rate stayed high (RTF 19-30) and an idle
    server answered 400 input_too_long (final for an OpenAI client) to work that finishes
    alone well within the timeout. The rate raised by load is not the cost alone: the idle
    server serves the request, and it then counts towards the quiet rate."""
    cfg = ServerConfig(max_sessions=1, queue_size=8, num_speech_tokens=8, cache_memory_mb=0,
                       request_timeout=5)
    s = RunningServer(cfg, [serial_synth])
    try:
        est = s.state.pool.estimator
        est.observe_chunk(600.0, 10.0)  # load: 60 s per s of speech, nothing measured alone
        # 0.16 s of speech x 50 (the prior weighs in) x 1.25 = 10 s > 5 s: was a 400
        r = post(s.url, {"input": SHORT, "voice": VOICE, "response_format": "wav"})
        assert r.status_code == 200, r.text
        assert metric(s.url, "cosyvino_refused_total", 'reason="too_long"') == 0
        assert est.quiet_rtf_of("plain") is not None  # it ran alone: measured
        assert httpx.get(s.url + "/ready").json()["admission"]["quiet_rtf"]["plain"] > 0
    finally:
        s.stop()


def test_metrics_can_require_the_api_key(busy_server, serial_synth):
    """Item 14: /metrics answered without the key while everything else needed it; it stays
    open by default (busy_server has a key) and takes the key with metrics_auth."""
    assert httpx.get(busy_server.url + "/metrics").status_code == 200
    cfg = ServerConfig(max_sessions=1, queue_size=0, api_key="k3y", metrics_auth=True,
                       cache_memory_mb=0, warmup=False)
    s = RunningServer(cfg, [serial_synth])
    try:
        assert_error(httpx.get(s.url + "/metrics"), 401, code="invalid_api_key")
        r = httpx.get(s.url + "/metrics", headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 200 and "cosyvino_requests_total" in r.text
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/ready").status_code == 200
    finally:
        s.stop()
    with pytest.raises(InputError, match="needs an API key"):
        ServerConfig(metrics_auth=True).validate()

